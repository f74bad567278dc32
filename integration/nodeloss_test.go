package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// Node loss: a launcher that dies while its host lives is
// confirmed by its peers' stream connections (a refused dial after the
// connection closed), the restart round closes as soon as every live node
// joined, and a short stall is not a loss. Behaviour only, generous
// timeouts: the speed is bench/run.sh --multinode's job.

// lossRank says ready<round> and, from round 1 on, exits 0 once
// $OUT/finish exists; round 0 runs until stopped.
func lossRank(c *cluster) string {
	return recorder(c, `
echo "ready$TORCHELASTIC_RESTART_COUNT" >> "$OUT/ready"
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 600; fi
i=0; while [ ! -e "$OUT/finish" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
exit 0
`)
}

// lossCluster starts n launchers with a lossRank and nnodes; it returns
// the cluster and the launchers' arguments (for a replacement node).
func lossCluster(t *testing.T, n int, nnodes string) (*cluster, []string) {
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	args := []string{"--nnodes", nnodes, "--nproc-per-node", "1", "--max-restarts", "2", "--no-python", lossRank(c)}
	for i := 0; i < n; i++ {
		c.addNodeV(nil, args...)
	}
	return c, args
}

// roundZeroActives waits until round 0 runs on want nodes and returns
// them, by group rank.
func roundZeroActives(t *testing.T, c *cluster, want int) map[int]int {
	t.Helper()
	waitCount(t, filepath.Join(c.dir, "ready"), "ready0", want, generous)
	time.Sleep(500 * time.Millisecond) // a late extra start would show here
	return checkRound(t, readStarts(t, c.dir), 0, want)
}

// lossReasons are the reasons of every survivor's round_ended events.
func lossReasons(c *cluster, skip map[int]bool) []string {
	var out []string
	for i, n := range c.nodes {
		if skip[i] {
			continue
		}
		for _, e := range n.eventsOfQuiet("round_ended") {
			out = append(out, fmt.Sprint(e["reason"]))
		}
	}
	return out
}

// addReplacement checks that the round waits below MIN (no round 1 after
// 2 s), then starts a replacement node.
func addReplacement(t *testing.T, c *cluster, args []string) {
	t.Helper()
	time.Sleep(2 * time.Second)
	if b, _ := os.ReadFile(filepath.Join(c.dir, "ready")); strings.Contains(string(b), "ready1") {
		t.Fatalf("round 1 ran with fewer than MIN nodes: %s", b)
	}
	c.addNodeV(nil, args...)
}

// finishAll lets every round-1 rank exit and checks the survivors' codes.
func finishAll(t *testing.T, c *cluster, dead map[int]bool) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		if dead[i] {
			n.wait(generous)
			continue
		}
		if code := n.wait(2 * time.Minute); code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
}

// TestNodeLossSigkillConfirmedByStream SIGKILLs an active launcher (not
// the etcd host) with a spare parked, and with none (a replacement node
// is started after the loss). The survivors must record a loss confirmed
// by the stream connection, and round 1 must run without the dead node.
func TestNodeLossSigkillConfirmedByStream(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name     string
		launched int // nodes started before the loss (MIN 2 of them active)
	}{
		{"spare", 3},
		{"no-spare", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, args := lossCluster(t, tc.launched, "2:3")
			g0 := roundZeroActives(t, c, 2)
			victim := -1
			for node := range g0 {
				if node != 0 {
					victim = node
				}
			}
			if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if tc.launched == 2 {
				addReplacement(t, c, args)
			}
			waitCount(t, filepath.Join(c.dir, "ready"), "ready1", 2, generous)
			recs := readStarts(t, c.dir)
			g1 := checkRound(t, recs, 1, 2)
			if _, ok := g1[victim]; ok {
				t.Fatalf("the killed node %d ran in round 1: %v", victim, recs)
			}
			dead := map[int]bool{victim: true}
			reasons := lossReasons(c, dead)
			found := false
			for _, r := range reasons {
				found = found || strings.Contains(r, "stream port refused")
			}
			if !found {
				t.Fatalf("no survivor recorded a loss confirmed by the stream connection; reasons: %q", reasons)
			}
			finishAll(t, c, dead)
			// The promoted node's round-1 cycle carries the detection phase.
			newcomer := -1
			for node := range g1 {
				if _, ok := g0[node]; !ok {
					newcomer = node
				}
			}
			v := readVerdict(t, c.verdictPath(newcomer))
			wantVerdict(t, v, verdict.Succeeded, 0)
			var cyc *verdict.Cycle
			for i := range v.Cycles {
				if v.Cycles[i].Round == 1 {
					cyc = &v.Cycles[i]
				}
			}
			if cyc == nil || cyc.DetectionMS <= 0 {
				t.Fatalf("node %d's round-1 cycle has no detection phase: %+v", newcomer, v.Cycles)
			}
			t.Logf("round-1 cycle on node %d: detection %.1f ms, rendezvous %.1f ms, spawn %.1f ms",
				newcomer, cyc.DetectionMS, cyc.RendezvousMS, cyc.SpawnMS)
		})
	}
}

// TestTwoNodesLostAtOnceOneSpare SIGKILLs two of three active launchers
// at once with one spare parked: the spare takes one slot, the round
// waits for a replacement node (MIN is 3) and then runs round 1 on the
// survivor, the spare and the replacement.
func TestTwoNodesLostAtOnceOneSpare(t *testing.T) {
	skipShort(t)
	c, args := lossCluster(t, 4, "3:4")
	g0 := roundZeroActives(t, c, 3)
	dead := map[int]bool{}
	for node := range g0 {
		if node != 0 && len(dead) < 2 {
			dead[node] = true
		}
	}
	if len(dead) != 2 {
		t.Fatalf("round 0 actives %v: want two besides the etcd host", g0)
	}
	for node := range dead {
		if err := c.nodes[node].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	addReplacement(t, c, args)
	waitCount(t, filepath.Join(c.dir, "ready"), "ready1", 3, generous)
	recs := readStarts(t, c.dir)
	g1 := checkRound(t, recs, 1, 3)
	for node := range dead {
		if _, ok := g1[node]; ok {
			t.Fatalf("killed node %d ran in round 1: %v", node, recs)
		}
	}
	if _, ok := g1[len(c.nodes)-1]; !ok {
		t.Fatalf("the replacement node did not run in round 1: %v", g1)
	}
	finishAll(t, c, dead)
	for _, r := range recs {
		if r.cycle > 1 {
			t.Fatalf("a round after 1 started: the two losses ended more than one round: %v", recs)
		}
	}
}

// TestShortStallNotLost freezes an active launcher and its ranks
// (SIGSTOP) for 300 ms, well under the detection bound with the default
// gossip timings (docs/rendezvous.md, "Detection"), then resumes them: no
// round may end, and the job succeeds in round 0 without a restart.
func TestShortStallNotLost(t *testing.T) {
	skipShort(t)
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := recorder(c, `
echo "ready$TORCHELASTIC_RESTART_COUNT" >> "$OUT/ready"
i=0; while [ ! -e "$OUT/finish" ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done
exit 0
`)
	for i := 0; i < 3; i++ {
		c.addNodeV(nil, "--nnodes", "3", "--nproc-per-node", "1", "--max-restarts", "2", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready0", 3, generous)
	time.Sleep(time.Second) // gossip has converged
	victim := c.nodes[2]
	pids := append([]int{victim.cmd.Process.Pid}, descendants(victim.cmd.Process.Pid)...)
	t.Cleanup(func() { stopAll(pids, syscall.SIGCONT) }) // never leave a stopped process behind
	for rep := 0; rep < 3; rep++ {
		stopAll(pids, syscall.SIGSTOP)
		time.Sleep(300 * time.Millisecond)
		stopAll(pids, syscall.SIGCONT)
		time.Sleep(2 * time.Second)
	}
	if reasons := lossReasons(c, nil); len(reasons) > 0 {
		t.Fatalf("a 300 ms stall ended a round: %q\n%s", reasons, c.stderrs())
	}
	finishAll(t, c, nil)
	for i := range c.nodes {
		v := readVerdict(t, c.verdictPath(i))
		wantVerdict(t, v, verdict.Succeeded, 0)
		if v.RestartsUsed != 0 || v.LastRound != 0 {
			t.Errorf("node %d: restarts used %d, last round %d; want 0 and 0", i, v.RestartsUsed, v.LastRound)
		}
	}
}

// stopAll sends sig to every pid (one gone already is skipped).
func stopAll(pids []int, sig syscall.Signal) {
	for _, p := range pids {
		_ = syscall.Kill(p, sig)
	}
}

// descendants lists pid's descendants from /proc.
func descendants(pid int) []int {
	parent := map[int]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 {
			parent[p], _ = strconv.Atoi(f[1])
		}
	}
	var out []int
	frontier := []int{pid}
	for len(frontier) > 0 {
		cur := frontier[0]
		frontier = frontier[1:]
		for p, pp := range parent {
			if pp == cur {
				out = append(out, p)
				frontier = append(frontier, p)
			}
		}
	}
	return out
}
