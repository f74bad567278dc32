package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// spareWarmRank is a Python rank that records its start as recorder's
// ranks do ($OUT/starts), then its pid and whether a module the standby
// imports ($PRELOADED) was imported before its code ran
// ($OUT/pid-NODE-ROUND-LOCAL);
// in round 0 it waits for $OUT/finish (or to be stopped), later it exits 0
// after a second.
const spareWarmRank = `import os, sys, time
e = os.environ
pre = e["PRELOADED"] in sys.modules
line = "%s %s %s %s %s %s %s:%s\n" % (e["NODE"], e["TORCHELASTIC_RESTART_COUNT"], e["RANK"], e["LOCAL_RANK"],
    e["GROUP_RANK"], e["WORLD_SIZE"], e["MASTER_ADDR"], e["MASTER_PORT"])
fd = os.open(os.path.join(e["OUT"], "starts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
os.close(fd)
with open(os.path.join(e["OUT"], "pid-%s-%s-%s" % (e["NODE"], e["TORCHELASTIC_RESTART_COUNT"], e["LOCAL_RANK"])), "w") as f:
    f.write("%d %s" % (os.getpid(), pre))
if e["TORCHELASTIC_RESTART_COUNT"] == "0":
    end = time.time() + 120
    while not os.path.exists(os.path.join(e["OUT"], "finish")) and time.time() < end:
        time.sleep(0.05)
else:
    time.sleep(1)
`

// TestSpareWithPrewarmPromotedWarm: a hot spare started with --prewarm
// (a module list; auto on a spare that never ran a rank: the built-in
// torch list) keeps standbys for its ranks while parked
// (prewarm_spare_ready); after an active node is SIGKILLed, the spare is
// promoted and both its ranks run on those standbys (prewarm_started with
// spare, the ranks' pids are the standbys', the module already imported),
// with the new round's rank numbers; the job ends 0 and nothing of it is
// left. A job that ends with the spare still parked leaves nothing either.
func TestSpareWithPrewarmPromotedWarm(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name, prewarm, preloaded string
		loss                     bool
	}{{"modules", "json", "json", true}, {"auto", "auto", "torch", true}, {"job ends parked", "json", "json", false}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prewarm == "auto" {
				requireTorch(t)
			}
			spareWarm(t, tc.prewarm, tc.preloaded, tc.loss)
		})
	}
}

// spareWarm runs 3 nodes, one a parked spare with --prewarm prewarm
// (whose standbys import preloaded); with loss an active node is killed
// and the spare promoted, else the job ends with the spare parked.
func spareWarm(t *testing.T, prewarm, preloaded string, loss bool) {
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	script := filepath.Join(c.dir, "rank.py")
	if err := os.WriteFile(script, []byte(spareWarmRank), 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PYTHON_EXEC=" + debianPython, "PRELOADED=" + preloaded,
		"XDG_STATE_HOME=" + filepath.Join(c.dir, "state")} // --prewarm auto: nothing learned yet
	for i := 0; i < 3; i++ {
		// The embedded store is hosted by node 0: it joins first.
		c.addNode(env, "--nnodes", "2:3", "--nproc-per-node", "2",
			"--max-restarts", "2", "--prewarm", prewarm, script)
		if i == 0 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	// The spare is the node that parked; wait until its standbys are ready.
	spare := -1
	deadline := time.Now().Add(90 * time.Second)
	for spare < 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		for i, n := range c.nodes {
			if len(n.eventsOfQuiet("standby")) > 0 {
				spare = i
			}
		}
	}
	if spare < 0 {
		t.Fatalf("no node parked as a spare\n%s", c.stderrs())
	}
	ready := c.nodes[spare].waitEvents("prewarm_spare_ready", 1, standbyTimeout)[0]
	if !strings.Contains(fmt.Sprint(ready["modules"]), preloaded) {
		t.Fatalf("spare ready event %v: want %s imported", ready, preloaded)
	}
	standbys := map[string]bool{}
	for _, p := range ready["pids"].([]any) {
		standbys[fmt.Sprint(p)] = true
	}
	if len(standbys) != 2 {
		t.Fatalf("spare ready event %v: want 2 standbys", ready)
	}
	if !loss {
		// The job ends with the spare still parked: it exits with the
		// job's code and its standbys die with it.
		if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		for i, code := range c.waitAll(2 * time.Minute) {
			if code != 0 {
				t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
			}
		}
		if w := c.nodes[spare].eventsOf("prewarm_started"); len(w) != 0 {
			t.Fatalf("the parked spare started ranks: %v", w)
		}
		for i, n := range c.nodes {
			if left := n.waitNoLeftovers(10 * time.Second); len(left) > 0 {
				t.Fatalf("node %d: processes left: %v", i, left)
			}
		}
		return
	}
	// Round 0 runs on the two active nodes; kill the one that does not
	// host the store.
	victim := -1
	for victim < 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		b, _ := os.ReadFile(filepath.Join(c.dir, "starts"))
		if strings.Count(string(b), "\n") < 4 {
			continue
		}
		for _, r := range readStarts(t, c.dir) {
			if r.node != 0 && r.node != spare {
				victim = r.node
			}
		}
	}
	if victim < 0 {
		t.Fatalf("round 0 never ran on an active node besides the store's host\n%s", c.stderrs())
	}
	if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		if i == victim {
			n.wait(generous)
			continue
		}
		if code := n.wait(2 * time.Minute); code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	recs := readStarts(t, c.dir)
	checkRound(t, recs, 0, 4)
	groups := checkRound(t, recs, 1, 4)
	if _, ok := groups[spare]; !ok {
		t.Fatalf("the spare (node %d) did not run in round 1: %v", spare, groups)
	}
	if _, ok := groups[victim]; ok {
		t.Fatalf("the lost node %d ran in round 1", victim)
	}

	sj := c.nodes[spare]
	for _, l := range strings.Split(sj.stderr.String(), "\n") {
		if strings.Contains(l, "spare") || strings.Contains(l, "standby") {
			t.Logf("spare: %s", l)
		}
	}
	var warm []map[string]any
	for _, e := range sj.eventsOf("prewarm_started") {
		if e["round"] == "1" {
			warm = append(warm, e)
		}
	}
	if len(warm) != 1 || warm[0]["spare"] != true || fmt.Sprint(warm[0]["local_ranks"]) != "[0 1]" {
		t.Fatalf("spare's prewarm_started %v (fallbacks %v): want both ranks of round 1 warm, from the spare", warm, sj.eventsOf("prewarm_fallback"))
	}
	if fb := sj.eventsOf("prewarm_fallback"); len(fb) != 0 {
		t.Fatalf("spare's fallbacks %v", fb)
	}
	if !strings.Contains(sj.stderr.String(), "promoted spare: ranks started on the standbys it kept while parked") {
		t.Errorf("the spare's log does not say its ranks started warm:\n%s", sj.stderr.String())
	}
	for lr := range 2 {
		b, err := os.ReadFile(filepath.Join(c.dir, fmt.Sprintf("pid-%d-1-%d", spare, lr)))
		if err != nil {
			t.Fatal(err)
		}
		pid, pre, _ := strings.Cut(string(b), " ")
		if !standbys[pid] || pre != "True" {
			t.Errorf("spare local rank %d ran as pid %s (%s preloaded %s), want one of its standbys %v", lr, pid, preloaded, pre, standbys)
		}
	}
	if sw := sj.eventsOf("spare_swap"); len(sw) != 1 {
		t.Errorf("spare_swap events %v, want 1", sw)
	}
	// Every node's processes (ranks, standbys, the killed node's orphans)
	// are gone.
	for i, n := range c.nodes {
		if left := n.waitNoLeftovers(10 * time.Second); len(left) > 0 {
			t.Fatalf("node %d: processes left: %v", i, left)
		}
	}
}
