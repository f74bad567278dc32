package appwrapper

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// message is v as the launcher leaves it in /dev/termination-log.
func message(t *testing.T, v verdict.Verdict) string {
	t.Helper()
	b, err := verdict.Compact(v, verdict.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

type podOpt func(*corev1.Pod)

func pod(name string, phase corev1.PodPhase, opts ...podOpt) corev1.Pod {
	p := corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team1"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c"}}},
		Status:     corev1.PodStatus{Phase: phase},
	}
	for _, o := range opts {
		o(&p)
	}
	return p
}

func onNode(n string) podOpt { return func(p *corev1.Pod) { p.Spec.NodeName = n } }

func terminating(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: time.Now()} }

func requesting(r string, q string) podOpt {
	return func(p *corev1.Pod) {
		p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceName(r): resource.MustParse(q)}
	}
}

func exited(container string, code int32, msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:  container,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}},
		})
	}
}

func restartedAfter(container string, code int32, msg string) podOpt {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{
			Name:                 container,
			State:                corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Message: msg}},
		})
	}
}

func initExited(code int32) podOpt {
	return func(p *corev1.Pod) {
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{
			Name: "init", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}},
		})
	}
}

func TestSummarizePodsCounts(t *testing.T) {
	pods := []corev1.Pod{
		pod("a", corev1.PodPending),
		pod("b", corev1.PodRunning),
		pod("c", corev1.PodRunning, terminating),
		pod("d", corev1.PodSucceeded),
		pod("e", corev1.PodSucceeded, terminating),
		pod("f", corev1.PodFailed, exited("c", 1, "")),
		pod("g", corev1.PodFailed, terminating),
		pod("h", corev1.PodUnknown),
		pod("i", corev1.PodPending, terminating),
	}
	s := SummarizePods(pods, Params{}, nil)
	if s.Pending != 2 || s.Running != 1 || s.Succeeded != 2 || s.Failed != 2 {
		t.Errorf("counts %+v", s)
	}
	if s.TerminalFailure || s.TerminalReason != "" || s.NoRestart || s.Verdicts != nil || s.NoExecuteNodes != nil || s.QuarantinedHosts != nil {
		t.Errorf("summary %+v", s)
	}
	if s := SummarizePods(nil, Params{}, nil); !reflect.DeepEqual(s, PodSummary{}) {
		t.Errorf("no pods: %+v", s)
	}
}

func TestSummarizePodsTerminalExitCodes(t *testing.T) {
	terminal := Params{TerminalExitCodes: []int32{3}}
	retryable := Params{RetryableExitCodes: []int32{137}}
	for _, tc := range []struct {
		name   string
		p      Params
		pods   []corev1.Pod
		reason string
	}{
		{name: "terminal code", p: terminal, pods: []corev1.Pod{pod("p1", corev1.PodFailed, exited("c", 3, ""))},
			reason: "pod p1 container c exit code 3 is terminal (terminalExitCodes)"},
		{name: "other code", p: terminal, pods: []corev1.Pod{pod("p1", corev1.PodFailed, exited("c", 1, ""))}},
		{name: "not in retryable", p: retryable, pods: []corev1.Pod{pod("p1", corev1.PodFailed, exited("c", 137, ""), exited("d", 2, ""))},
			reason: "pod p1 container d exit code 2 is terminal (not in retryableExitCodes)"},
		{name: "retryable only", p: retryable, pods: []corev1.Pod{pod("p1", corev1.PodFailed, exited("c", 137, ""), exited("d", 0, ""))}},
		{name: "init containers are not read", p: terminal, pods: []corev1.Pod{pod("p1", corev1.PodFailed, initExited(3))}},
		{name: "only Failed pods", p: terminal, pods: []corev1.Pod{
			pod("p1", corev1.PodRunning, restartedAfter("c", 3, "")),
			pod("p2", corev1.PodSucceeded, exited("c", 3, "")),
		}},
		{name: "last termination state is not read", p: terminal, pods: []corev1.Pod{pod("p1", corev1.PodFailed, restartedAfter("c", 3, ""))}},
		{name: "first pod by name", p: terminal, pods: []corev1.Pod{
			pod("p9", corev1.PodFailed, exited("c", 3, "")),
			pod("p2", corev1.PodFailed, exited("c", 3, "")),
		}, reason: "pod p2 container c exit code 3 is terminal (terminalExitCodes)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SummarizePods(tc.pods, tc.p, nil)
			if s.TerminalReason != tc.reason || s.TerminalFailure != (tc.reason != "") || s.NoRestart {
				t.Errorf("got %v %q, want %q", s.TerminalFailure, s.TerminalReason, tc.reason)
			}
		})
	}
}

func TestSummarizePodsVerdicts(t *testing.T) {
	at := time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)
	noRestart := verdict.Verdict{Kind: verdict.NoRestart, ExitCode: 93, Reason: "rank 3 asked to shut down", LastRound: 2,
		Quarantined: []verdict.Quarantine{
			{Node: "10.0.0.7/41", Host: "gpu-7", Evidence: verdict.EvidenceHang, Detail: "rank 5 hung", At: at},
			{Node: "10.0.0.9/12", Evidence: verdict.EvidenceLost, At: at},
		}}
	exhausted := verdict.Verdict{Kind: verdict.RestartBudgetExhausted, ExitCode: 1, Reason: "no restart left",
		Quarantined: []verdict.Quarantine{
			{Node: "10.0.0.7/41", Host: "gpu-7", Evidence: verdict.EvidenceHealthCheck},
			{Node: "10.0.0.3/5", Host: "gpu-3", Evidence: verdict.EvidenceExcluded},
		}}
	big := exhausted
	big.Reason = strings.Repeat("long reason ", 1000) // Compact must cut it to fit
	full := message(t, noRestart)
	wrongSchema := strings.Replace(full, verdict.Schema, verdict.SchemaPrefix+"v2", 1)

	pods := []corev1.Pod{
		pod("w2", corev1.PodFailed, onNode("n2"), exited("launcher", 93, full)),
		pod("w0", corev1.PodFailed, onNode("n0"), exited("launcher", 1, message(t, exhausted))),
		pod("w1", corev1.PodRunning, onNode("n1"), restartedAfter("launcher", 1, message(t, big))),
		pod("w3", corev1.PodFailed, exited("launcher", 2, "panic: runtime error: index out of range")),
		pod("w4", corev1.PodFailed, exited("launcher", 2, full[:len(full)/2])), // truncated by someone
		pod("w5", corev1.PodFailed, exited("launcher", 2, wrongSchema)),
		pod("w6", corev1.PodFailed, exited("launcher", 2, `{"schema": 1}`+verdict.SchemaPrefix)),
	}
	// Launchers name quarantined nodes by rendezvous id (pod IP/pid) or
	// their own host name (the pod's); the summary gives node names.
	pods[0].Status.PodIP = "10.0.0.9" // the lost peer 10.0.0.9/12 ran on n2
	pods[1].Spec.Hostname = "gpu-3"   // the launcher that excluded itself, on n0
	s := SummarizePods(pods, Params{TerminalExitCodes: []int32{1}}, nil)
	if len(s.Verdicts) != 3 {
		t.Fatalf("verdicts %+v", s.Verdicts)
	}
	for i, want := range []struct {
		pod, node string
		kind      verdict.Kind
	}{{"w0", "n0", verdict.RestartBudgetExhausted}, {"w1", "n1", verdict.RestartBudgetExhausted}, {"w2", "n2", verdict.NoRestart}} {
		got := s.Verdicts[i]
		if got.Pod != want.pod || got.Node != want.node || got.Verdict.Kind != want.kind {
			t.Errorf("verdict %d: %s %s %s, want %+v", i, got.Pod, got.Node, got.Verdict.Kind, want)
		}
	}
	if v := s.Verdicts[2].Verdict; v.Reason != noRestart.Reason || v.ExitCode != 93 || len(v.Quarantined) != 2 || !v.Quarantined[0].At.Equal(at) {
		t.Errorf("no_restart verdict decoded as %+v", v)
	}
	// The no_restart verdict wins over w0's terminal exit code 1.
	if !s.NoRestart || !s.TerminalFailure || s.TerminalReason != "pod w2: ft-launcher verdict no_restart: rank 3 asked to shut down" {
		t.Errorf("terminal %v %v %q", s.NoRestart, s.TerminalFailure, s.TerminalReason)
	}
	// gpu-7 is no pod of the workload: not avoided rather than a guess.
	if want := []string{"n0", "n2"}; !reflect.DeepEqual(s.QuarantinedHosts, want) {
		t.Errorf("quarantined %v, want %v", s.QuarantinedHosts, want)
	}
	if s.Failed != 6 || s.Running != 1 {
		t.Errorf("counts %+v", s)
	}

	// Without the no_restart pod the exit code is the reason.
	s = SummarizePods(pods[1:], Params{TerminalExitCodes: []int32{1}}, nil)
	if s.NoRestart || s.TerminalReason != "pod w0 container launcher exit code 1 is terminal (terminalExitCodes)" {
		t.Errorf("terminal %v %q", s.NoRestart, s.TerminalReason)
	}
	// A verdict that is not no_restart is not terminal by itself.
	s = SummarizePods(pods[1:3], Params{}, nil)
	if s.TerminalFailure || s.NoRestart || len(s.Verdicts) != 2 {
		t.Errorf("summary %+v", s)
	}
}

func TestSummarizePodsNoExecute(t *testing.T) {
	noExecute := map[string][]string{
		"bad-gpu": {"nvidia.com/gpu"},
		"bad-nic": {"example.com/nic"},
	}
	gpu := requesting("nvidia.com/gpu", "8")
	pods := []corev1.Pod{
		pod("running-gpu", corev1.PodRunning, onNode("bad-gpu"), gpu),
		pod("running-gpu-2", corev1.PodRunning, onNode("bad-gpu"), gpu),
		pod("running-cpu", corev1.PodRunning, onNode("bad-gpu"), requesting("cpu", "1")),
		pod("zero-gpu", corev1.PodRunning, onNode("bad-nic"), requesting("nvidia.com/gpu", "0")),
		pod("other-resource", corev1.PodRunning, onNode("bad-nic"), gpu),
		pod("pending", corev1.PodPending, onNode("bad-gpu"), gpu),
		pod("terminating", corev1.PodRunning, onNode("bad-gpu"), gpu, terminating),
		pod("healthy", corev1.PodRunning, onNode("good"), gpu),
	}
	if s := SummarizePods(pods, Params{}, noExecute); !reflect.DeepEqual(s.NoExecuteNodes, []string{"bad-gpu"}) {
		t.Errorf("got %v", s.NoExecuteNodes)
	}
	if s := SummarizePods(pods[2:], Params{}, noExecute); s.NoExecuteNodes != nil {
		t.Errorf("got %v", s.NoExecuteNodes)
	}
	// An init container's limit counts.
	nic := pod("init-nic", corev1.PodRunning, onNode("bad-nic"))
	nic.Spec.InitContainers = []corev1.Container{{Name: "i", Resources: corev1.ResourceRequirements{
		Limits: corev1.ResourceList{"example.com/nic": resource.MustParse("1")}}}}
	if s := SummarizePods(append(pods, nic), Params{}, noExecute); !reflect.DeepEqual(s.NoExecuteNodes, []string{"bad-gpu", "bad-nic"}) {
		t.Errorf("got %v", s.NoExecuteNodes)
	}
}

// TestSummarizePodsFailingNode: a launcher whose ranks kept failing in
// ways that point at its node, with no spare to take its place, names
// itself in failing_node: the controller keeps the next placement off
// the pod's node as off a quarantined one.
func TestSummarizePodsFailingNode(t *testing.T) {
	failing := verdict.Verdict{Kind: verdict.RestartBudgetExhausted, ExitCode: 1, Reason: "no restart left",
		RankFailures: []verdict.RankFailure{{Round: 0, Rank: 1, Kind: verdict.FailureCrash, Signal: "SIGBUS"},
			{Round: 2, Rank: 1, Kind: verdict.FailureCrash, Signal: "SIGBUS"}},
		FailingNode: &verdict.FailingNode{Rounds: []int{0, 2}, Window: 3, Detail: "round 0: rank 1 killed by SIGBUS; round 2: rank 1 killed by SIGBUS"}}
	healthy := verdict.Verdict{Kind: verdict.RestartBudgetExhausted, ExitCode: 1, Reason: "no restart left"}
	pods := []corev1.Pod{
		pod("w0", corev1.PodFailed, onNode("n0"), exited("launcher", 1, message(t, healthy))),
		pod("w1", corev1.PodFailed, onNode("n5"), exited("launcher", 1, message(t, failing))),
	}
	s := SummarizePods(pods, Params{TerminalExitCodes: []int32{1}}, nil)
	if want := []string{"n5"}; !reflect.DeepEqual(s.QuarantinedHosts, want) {
		t.Errorf("avoided %v, want %v", s.QuarantinedHosts, want)
	}
	if len(s.Verdicts) != 2 || s.Verdicts[1].Verdict.FailingNode == nil || s.Verdicts[1].Verdict.FailingNode.Window != 3 {
		t.Errorf("the failing node's verdict did not carry failing_node through the termination message: %+v", s.Verdicts)
	}
}
