package integration

import (
	"context"
	"fmt"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// A dead embedded etcd member is noticed and restarted by the launcher
// that hosts it: three launchers host the three members of the job's etcd;
// node 1's ft-launcher-etcd is SIGKILLed while the ranks run.

// childrenNamed lists the live children of pid whose command name (as in
// /proc/<pid>/stat, at most 15 characters) is comm.
func childrenNamed(pid int, comm string) []int {
	all, _ := procfs.List()
	var out []int
	for _, p := range all {
		if p.PPID == pid && p.Comm == comm && !p.Dead() {
			out = append(out, p.PID)
		}
	}
	return out
}

// ownedDirOf is the ft-launcher-etcd-* dir under tmp whose owner lock names pid.
func ownedDirOf(t *testing.T, tmp string, pid int) string {
	t.Helper()
	dirs, _ := filepath.Glob(filepath.Join(tmp, "ft-launcher-etcd-*"))
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "owner.lock")); err == nil && strings.TrimSpace(string(b)) == strconv.Itoa(pid) {
			return d
		}
	}
	t.Fatalf("no ft-launcher-etcd-* dir under %s owned by pid %d (dirs %v)", tmp, pid, dirs)
	return ""
}

// memberIDs maps member name to id, requiring every member started (named).
func memberIDs(ctx context.Context, t *testing.T, cli *clientv3.Client) (map[string]uint64, error) {
	t.Helper()
	resp, err := cli.MemberList(ctx)
	if err != nil {
		return nil, err
	}
	ids := map[string]uint64{}
	for _, m := range resp.Members {
		if m.Name == "" || m.IsLearner {
			return nil, fmt.Errorf("member %x not started (name %q, learner %v)", m.ID, m.Name, m.IsLearner)
		}
		ids[m.Name] = m.ID
	}
	return ids, nil
}

// eventAt is the time stamp of an event.
func eventAt(t *testing.T, ev map[string]any) time.Time {
	t.Helper()
	ts, _ := ev["ts"].(string)
	at, err := time.Parse(time.RFC3339Nano, ts)
	if err != nil {
		t.Fatalf("event %v: bad ts: %v", ev, err)
	}
	return at
}

func TestEmbeddedEtcdMemberRestarted(t *testing.T) {
	skipShort(t)
	tests := []struct {
		name    string
		rmData  bool // remove the member's data dir before killing it
		wantHow string
		// settle: how long the cluster runs before the kill; etcd
		// refuses a reconfiguration until its members have been
		// connected for 5 s, which the replacement waits out.
		settle time.Duration
	}{
		{"intact data dir rejoins", false, string(verdict.EtcdMemberRejoined), 0},
		{"lost data dir is replaced in a young cluster", true, string(verdict.EtcdMemberReplaced), 0},
		{"lost data dir is replaced", true, string(verdict.EtcdMemberReplaced), 6 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, tmp, metricsAddr, urls, cli := startMemberCluster(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*generous)
			defer cancel()
			before, err := memberIDs(ctx, t, cli)
			if err != nil || len(before) != 3 {
				t.Fatalf("members before the kill: %v, %v; want m0, m1, m2 started", before, err)
			}

			time.Sleep(tt.settle)
			launcher := c.nodes[1].cmd.Process.Pid
			pids := childrenNamed(launcher, "ft-launcher-etc")
			if len(pids) != 1 {
				t.Fatalf("node 1 (pid %d) has ft-launcher-etcd children %v, want one", launcher, pids)
			}
			victim := pids[0]
			dir := ownedDirOf(t, tmp, victim)
			if tt.rmData {
				if err := os.RemoveAll(dir); err != nil {
					t.Fatal(err)
				}
			}
			killed := time.Now() // before the kill: the launcher may reap it before Kill returns here
			if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}

			// The launcher notices, says so and restarts it.
			var restarted map[string]any
			for deadline := time.Now().Add(2 * generous); restarted == nil; time.Sleep(50 * time.Millisecond) {
				if evs := c.nodes[1].eventsOf("etcd_member_restarted"); len(evs) > 0 {
					restarted = evs[0]
				} else if time.Now().After(deadline) {
					t.Fatalf("no etcd_member_restarted event within %v of the kill; events: %v", 2*generous,
						c.nodes[1].eventsOf("etcd_member_gave_up"))
				}
			}
			exited := c.nodes[1].eventsOf("etcd_member_exited")
			if len(exited) != 1 || exited[0]["member"] != "m1" || exited[0]["signal"] != "SIGKILL" ||
				exited[0]["pid"] != float64(victim) || exited[0]["exit"] != "killed by SIGKILL" {
				t.Fatalf("etcd_member_exited events %v, want one for m1, pid %d, killed by SIGKILL", exited, victim)
			}
			if restarted["member"] != "m1" || restarted["how"] != tt.wantHow || restarted["dead_pid"] != float64(victim) {
				t.Fatalf("etcd_member_restarted %v, want m1 %s after pid %d", restarted, tt.wantHow, victim)
			}
			noticed, served := eventAt(t, exited[0]).Sub(killed), eventAt(t, restarted).Sub(killed)
			if served < noticed {
				t.Fatalf("restarted (%v) before noticed (%v)", served, noticed)
			}

			// The member serves again: it is in the member list, started,
			// and answers a linearizable read (which needs the quorum and
			// its catching up) through its own endpoint alone.
			var healthy time.Duration
			for deadline := time.Now().Add(generous); ; time.Sleep(100 * time.Millisecond) {
				after, err := memberIDs(ctx, t, cli)
				if err == nil && len(after) == 3 {
					err = memberServes(ctx, urls[1])
				}
				if err == nil {
					healthy = time.Since(killed)
					if tt.rmData == (after["m1"] == before["m1"]) {
						t.Fatalf("m1 id %x after the restart, %x before: want a new id only when its data was lost", after["m1"], before["m1"])
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("m1 not healthy within %v of its restart event: %v", generous, err)
				}
			}
			if left := childrenNamed(launcher, "ft-launcher-etc"); len(left) != 1 || left[0] == victim {
				t.Fatalf("ft-launcher-etcd children of node 1 after the restart: %v (killed %d)", left, victim)
			}
			m := scrape(t, metricsAddr)
			for series, want := range map[string]float64{
				`ftlauncher_etcd_member_up{member="m1"}`:                                      1,
				`ftlauncher_etcd_member_exits_total{member="m1"}`:                             1,
				`ftlauncher_etcd_member_restarts_total{how="` + tt.wantHow + `",member="m1"}`: 1,
			} {
				if got, ok := m[series]; !ok || got != want {
					t.Errorf("metric %s = %v (present %v), want %v", series, got, ok, want)
				}
			}
			t.Logf("member m1 SIGKILLed: noticed (etcd_member_exited) after %v, restarted and serving (%s) after %v, healthy through the etcd client after %v",
				noticed.Round(time.Millisecond), tt.wantHow, served.Round(time.Millisecond), healthy.Round(time.Millisecond))

			// The job finishes; node 1's verdict lists the failure.
			if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if code := c.nodes[i].wait(2 * time.Minute); code != 0 {
					t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
				}
				v := readVerdict(t, c.verdictPath(i))
				wantVerdict(t, v, verdict.Succeeded, 0)
				if i != 1 {
					if len(v.EtcdMemberFailures) != 0 {
						t.Errorf("node %d verdict lists etcd member failures %+v, want none", i, v.EtcdMemberFailures)
					}
					continue
				}
				if f := v.EtcdMemberFailures; len(f) != 1 || f[0].Member != "m1" || f[0].PID != victim ||
					f[0].Exit != "killed by SIGKILL" || string(f[0].Action) != tt.wantHow || f[0].Attempts != 1 || f[0].RestartedAt == nil {
					t.Errorf("node 1 verdict etcd_member_failures %+v, want m1 pid %d killed by SIGKILL, %s after 1 attempt", f, victim, tt.wantHow)
				}
			}
			// The launchers' own stops at the end are no deaths: nothing
			// else was reported or restarted.
			for i := 0; i < 3; i++ {
				want := 0
				if i == 1 {
					want = 1
				}
				if ex, re := c.nodes[i].eventsOf("etcd_member_exited"), c.nodes[i].eventsOf("etcd_member_restarted"); len(ex) != want || len(re) != want {
					t.Errorf("node %d: %d etcd_member_exited and %d etcd_member_restarted events, want %d each: %v %v", i, len(ex), len(re), want, ex, re)
				}
			}
			log := c.nodes[1].stderr.String() // read once the launcher exited
			if !strings.Contains(log, "embedded etcd member exited") || !strings.Contains(log, "killed by SIGKILL") ||
				!strings.Contains(log, "embedded etcd member restarted and serving") {
				t.Errorf("node 1's log lacks the member's death and restart:\n%s", log)
			}
			if left := c.nodes[1].waitNoLeftovers(15 * time.Second); len(left) > 0 {
				t.Fatalf("processes left: %s", hangdump.Describe(left))
			}
			if dirs, _ := filepath.Glob(filepath.Join(tmp, "ft-launcher-etcd-*")); len(dirs) > 0 {
				t.Errorf("etcd data dirs left under %s: %v", tmp, dirs)
			}
		})
	}
}

// startMemberCluster starts three launchers (one rank each, waiting for
// $OUT/finish) that host the three members of the job's embedded etcd,
// with $TMPDIR (where the members keep their data dirs) tmp and node 1's
// metrics at metricsAddr, and waits until the ranks run. cli is a client
// of every member; urls are the members' client URLs.
func startMemberCluster(t *testing.T) (c *cluster, tmp, metricsAddr string, urls []string, cli *clientv3.Client) {
	t.Helper()
	eps := memberEndpoints(t)
	c = newCluster(t, eps)
	c.extra = []string{"--rdzv-backend", "c10d"}
	tmp = filepath.Join(c.dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	s := recorder(c, `echo ready0 >> "$OUT/ready"
while [ ! -e "$OUT/finish" ]; do sleep 0.05; done
exit 0
`)
	metricsAddr = fmt.Sprintf("127.0.0.3:%d", freeTCPPort(t, "127.0.0.3"))
	for i := 0; i < 3; i++ {
		args := []string{"--nnodes", "3", "--nproc-per-node", "1", "--max-restarts", "0", "--no-python"}
		if i == 1 {
			args = append(args, "--metrics-addr", metricsAddr)
		}
		c.addNodeV([]string{"TMPDIR=" + tmp}, append(args, s)...)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready0", 3, 2*generous)
	for _, ep := range strings.Split(eps, ",") {
		urls = append(urls, "http://"+ep)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return c, tmp, metricsAddr, urls, cli
}

// memberServes does a linearizable read through endpoint alone.
func memberServes(ctx context.Context, endpoint string) error {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return err
	}
	defer cli.Close()
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := cli.Status(rctx, endpoint); err != nil {
		return fmt.Errorf("status of %s: %w", endpoint, err)
	}
	if _, err := cli.Get(rctx, "ft-launcher-test-health"); err != nil {
		return fmt.Errorf("linearizable read through %s: %w", endpoint, err)
	}
	return nil
}

// TestEmbeddedEtcdMemberStoppedFromOutsideNotRestarted: a member stopped
// cleanly by a SIGTERM that the launcher did not send (a scheduler stopping
// every process of the node) exits 0; the launcher says so everywhere but
// does not restart it, and the job goes on with two of three members.
func TestEmbeddedEtcdMemberStoppedFromOutsideNotRestarted(t *testing.T) {
	skipShort(t)
	c, tmp, metricsAddr, urls, cli := startMemberCluster(t)
	launcher := c.nodes[1].cmd.Process.Pid
	pids := childrenNamed(launcher, "ft-launcher-etc")
	if len(pids) != 1 {
		t.Fatalf("node 1 (pid %d) has ft-launcher-etcd children %v, want one", launcher, pids)
	}
	victim := pids[0]
	if err := syscall.Kill(victim, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exited []map[string]any
	for deadline := time.Now().Add(generous); len(exited) == 0; time.Sleep(50 * time.Millisecond) {
		if exited = c.nodes[1].eventsOf("etcd_member_exited"); len(exited) == 0 && time.Now().After(deadline) {
			t.Fatalf("no etcd_member_exited event within %v of the SIGTERM", generous)
		}
	}
	if e := exited[0]; e["member"] != "m1" || e["pid"] != float64(victim) || e["exit"] != "exit code 0" || e["restart"] != false {
		t.Fatalf("etcd_member_exited %v, want m1 pid %d, exit code 0, restart false", e, victim)
	}
	// Give a wrong restart time to happen: none may.
	time.Sleep(3 * time.Second)
	if re := c.nodes[1].eventsOf("etcd_member_restarted"); len(re) != 0 {
		t.Fatalf("the member was restarted: %v", re)
	}
	if left := childrenNamed(launcher, "ft-launcher-etc"); len(left) != 0 {
		t.Fatalf("ft-launcher-etcd children of node 1: %v, want none", left)
	}
	if err := memberServes(context.Background(), urls[1]); err == nil {
		t.Fatalf("m1 at %s still serves", urls[1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	if resp, err := cli.MemberList(ctx); err != nil || len(resp.Members) != 3 {
		t.Fatalf("member list with two of three members up: %v, %v; want the three members (none removed)", resp, err)
	}
	// The other hosting launchers notice the dead peer member.
	for _, i := range []int{0, 2} {
		var down []map[string]any
		for deadline := time.Now().Add(generous); ; time.Sleep(100 * time.Millisecond) {
			if down = c.nodes[i].eventsOf("etcd_peer_member_down"); len(down) > 0 || time.Now().After(deadline) {
				break
			}
		}
		if len(down) != 1 || down[0]["peer"] != "m1" {
			t.Fatalf("node %d: etcd_peer_member_down events %v, want one for m1", i, down)
		}
	}
	m := scrape(t, metricsAddr)
	if m[`ftlauncher_etcd_member_up{member="m1"}`] != 0 || m[`ftlauncher_etcd_member_exits_total{member="m1"}`] != 1 {
		t.Errorf("metrics up %v, exits %v; want 0, 1", m[`ftlauncher_etcd_member_up{member="m1"}`], m[`ftlauncher_etcd_member_exits_total{member="m1"}`])
	}
	for series := range m {
		if strings.HasPrefix(series, "ftlauncher_etcd_member_restarts_total") {
			t.Errorf("a restart was counted: %s", series)
		}
	}
	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if code := c.nodes[i].wait(2 * time.Minute); code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	v := readVerdict(t, c.verdictPath(1))
	wantVerdict(t, v, verdict.Succeeded, 0)
	if f := v.EtcdMemberFailures; len(f) != 1 || f[0].PID != victim || f[0].Exit != "exit code 0" ||
		f[0].Action != verdict.EtcdMemberNotRestarted || f[0].Attempts != 0 || f[0].RestartedAt != nil {
		t.Errorf("node 1 verdict etcd_member_failures %+v, want pid %d, exit code 0, not_restarted, no attempt", f, victim)
	}
	if log := c.nodes[1].stderr.String(); !strings.Contains(log, "not restarting it") {
		t.Errorf("node 1's log does not say the member is not restarted:\n%s", log)
	}
	if log := c.nodes[0].stderr.String(); !strings.Contains(log, "another member of the embedded etcd does not answer") || !strings.Contains(log, "peer=m1") {
		t.Errorf("node 0's log does not report the dead peer member m1:\n%s", log)
	}
	if left := c.nodes[1].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left: %s", hangdump.Describe(left))
	}
	if dirs, _ := filepath.Glob(filepath.Join(tmp, "ft-launcher-etcd-*")); len(dirs) > 0 {
		t.Errorf("etcd data dirs left under %s: %v", tmp, dirs)
	}
}
