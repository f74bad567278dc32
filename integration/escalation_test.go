package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The escalation seam: why a launcher stopped (its verdict file and exit
// code), with every rendezvous call bounded by the etcd loss bound and by
// signals.

// readVerdict reads and checks a verdict file.
func readVerdict(t *testing.T, path string) verdict.Verdict {
	t.Helper()
	v, err := verdict.Read(path)
	if err != nil {
		t.Fatalf("verdict: %v", err)
	}
	if v.Reason == "" || v.EndedAt.IsZero() || v.EndedAt.Before(v.StartedAt) {
		t.Fatalf("verdict without reason or times: %+v", v)
	}
	return v
}

func wantVerdict(t *testing.T, v verdict.Verdict, kind verdict.Kind, code int) {
	t.Helper()
	if v.Kind != kind || v.ExitCode != code {
		t.Fatalf("verdict %s exit %d (reason %q), want %s exit %d", v.Kind, v.ExitCode, v.Reason, kind, code)
	}
}

// verdictPath is where node i of a cluster writes its verdict.
func (c *cluster) verdictPath(i int) string {
	return filepath.Join(c.dir, fmt.Sprintf("verdict%d.json", i))
}

// addNodeV is addNode with the node's verdict file set.
func (c *cluster) addNodeV(env []string, args ...string) *job {
	c.t.Helper()
	return c.addNode(env, append([]string{"--verdict-file", c.verdictPath(len(c.nodes))}, args...)...)
}

func TestVerdictSuccessWithFinishedFlag(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	flag := filepath.Join(j.dir, "finished.flag")
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("rank.sh", `[ "$LOCAL_RANK" = 0 ] && touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0`+"\n")
	code := j.run(generous, []string{"FAULT_TOL_FINISHED_FLAG_FILE=" + flag, verdict.EnvPath + "=" + vpath},
		"--standalone", "--nproc-per-node", "2", "--no-python", s)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.Succeeded, 0)
	if !v.Finished || !v.FinishedFlag.Present || v.FinishedFlag.Path != flag {
		t.Fatalf("finished flag not recorded: %+v", v)
	}
	if v.Schema != verdict.Schema || v.PID == 0 || v.LastRound != 0 || len(v.Cycles) != 1 || v.Cycles[0].End != "success" {
		t.Fatalf("verdict %+v", v)
	}
}

func TestVerdictSuccessWithoutFlagIsNotFinished(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("rank.sh", "exit 0\n")
	if code := j.run(generous, []string{"FAULT_TOL_FINISHED_FLAG_FILE=" + filepath.Join(j.dir, "never")},
		"--standalone", "--nproc-per-node", "1", "--verdict-file", vpath, "--no-python", s); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.Succeeded, 0)
	if v.Finished || v.FinishedFlag.Present {
		t.Fatalf("finished without the flag: %+v", v)
	}
}

// The default verdict path is verdict.json in the run's log directory.
func TestVerdictDefaultPathInLogDir(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	logDir := filepath.Join(j.dir, "logs")
	s := j.script("rank.sh", "exit 0\n")
	if code := j.run(generous, nil, "--standalone", "--nproc-per-node", "1", "--log-dir", logDir, "--no-python", s); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	ms, _ := filepath.Glob(filepath.Join(logDir, "*", "verdict.json"))
	if len(ms) != 1 {
		t.Fatalf("verdict files under --log-dir: %v", ms)
	}
	wantVerdict(t, readVerdict(t, ms[0]), verdict.Succeeded, 0)
}

func TestVerdictBudgetExhausted(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("rank.sh", "exit 3\n")
	code := j.run(generous, nil, "--standalone", "--nproc-per-node", "1", "--max-restarts", "2",
		"--verdict-file", vpath, "--no-python", s)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.RestartBudgetExhausted, 1)
	if v.RestartsUsed != 2 || v.MaxRestarts != 2 || v.LastRound != 2 || len(v.Cycles) != 3 {
		t.Fatalf("restarts %d/%d last round %d cycles %d", v.RestartsUsed, v.MaxRestarts, v.LastRound, len(v.Cycles))
	}
	if !strings.Contains(v.Reason, "exited with code 3") {
		t.Fatalf("reason %q does not say what failed", v.Reason)
	}
}

func TestVerdictSIGTERM(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("rank.sh", `echo $$ > "$OUT/rank.pid"; exec sleep 60`+"\n")
	j.start([]string{"OUT=" + j.dir}, "--standalone", "--nproc-per-node", "1", "--verdict-file", vpath, "--no-python", s)
	waitFile(t, filepath.Join(j.dir, "rank.pid"), generous)
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	if code := j.wait(generous); code != 1 {
		t.Fatalf("exit %d, want 1 (the rank died of SIGTERM)\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.Signaled, 1)
	if v.Signal != "SIGTERM" {
		t.Fatalf("signal %q", v.Signal)
	}
}

// A bad --rdzv-conf value is refused before anything starts: exit 2, no
// etcd, no rank, no verdict.
func TestBadRdzvConfExitsBeforeStarting(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("rank.sh", `touch "$OUT/started"`+"\n")
	code := j.run(generous, []string{"OUT=" + j.dir}, "--nnodes", "2", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", "127.0.0.1:29400", "--rdzv-conf", "join_timeout=abc", "--verdict-file", vpath, "--no-python", s)
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, j.stderr.String())
	}
	if !strings.Contains(j.stderr.String(), "join_timeout") {
		t.Fatalf("message does not name the key: %s", j.stderr.String())
	}
	for _, p := range []string{filepath.Join(j.dir, "started"), vpath} {
		if _, err := os.Stat(p); err == nil {
			t.Fatalf("%s exists: something started", p)
		}
	}
}

// rankProbe is a rank that records its pid, says ready, and exits 1 once
// $OUT/crash exists on node 1 (else sleeps).
func rankProbe(c *cluster) string {
	return recorder(c, `
echo $$ >> "$OUT/pids"
echo $$ > "$OUT/pid.$NODE"
echo ready >> "$OUT/ready"
while :; do
  if [ "$NODE" = 1 ] && [ -e "$OUT/crash" ]; then exit 1; fi
  sleep 0.05
done
`)
}

func waitCount(t *testing.T, path, word string, n int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(path)
		if strings.Count(string(b), word) >= n {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s: fewer than %d %q within %s", path, n, word, timeout)
}

func rankPids(t *testing.T, dir string) []int {
	b, _ := os.ReadFile(filepath.Join(dir, "pids"))
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// etcdCompanionPid finds the embedded etcd server started by the cluster.
func etcdCompanionPid(t *testing.T, marker string) int {
	t.Helper()
	for _, pid := range processesWithEnv("FTL_TEST_MARKER=" + marker) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if bytes.Contains(cmd, []byte("ft-launcher-etcd")) {
			return pid
		}
	}
	t.Fatal("no embedded etcd process found")
	return 0
}

// TestEtcdOutageThenRankFailure: etcd goes away while ranks run, then a
// rank fails. Every launcher must exit within the loss bound plus a margin,
// naming the endpoints, leaving no rank, with a rendezvous_lost verdict.
func TestEtcdOutageThenRankFailure(t *testing.T) {
	skipShort(t)
	const bound = 2 * time.Second
	const margin = 8 * time.Second
	for _, backend := range []string{"debian-etcd", "embedded"} {
		t.Run(backend, func(t *testing.T) {
			var c *cluster
			var outage func()
			switch backend {
			case "debian-etcd":
				client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
				peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
				e := startEtcd(t, t.TempDir(), client, peer)
				c = newCluster(t, client)
				c.extra = []string{"--rdzv-backend", "etcd"}
				outage = e.stop
			default:
				c = newCluster(t, embeddedEndpoint(t))
				c.extra = []string{"--rdzv-backend", "c10d"}
				// Freeze the embedded etcd (it stays in place and is resumed
				// at the end so that it can remove its data directory).
				outage = func() {
					pid := etcdCompanionPid(t, c.marker)
					_ = syscall.Kill(pid, syscall.SIGSTOP)
					t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) })
				}
			}
			s := rankProbe(c)
			for i := 0; i < 2; i++ {
				c.addNodeV(nil, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "3",
					"--rdzv-conf", "etcd_loss_bound=2", "--term-timeout", "5", "--no-python", s)
			}
			waitCount(t, filepath.Join(c.dir, "ready"), "ready", 2, generous)
			outage()
			stopped := time.Now()
			if err := os.WriteFile(filepath.Join(c.dir, "crash"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for i, n := range c.nodes {
				code := n.wait(bound + margin + 20*time.Second) // generous for the harness; checked below
				took := time.Since(stopped)
				if took > bound+margin {
					t.Errorf("node %d exited %s after the outage, want within %s", i, took, bound+margin)
				}
				if code != 1 {
					t.Errorf("node %d exited %d, want 1\n%s", i, code, c.stderrs())
				}
				v := readVerdict(t, c.verdictPath(i))
				if v.Kind != verdict.RendezvousLost {
					t.Errorf("node %d verdict %s (%s), want rendezvous_lost", i, v.Kind, v.Reason)
				}
				host := strings.TrimPrefix(c.endpoint, "http://")
				if !strings.Contains(v.Reason, host) || !strings.Contains(n.stderr.String(), host) {
					t.Errorf("node %d: reason %q / log does not name the endpoint %s", i, v.Reason, host)
				}
			}
			for _, pid := range rankPids(t, c.dir) {
				if pidAlive(pid) {
					t.Errorf("rank %d still alive", pid)
				}
			}
		})
	}
}

// TestEmbeddedEtcdHostKilled: SIGKILL of the launcher that hosts the
// embedded etcd; every other launcher exits within the loss bound plus a
// margin (a multi-member etcd that survives this is a later step).
func TestEmbeddedEtcdHostKilled(t *testing.T) {
	skipShort(t)
	const bound = 2 * time.Second
	const margin = 8 * time.Second
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := rankProbe(c)
	for i := 0; i < 3; i++ {
		c.addNodeV(nil, "--nnodes", "3", "--nproc-per-node", "1", "--rdzv-conf", "etcd_loss_bound=2", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready", 3, generous)
	if err := c.nodes[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	c.nodes[0].wait(generous)
	for i := 1; i < 3; i++ {
		code := c.nodes[i].wait(bound + margin + 20*time.Second)
		if took := time.Since(killed); took > bound+margin {
			t.Errorf("node %d exited %s after the etcd host died, want within %s", i, took, bound+margin)
		}
		if code != 1 {
			t.Errorf("node %d exited %d, want 1", i, code)
		}
		if v := readVerdict(t, c.verdictPath(i)); v.Kind != verdict.RendezvousLost {
			t.Errorf("node %d verdict %s (%s), want rendezvous_lost", i, v.Kind, v.Reason)
		}
	}
	if left := c.nodes[1].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left: %s", hangdump.Describe(left))
	}
}

// TestSIGTERMDuringBlockedRendezvousCall: with etcd gone and a long loss
// bound, a rank failure leaves the launcher in a rendezvous call; SIGTERM
// ends it within --term-timeout.
func TestSIGTERMDuringBlockedRendezvousCall(t *testing.T) {
	skipShort(t)
	client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	e := startEtcd(t, t.TempDir(), client, peer)
	c := newCluster(t, client)
	c.extra = []string{"--rdzv-backend", "etcd"}
	s := rankProbe(c)
	for i := 0; i < 2; i++ {
		c.addNodeV(nil, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-conf", "etcd_loss_bound=300",
			"--term-timeout", "3", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready", 2, generous)
	e.stop()
	if err := os.WriteFile(filepath.Join(c.dir, "crash"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Node 1's rank fails; its launcher now reports to an unreachable etcd.
	failed := readInt(t, filepath.Join(c.dir, "pid.1"))
	waitFor(t, generous, func() bool { return !pidAlive(failed) })
	time.Sleep(500 * time.Millisecond)
	for _, n := range c.nodes {
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
	}
	sent := time.Now()
	for i, n := range c.nodes {
		n.wait(time.Minute)
		if took := time.Since(sent); took > 3*time.Second+20*time.Second {
			t.Errorf("node %d exited %s after SIGTERM, want within --term-timeout (3s) plus a margin\n%s", i, took, n.stderr.String())
		}
		if v := readVerdict(t, c.verdictPath(i)); v.Kind != verdict.Signaled {
			t.Errorf("node %d verdict %s (%s), want signaled", i, v.Kind, v.Reason)
		}
	}
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool) {
	t.Helper()
	expired, stop := runclock.After(timeout) // running time: see internal/runclock
	defer stop()
	for !cond() {
		select {
		case <-expired:
			t.Fatal("condition not reached in time")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestMaxRestartsZeroStandbyPromoted: with no restart budget at all, a lost
// active node is still replaced by the standby (a swap spends no restart).
func TestMaxRestartsZeroStandbyPromoted(t *testing.T) {
	skipShort(t)
	forEachBackend(t, func(t *testing.T, c *cluster) {
		s := recorder(c, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo ready >> "$OUT/ready"; exec sleep 120; fi
sleep 1
exit 0
`)
		for i := 0; i < 3; i++ {
			c.addNodeV(nil, "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "0", "--no-python", s)
		}
		waitCount(t, filepath.Join(c.dir, "ready"), "ready", 2, generous)
		victim := -1
		for _, r := range readStarts(t, c.dir) {
			if r.node != 0 { // node 0 hosts the embedded etcd
				victim = r.node
				break
			}
		}
		if victim < 0 {
			t.Fatalf("round 0 never ran on a node other than node 0\n%s", c.stderrs())
		}
		if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		for i, n := range c.nodes {
			code := n.wait(2 * time.Minute)
			if i == victim {
				continue
			}
			if code != 0 {
				t.Fatalf("surviving node %d exited %d\n%s", i, code, c.stderrs())
			}
			v := readVerdict(t, c.verdictPath(i))
			wantVerdict(t, v, verdict.Succeeded, 0)
			if v.RestartsUsed != 0 || v.MaxRestarts != 0 {
				t.Errorf("node %d: restarts used %d of %d, want 0 of 0 (a swap spends none)", i, v.RestartsUsed, v.MaxRestarts)
			}
			lost := false
			for _, q := range v.Quarantined {
				if q.Evidence == verdict.EvidenceLost && strings.HasPrefix(q.Node, c.nodeAddr(victim)+"/") {
					lost = true
				}
			}
			// A standby that never ran in the lost node's round did not see
			// the loss; the node active with it did.
			if !lost && len(v.Cycles) > 1 {
				t.Errorf("node %d ran both rounds but did not record the lost node: %+v", i, v.Quarantined)
			}
		}
		groups := checkRound(t, readStarts(t, c.dir), 1, 2)
		if _, ok := groups[victim]; ok || len(groups) != 2 {
			t.Fatalf("round 1 ran on %v, want the two survivors", groups)
		}
	})
}

// TestWalltimeSignalForwardedNotAFailure: the scheduler's pre-walltime
// USR1 reaches the rank (which checkpoints and exits 0 here), is not
// counted as a failure and no restart follows; the verdict says walltime.
// A rank without a handler dies of USR1: still walltime, no restart.
func TestWalltimeSignalForwardedNotAFailure(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name, rank string
		code       int
	}{
		{"rank checkpoints and exits 0", `trap 'echo ckpt >> "$OUT/ckpt"; exit 0' USR1` + "\n" + `echo $$ > "$OUT/rank.pid"; while :; do sleep 0.05; done`, 0},
		{"rank without a handler", `echo $$ > "$OUT/rank.pid"; exec sleep 600`, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t)
			vpath := filepath.Join(j.dir, "verdict.json")
			s := j.script("rank.sh", tc.rank+"\n")
			j.start([]string{"OUT=" + j.dir}, "--standalone", "--nproc-per-node", "1", "--max-restarts", "3",
				"--verdict-file", vpath, "--no-python", s)
			waitFile(t, filepath.Join(j.dir, "rank.pid"), generous)
			_ = j.cmd.Process.Signal(syscall.SIGUSR1)
			if code := j.wait(generous); code != tc.code {
				t.Fatalf("exit %d, want %d\n%s", code, tc.code, j.stderr.String())
			}
			v := readVerdict(t, vpath)
			wantVerdict(t, v, verdict.Walltime, tc.code)
			if v.RestartsUsed != 0 || len(j.eventsOf("cycle_started")) != 1 {
				t.Fatalf("restarted after the walltime signal: %+v", v)
			}
			if len(j.eventsOf("walltime_warning")) != 1 {
				t.Fatalf("no walltime_warning event")
			}
			if tc.code == 0 {
				if b, _ := os.ReadFile(filepath.Join(j.dir, "ckpt")); !strings.Contains(string(b), "ckpt") {
					t.Fatal("the rank never got USR1")
				}
			}
		})
	}
}
