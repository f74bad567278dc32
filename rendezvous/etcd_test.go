package rendezvous

// This file is long on purpose: it holds the cluster harness every etcd
// rendezvous test builds on (nodes on loopback addresses, options, Next on
// all nodes at once, consistency checks) beside the basic scenarios that
// exercise it; the other _test.go files of the package use the harness.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous/etcdserver"
	"github.com/ftlauncher/ft-launcher/verdict"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/metrics"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// testLogger discards logs to keep test output readable.
func testLogger(t testing.TB) *slog.Logger {
	t.Helper()
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

func startEmbedded(t testing.TB) *etcdserver.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m, err := etcdserver.Start(ctx, etcdserver.Options{Dir: t.TempDir(), ClientURL: "http://127.0.0.1:0", Logger: testLogger(t)})
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close embedded: %v", err)
		}
	})
	return m
}

// testClient is a plain etcd client of endpoint, closed at the test's end.
func testClient(t testing.TB, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

type cluster struct {
	t     *testing.T
	ep    string
	run   string
	nodes []*Etcd
}

// nodeOpts returns options for node i, bound to 127.0.0.(i+2).
func (c *cluster) opts(i, nproc, minN, maxN, maxRestarts int) EtcdOptions {
	addr := fmt.Sprintf("127.0.0.%d", i+2)
	return EtcdOptions{Endpoints: []string{c.ep}, RunID: c.run, NodeID: fmt.Sprintf("%s/n%d", addr, i),
		LocalAddr: addr, NProcPerNode: nproc, MinNodes: minN, MaxNodes: maxN, MaxRestarts: maxRestarts,
		InfraRank: -1, LastCall: 300 * time.Millisecond, LeaseTTL: 2 * time.Second,
		ConnectTimeout: 10 * time.Second, Logger: testLogger(c.t)}
}

func (c *cluster) add(o EtcdOptions) *Etcd {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e, err := NewEtcd(ctx, o)
	if err != nil {
		c.t.Fatalf("NewEtcd(%s): %v", o.NodeID, err)
	}
	c.t.Cleanup(func() { e.Close() })
	c.nodes = append(c.nodes, e)
	return e
}

// embeddedJob is an empty job on a new embedded etcd server (skipped
// with -short).
func embeddedJob(t *testing.T) *cluster {
	t.Helper()
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	return &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
}

func newCluster(t *testing.T, ep string, n, nproc, minN, maxN, maxRestarts int) *cluster {
	c := &cluster{t: t, ep: ep, run: strings.ReplaceAll(t.Name(), "/", "_")}
	for i := 0; i < n; i++ {
		c.add(c.opts(i, nproc, minN, maxN, maxRestarts))
	}
	return c
}

// nextAll runs Next on every given node concurrently.
func nextAll(t *testing.T, nodes []*Etcd) []Assignment {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := make([]Assignment, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = n.Next(ctx)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d Next: %v", i, err)
		}
	}
	return out
}

// checkConsistent verifies one round's assignments against each other.
func checkConsistent(t testing.TB, as []Assignment, nproc, active int) {
	t.Helper()
	seen := map[int]bool{}
	round := as[0].Round
	var master string
	for i, a := range as {
		if a.Round != round {
			t.Fatalf("node %d round %d, node 0 round %d", i, a.Round, round)
		}
		if a.Standby {
			continue
		}
		if seen[a.GroupRank] {
			t.Fatalf("group rank %d assigned twice: %+v", a.GroupRank, as)
		}
		seen[a.GroupRank] = true
		if a.GroupWorldSize != active || a.WorldSize != active*nproc || a.RankBase != a.GroupRank*nproc {
			t.Fatalf("node %d: inconsistent assignment %+v (active %d, nproc %d)", i, a, active, nproc)
		}
		m := fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort)
		if master == "" {
			master = m
		} else if m != master {
			t.Fatalf("master differs: %s vs %s", m, master)
		}
		if a.MasterPort <= 0 {
			t.Fatalf("no master port: %+v", a)
		}
	}
	if len(seen) != active {
		t.Fatalf("%d active nodes, want %d: %+v", len(seen), active, as)
	}
}

func waitEnd(t *testing.T, ch <-chan RoundEnd, within time.Duration) RoundEnd {
	t.Helper()
	return recvWithin(t, ch, within, "round end")
}

// recvWithin receives from ch, failing the test when nothing comes within.
func recvWithin[T any](t *testing.T, ch <-chan T, within time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("no %s within %v", what, within)
		var zero T
		return zero
	}
}

func assertNoEnd(t *testing.T, ch <-chan RoundEnd, d time.Duration) {
	t.Helper()
	select {
	case e := <-ch:
		t.Fatalf("unexpected round end: %+v", e)
	case <-time.After(d):
	}
}

func succeedAll(t *testing.T, nodes []*Etcd, round int) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	codes := make([]int, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i], errs[i] = n.Succeed(ctx, round)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d Succeed: %v", i, err)
		}
	}
	return codes
}

func groupRanks(as []Assignment) []int {
	out := make([]int, len(as))
	for i, a := range as {
		out[i] = a.GroupRank
	}
	return out
}

func TestEtcdHappyPathAndFail(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	met := metrics.New()
	for i := 0; i < 3; i++ {
		o := c.opts(i, 2, 3, 3, 3)
		if i == 0 {
			o.Metrics = met
		}
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 3)
	if as[0].Round != 0 || as[0].MaxRestarts != 3 {
		t.Fatalf("first round: %+v", as[0])
	}
	first := groupRanks(as)

	// A failure on node 1 ends the round everywhere with the same next round.
	ends := make([]<-chan RoundEnd, 3)
	for i, n := range c.nodes {
		ends[i] = n.Ended(0)
	}
	d, err := c.nodes[1].Fail(context.Background(), 0, policy.RankCrash, "rank 3 exited 1")
	if err != nil || !d.Restart {
		t.Fatalf("Fail: %+v %v", d, err)
	}
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndRestart || e.Round != 0 || !strings.Contains(e.Reason, "rank 3 exited 1") {
			t.Fatalf("node %d end: %+v", i, e)
		}
	}
	// A stale report for round 0 is a no-op.
	if d, err := c.nodes[2].Fail(context.Background(), 0, policy.RankCrash, "late"); err != nil || !d.Restart {
		t.Fatalf("stale Fail: %+v %v", d, err)
	}
	as = nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 3)
	if as[0].Round != 1 {
		t.Fatalf("round after restart = %d, want 1", as[0].Round)
	}
	if got := groupRanks(as); fmt.Sprint(got) != fmt.Sprint(first) {
		t.Fatalf("group ranks not stable: %v then %v", first, got)
	}
	for i, code := range succeedAll(t, c.nodes, 1) {
		if code != 0 {
			t.Fatalf("node %d code %d", i, code)
		}
	}
	if _, err := c.nodes[0].Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after success: %v, want ErrClosed", err)
	}
	for name, want := range map[string]float64{"ftlauncher_rounds_total": 2,
		"ftlauncher_current_round": 1, "ftlauncher_world_size": 6} {
		if got := metricValue(t, met, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

func metricValue(t *testing.T, m *metrics.Metrics, name string) float64 {
	t.Helper()
	ms := metricSeries(t, m, name)
	if len(ms) == 0 {
		t.Fatalf("metric %s not found", name)
	}
	if ms[0].GetCounter() != nil {
		return ms[0].GetCounter().GetValue()
	}
	return ms[0].GetGauge().GetValue()
}

// metricSeries is the series of metric name on m's registry (none when
// absent).
func metricSeries(t testing.TB, m *metrics.Metrics, name string) []*dto.Metric {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()
		}
	}
	return nil
}

func TestEtcdInfraRankOrders(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 3, 3, 0)
		o.InfraRank = 2 - i // reverse of the address order
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 3)
	for i, a := range as {
		if a.GroupRank != 2-i {
			t.Fatalf("node %d (infra rank %d) got group rank %d", i, 2-i, a.GroupRank)
		}
	}
	if as[2].MasterAddr != "127.0.0.4" {
		t.Fatalf("master addr %s, want the infra-rank-0 node 127.0.0.4", as[2].MasterAddr)
	}
}

func TestEtcdStandbyPromotedOnNodeLoss(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := newCluster(t, m.Endpoint(), 3, 1, 2, 3, 5)
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 2)
	standby := -1
	for i, a := range as {
		if a.Standby {
			if standby >= 0 {
				t.Fatalf("two standbys: %+v", as)
			}
			standby = i
		}
	}
	if standby < 0 {
		t.Fatalf("no standby with nnodes 2:3 and 3 nodes: %+v", as)
	}
	// The standby goes back to waiting for the next round.
	type res struct {
		a   Assignment
		err error
	}
	sbc := make(chan res, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := c.nodes[standby].Next(ctx)
		sbc <- res{a, err}
	}()
	var victim, survivor int = -1, -1
	for i, a := range as {
		if !a.Standby && victim < 0 && a.GroupRank == 0 {
			victim = i
		} else if !a.Standby {
			survivor = i
		}
	}
	end := c.nodes[survivor].Ended(0)
	// The standby waits for round 1, and the actives know each other by
	// gossip, so that the crash below is gossip's to see.
	waitRegistered(t, c.nodes[standby], 1)
	waitGossip(t, c.nodes[victim], c.nodes[survivor])
	start := time.Now()
	crash(c.nodes[victim])
	e := waitEnd(t, end, 10*time.Second)
	took := time.Since(start)
	if e.Kind != EndRestart || !strings.Contains(e.Reason, "lost") || !strings.Contains(e.Reason, c.nodes[victim].o.NodeID) {
		t.Fatalf("survivor end: %+v", e)
	}
	t.Logf("node loss detected in %v: %s", took, e.Reason)
	nextStart := time.Now()
	a, err := c.nodes[survivor].Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// The lost node is not waited for (RejoinWait is 30 s by default).
	t.Logf("round 1 closed %v after the survivor's Next", time.Since(nextStart))
	r := <-sbc
	if r.err != nil {
		t.Fatalf("standby Next: %v", r.err)
	}
	checkConsistent(t, []Assignment{a, r.a}, 1, 2)
	if r.a.Standby || a.Round != 1 {
		t.Fatalf("standby not promoted into round 1: survivor %+v standby %+v", a, r.a)
	}
	// The survivor keeps its group rank; the standby fills the lost slot.
	if a.GroupRank != as[survivor].GroupRank || r.a.GroupRank != as[victim].GroupRank {
		t.Fatalf("survivor %+v should keep group rank %d, standby %+v should take %d",
			a, as[survivor].GroupRank, r.a, as[victim].GroupRank)
	}
}

// crash simulates a launcher dying: gossip stops without a leave message
// and the lease is left to expire (nothing is revoked).
func crash(e *Etcd) {
	e.stopGossip(false)
	e.sess.abandon()
	e.cancel()
	e.wg.Wait()
	e.sess.wait()
	if e.ownsClient {
		e.cli.Close()
	}
	e.ownsClient = false
}

// TestEtcdLeaseBackstopWithoutGossip: with gossip off, a crashed node's
// lease expiry ends the round for every survivor, whether the lost node is
// one of the lossWatchers that watch the member keys, one that only they
// watch, or two of the three watchers at once.
func TestEtcdLeaseBackstopWithoutGossip(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	for _, tc := range []struct {
		name    string
		victims []int // group ranks crashed together
	}{
		{"a watcher (group rank 0)", []int{0}},
		{"a node only the watchers see (group rank 4)", []int{4}},
		{"two of the three watchers at once (group ranks 0 and 1)", []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &cluster{t: t, ep: m.Endpoint(), run: strings.ReplaceAll(t.Name(), "/", "_")}
			for i := 0; i < 5; i++ {
				o := c.opts(i, 1, 5, 5, 2)
				o.DisableGossip = true
				c.add(o)
			}
			as := nextAll(t, c.nodes)
			checkConsistent(t, as, 1, 5)
			lost := map[int]bool{}
			for i, a := range as {
				if slices.Contains(tc.victims, a.GroupRank) {
					lost[i] = true
				}
			}
			ends := map[int]<-chan RoundEnd{}
			for i, n := range c.nodes {
				if !lost[i] {
					ends[i] = n.Ended(0)
				}
			}
			for i := range lost {
				crash(c.nodes[i])
			}
			for i, ch := range ends {
				e := waitEnd(t, ch, 15*time.Second)
				if e.Kind != EndRestart || !strings.Contains(e.Reason, "lease expired") {
					t.Fatalf("node %d: end %+v, want a restart for an expired lease", i, e)
				}
				if !slices.ContainsFunc(slices.Collect(maps.Keys(lost)), func(v int) bool { return c.nodes[v].NodeID() == e.Node }) {
					t.Fatalf("node %d: end names %s, not a crashed node", i, e.Node)
				}
			}
		})
	}
}

func TestEtcdBudgetExhausted(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := newCluster(t, m.Endpoint(), 3, 1, 3, 3, 1)
	nextAll(t, c.nodes)
	if d, err := c.nodes[0].Fail(context.Background(), 0, policy.RankCrash, "boom"); err != nil || !d.Restart {
		t.Fatalf("first Fail: %+v %v", d, err)
	}
	as := nextAll(t, c.nodes)
	ends := make([]<-chan RoundEnd, 3)
	for i, n := range c.nodes {
		ends[i] = n.Ended(as[i].Round)
	}
	d, err := c.nodes[2].Fail(context.Background(), 1, policy.RankCrash, "boom again")
	if err != nil || d.Restart || d.Code != 1 || !strings.Contains(d.Reason, "restart budget exhausted") {
		t.Fatalf("second Fail: %+v %v", d, err)
	}
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndJobClosed || e.Code != 1 || e.Reason != d.Reason {
			t.Fatalf("node %d: %+v, want closed code 1 %q", i, e, d.Reason)
		}
	}
	var ce *JobClosedError
	if _, err := c.nodes[1].Next(context.Background()); !errors.As(err, &ce) || ce.Code != 1 {
		t.Fatalf("Next after close: %v", err)
	}
}

func TestEtcdMismatchRefused(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := newCluster(t, m.Endpoint(), 1, 4, 2, 2, 0)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c.nodes[0].Next(ctx) // creates the job config, then waits alone
	}()
	waitKey(t, c.nodes[0], c.nodes[0].k.config(), "the job config created")
	tests := []struct {
		name              string
		nproc, minN, maxN int
		want              []string
	}{
		{"nproc", 8, 2, 2, []string{"nproc_per_node=8", "nproc_per_node=4"}},
		{"nnodes", 4, 1, 3, []string{"nnodes=1:3", "nnodes=2:2"}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := c.add(c.opts(i+1, tc.nproc, tc.minN, tc.maxN, 0))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := n.Next(ctx)
			if err == nil {
				t.Fatal("mismatched node admitted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestEtcdShutdownClosesForAll(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := newCluster(t, m.Endpoint(), 3, 1, 3, 3, 3)
	nextAll(t, c.nodes)
	ends := make([]<-chan RoundEnd, 3)
	for i, n := range c.nodes {
		ends[i] = n.Ended(0)
	}
	if err := c.nodes[1].Shutdown(context.Background(), verdict.NoRestart, 93, "workload asked to stop"); err != nil {
		t.Fatal(err)
	}
	if err := c.nodes[2].Shutdown(context.Background(), verdict.NoRestart, 7, "second writer loses"); err != nil {
		t.Fatal(err)
	}
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndJobClosed || e.Code != 93 || e.Reason != "workload asked to stop" {
			t.Fatalf("node %d: %+v", i, e)
		}
	}
}

func TestEtcdLeaveAndHealthCheck(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 2, 3, 3)
		if i == 2 {
			o.HealthCheck = func(context.Context) error { return errors.New("GPU 3 fell off the bus") }
		}
		c.add(o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.nodes[2].Next(ctx); !errors.Is(err, ErrHealthCheck) || !strings.Contains(err.Error(), "GPU 3") {
		t.Fatalf("unhealthy node admitted: %v", err)
	}
	as := nextAll(t, c.nodes[:2])
	checkConsistent(t, as, 1, 2)
	if _, err := c.nodes[2].Next(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after leave: %v", err)
	}
	// A clean Leave of an active node is a node loss for the others.
	end := c.nodes[0].Ended(0)
	if err := c.nodes[1].Leave(ctx, "ExcludeThisNode"); err != nil {
		t.Fatal(err)
	}
	e := waitEnd(t, end, 10*time.Second)
	if e.Kind != EndRestart || !strings.Contains(e.Reason, c.nodes[1].o.NodeID) {
		t.Fatalf("end after leave: %+v", e)
	}
}

// TestEtcdJoinTimeout: a round that cannot gather MIN nodes fails Next
// with ErrJoinTimeout after JoinTimeout.
func TestEtcdJoinTimeout(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	o := c.opts(0, 1, 2, 2, 0)
	o.JoinTimeout = time.Second
	n := c.add(o)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := n.Next(ctx); !errors.Is(err, ErrJoinTimeout) || !strings.Contains(err.Error(), "need 2 nodes") {
		t.Fatalf("Next alone in a 2-node job: %v, want ErrJoinTimeout", err)
	}
}

func TestEtcdUnreachableAtStart(t *testing.T) {
	port, err := FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ep := fmt.Sprintf("http://127.0.0.1:%d", port)
	// With a username the client logs in while connecting: that must be
	// retried within ConnectTimeout too, and fail the same way.
	for _, user := range []string{"", "root"} {
		start := time.Now()
		_, err = NewEtcd(context.Background(), EtcdOptions{Endpoints: []string{ep}, RunID: "r", NodeID: "n",
			Username: user, Password: "pw",
			NProcPerNode: 1, MinNodes: 1, MaxNodes: 1, ConnectTimeout: time.Second, DisableGossip: true,
			Logger: testLogger(t)})
		if err == nil || !strings.Contains(err.Error(), ep) || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("user %q: got %v, want an error naming %s", user, err, ep)
		}
		if d := time.Since(start); d > 10*time.Second {
			t.Fatalf("user %q: took %v for a 1s bound", user, d)
		}
	}
}

func TestIsLocalEndpoint(t *testing.T) {
	tests := []struct {
		ep, local string
		want      bool
	}{
		{"http://127.0.0.2:2379", "127.0.0.2", true},
		{"http://127.0.0.2:2379", "127.0.0.3", false},
		{"127.0.0.2:2379", "127.0.0.2", true},
		{"127.0.0.1:2379", "", true},
		{"localhost:2379", "", true},
		{"http://192.0.2.77:2379", "", false},
		{"", "", false},
	}
	for _, tc := range tests {
		if got := IsLocalEndpoint(tc.ep, tc.local); got != tc.want {
			t.Errorf("IsLocalEndpoint(%q, %q) = %v, want %v", tc.ep, tc.local, got, tc.want)
		}
	}
}

// TestEtcdWaiterReRegistersAfterLeaseExpiry: a node waiting for a round
// whose lease expires (etcd answered its renewals too late; here the lease
// is revoked from outside) loses its membership with it. It takes a new
// lease and registers again, so the round still closes with it when the
// other node comes; before, the round waited for a member that was gone.
func TestEtcdWaiterReRegistersAfterLeaseExpiry(t *testing.T) {
	c := embeddedJob(t)
	a := c.add(c.opts(0, 1, 2, 2, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type result struct {
		a   Assignment
		err error
	}
	got := make(chan result, 1)
	go func() {
		as, err := a.Next(ctx)
		got <- result{as, err}
	}()
	member := a.k.member(0, a.o.NodeID)
	waitMember := func() int64 {
		for ctx.Err() == nil {
			resp, err := a.cli.Get(ctx, member)
			if err == nil && len(resp.Kvs) > 0 {
				return resp.Kvs[0].Lease
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Fatalf("node never registered in round 0")
		return 0
	}
	old := waitMember()
	if _, err := a.cli.Revoke(ctx, clientv3.LeaseID(old)); err != nil {
		t.Fatalf("revoke: %v", err)
	}
	// Registered again, under a new lease.
	for ctx.Err() == nil {
		if l := waitMember(); l != old {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	b := c.add(c.opts(1, 1, 2, 2, 2))
	bs, err := b.Next(ctx)
	if err != nil {
		t.Fatalf("second node: %v", err)
	}
	r := <-got
	if r.err != nil {
		t.Fatalf("first node: %v", r.err)
	}
	checkConsistent(t, []Assignment{r.a, bs}, 1, 2)
}

// TestEtcdRefusesAnotherKeyLayout: a launcher that joins a job whose
// config was written with another key layout (an older launcher's, which
// wrote none) is refused at its first Next with an error naming both
// layouts, before it registers in a round (as a node of another size is):
// each would wait for keys the other never writes.
func TestEtcdRefusesAnotherKeyLayout(t *testing.T) {
	c := embeddedJob(t)
	a := c.add(c.opts(0, 1, 2, 2, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := a.cli.Get(ctx, a.k.config())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("job config: %v, %d keys", err, len(resp.Kvs))
	}
	var cfg map[string]any
	if err := json.Unmarshal(resp.Kvs[0].Value, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg["layout"] != float64(keyLayout) {
		t.Fatalf("job config %s: want layout %d", resp.Kvs[0].Value, keyLayout)
	}
	delete(cfg, "layout") // as a launcher of layout 1 wrote it
	old, _ := json.Marshal(cfg)
	if _, err := a.cli.Put(ctx, a.k.config(), string(old)); err != nil {
		t.Fatal(err)
	}
	b := c.add(c.opts(1, 1, 2, 2, 2))
	_, err = b.Next(ctx)
	if err == nil || !strings.Contains(err.Error(), "key layout 2 but the job was started by a launcher using key layout 1") {
		t.Fatalf("Next in a job of layout 1: %v, want a refusal naming both layouts", err)
	}
	members, err := a.cli.Get(ctx, a.k.nodes(0), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || members.Count != 0 {
		t.Fatalf("round 0 members after the refusal: %v, %d; want none", err, members.Count)
	}
}

// TestEtcdCloserDeathTakenOver: when the node holding a round's closer key
// dies before it closes the round (here a ghost claim under a lease that
// is then revoked), a node waiting in the round sees the key go on its ctl
// watch, claims it and closes the round: every node gets its assignment.
func TestEtcdCloserDeathTakenOver(t *testing.T) {
	c := embeddedJob(t)
	a := c.add(c.opts(0, 1, 2, 2, 2))
	b := c.add(c.opts(1, 1, 2, 2, 2))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ghost, err := a.cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Put(ctx, a.k.closer(0), "ghost", clientv3.WithLease(ghost.ID)); err != nil {
		t.Fatal(err)
	}
	type result struct {
		as  Assignment
		err error
	}
	res := make(chan result, 2)
	for _, n := range []*Etcd{a, b} {
		go func() {
			as, err := n.Next(ctx)
			res <- result{as, err}
		}()
	}
	// Both register and find the closer key held: nobody claims.
	for {
		resp, err := a.cli.Get(ctx, a.k.nodes(0), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		if resp.Count == 2 {
			break
		}
		select {
		case r := <-res:
			t.Fatalf("Next returned while the ghost held the closer key: %+v, %v", r.as, r.err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond) // past the claim spread: the ghost still holds the key
	if resp, err := a.cli.Get(ctx, a.k.assignment(0)); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("round 0 assigned while the ghost held its closer key: %v, %d keys", err, len(resp.Kvs))
	}
	if _, err := a.cli.Revoke(ctx, ghost.ID); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		r := <-res
		if r.err != nil || r.as.Round != 0 || r.as.GroupWorldSize != 2 {
			t.Fatalf("Next after the closer died: %+v, %v; want round 0 of 2 nodes", r.as, r.err)
		}
	}
	resp, err := a.cli.Get(ctx, a.k.closer(0))
	if err != nil || len(resp.Kvs) != 1 || (string(resp.Kvs[0].Value) != a.o.NodeID && string(resp.Kvs[0].Value) != b.o.NodeID) {
		t.Fatalf("closer key of round 0 after the takeover: %v %v; want one of the nodes", err, resp.Kvs)
	}
}
