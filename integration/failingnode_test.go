package integration

import (
	"slices"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestFailingNodeSwappedForSpare: 2 active nodes and a hot spare. Node 1's
// rank exits 1 with no explanation in rounds 0 and 2, node 0's once, in
// round 1. Node 1's ranks failed in 2 of its 3 rounds: it leaves for the
// spare (quarantined: rank_failures, failing_node.swapped_out), the job
// goes on with nodes 0 and 2 at the same world size and succeeds; node 0,
// with one failure in 3 rounds, is accused of nothing.
func TestFailingNodeSwappedForSpare(t *testing.T) {
	skipShort(t)
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := recorder(c, `
rc=$TORCHELASTIC_RESTART_COUNT
case "$NODE:$rc" in
1:0|1:2|0:1) sleep 1; exit 1 ;;
esac
[ "$rc" -ge 3 ] && exit 0
exec sleep 600
`)
	args := []string{"--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "5", "--no-python", s}
	for range 3 {
		c.addNodeV(nil, args...)
	}
	for _, i := range []int{0, 2} {
		if code := c.nodes[i].wait(generous); code != 0 {
			t.Fatalf("node %d exited %d, want 0\n%s", i, code, c.stderrs())
		}
	}
	if code := c.nodes[1].wait(generous); code != 1 {
		t.Fatalf("the failing node exited %d, want 1 (node_excluded)\n%s", code, c.stderrs())
	}
	recs := readStarts(t, c.dir)
	for cycle := range 3 {
		g := checkRound(t, recs, cycle, 2)
		_, on0 := g[0]
		_, on1 := g[1]
		if len(g) != 2 || !on0 || !on1 {
			t.Fatalf("round %d ran on nodes %v, want 0 and 1 (node 2 the spare)", cycle, g)
		}
	}
	if g := checkRound(t, recs, 3, 2); len(g) != 2 {
		t.Fatalf("round 3 ran on %v, want 2 nodes", g)
	} else if _, ok := g[1]; ok {
		t.Fatalf("round 3 ran on the failing node: %v", g)
	} else if _, ok := g[2]; !ok {
		t.Fatalf("round 3 did not run on the spare: %v", g)
	}

	v1 := readVerdict(t, c.verdictPath(1))
	wantVerdict(t, v1, verdict.NodeExcluded, 1)
	if len(v1.Quarantined) != 1 || v1.Quarantined[0].Evidence != verdict.EvidenceRankFailures || v1.Quarantined[0].Host == "" {
		t.Errorf("the failing node's quarantine %+v, want itself with rank_failures", v1.Quarantined)
	}
	fn := v1.FailingNode
	if fn == nil || !fn.SwappedOut || !slices.Equal(fn.Rounds, []int{0, 2}) || fn.Window != 3 ||
		!strings.Contains(fn.Detail, "exited 1 with no explanation") {
		t.Errorf("failing_node %+v, want rounds [0 2] of 3, swapped out", fn)
	}
	if ev := c.nodes[1].eventsOf("node_failing"); len(ev) != 1 || ev[0]["swapped_out"] != true {
		t.Errorf("node_failing events %v, want one, swapped out", ev)
	}
	for _, i := range []int{0, 2} {
		v := readVerdict(t, c.verdictPath(i))
		wantVerdict(t, v, verdict.Succeeded, 0)
		if v.FailingNode != nil {
			t.Errorf("node %d named as failing: %+v", i, v.FailingNode)
		}
	}
	v0 := readVerdict(t, c.verdictPath(0))
	if len(v0.RankFailures) != 1 || v0.RankFailures[0].Round != 1 {
		t.Errorf("node 0's rank failures %+v, want the one of round 1", v0.RankFailures)
	}
}
