package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// fenceRank writes the wall-clock time (ns) every ~100 ms to
// $OUT/ts.<node>.<round> and its pid to $OUT/pid.<node>.<round>; round 0
// runs until stopped, a later round until $OUT/finish exists.
func fenceRank(c *cluster) string {
	return recorder(c, `
r=$TORCHELASTIC_RESTART_COUNT
echo $$ > "$OUT/pid.$NODE.$r"
echo "ready$r" >> "$OUT/ready"
while [ "$r" = 0 ] || [ ! -e "$OUT/finish" ]; do
	date +%s%N >> "$OUT/ts.$NODE.$r"
	sleep 0.1
done
exit 0
`)
}

// readStamps returns the timestamps of $OUT/ts.<node>.<round>.
func readStamps(t *testing.T, dir string, node, round int) []int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("ts.%d.%d", node, round)))
	if err != nil {
		return nil
	}
	var out []int64
	for _, l := range strings.Fields(string(b)) {
		if v, err := strconv.ParseInt(l, 10, 64); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// TestFrozenLauncherFencedByWatchdog: one active launcher is
// frozen by SIGSTOP for 60 s while its rank runs; a spare is parked. Its
// fence watchdog, a separate process, must kill the rank before the peers
// can start round 1 without the node: no timestamp of the frozen node's
// round-0 rank may follow the first of round 1. After SIGCONT the launcher
// records the fence (fenced_by_watchdog) and the job ends cleanly, nothing
// left.
//
// Two cases: the default gossip timings, where gossip suspects the frozen
// node within about a second and the peers wait for its lease to expire
// before they end the round (docs/rendezvous.md, "Fencing: never two rounds
// at once"), and gossip slowed (a probe every 2 s) so that the lease's
// expiry alone ends the round. Either way the watchdog's bound is relative
// to the lease: it fires half the fence margin (0.5 s) before the lease can
// expire.
//
// The two cases run side by side (each spends about a minute waiting out
// the freeze): each is its own job, with its own embedded etcd, rendezvous
// id, directory and loopback addresses (127.0.0.2-4 and 127.0.0.12-14), so
// neither can see the other's launchers, ranks or watchdogs.
func TestFrozenLauncherFencedByWatchdog(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name  string
		host0 int // the first node's address: 127.0.0.<host0>
		extra []string
	}{
		{"default-gossip", 2, nil},
		{"slow-gossip", 12, []string{"--rdzv-conf", "gossip_probe_interval=2,gossip_probe_timeout=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			frozenLauncherFenced(t, tc.host0, tc.extra)
		})
	}
}

func frozenLauncherFenced(t *testing.T, host0 int, extra []string) {
	c, victim := fenceCluster(t, host0, extra, "", nil)
	freezeFenced(t, c, victim, 60*time.Second)
}

// fenceCluster starts three launchers (2:3 nodes, one rank each running
// fenceRank) on 127.0.0.<host0>.. and returns the cluster once round 0
// runs, with the active node that does not host the embedded etcd.
// bin is the launchers' executable ("": the tests' build); args(i) adds
// arguments of node i (nil: none).
func fenceCluster(t *testing.T, host0 int, extra []string, bin string, args func(i int) []string) (*cluster, int) {
	c := newCluster(t, embeddedEndpointOn(t, fmt.Sprintf("127.0.0.%d", host0)))
	c.host0, c.bin = host0, bin
	c.extra = append([]string{"--rdzv-backend", "c10d"}, extra...)
	s := fenceRank(c)
	for i := 0; i < 3; i++ {
		var more []string
		if args != nil {
			more = args(i)
		}
		c.addNodeV(nil, append(append([]string{"--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "2", "--no-python"}, more...), s)...)
	}
	g0 := roundZeroActives(t, c, 2)
	victim := -1
	for node := range g0 {
		if node != 0 { // node 0 hosts the embedded etcd
			victim = node
		}
	}
	return c, victim
}

// freezeFenced freezes the launcher of node victim (SIGSTOP) for freeze
// while its round-0 rank runs: its fence watchdog must kill the rank before
// the peers start round 1 without the node, so that no round-0 timestamp
// follows round 1's first. After SIGCONT the launcher records the fence and
// the job ends, nothing left.
func freezeFenced(t *testing.T, c *cluster, victim int, freeze time.Duration) {
	rank := readInt(t, filepath.Join(c.dir, fmt.Sprintf("pid.%d.0", victim)))
	time.Sleep(2 * time.Second) // a few renewals: the watchdog is armed
	launcher := c.nodes[victim].cmd.Process
	wd := fenceWatchdogs(launcher.Pid)
	if len(wd) != 1 {
		t.Fatalf("launcher %d has %d fence watchdogs %v, want 1", launcher.Pid, len(wd), wd)
	}
	if err := launcher.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = launcher.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // never leave a stopped launcher behind

	// The rank dies while its launcher is frozen: a zombie (its parent
	// cannot reap it) or gone.
	var killedAfter time.Duration
	for {
		st, err := procfs.Read(rank)
		if err != nil || st.Dead() {
			killedAfter = time.Since(stopped)
			break
		}
		if time.Since(stopped) > 30*time.Second {
			t.Fatalf("the frozen node's rank %d still runs %s after SIGSTOP\n%s", rank, time.Since(stopped), c.stderrs())
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready1", 2, generous)
	if st, err := procfs.Read(launcher.Pid); err != nil || st.State != 'T' {
		t.Fatalf("the launcher is not frozen any more: %+v %v", st, err)
	}
	if st, err := procfs.Read(wd[0]); err != nil || st.State == 'T' || st.Dead() {
		t.Fatalf("the fence watchdog %d does not run beside the frozen launcher: %+v %v", wd[0], st, err)
	}
	if rest := freeze - time.Since(stopped); rest > 0 {
		time.Sleep(rest)
	}
	resume()

	// No overlap: the frozen node's last round-0 stamp precedes every
	// round-1 stamp.
	old := readStamps(t, c.dir, victim, 0)
	if len(old) == 0 {
		t.Fatalf("no timestamps of the frozen node's rank")
	}
	last := old[len(old)-1]
	var first int64
	for node := range c.nodes {
		if st := readStamps(t, c.dir, node, 1); len(st) > 0 && (first == 0 || st[0] < first) {
			first = st[0]
		}
	}
	if first == 0 {
		t.Fatal("no round-1 timestamps")
	}
	var overlap int
	for node := range c.nodes {
		for _, v := range readStamps(t, c.dir, node, 0) {
			if v >= first {
				overlap++
			}
		}
	}
	if overlap > 0 || last >= first {
		t.Fatalf("two rounds at once: %d round-0 stamps at or after round 1's first (frozen node's last %s after it)",
			overlap, time.Duration(last-first))
	}
	t.Logf("SIGSTOP -> frozen node's rank killed: %s; -> first round-1 stamp: %s; gap between the rounds: %s",
		killedAfter.Round(time.Millisecond), time.Duration(first-stopped.UnixNano()).Round(time.Millisecond),
		time.Duration(first-last).Round(time.Millisecond))

	// The resumed launcher records the fence.
	waitFor(t, generous, func() bool { return len(c.nodes[victim].eventsOfQuiet("fenced_by_watchdog")) > 0 })
	ev := c.nodes[victim].eventsOfQuiet("fenced_by_watchdog")[0]
	pgids, _ := ev["pgids"].([]any)
	if ev["reason"] != "deadline" || !slices.Contains(pgids, any(float64(rank))) {
		t.Errorf("fenced_by_watchdog event %v, want reason deadline and pgid %d", ev, rank)
	}

	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		code := n.wait(2 * time.Minute)
		if i != victim && code != 0 {
			t.Errorf("node %d exited %d", i, code)
		}
		if i == victim {
			t.Logf("the frozen node exited %d", code)
		}
	}
	for i, n := range c.nodes {
		if left := n.waitNoLeftovers(15 * time.Second); len(left) > 0 {
			t.Fatalf("node %d: processes left: %s", i, hangdump.Describe(left))
		}
	}
	if left := fenceWatchdogs(launcher.Pid); len(left) > 0 {
		t.Fatalf("fence watchdog left: %v", left)
	}
}

// fenceWatchdogs are the fence watchdogs whose parent is pid.
func fenceWatchdogs(pid int) []int {
	procs, _ := procfs.List()
	var out []int
	for _, p := range procs {
		if p.PPID != pid || p.Dead() {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID)); err == nil && strings.Contains(string(b), "\x00fence-watchdog") {
			out = append(out, p.PID)
		}
	}
	return out
}

// TestFenceWatchdogRestartedAfterSIGKILL: the fence watchdog of an active
// launcher is SIGKILLed (as the OOM killer would). The launcher restarts
// it (a new pid, its child) and records it: a fence_watchdog_restarted
// event, ftlauncher_fence_watchdog_restarts_total 1, and the verdict's
// fence_watchdog. Then the launcher is frozen (SIGSTOP) for 20 s: the
// restarted watchdog, given the guarded rank and the deadline again, kills
// the rank before the peers start round 1, so no round-0 write of the
// frozen node follows round 1's first (freezeFenced).
func TestFenceWatchdogRestartedAfterSIGKILL(t *testing.T) {
	skipShort(t)
	t.Parallel()     // mostly waiting (the freeze), on addresses of its own
	const host0 = 22 // 127.0.0.22-24: beside TestFrozenLauncherFencedByWatchdog's
	metrics := make([]string, 3)
	for i := range metrics {
		h := fmt.Sprintf("127.0.0.%d", host0+i)
		metrics[i] = fmt.Sprintf("%s:%d", h, freeTCPPort(t, h))
	}
	c, victim := fenceCluster(t, host0, nil, "", func(i int) []string { return []string{"--metrics-addr", metrics[i]} })
	launcher := c.nodes[victim].cmd.Process
	time.Sleep(2 * time.Second) // a few renewals: the watchdog is armed
	wd := fenceWatchdogs(launcher.Pid)
	if len(wd) != 1 {
		t.Fatalf("launcher %d has %d fence watchdogs %v, want 1", launcher.Pid, len(wd), wd)
	}
	if err := syscall.Kill(wd[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var now []int
	for {
		now = fenceWatchdogs(launcher.Pid)
		if len(now) == 1 && now[0] != wd[0] {
			break
		}
		if time.Since(killed) > generous {
			t.Fatalf("no new fence watchdog %s after SIGKILL of %d: %v\n%s", generous, wd[0], now, c.stderrs())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("SIGKILL of the fence watchdog %d -> its successor %d seen in /proc: %s", wd[0], now[0], time.Since(killed).Round(time.Microsecond))
	if st, err := procfs.Read(wd[0]); err == nil && !st.Dead() {
		t.Errorf("the killed watchdog %d still runs: %+v", wd[0], st)
	}
	waitFor(t, generous, func() bool { return len(c.nodes[victim].eventsOfQuiet("fence_watchdog_restarted")) > 0 })
	ev := c.nodes[victim].eventsOfQuiet("fence_watchdog_restarted")[0]
	if ev["old_pid"] != float64(wd[0]) || ev["new_pid"] != float64(now[0]) || ev["exit"] != "killed by SIGKILL" ||
		ev["guarded"] != 1.0 || ev["armed"] != true || ev["restarts"] != 1.0 {
		t.Errorf("fence_watchdog_restarted %v: want old_pid %d, new_pid %d, killed by SIGKILL, 1 group guarded, armed, restart 1", ev, wd[0], now[0])
	}
	t.Logf("the launcher's restart_ms (death reaped -> successor started with the state): %v", ev["restart_ms"])
	m := scrape(t, metrics[victim])
	if m["ftlauncher_fence_watchdog_restarts_total"] != 1 || m["ftlauncher_fence_watchdog_up"] != 1 {
		t.Errorf("metrics: restarts_total %v, up %v; want 1 and 1", m["ftlauncher_fence_watchdog_restarts_total"], m["ftlauncher_fence_watchdog_up"])
	}

	freezeFenced(t, c, victim, 20*time.Second)

	v := readVerdict(t, c.verdictPath(victim))
	if v.FenceWatchdog == nil || v.FenceWatchdog.Restarts != 1 || len(v.FenceWatchdog.Deaths) != 1 ||
		v.FenceWatchdog.Deaths[0].PID != wd[0] || v.FenceWatchdog.Deaths[0].NewPID != now[0] || v.FenceWatchdog.GaveUp != "" {
		t.Errorf("verdict fence_watchdog %+v: want 1 restart, the death of %d replaced by %d", v.FenceWatchdog, wd[0], now[0])
	}
	if !strings.Contains(c.nodes[victim].stderr.String(), "fence watchdog died during the run") {
		t.Error("no warning of the watchdog's death at the launcher's exit")
	}
}

// TestFenceWatchdogNotRestartableStopsNode: the launchers run from a copy
// of ft-launcher that is removed once round 0 runs, so a dead watchdog
// cannot be started again. SIGKILL of the active node's watchdog: the
// launcher kills its rank at once (not unprotected), writes
// fence_watchdog_gave_up, departs and ends with a fatal_error verdict that
// says why; the job goes on without it (the spare takes its place).
func TestFenceWatchdogNotRestartableStopsNode(t *testing.T) {
	skipShort(t)
	t.Parallel()     // on addresses of its own
	const host0 = 32 // 127.0.0.32-34
	bin := filepath.Join(t.TempDir(), "ft-launcher")
	copyExecutable(t, bins.launcher, bin)
	// The embedded etcd's server is looked for beside the launcher.
	if err := os.Symlink(filepath.Join(filepath.Dir(bins.launcher), "ft-launcher-etcd"), filepath.Join(filepath.Dir(bin), "ft-launcher-etcd")); err != nil {
		t.Fatal(err)
	}
	c, victim := fenceCluster(t, host0, nil, bin, nil)
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	rank := readInt(t, filepath.Join(c.dir, fmt.Sprintf("pid.%d.0", victim)))
	launcher := c.nodes[victim].cmd.Process
	time.Sleep(2 * time.Second) // a few renewals: the watchdog is armed
	wd := fenceWatchdogs(launcher.Pid)
	if len(wd) != 1 {
		t.Fatalf("launcher %d has %d fence watchdogs %v, want 1", launcher.Pid, len(wd), wd)
	}
	if err := syscall.Kill(wd[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for {
		st, err := procfs.Read(rank)
		if err != nil || st.Dead() {
			break
		}
		if time.Since(killed) > generous {
			t.Fatalf("the rank %d still runs %s after its watchdog could not be restarted\n%s", rank, generous, c.stderrs())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("SIGKILL of the watchdog -> the rank killed by its launcher: %s", time.Since(killed).Round(time.Millisecond))
	code := c.nodes[victim].wait(2 * time.Minute)
	if code != 1 {
		t.Errorf("the node without a watchdog exited %d, want 1", code)
	}
	gave := c.nodes[victim].eventsOfQuiet("fence_watchdog_gave_up")
	if len(gave) != 1 || !strings.Contains(fmt.Sprint(gave[0]["reason"]), "the last start failed") ||
		!slices.Contains(gave[0]["pgids"].([]any), any(float64(rank))) {
		t.Errorf("fence_watchdog_gave_up events %v: want one, the failed starts, pgid %d", gave, rank)
	}
	if len(c.nodes[victim].eventsOfQuiet("fence_watchdog_restarted")) != 0 {
		t.Error("a fence_watchdog_restarted event, want none")
	}
	v := readVerdict(t, c.verdictPath(victim))
	if v.Kind != "fatal_error" || !strings.Contains(v.Reason, "fence watchdog could not be restarted") ||
		v.FenceWatchdog == nil || v.FenceWatchdog.GaveUp == "" {
		t.Errorf("verdict %s %q fence_watchdog %+v: want fatal_error saying why", v.Kind, v.Reason, v.FenceWatchdog)
	}
	if !strings.Contains(c.nodes[victim].stderr.String(), "this node stops: its fence watchdog could not be restarted") {
		t.Errorf("no log line saying why the node stops:\n%s", c.nodes[victim].stderr.String())
	}

	// The job goes on without the node: round 1 on the other two.
	waitCount(t, filepath.Join(c.dir, "ready"), "ready1", 2, generous)
	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		if i == victim {
			continue
		}
		if code := n.wait(2 * time.Minute); code != 0 {
			t.Errorf("node %d exited %d", i, code)
		}
	}
	for i, n := range c.nodes {
		if left := n.waitNoLeftovers(15 * time.Second); len(left) > 0 {
			t.Fatalf("node %d: processes left: %s", i, hangdump.Describe(left))
		}
	}
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, 0o755); err != nil {
		t.Fatal(err)
	}
}
