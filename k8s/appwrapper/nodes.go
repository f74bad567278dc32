package appwrapper

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// nodeHealth is the node → NoExecute resources map that the Node watch
// keeps for the pod summary (upstream's node_health_monitor.go). It lives in the
// reconciler, not in package variables, so two reconcilers in one process
// (tests, or two managers) do not share it.
type nodeHealth struct {
	mu        sync.RWMutex
	noExecute map[string][]string
}

func newNodeHealth() *nodeHealth {
	return &nodeHealth{noExecute: map[string][]string{}}
}

// set records the node's NoExecute resources (none removes it) and reports
// whether that changed anything.
func (n *nodeHealth) set(node string, resources []string) bool {
	resources = slices.Sorted(slices.Values(resources))
	resources = slices.Compact(resources)
	n.mu.Lock()
	defer n.mu.Unlock()
	old, had := n.noExecute[node]
	if len(resources) == 0 {
		delete(n.noExecute, node)
		return had
	}
	n.noExecute[node] = resources
	return !had || !slices.Equal(old, resources)
}

// remove forgets a deleted node.
func (n *nodeHealth) remove(node string) {
	n.mu.Lock()
	delete(n.noExecute, node)
	n.mu.Unlock()
}

// snapshot is a copy the caller may keep.
func (n *nodeHealth) snapshot() map[string][]string {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := maps.Clone(n.noExecute)
	for k, v := range out {
		out[k] = slices.Clone(v)
	}
	return out
}

// nodeDown reports whether no kubelet can be expected to finish the pods
// of node, and since when: its Ready condition is False or Unknown (since
// the condition's transition), it carries the node controller's
// unreachable taint (since the taint was added, when that is earlier), or
// it carries the out-of-service taint, an administrator's statement that
// the node is shut down (since ever: no bound applies).
func nodeDown(n *corev1.Node) (since time.Time, down bool) {
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeOutOfService {
			return time.Time{}, true
		}
	}
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			since, down = c.LastTransitionTime.Time, true
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key != corev1.TaintNodeUnreachable {
			continue
		}
		if t.TimeAdded != nil && (!down || t.TimeAdded.Time.Before(since)) {
			since = t.TimeAdded.Time
		}
		down = true
	}
	return since, down
}

// nodeState is what of a node the controller reacts to when it changes:
// its readiness, its unreachable and out-of-service taints.
func nodeState(n *corev1.Node) string {
	if n == nil {
		return ""
	}
	var b strings.Builder
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			b.WriteString(string(c.Status))
		}
	}
	for _, t := range n.Spec.Taints {
		if t.Key == corev1.TaintNodeUnreachable || t.Key == corev1.TaintNodeOutOfService {
			b.WriteString("," + t.Key)
		}
	}
	return b.String()
}

// stripNode keeps the cached Node small: the controller reads its
// labels, taints and conditions, never its image list or volumes, which
// are most of a GPU node's size.
func stripNode(obj any) (any, error) {
	if n, ok := obj.(*corev1.Node); ok {
		n.ManagedFields = nil
		n.Status.Images = nil
		n.Status.VolumesInUse = nil
		n.Status.VolumesAttached = nil
	}
	return obj, nil
}
