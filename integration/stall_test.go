package integration

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestStalledNodeCostsOneRestart: one launcher frozen (SIGSTOP)
// for about the membership lease TTL, then resumed. Gossip ends the round
// while it is frozen; its lease expires around the time it comes back. The
// two must not end two rounds: with --max-restarts 1 the job succeeds on
// every node, having spent at most that one restart.
func TestStalledNodeCostsOneRestart(t *testing.T) {
	skipShort(t)
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := recorder(c, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo ready >> "$OUT/ready"; fi
sleep 20
exit 0
`)
	for i := 0; i < 3; i++ {
		c.addNodeV(nil, "--nnodes", "3", "--nproc-per-node", "1", "--max-restarts", "1", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready", 3, generous)
	time.Sleep(time.Second)
	victim := c.nodes[2] // node 0 hosts the embedded etcd; its companion keeps serving anyway
	if err := victim.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = victim.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // never leave a stopped launcher behind
	time.Sleep(5 * time.Second)
	resume()

	for i, code := range c.waitAll(3 * time.Minute) {
		if code != 0 {
			t.Errorf("node %d exited %d, want 0", i, code)
		}
	}
	if t.Failed() {
		t.Fatalf("the stall cost more than the one restart allowed\n%s", c.stderrs())
	}
	for i := range c.nodes {
		v := readVerdict(t, c.verdictPath(i))
		wantVerdict(t, v, verdict.Succeeded, 0)
		if v.RestartsUsed > 1 {
			t.Errorf("node %d: %d restarts used for one stall", i, v.RestartsUsed)
		}
	}
	// The job ended in a round every node ran: round 1 after the one
	// restart, or round 0 when the node came back before it was declared lost.
	recs := readStarts(t, c.dir)
	last := 0
	for _, r := range recs {
		last = max(last, r.cycle)
	}
	if last > 1 {
		t.Fatalf("ranks started in round %d: more than one round ended\n%v", last, recs)
	}
	checkRound(t, recs, last, 3)
	for _, e := range c.nodes[0].eventsOf("restart") {
		t.Logf("node 0 restart: %v", e["reason"])
	}
	t.Logf("the job succeeded in round %d", last)
}
