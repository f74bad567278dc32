package appwrapper

import (
	"maps"
	"slices"
	"sync"
)

// nodeHealth is the node → NoExecute resources map that the Node watch
// keeps for the pod summary (appwrapper.md 2.3). It lives in the
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
