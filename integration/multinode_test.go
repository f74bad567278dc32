package integration

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// Several nodes on one machine: each launcher binds its own loopback address
// (127.0.0.2, 127.0.0.3, ...); Linux routes all of 127.0.0.0/8 to lo.

// cluster is a set of launchers of one job.
type cluster struct {
	t        *testing.T
	dir      string
	marker   string
	endpoint string
	extra    []string // backend flags given to every node
	nodes    []*job
	// host0 numbers the nodes' addresses: node i binds 127.0.0.<host0+i>
	// (2 when 0). Clusters that run side by side take distinct ranges.
	host0 int
	// bin is the launchers' executable ("": the one built for the tests).
	bin string
}

// rdzvBackend is one way to provide the rendezvous store.
type rdzvBackend struct {
	name  string
	host0 int // the cluster's first node address, 127.0.0.<host0>
	start func(t *testing.T) (endpoint string, flags []string)
}

// backends are the stores every multi-node scenario runs against: the
// embedded default (hosted by the node on 127.0.0.2) and Debian's etcd
// (on 127.0.0.1, its nodes on 127.0.0.12 and up).
var backends = []rdzvBackend{
	{"embedded", 2, func(t *testing.T) (string, []string) {
		return embeddedEndpoint(t), []string{"--rdzv-backend", "c10d"}
	}},
	{"debian-etcd", 12, func(t *testing.T) (string, []string) {
		client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
		peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
		startEtcd(t, t.TempDir(), client, peer)
		return client, []string{"--rdzv-backend", "etcd"}
	}},
}

// forEachBackend runs scenario as a subtest against every backend, the
// backends side by side: each is its own job (store, rendezvous id,
// directory, marker) on its own loopback addresses, and the scenarios
// mostly wait on their ranks' sleeps and on lease expiry.
func forEachBackend(t *testing.T, scenario func(t *testing.T, c *cluster)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ep, flags := b.start(t)
			c := newCluster(t, ep)
			c.host0 = b.host0
			c.extra = flags
			scenario(t, c)
		})
	}
}

func freeTCPPort(t *testing.T, host string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func newCluster(t *testing.T, endpoint string) *cluster {
	dir := t.TempDir()
	c := &cluster{t: t, dir: dir, endpoint: endpoint, marker: testMarker(t)}
	// Registered before any node's cleanup, so it runs after them: every
	// launcher has exited and its output can be read.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("every node's log:\n%s", c.stderrs())
		}
	})
	return c
}

// swapRank is a rank that says ready0 in round 0 and waits there to be
// stopped, says ready1 in a later round and exits 0 once $OUT/finish exists.
func swapRank(c *cluster) string {
	return recorder(c, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then echo ready0 >> "$OUT/ready"; exec sleep 600; fi
echo ready1 >> "$OUT/ready"
while [ ! -e "$OUT/finish" ]; do sleep 0.05; done
exit 0
`)
}

// embeddedEndpoint is a rendezvous endpoint served by the launcher on 127.0.0.2.
func embeddedEndpoint(t *testing.T) string {
	return embeddedEndpointOn(t, "127.0.0.2")
}

// embeddedEndpointOn is a rendezvous endpoint served by the launcher on host.
func embeddedEndpointOn(t *testing.T, host string) string {
	return fmt.Sprintf("%s:%d", host, freeTCPPort(t, host))
}

// nodeAddr is the loopback address node i of c binds.
func (c *cluster) nodeAddr(i int) string {
	first := c.host0
	if first == 0 {
		first = 2
	}
	return fmt.Sprintf("127.0.0.%d", first+i)
}

// addNode starts one launcher on c.nodeAddr(i) (127.0.0.<2+i> unless
// host0 is set). All nodes share the marker so a test can find every
// process of the job.
func (c *cluster) addNode(env []string, args ...string) *job {
	c.t.Helper()
	i := len(c.nodes)
	addr := c.nodeAddr(i)
	j := &job{t: c.t, dir: c.dir, marker: c.marker, events: filepath.Join(c.dir, fmt.Sprintf("events%d.jsonl", i)), bin: c.bin}
	c.t.Cleanup(j.cleanup)
	full := append(append([]string{"--local-addr", addr, "--rdzv-endpoint", c.endpoint, "--rdzv-id", "job-" + c.marker}, c.extra...), args...)
	j.start(append([]string{"OUT=" + c.dir, "NODE=" + strconv.Itoa(i)}, env...), full...)
	c.nodes = append(c.nodes, j)
	return j
}

// waitAll waits for every launcher and returns their exit codes.
func (c *cluster) waitAll(timeout time.Duration) []int {
	codes := make([]int, len(c.nodes))
	for i, n := range c.nodes {
		codes[i] = n.wait(timeout)
	}
	return codes
}

func (c *cluster) stderrs() string {
	var b strings.Builder
	for i, n := range c.nodes {
		fmt.Fprintf(&b, "--- node %d stderr:\n%s\n", i, n.stderr.String())
	}
	return b.String()
}

// envRecord is what the env workload writes: one line per start.
type envRecord struct {
	node, cycle, rank, localRank, groupRank, worldSize int
	master                                             string
}

// readStarts parses $OUT/starts: "node cycle rank local group world master".
func readStarts(t *testing.T, dir string) []envRecord {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "starts"))
	if err != nil {
		t.Fatal(err)
	}
	var out []envRecord
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 7 {
			t.Fatalf("bad starts line %q", line)
		}
		n := make([]int, 6)
		for i := range n {
			n[i], _ = strconv.Atoi(f[i])
		}
		out = append(out, envRecord{n[0], n[1], n[2], n[3], n[4], n[5], f[6]})
	}
	return out
}

// recorder is a rank that records its identity (one write, so lines from
// concurrent ranks never interleave) and then runs body.
func recorder(c *cluster, body string) string {
	p := filepath.Join(c.dir, "rank.sh")
	script := "#!/bin/sh\n" +
		`echo "$NODE $TORCHELASTIC_RESTART_COUNT $RANK $LOCAL_RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR:$MASTER_PORT" >> "$OUT/starts"` + "\n" + body
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		c.t.Fatal(err)
	}
	return p
}

func checkRound(t *testing.T, recs []envRecord, cycle, world int) map[int]int {
	t.Helper()
	ranks := map[int]bool{}
	groupOf := map[int]int{} // node -> group rank
	masters := map[string]bool{}
	for _, r := range recs {
		if r.cycle != cycle {
			continue
		}
		if ranks[r.rank] {
			t.Fatalf("cycle %d: rank %d started twice: %v", cycle, r.rank, recs)
		}
		ranks[r.rank] = true
		if r.worldSize != world {
			t.Fatalf("cycle %d: WORLD_SIZE %d, want %d", cycle, r.worldSize, world)
		}
		groupOf[r.node] = r.groupRank
		masters[r.master] = true
	}
	if len(ranks) != world {
		t.Fatalf("cycle %d: %d ranks started, want %d: %v", cycle, len(ranks), world, recs)
	}
	for r := 0; r < world; r++ {
		if !ranks[r] {
			t.Fatalf("cycle %d: rank %d missing", cycle, r)
		}
	}
	if len(masters) != 1 {
		t.Fatalf("cycle %d: ranks disagree on MASTER_ADDR:PORT: %v", cycle, masters)
	}
	return groupOf
}

func TestMultiNodeHappyPath(t *testing.T) {
	skipShort(t)
	forEachBackend(t, func(t *testing.T, c *cluster) {
		s := recorder(c, "exit 0\n")
		for i := 0; i < 3; i++ {
			c.addNode(nil, "--nnodes", "3", "--nproc-per-node", "2", "--no-python", s)
		}
		codes := c.waitAll(2 * time.Minute)
		for i, code := range codes {
			if code != 0 {
				t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
			}
		}
		groups := checkRound(t, readStarts(t, c.dir), 0, 6)
		seen := map[int]bool{}
		for _, g := range groups {
			seen[g] = true
		}
		if len(seen) != 3 {
			t.Fatalf("group ranks %v, want 3 distinct", groups)
		}
	})
}

func TestMultiNodeRankCrashRestartsEveryNode(t *testing.T) {
	skipShort(t)
	forEachBackend(t, func(t *testing.T, c *cluster) {
		// Node 1's local rank 1 fails once in cycle 0; the others keep running
		// until the job-wide restart stops them.
		s := recorder(c, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
  if [ "$NODE" = 1 ] && [ "$LOCAL_RANK" = 1 ]; then sleep 1; exit 9; fi
  sleep 60
fi
exit 0
`)
		for i := 0; i < 3; i++ {
			c.addNode(nil, "--nnodes", "3", "--nproc-per-node", "2", "--max-restarts", "3", "--no-python", s)
		}
		codes := c.waitAll(2 * time.Minute)
		for i, code := range codes {
			if code != 0 {
				t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
			}
		}
		recs := readStarts(t, c.dir)
		g0 := checkRound(t, recs, 0, 6)
		g1 := checkRound(t, recs, 1, 6)
		for node, g := range g0 {
			if g1[node] != g {
				t.Errorf("node %d changed group rank across rounds: %d -> %d", node, g, g1[node])
			}
		}
		for _, r := range recs {
			if r.cycle > 1 {
				t.Fatalf("a cycle beyond 1 started: %v", r)
			}
		}
	})
}

func TestMultiNodeBudgetExhaustedSameCodeEverywhere(t *testing.T) {
	skipShort(t)
	forEachBackend(t, func(t *testing.T, c *cluster) {
		s := recorder(c, `
if [ "$NODE" = 2 ]; then sleep 0.5; exit 4; fi
sleep 60
`)
		for i := 0; i < 3; i++ {
			c.addNode(nil, "--nnodes", "3", "--nproc-per-node", "1", "--max-restarts", "1", "--no-python", s)
		}
		codes := c.waitAll(2 * time.Minute)
		for i, code := range codes {
			if code != 1 {
				t.Fatalf("node %d exited %d, want 1 on every node: %v\n%s", i, code, codes, c.stderrs())
			}
		}
		if left := c.nodes[0].waitNoLeftovers(15 * time.Second); len(left) > 0 {
			t.Fatalf("processes left: %v", left)
		}
	})
}

func TestMultiNodeLossPromotesStandby(t *testing.T) {
	skipShort(t)
	forEachBackend(t, func(t *testing.T, c *cluster) {
		s := recorder(c, `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exec sleep 120; fi
sleep 1
exit 0
`)
		// MIN 2, MAX 3: two active nodes and one standby.
		for i := 0; i < 3; i++ {
			c.addNode(nil, "--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "2", "--no-python", s)
		}
		// Wait until round 0 runs on two nodes, then SIGKILL an active node that
		// does not host the embedded etcd (node 0 hosts it).
		deadline := time.Now().Add(90 * time.Second)
		victim := -1
		for victim < 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
			b, _ := os.ReadFile(filepath.Join(c.dir, "starts"))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(lines) < 4 {
				continue
			}
			recs := readStarts(t, c.dir)
			for _, r := range recs {
				if r.node != 0 {
					victim = r.node
					break
				}
			}
		}
		if victim < 0 {
			t.Fatalf("round 0 never ran on a node other than the etcd host\n%s", c.stderrs())
		}
		if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		codes := make([]int, len(c.nodes))
		for i, n := range c.nodes {
			if i == victim {
				n.wait(generous)
				continue
			}
			codes[i] = n.wait(2 * time.Minute)
			if codes[i] != 0 {
				t.Fatalf("surviving node %d exited %d\n%s", i, codes[i], c.stderrs())
			}
		}
		recs := readStarts(t, c.dir)
		checkRound(t, recs, 0, 4)
		groups := checkRound(t, recs, 1, 4)
		if _, ok := groups[victim]; ok {
			t.Fatalf("the lost node %d ran in round 1", victim)
		}
		nodes := []int{}
		for n := range groups {
			nodes = append(nodes, n)
		}
		sort.Ints(nodes)
		if len(nodes) != 2 {
			t.Fatalf("round 1 ran on nodes %v, want 2 nodes (a standby promoted)", nodes)
		}
		lost := false
		for i := range c.nodes {
			for _, e := range c.nodes[i].eventsOfQuiet("round_ended") {
				if strings.Contains(fmt.Sprint(e["reason"]), "lost") {
					lost = true
				}
			}
		}
		if !lost {
			t.Errorf("no node recorded the node loss in its event log")
		}
	})
}

// eventsOfQuiet is eventsOf that tolerates a missing log (a killed node).
func (j *job) eventsOfQuiet(kind string) []map[string]any {
	if _, err := os.Stat(j.events); err != nil {
		return nil
	}
	return j.eventsOf(kind)
}

// startEtcd runs Debian's etcd server on 127.0.0.1 with its own data dir.
type etcdProc struct {
	cmd     *exec.Cmd
	dataDir string
	client  string
	peer    string
}

func startEtcd(t *testing.T, dataDir, client, peer string) *etcdProc {
	t.Helper()
	testenv.Require(t, testenv.Etcd)
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--name", "ftl-test", "--data-dir", dataDir,
		"--listen-client-urls", "http://"+client, "--advertise-client-urls", "http://"+client,
		"--listen-peer-urls", "http://"+peer, "--initial-advertise-peer-urls", "http://"+peer,
		"--initial-cluster", "ftl-test=http://"+peer, "--log-level", "error")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e := &etcdProc{cmd: cmd, dataDir: dataDir, client: client, peer: peer}
	t.Cleanup(e.stop)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", client, 200*time.Millisecond); err == nil {
			c.Close()
			return e
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("etcd did not listen on %s", client)
	return nil
}

func (e *etcdProc) stop() {
	if e.cmd.ProcessState == nil {
		_ = e.cmd.Process.Kill()
		_ = e.cmd.Wait()
	}
}

func TestMultiNodeExternalEtcdRestartedMidRun(t *testing.T) {
	skipShort(t)
	client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	data := t.TempDir()
	etcd := startEtcd(t, data, client, peer)
	c := newCluster(t, client)
	s := recorder(c, `
echo ready >> "$OUT/ready"
i=0; while [ $i -lt 80 ]; do sleep 0.1; i=$((i+1)); done
exit 0
`)
	// An etcd outage longer than the fence deadline (about 2.8 s with the
	// default 6 s lease) stops every rank (docs/rendezvous.md, "Fencing");
	// this test is about shorter ones, so the lease is longer than the
	// outage and etcd's restart together.
	for i := 0; i < 3; i++ {
		c.addNode(nil, "--nnodes", "3", "--nproc-per-node", "1", "--max-restarts", "2", "--rdzv-backend", "etcd",
			"--rdzv-conf", "lease_ttl=15", "--no-python", s)
	}
	// Once every rank runs, stop etcd for a while, then bring it back.
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(c.dir, "ready"))
		if strings.Count(string(b), "ready") >= 3 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	etcd.stop()
	time.Sleep(2 * time.Second)
	startEtcd(t, data, client, peer)
	codes := c.waitAll(2 * time.Minute)
	for i, code := range codes {
		if code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	for _, r := range readStarts(t, c.dir) {
		if r.cycle != 0 {
			t.Fatalf("a restart happened while etcd was away (false restart): %v", r)
		}
	}
}

func TestMultiNodeMismatchedNprocRefused(t *testing.T) {
	skipShort(t)
	c := newCluster(t, embeddedEndpoint(t))
	s := recorder(c, "sleep 30\n")
	// Whichever node registers the job first sets nproc; the other is
	// refused. If the refused one hosts the embedded etcd, the other loses
	// its store and stops after the (short) etcd-loss bound.
	c.addNode(nil, "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-conf", "etcd_loss_bound=3", "--no-python", s)
	c.addNode(nil, "--nnodes", "2", "--nproc-per-node", "3", "--rdzv-conf", "etcd_loss_bound=3", "--no-python", s)
	// The refused node exits; the other waits for a matching node until
	// stopped (or, if it lost its etcd host, until the etcd-loss bound).
	var first int
	select {
	case <-c.nodes[0].done:
		first = 0
	case <-c.nodes[1].done:
		first = 1
	case <-time.After(2 * time.Minute):
		t.Fatalf("neither node exited\n%s", c.stderrs())
	}
	named := func(msg string) bool {
		return strings.Contains(msg, "refused") && strings.Contains(msg, "nproc_per_node=2") && strings.Contains(msg, "nproc_per_node=3")
	}
	refused := first
	if !named(c.nodes[first].stderr.String()) {
		// The refused node was the etcd host and is still stopping its etcd;
		// the other exited first on the etcd-loss bound.
		refused = 1 - first
	} else {
		_ = c.nodes[1-first].cmd.Process.Signal(syscall.SIGTERM)
	}
	codes := c.waitAll(generous)
	if codes[refused] == 0 || !named(c.nodes[refused].stderr.String()) {
		t.Fatalf("no node was refused with both nproc values named (codes %v)\n%s", codes, c.stderrs())
	}
	if _, err := os.Stat(filepath.Join(c.dir, "starts")); err == nil {
		t.Fatalf("a rank started although the job's nodes disagree on nproc")
	}
}
