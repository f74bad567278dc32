package appwrapper

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// PodVerdict is an ft-launcher verdict found in a pod's termination
// message.
type PodVerdict struct {
	Pod, Node string
	Verdict   verdict.Verdict
}

// PodSummary is the health of a workload's pods, as the Running-phase evaluation
// (upstream's appwrapper_controller.go, Running phase) needs it, plus what
// ft-launcher reported.
type PodSummary struct {
	Pending, Running, Succeeded, Failed int32
	// TerminalFailure: a Failed pod's container exited with a terminal
	// code (Params.IsTerminalExitCode), or a verdict said no_restart.
	TerminalFailure bool
	// TerminalReason says which pod and why, for conditions and events.
	TerminalReason string
	// NoRestart: an ft-launcher verdict of kind no_restart was found; the
	// workload asked to stop, so it fails at once (no FailureGracePeriod).
	NoRestart bool
	// NoExecuteNodes, sorted: nodes flagged NoExecute for a resource that
	// a Running, non-terminating pod on them requests (upstream's node_health_monitor.go).
	NoExecuteNodes []string
	// Verdicts: every parsable verdict in a terminated container's
	// message (current state, then last termination state).
	Verdicts []PodVerdict
	// QuarantinedHosts, sorted and deduplicated: the Kubernetes node names
	// of the nodes the verdicts quarantined (see podNodes).
	QuarantinedHosts []string
}

// SummarizePods counts pods as upstream does (upstream's
// appwrapper_controller.go, Running phase): Running only without a
// deletionTimestamp, every Failed pod (historical ones included), and terminal
// exit codes read from the containers (not init containers) of Failed pods.
// noExecute maps a node name to the resources flagged NoExecute on it
// (NoExecuteResources). Pods are taken in name order so that TerminalReason does
// not depend on list order.
func SummarizePods(pods []corev1.Pod, p Params, noExecute map[string][]string) PodSummary {
	var s PodSummary
	order := make([]int, len(pods))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return pods[order[a]].Name < pods[order[b]].Name })

	where := podNodes(pods)
	var exitReason, verdictReason string
	noExec := map[string]bool{}
	hosts := map[string]bool{}
	for _, i := range order {
		pod := &pods[i]
		switch pod.Status.Phase {
		case corev1.PodPending:
			s.Pending++
		case corev1.PodRunning:
			if pod.DeletionTimestamp == nil {
				s.Running++
				if flaggedNode(pod, noExecute) {
					noExec[pod.Spec.NodeName] = true
				}
			}
		case corev1.PodSucceeded:
			s.Succeeded++
		case corev1.PodFailed:
			s.Failed++
			if exitReason == "" {
				exitReason = terminalExit(pod, p)
			}
		}

		for _, cs := range pod.Status.ContainerStatuses {
			for _, t := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
				if t == nil || !strings.Contains(t.Message, verdict.SchemaPrefix) {
					continue
				}
				v, err := verdict.Parse([]byte(t.Message))
				if err != nil {
					// A truncated or foreign message is not a verdict.
					continue
				}
				s.Verdicts = append(s.Verdicts, PodVerdict{Pod: pod.Name, Node: pod.Spec.NodeName, Verdict: v})
				for _, q := range v.Quarantined {
					if n := where.node(q); n != "" {
						hosts[n] = true
					}
				}
				if v.FailingNode != nil && pod.Spec.NodeName != "" {
					// Its ranks kept failing in ways that point at the
					// node, and no spare took its place: the next
					// placement keeps off it as off a quarantined one.
					hosts[pod.Spec.NodeName] = true
				}
				if v.Kind == verdict.NoRestart {
					s.NoRestart = true
					if verdictReason == "" {
						verdictReason = fmt.Sprintf("pod %s: ft-launcher verdict %s: %s", pod.Name, v.Kind, v.Reason)
					}
				}
			}
		}
	}
	// The workload's own request to stop explains more than an exit code.
	s.TerminalReason = cmp.Or(verdictReason, exitReason)
	s.TerminalFailure = s.TerminalReason != ""
	s.NoExecuteNodes = sortedKeys(noExec)
	s.QuarantinedHosts = sortedKeys(hosts)
	return s
}

// terminalExit is why a Failed pod's failure is terminal, "" if it is not.
func terminalExit(pod *corev1.Pod, p Params) string {
	for _, cs := range pod.Status.ContainerStatuses {
		t := cs.State.Terminated
		if t == nil || !p.IsTerminalExitCode(t.ExitCode) {
			continue
		}
		rule := "not in retryableExitCodes"
		if slices.Contains(p.TerminalExitCodes, t.ExitCode) {
			rule = "terminalExitCodes"
		}
		return fmt.Sprintf("pod %s container %s exit code %d is terminal (%s)", pod.Name, cs.Name, t.ExitCode, rule)
	}
	return ""
}

// flaggedNode reports whether pod runs on a node flagged NoExecute for a
// resource it requests.
func flaggedNode(pod *corev1.Pod, noExecute map[string][]string) bool {
	if pod.Spec.NodeName == "" {
		return false
	}
	for _, r := range noExecute[pod.Spec.NodeName] {
		if requestsResource(&pod.Spec, corev1.ResourceName(r)) {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]bool) []string {
	if len(m) == 0 {
		return nil
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// nodeIndex maps what a launcher knows a node by to the Kubernetes node its
// pod ran on. Launchers name a quarantined node by its rendezvous id
// ("<address>/<pid>", the address being the pod IP) and, for their own
// node, by their host name (the pod's host name): neither is a node name,
// and an anti-affinity on kubernetes.io/hostname needs the node's.
type nodeIndex map[string]string

// podNodes indexes the pods' names, host names and IPs, and the node names
// themselves (a launcher given the node name as its host name), to their
// node; pods not bound to a node are left out.
func podNodes(pods []corev1.Pod) nodeIndex {
	ix := nodeIndex{}
	for i := range pods {
		p := &pods[i]
		n := p.Spec.NodeName
		if n == "" {
			continue
		}
		ix[n] = n
		for _, k := range []string{p.Name, p.Spec.Hostname, p.Status.PodIP} {
			if k != "" {
				ix[k] = n
			}
		}
		for _, ip := range p.Status.PodIPs {
			if ip.IP != "" {
				ix[ip.IP] = n
			}
		}
	}
	return ix
}

// node is the Kubernetes node of quarantine entry q, "" when no pod of the
// workload explains it (it is then not avoided: a wrong name would only
// mislead).
func (ix nodeIndex) node(q verdict.Quarantine) string {
	addr, _, _ := strings.Cut(q.Node, "/")
	for _, k := range []string{q.Host, addr} {
		if n := ix[k]; n != "" {
			return n
		}
	}
	return ""
}
