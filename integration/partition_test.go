package integration

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// A network partition between real "hosts": every launcher runs in its own
// Linux network namespace, all namespaces hang off one bridge that lives in
// a switch namespace, and Debian's etcd listens on the bridge address. The
// root namespace is never touched; only 169.254.77.0/24 link-local addresses
// (and each namespace's own loopback) are used.
//
// netLabParallel: the tests on a network lab (TestPartitionActiveNode,
// TestFenceLongCut, TestBlipIsNotALoss) and their cases call t.Parallel.
// They spend most of their time waiting out cuts, leases and holds with
// their ranks asleep, and each lab is a world of its own: its namespaces
// are named after the process and a timestamp, its bridge, etcd (fixed
// ports, in its own switch namespace) and addresses are its own, its
// directory and marker too, and cut/heal touch only its own switch ports.
// So they run two at a time (go test's -parallel, GOMAXPROCS on the 2-core
// CI machine) after the package's sequential tests, instead of one after
// the other (about 2 minutes).

const (
	partSubnet   = "169.254.77."
	partEtcdAddr = partSubnet + "1" // the bridge, in the switch namespace
	partLeaseTTL = 6 * time.Second  // rendezvous default; see docs/rendezvous.md
)

// netLab is a set of network namespaces joined by a bridge. Every name
// carries the test process's pid and a timestamp, so a crashed earlier run
// cannot collide with this one.
type netLab struct {
	t      *testing.T
	prefix string
	sw     string   // switch namespace: bridge + etcd
	nss    []string // every namespace created, for cleanup
}

// newNetLab creates the switch namespace, or ends the test when network
// namespaces cannot be created here (a skip, or a failure under CI).
func newNetLab(t *testing.T) *netLab {
	t.Helper()
	testenv.Require(t, testenv.NetNamespaces, testenv.Etcd)
	reapStaleNamespaces(t)
	l := &netLab{t: t}
	for {
		l.prefix = fmt.Sprintf("ftlpart-%d-%d", os.Getpid(), time.Now().UnixNano()%1_000_000_000)
		l.sw = l.prefix + "-sw"
		out, err := exec.Command("ip", "netns", "add", l.sw).CombinedOutput()
		if err == nil {
			break
		}
		// Labs of parallel subtests are made at the same moment: a name
		// taken by the other one (same nanosecond) is tried again.
		if !strings.Contains(string(out), "File exists") {
			testenv.Missing(t, testenv.NetNamespaces, fmt.Sprintf("cannot create a network namespace (euid %d): ip netns add: %v: %s",
				os.Geteuid(), err, strings.TrimSpace(string(out))))
		}
	}
	l.nss = append(l.nss, l.sw)
	t.Cleanup(l.cleanup)
	l.ip("-n", l.sw, "link", "set", "lo", "up")
	l.ip("-n", l.sw, "link", "add", "ftlbr0", "type", "bridge")
	l.ip("-n", l.sw, "addr", "add", partEtcdAddr+"/24", "dev", "ftlbr0")
	l.ip("-n", l.sw, "link", "set", "ftlbr0", "up")
	return l
}

// reapStaleNamespaces deletes namespaces left by an earlier run of this test
// whose process is gone (a crash or SIGKILL skipped its cleanup).
func reapStaleNamespaces(t *testing.T) {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "ftlpart-")
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
		if err != nil || pid == os.Getpid() || pidAlive(pid) {
			continue
		}
		if out, err := exec.Command("ip", "netns", "del", e.Name()).CombinedOutput(); err != nil {
			t.Logf("remove stale namespace %s: %v: %s", e.Name(), err, out)
		}
	}
}

func (l *netLab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// addHost creates namespace <prefix>-h<i> with eth0 at addr, wired to the
// bridge through port p<i> in the switch namespace.
func (l *netLab) addHost(i int, addr string) string {
	l.t.Helper()
	ns := fmt.Sprintf("%s-h%d", l.prefix, i)
	l.ip("netns", "add", ns)
	l.nss = append(l.nss, ns)
	port := fmt.Sprintf("p%d", i)
	l.ip("-n", l.sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
	l.ip("-n", l.sw, "link", "set", port, "master", "ftlbr0")
	l.ip("-n", l.sw, "link", "set", port, "up")
	l.ip("-n", ns, "link", "set", "lo", "up")
	l.ip("-n", ns, "addr", "add", addr+"/24", "dev", "eth0")
	l.ip("-n", ns, "link", "set", "eth0", "up")
	return ns
}

// state is what the lab's network looks like now: each namespace's links,
// addresses, routes and neighbours, the bridge's ports and forwarding
// table, the TCP sockets, and whether each host reaches etcd's port now.
// A failure to start on the lab logs it (a host that could not reach etcd
// at start, seen twice and not understood: docs/testing.md).
func (l *netLab) state() string {
	var b strings.Builder
	run := func(argv ...string) {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		fmt.Fprintf(&b, "$ %s\n%s", strings.Join(argv, " "), out)
		if err != nil {
			fmt.Fprintf(&b, "(%v)\n", err)
		}
	}
	for _, ns := range l.nss {
		for _, what := range [][]string{{"-s", "link"}, {"addr"}, {"route"}, {"neigh"}} {
			run(append([]string{"ip", "-n", ns}, what...)...)
		}
		run("ip", "netns", "exec", ns, "ss", "-tan")
		if ns != l.sw {
			run("timeout", "3", "ip", "netns", "exec", ns, "bash", "-c", "exec 3<>/dev/tcp/"+partEtcdAddr+"/2379 && echo reached etcd")
		}
	}
	run("bridge", "-n", l.sw, "link")
	run("bridge", "-n", l.sw, "fdb", "show", "br", "ftlbr0")
	return b.String()
}

// cut takes host i's switch port down (both veth ends lose carrier): the
// host can reach neither etcd nor the other launchers. heal undoes it.
func (l *netLab) cut(i int)  { l.ip("-n", l.sw, "link", "set", fmt.Sprintf("p%d", i), "down") }
func (l *netLab) heal(i int) { l.ip("-n", l.sw, "link", "set", fmt.Sprintf("p%d", i), "up") }

// cleanup deletes every namespace (their veths and the bridge go with
// them). It runs after the launchers and etcd were killed (t.Cleanup is
// LIFO and the lab is created first).
func (l *netLab) cleanup() {
	for i := len(l.nss) - 1; i >= 0; i-- {
		if out, err := exec.Command("ip", "netns", "del", l.nss[i]).CombinedOutput(); err != nil {
			l.t.Errorf("ip netns del %s: %v: %s", l.nss[i], err, out)
		}
	}
	for _, ns := range l.nss {
		if _, err := os.Stat(filepath.Join("/run/netns", ns)); err == nil {
			l.t.Errorf("namespace %s still exists after cleanup", ns)
		}
	}
}

// nsCommand runs argv inside namespace ns. `ip netns exec` execs argv in
// place (no fork), so the command's pid is the target program's pid and
// killing it kills the program itself.
func nsCommand(ns string, argv ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
}

// startEtcdIn runs Debian's etcd in namespace ns on addr and waits until it
// accepts connections there.
func startEtcdIn(t *testing.T, ns, addr, marker string) {
	t.Helper()
	testenv.Require(t, testenv.Etcd)
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal(err)
	}
	client, peer := addr+":2379", addr+":2380" // fixed ports: the namespace is ours alone
	cmd := nsCommand(ns, bin, "--name", "ftl-part", "--data-dir", t.TempDir(),
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "ftl-part=http://"+peer, "--log-level", "error")
	cmd.Env = append(os.Environ(), "FTL_TEST_MARKER="+marker)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		for _, pid := range processesWithEnv("FTL_TEST_MARKER=" + marker) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	// The test process lives in the root namespace and cannot dial the
	// bridge; probe from inside the switch namespace with bash's /dev/tcp.
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		probe := nsCommand(ns, "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/2379", addr))
		if probe.Run() == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("etcd exited before listening on %s", client)
		case <-time.After(100 * time.Millisecond):
		}
	}
	t.Fatalf("etcd did not listen on %s within 30s", client)
}

// partNode is one launcher in its own namespace; its stderr goes to a file
// so the test can read it while the launcher runs.
type partNode struct {
	*job
	ns, addr, errPath string
}

func startNodeIn(t *testing.T, dir, marker, ns, addr string, idx int, args ...string) *partNode {
	t.Helper()
	n := &partNode{job: &job{t: t, dir: dir, marker: marker,
		events: filepath.Join(dir, fmt.Sprintf("events%d.jsonl", idx))},
		ns: ns, addr: addr, errPath: filepath.Join(dir, fmt.Sprintf("stderr%d.log", idx))}
	t.Cleanup(n.cleanup)
	f, err := os.Create(n.errPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	full := append([]string{bins.launcher, "--event-log", n.events, "--local-addr", addr}, args...)
	n.cmd = nsCommand(ns, full...)
	n.cmd.Env = append(os.Environ(), "FTL_TEST_MARKER="+marker, "OUT="+dir, "NODE="+strconv.Itoa(idx))
	n.cmd.Dir = dir
	n.cmd.Stdout, n.cmd.Stderr = f, f
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.done = make(chan struct{})
	go func() { n.exitErr = n.cmd.Wait(); close(n.done) }()
	return n
}

func (n *partNode) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

func partStderrs(nodes []*partNode) string {
	var b strings.Builder
	for i, n := range nodes {
		out, _ := os.ReadFile(n.errPath)
		fmt.Fprintf(&b, "--- node %d (%s) stderr:\n%s\n", i, n.addr, out)
	}
	return b.String()
}

// readStartsQuiet is readStarts that returns nothing until the file exists.
func readStartsQuiet(t *testing.T, dir string) []envRecord {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(dir, "starts")); err != nil || len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	return readStarts(t, dir)
}

// waitStarts polls the starts file until ok accepts the records; it gives
// up early if a launcher exits, since none should while it waits.
func waitStarts(t *testing.T, dir string, nodes []*partNode, timeout time.Duration, ok func([]envRecord) bool) ([]envRecord, error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := readStartsQuiet(t, dir)
		if ok(recs) {
			return recs, nil
		}
		for i, n := range nodes {
			if n.exited() {
				return recs, fmt.Errorf("node %d exited (%v)", i, n.exitErr)
			}
		}
		if time.Now().After(deadline) {
			return recs, errors.New("timed out")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func inCycle(recs []envRecord, cycle int) []envRecord {
	var out []envRecord
	for _, r := range recs {
		if r.cycle == cycle {
			out = append(out, r)
		}
	}
	return out
}

// waitEvent waits until n's event log has an event of kind that match accepts.
func (n *partNode) waitEvent(kind string, timeout time.Duration, match func(map[string]any) bool) (map[string]any, bool) {
	deadline := time.Now().Add(timeout)
	for {
		for _, e := range n.eventsOfQuiet(kind) {
			if match(e) {
				return e, true
			}
		}
		if time.Now().After(deadline) {
			return nil, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func roundOf(e map[string]any) int {
	f, _ := e["round"].(float64)
	return int(f)
}

// TestPartitionActiveNode cuts one active node off the network (etcd and
// the other launchers), checks that the majority side restarts without it,
// heals the partition and checks that the returning node cannot corrupt the
// round the majority is running, and ends with the job's code.
//
// Parallel, and so are its cases (netLabParallel).
func TestPartitionActiveNode(t *testing.T) {
	skipShort(t)
	t.Parallel()
	for _, tc := range []struct {
		name string
		// hold is how long the partition lasts at least, from the cut.
		hold time.Duration
	}{
		// Healed as soon as the majority runs round 1: since the majority
		// waits for the victim's lease to expire, its lease is gone by
		// then, but the healed node may still hold queued gossip.
		{"healed-within-lease", 0},
		// Healed after the lease TTL: etcd has dropped the victim's keys
		// and lease, the case the fencing section of the docs describes.
		{"healed-after-lease-expiry", partLeaseTTL + 3*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			testPartition(t, tc.hold)
		})
	}
}

func testPartition(t *testing.T, hold time.Duration) {
	lab := newNetLab(t)
	dir := t.TempDir()
	// The marker doubles as the run id, which the launcher uses in a
	// directory name: no path separator from the subtest name.
	marker := fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())
	startEtcdIn(t, lab.sw, partEtcdAddr, marker+"-etcd")

	// Round 0 sleeps until stopped; later rounds wait for the test's
	// release file (bounded), so the healed node meets a running round.
	script := filepath.Join(dir, "rank.sh")
	body := "#!/bin/sh\n" +
		`echo "$NODE $TORCHELASTIC_RESTART_COUNT $RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR:$MASTER_PORT" >> "$OUT/starts"` + "\n" + `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 120; fi
i=0; while [ ! -e "$OUT/release" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done
exit 0
`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}

	const nNodes = 3
	nodes := make([]*partNode, nNodes)
	for i := range nodes {
		addr := fmt.Sprintf("%s%d", partSubnet, 11+i)
		ns := lab.addHost(i, addr)
		nodes[i] = startNodeIn(t, dir, marker, ns, addr, i,
			"--rdzv-backend", "etcd", "--rdzv-endpoint", partEtcdAddr+":2379", "--rdzv-id", "job-"+marker,
			"--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "3", "--no-python", script)
	}

	// Round 0: two active nodes (one rank each) and one standby.
	recs, err := waitStarts(t, dir, nodes, 60*time.Second, func(r []envRecord) bool { return len(inCycle(r, 0)) >= 2 })
	if err != nil {
		t.Fatalf("round 0 did not start on two nodes: %v\n%s\nthe lab's network:\n%s", recs, partStderrs(nodes), lab.state())
	}
	time.Sleep(time.Second) // a third start in round 0 would show up here
	recs = readStarts(t, dir)
	g0 := checkRound(t, recs, 0, 2)
	victim, survivor, standby := -1, -1, -1
	for node, g := range g0 {
		if g == 0 {
			victim = node // the master: the harder case, MASTER_ADDR must move
		} else {
			survivor = node
		}
	}
	for i := range nodes {
		if _, ok := g0[i]; !ok {
			standby = i
		}
	}
	if victim < 0 || survivor < 0 || standby < 0 {
		t.Fatalf("round 0 group ranks %v: want two active nodes and one standby", g0)
	}
	for i, n := range nodes {
		if n.exited() {
			t.Fatalf("node %d exited during round 0\n%s", i, partStderrs(nodes))
		}
	}
	t.Logf("round 0: victim node %d (%s, group rank 0), survivor node %d, standby node %d",
		victim, nodes[victim].addr, survivor, standby)

	// Partition the victim.
	cutAt := time.Now()
	lab.cut(victim)

	// The majority restarts in round 1 without it, WORLD_SIZE 2.
	recs, err = waitStarts(t, dir, nodes, 30*time.Second, func(r []envRecord) bool { return len(inCycle(r, 1)) >= 2 })
	if err != nil {
		t.Fatalf("the majority did not restart within 30s of the partition: %v\n%s", recs, partStderrs(nodes))
	}
	t.Logf("round 1 started %.2fs after the partition", time.Since(cutAt).Seconds())
	// A silent node is seen by gossip (docs/rendezvous.md, "Node-loss
	// detection"), not by the stream connections, which a cut does not
	// close; the round ends only once its lease expired ("Fencing: never
	// two rounds at once"), so the reason names the lease expiry.
	if e, ok := nodes[survivor].waitEvent("round_ended", 10*time.Second, func(e map[string]any) bool { return roundOf(e) == 0 }); !ok {
		t.Fatalf("the survivor recorded no end of round 0\n%s", partStderrs(nodes))
	} else if r := fmt.Sprint(e["reason"]); !strings.Contains(r, "lease expired") || strings.Contains(r, "stream") {
		t.Fatalf("round 0 ended with %q: want the loss confirmed by the lease's expiry", r)
	}
	g1 := checkRound(t, recs, 1, 2)
	if _, ok := g1[victim]; ok {
		t.Fatalf("the partitioned node %d ran in round 1: %v", victim, recs)
	}
	// docs/rendezvous.md, "Slots are sticky": the survivor keeps its group
	// rank and the standby fills the lost node's slot (here 0, so the
	// standby hosts MASTER_ADDR now).
	if g1[survivor] != g0[survivor] || g1[standby] != g0[victim] {
		t.Fatalf("round 1 group ranks %v (round 0: %v): want survivor node %d to keep %d and promoted standby node %d to take the lost node's %d",
			g1, g0, survivor, g0[survivor], standby, g0[victim])
	}
	if m := inCycle(recs, 1)[0].master; !strings.HasPrefix(m, nodes[standby].addr+":") {
		t.Fatalf("round 1 MASTER_ADDR:PORT %s, want group rank 0's (the promoted standby's) address %s", m, nodes[standby].addr)
	}

	if d := hold - time.Since(cutAt); d > 0 {
		time.Sleep(d)
	}
	if nodes[victim].exited() {
		// Only the etcd loss bound (60 s) may stop an isolated node.
		t.Fatalf("the partitioned node exited while isolated (%v)\n%s", nodes[victim].exitErr, partStderrs(nodes))
	}
	lab.heal(victim)
	healedAt := time.Now()

	// Once it reaches etcd again the victim learns that round 0 ended
	// because it was lost, stops its round-0 rank and parks.
	if _, ok := nodes[victim].waitEvent("round_ended", 30*time.Second, func(e map[string]any) bool {
		return roundOf(e) == 0 && strings.Contains(fmt.Sprint(e["reason"]), "lost")
	}); !ok {
		t.Fatalf("the healed node did not record the end of round 0 within 30s\n%s", partStderrs(nodes))
	}
	t.Logf("healed node saw round 0 end %.2fs after the heal", time.Since(healedAt).Seconds())
	time.Sleep(3 * time.Second) // room for a stale write to land, if any could

	// Round 1 is untouched: the majority still runs it, nothing newer
	// started, and the victim started no rank.
	for _, i := range []int{survivor, standby} {
		if nodes[i].exited() {
			t.Fatalf("majority node %d exited before release (code from %v)\n%s", i, nodes[i].exitErr, partStderrs(nodes))
		}
	}
	recs = readStarts(t, dir)
	for _, r := range recs {
		if r.cycle > 1 || (r.cycle >= 1 && r.node == victim) {
			t.Fatalf("the healed node disturbed round 1: start %+v in %v\n%s", r, recs, partStderrs(nodes))
		}
	}

	// Let round 1 finish.
	if err := os.WriteFile(filepath.Join(dir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{survivor, standby} {
		if code := nodes[i].wait(60 * time.Second); code != 0 {
			t.Fatalf("majority node %d exited %d, want 0\n%s", i, code, partStderrs(nodes))
		}
	}
	victimCode := nodes[victim].wait(30 * time.Second)

	recs = readStarts(t, dir)
	checkRound(t, recs, 0, 2)
	if g := checkRound(t, recs, 1, 2); g[survivor] != g1[survivor] || g[standby] != g1[standby] {
		t.Fatalf("round 1 changed after the heal: %v, was %v", g, g1)
	}
	for _, r := range recs {
		if r.cycle > 1 || (r.cycle >= 1 && r.node == victim) {
			t.Fatalf("unexpected start %+v in %v", r, recs)
		}
	}

	// Event logs: the majority restarted once, because the victim was
	// lost, ran round 1 with the ranks above and succeeded in round 1.
	for _, i := range []int{survivor, standby} {
		n := nodes[i]
		// Only the survivor ran round 0, so only it restarts; the standby
		// simply takes part in round 1.
		rs := n.eventsOf("restart")
		wantRestarts := 0
		if i == survivor {
			wantRestarts = 1
		}
		if len(rs) != wantRestarts {
			t.Fatalf("node %d: %d restart events, want %d: %v", i, len(rs), wantRestarts, rs)
		}
		for _, r := range rs {
			if reason := fmt.Sprint(r["reason"]); !strings.Contains(reason, nodes[victim].addr) || !strings.Contains(reason, "lost") {
				t.Errorf("node %d: restart reason %q does not name the lost node %s", i, reason, nodes[victim].addr)
			}
		}
		var cycles []int
		for _, e := range n.eventsOf("cycle_started") {
			cycles = append(cycles, roundOf(e))
			if roundOf(e) == 1 {
				if gr, _ := e["group_rank"].(float64); int(gr) != g1[i] {
					t.Errorf("node %d: cycle_started round 1 group_rank %v, starts say %d", i, e["group_rank"], g1[i])
				}
			}
		}
		want := []int{1}
		if i == survivor {
			want = []int{0, 1}
		}
		if fmt.Sprint(cycles) != fmt.Sprint(want) {
			t.Errorf("node %d: cycles started %v, want %v", i, cycles, want)
		}
		ok := false
		for _, e := range n.eventsOf("job_succeeded") {
			ok = ok || roundOf(e) == 1
		}
		if !ok {
			t.Errorf("node %d: no job_succeeded for round 1", i)
		}
	}

	// The victim ran round 0 only and recorded why it ended.
	for _, e := range nodes[victim].eventsOf("cycle_started") {
		if roundOf(e) != 0 {
			t.Errorf("the healed node started cycle %d: %v", roundOf(e), e)
		}
	}
	// docs/rendezvous.md: a node that is parked as a standby when the job
	// closes gets the job's code ("so standbys exit with the same code as
	// everyone else"); the job closed with 0 ("all nodes succeeded").
	if victimCode != 0 {
		out, _ := os.ReadFile(nodes[victim].errPath)
		t.Errorf("the healed node exited %d (partition held %.1fs); the job closed with 0 and the docs promise a parked node exits with the job's code; its job_failed events: %v\n--- its stderr:\n%s",
			victimCode, healedAt.Sub(cutAt).Seconds(), nodes[victim].eventsOfQuiet("job_failed"), out)
	}

	if left := nodes[0].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}
