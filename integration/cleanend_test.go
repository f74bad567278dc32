package integration

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestMultiNodeCleanEndNoGossipWarn: a clean multi-node end is
// quiet. Launchers shut their gossip down as they exit, and a peer whose
// probe fails then must not warn that "gossip declared a node dead, but it
// answers on its stream port" (every clean end logged four such lines):
// a departure at the end of the job is expected.
func TestMultiNodeCleanEndNoGossipWarn(t *testing.T) {
	skipShort(t)
	for _, n := range []int{2, 3} {
		c := newCluster(t, embeddedEndpoint(t))
		c.extra = []string{"--rdzv-backend", "c10d"}
		s := recorder(c, "exit 0\n")
		for i := 0; i < n; i++ {
			c.addNode(nil, "--nnodes", strconv.Itoa(n), "--nproc-per-node", "1", "--no-python", s)
		}
		for i, code := range c.waitAll(2 * time.Minute) {
			if code != 0 {
				t.Fatalf("%d nodes: node %d exited %d\n%s", n, i, code, c.stderrs())
			}
		}
		for i, node := range c.nodes {
			for _, l := range strings.Split(node.stderr.String(), "\n") {
				if strings.Contains(l, "level=WARN") && strings.Contains(l, "gossip declared a node dead") {
					t.Errorf("%d nodes: node %d warned at a clean end: %s", n, i, l)
				}
			}
		}
	}
}
