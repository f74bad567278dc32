package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestEtcdStallPastTTLTrainsAgain: the job's etcd stalls longer than the
// lease TTL (5 s) while two nodes train: Debian's etcd SIGSTOPped for 8 s
// and for 30 s, and the embedded etcd's host frozen for 8 s (its launcher
// and its ft-launcher-etcd child SIGSTOPped; its ranks and its fence
// watchdog run on, as on a host whose launcher alone stalls). Every node
// fences, and when etcd resumes it expires every lease, so round 0 is left
// with no member: it used to stay open forever with every node waiting for
// round 1. Now a node ends the orphaned round (or a fenced node's own report
// ends it, if etcd takes that first) and the job trains again (a
// rank of round 1 makes progress after the stall), with no two rounds at
// once (no round-0 timestamp at or after the first of round 1), and ends
// cleanly.
//
// The three cases run side by side (each mostly waits out its stall), each
// its own job on its own loopback addresses.
func TestEtcdStallPastTTLTrainsAgain(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name     string
		host0    int
		embedded bool
		stall    time.Duration
	}{
		{"debian-etcd-8s", 22, false, 8 * time.Second},
		{"debian-etcd-30s", 32, false, 30 * time.Second},
		{"embedded-etcd-host-8s", 42, true, 8 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			etcdStallTrainsAgain(t, tc.host0, tc.embedded, tc.stall)
		})
	}
}

func etcdStallTrainsAgain(t *testing.T, host0 int, embedded bool, stall time.Duration) {
	var c *cluster
	var etcd *etcdProc
	if embedded {
		c = newCluster(t, embeddedEndpointOn(t, fmt.Sprintf("127.0.0.%d", host0)))
		c.extra = []string{"--rdzv-backend", "c10d"}
	} else {
		client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
		peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
		etcd = startEtcd(t, t.TempDir(), client, peer)
		c = newCluster(t, client)
		c.extra = []string{"--rdzv-backend", "etcd"}
	}
	c.host0 = host0
	c.extra = append(c.extra, "--rdzv-conf", "lease_ttl=5")
	s := fenceRank(c)
	for i := 0; i < 2; i++ {
		c.addNodeV(nil, "--nnodes", "2", "--nproc-per-node", "1", "--max-restarts", "2", "--no-python", s)
	}
	roundZeroActives(t, c, 2)
	time.Sleep(2 * time.Second) // a few renewals: the fence watchdogs are armed

	// What stalls: the etcd server, or the embedded etcd's host (node 0's
	// launcher and the etcd member it runs).
	var frozen []int
	if embedded {
		frozen = append(frozen, c.nodes[0].cmd.Process.Pid)
		frozen = append(frozen, etcdMembers(c.nodes[0].cmd.Process.Pid)...)
		if len(frozen) != 2 {
			t.Fatalf("node 0 (launcher %d) runs etcd members %v, want one", c.nodes[0].cmd.Process.Pid, frozen[1:])
		}
	} else {
		frozen = append(frozen, etcd.cmd.Process.Pid)
	}
	signalAll := func(sig syscall.Signal) {
		for _, pid := range frozen {
			_ = syscall.Kill(pid, sig)
		}
	}
	signalAll(syscall.SIGSTOP)
	stopped := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			signalAll(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume) // never leave a stopped process behind
	time.Sleep(stall)
	for _, pid := range frozen {
		if st, err := procfs.Read(pid); err != nil || st.State != 'T' {
			t.Fatalf("process %d is not stopped at the end of the stall: %+v %v", pid, st, err)
		}
	}
	resume()
	back := time.Now()

	// Training again: a round-1 rank's timestamp after etcd came back, and a
	// later one (it makes progress).
	var first int64
	waitFor(t, 2*time.Minute, func() bool {
		n := 0
		for node := range c.nodes {
			for _, v := range readStamps(t, c.dir, node, 1) {
				if v > back.UnixNano() {
					if first == 0 || v < first {
						first = v
					}
					n++
				}
			}
		}
		return n >= 4
	})
	t.Logf("%v stall (etcd %s): training again %v after etcd returned (%v after the stall began)", stall,
		map[bool]string{true: "embedded, host frozen", false: "Debian's, SIGSTOPped"}[embedded],
		time.Duration(first-back.UnixNano()).Round(time.Millisecond), time.Duration(first-stopped.UnixNano()).Round(time.Millisecond))
	for node := range c.nodes {
		if len(readStamps(t, c.dir, node, 2)) > 0 {
			t.Errorf("node %d ran a round 2: the stall ended more than one round", node)
		}
	}

	// No two rounds at once: every round-0 timestamp precedes round 1's first.
	var first1 int64
	for node := range c.nodes {
		if st := readStamps(t, c.dir, node, 1); len(st) > 0 && (first1 == 0 || st[0] < first1) {
			first1 = st[0]
		}
	}
	for node := range c.nodes {
		old := readStamps(t, c.dir, node, 0)
		if len(old) == 0 {
			t.Fatalf("node %d: no round-0 timestamps", node)
		}
		if last := old[len(old)-1]; last >= first1 {
			t.Fatalf("two rounds at once: node %d's last round-0 timestamp is %v after round 1's first",
				node, time.Duration(last-first1))
		}
		t.Logf("node %d: last round-0 timestamp %v after the stall began, %v before round 1's first", node,
			time.Duration(old[len(old)-1]-stopped.UnixNano()).Round(time.Millisecond), time.Duration(first1-old[len(old)-1]).Round(time.Millisecond))
	}
	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i, code := range c.waitAll(2 * time.Minute) {
		if code != 0 {
			t.Errorf("node %d exited %d", i, code)
		}
	}
	// Round 0 ended one of two ways, whichever came first once etcd was
	// back: as an orphaned round, by a node that fenced out of it after
	// every lease expired (rendezvous/orphan.go, whose own tests force that
	// path), or by a fenced node's own report, when etcd took it before its
	// expiry loop revoked that node's lease (seen with the embedded etcd's
	// host frozen: the host's launcher resumes with its etcd). Either is
	// the fenced end of round 0, charged as node_stopped. Read once the
	// launchers exited: their output is written until then.
	out := c.stderrs()
	switch {
	case strings.Contains(out, "round orphaned"):
		t.Log("round 0 ended as an orphaned round")
	case strings.Contains(out, "stopped: fenced"):
		t.Log("round 0 ended by a fenced node's own report")
	default:
		t.Errorf("round 0's end was neither an orphaned round's nor a fenced node's report\n%s", out)
	}
	for i := range c.nodes {
		v := readVerdict(t, c.verdictPath(i))
		if v.Kind != verdict.Succeeded || v.RestartsUsed != 1 {
			t.Errorf("node %d: verdict %s with %d restarts used (%s); want succeeded after one restart", i, v.Kind, v.RestartsUsed, v.Reason)
		}
	}
	for i, n := range c.nodes {
		if left := n.waitNoLeftovers(15 * time.Second); len(left) > 0 {
			t.Fatalf("node %d: processes left: %s", i, hangdump.Describe(left))
		}
	}
}

// etcdMembers are the ft-launcher-etcd processes whose parent is pid.
func etcdMembers(pid int) []int {
	procs, _ := procfs.List()
	var out []int
	for _, p := range procs {
		if p.PPID != pid || p.Dead() {
			continue
		}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.PID)); err == nil &&
			strings.HasSuffix(strings.SplitN(string(b), "\x00", 2)[0], "ft-launcher-etcd") {
			out = append(out, p.PID)
		}
	}
	return out
}
