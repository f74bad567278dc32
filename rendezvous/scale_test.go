package rendezvous

// This file is long on purpose: it holds the rendezvous's scale harness
// (simulated nodes, each a real rendezvous client and ledger book, driven
// through rounds against one etcd; what it measures per round) and the
// two tests that run it, the small job every run checks and the opt-in
// measurement; the harness is their shared body.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous/etcdserver"
	"github.com/ftlauncher/ft-launcher/verdict"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// Simulated nodes for the scale measurement (docs/benchmarks.md,
// "Rendezvous at scale"): each is a real
// rendezvous client (*Etcd, with its own lease and keep-alive) and a real
// ledger book on the job's etcd ledger, driven by a loop that does per
// round what the agent does (agent/states.go, agent/spares.go): Next; the
// Active lease, or the Spare and Filler leases when parked; on a peer's
// loss the ledger record of it; the failure report. No ranks run and
// gossip is off (lease revocation is the loss signal); the nodes share a
// few etcd connections so that thousands fit in one process.

// simConfig is one simulated job.
type simConfig struct {
	nodes, spares int // MIN = nodes, MAX = nodes + spares
	clients       int // etcd connections shared by the nodes
	nproc         int
	leaseTTL      time.Duration // 0: the default (5 s)
	// relayGroup > 0 makes every relayGroup-th node a relay for itself
	// and the relayGroup-1 nodes after it (the two-level join: relay.go).
	relayGroup int
	// victim picks the node a node loss takes (nil: group rank 1's).
	victim func(as map[int]Assignment) int
}

// simEvent is a node's assignment once its per-round bookkeeping is done.
type simEvent struct {
	node int
	asg  Assignment
	at   time.Time
	err  error
}

type simNode struct {
	i     int
	e     *Etcd
	book  *ledger.Book
	crash chan struct{} // a scripted rank crash in the current round
	stop  context.CancelFunc
	done  chan struct{}

	mu    sync.Mutex
	asg   Assignment
	spare bool
	// quarantined are the peers this node saw lost (the agent's verdict
	// bookkeeping, kept in memory).
	quarantined []string
}

// simJob is N simulated nodes of one job.
type simJob struct {
	t       testing.TB
	cfg     simConfig
	run     string
	clients []*clientv3.Client
	load    *rpcLoad
	nodes   []*simNode
	events  chan simEvent
	ledgerE atomic.Int64 // ledger write errors
	// met is every node's metrics together: the lease renewals' round
	// trips and headroom before the fence, summed over the nodes.
	met   *metrics.Metrics
	pipes *pipeNet // the relays' in-memory connections
}

// newSimJob connects cfg.clients clients to endpoints and starts the
// nodes' rendezvous clients (NewEtcd: lease, generation, ctl watch).
func newSimJob(t testing.TB, endpoints []string, cfg simConfig) *simJob {
	t.Helper()
	if cfg.nproc == 0 {
		cfg.nproc = 8
	}
	j := &simJob{t: t, cfg: cfg, run: fmt.Sprintf("scale-%d-%d", cfg.nodes, time.Now().UnixNano()), load: newRPCLoad(), pipes: &pipeNet{ls: map[string]*pipeListener{}},
		events: make(chan simEvent, 4*(cfg.nodes+cfg.spares)), met: metrics.New()}
	// The nodes' side of the process carries the profile label side=node
	// (their connections' goroutines, started here, inherit it; so do
	// every node's and relay's, started below): a phase's profile then
	// tells the nodes' CPU, which a cluster spreads over its hosts, from
	// etcd's (FTL_SCALE_PROFILE; docs/benchmarks.md).
	nodeSide(func() { j.clients = scaleClients(t, endpoints, cfg.clients, j.load.dialOptions()...) })
	return j
}

// nodeSide runs f with the profile label side=node.
func nodeSide(f func()) {
	pprof.Do(context.Background(), pprof.Labels("side", "node"), func(context.Context) { f() })
}

// scaleClients opens n etcd connections for simulated nodes to share,
// closed at the test's end.
func scaleClients(t testing.TB, endpoints []string, n int, dial ...grpc.DialOption) []*clientv3.Client {
	t.Helper()
	var clis []*clientv3.Client
	for range n {
		cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
			MaxCallSendMsgSize: 16 << 20, MaxCallRecvMsgSize: 64 << 20, Logger: zap.NewNop(), DialOptions: dial})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		clis = append(clis, cli)
	}
	return clis
}

// start creates every node (64 at a time; the relays first, when the job
// has them) and returns how long it took.
func (j *simJob) start(ctx context.Context) time.Duration {
	n := j.cfg.nodes + j.cfg.spares
	j.nodes = make([]*simNode, n)
	errs := make([]error, n)
	g := j.cfg.relayGroup
	relayKey := []byte("scale-harness-relay-key-of-32-bytes!")
	t0 := time.Now()
	create := func(i int) {
		id := fmt.Sprintf("sim-%05d/1", i)
		opts := EtcdOptions{Client: j.clients[i%len(j.clients)], RunID: j.run, NodeID: id,
			LocalAddr: "127.0.0.1", NProcPerNode: j.cfg.nproc, MinNodes: j.cfg.nodes, MaxNodes: n,
			MaxRestarts: 1000, InfraRank: -1, DisableGossip: true, LeaseTTL: j.cfg.leaseTTL, Metrics: j.met,
			// Not even formatted: N nodes' logs would be N hosts' work;
			// only warnings (rare: a watch behind, a lease lost) reach
			// the test's log.
			Logger: slog.New(warnHandler{t: j.t}),
			// 32 nodes' ctl watches per gRPC stream (node i is on client
			// i%8): on a cluster each has its own; thousands on one stream
			// overflowed etcd's 128-response buffer on every change
			// (EtcdOptions.ctlStream).
			ctlStream: strconv.Itoa(i / (32 * len(j.clients)))}
		if g > 0 {
			// Members reach their relays over in-memory pipes: 16,000
			// nodes' TCP connections, both ends in this process, do not
			// fit its 20,000 descriptors. On a cluster each is a TCP
			// connection between two other hosts; the handshake, frames
			// and batching are the same.
			opts.RelayKey, opts.RelayDial = relayKey, j.pipes.dial
			if i%g == 0 {
				// Named as a launcher's relay address: the node's
				// address (its id before the "/") and the relay port.
				opts.RelayListener = j.pipes.listen(fmt.Sprintf("sim-%05d:29402", i))
			} else if r := j.nodes[i-i%g]; r != nil {
				opts.Relay = r.e.RelayAddr()
			}
		}
		e, err := NewEtcd(ctx, opts)
		if err != nil {
			errs[i] = err
			return
		}
		book := ledger.NewBook(j.run, id, "sim", func(error) { j.ledgerE.Add(1) }, e.LedgerStore())
		j.nodes[i] = &simNode{i: i, e: e, book: book, crash: make(chan struct{}, 1), done: make(chan struct{})}
	}
	pass := func(want func(i int) bool) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range n {
			if !want(i) {
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go nodeSide(func() {
				defer wg.Done()
				defer func() { <-sem }()
				create(i)
			})
		}
		wg.Wait()
	}
	if g > 0 {
		pass(func(i int) bool { return i%g == 0 })
		pass(func(i int) bool { return i%g != 0 })
	} else {
		pass(func(int) bool { return true })
	}
	took := time.Since(t0)
	j.t.Cleanup(j.closeAll)
	for i, err := range errs {
		if err != nil {
			j.t.Fatalf("node %d: %v", i, err)
		}
	}
	return took
}

// closeAll stops every node's loop and rendezvous client.
func (j *simJob) closeAll() {
	var wg sync.WaitGroup
	for _, n := range j.nodes {
		if n == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if n.stop != nil {
				n.stop()
			}
			n.e.Close()
			if n.stop != nil {
				<-n.done
			}
		}()
	}
	wg.Wait()
}

// runAll starts every node's agent loop.
func (j *simJob) runAll(ctx context.Context) {
	for _, n := range j.nodes {
		nctx, cancel := context.WithCancel(ctx)
		n.stop = cancel
		go nodeSide(func() { n.loop(nctx, j.events) })
	}
}

// loop is the agent's cycle for one simulated node.
func (n *simNode) loop(ctx context.Context, events chan<- simEvent) {
	defer close(n.done)
	for {
		a, err := n.join(ctx)
		if err != nil {
			if ctx.Err() == nil && !errorsIsClosed(err) {
				events <- simEvent{node: n.i, err: err}
			}
			return
		}
		events <- simEvent{node: n.i, asg: a, at: time.Now()}
		if a.Standby {
			continue // a spare waits in the next round at once
		}
		select {
		case <-ctx.Done():
			return
		case end := <-n.e.Ended(a.Round):
			if end.Kind == EndJobClosed {
				return
			}
			n.roundEnded(ctx, end)
		case <-n.crash:
			d, err := n.e.Fail(ctx, a.Round, policy.RankCrash, "simulated rank crash")
			if err != nil || !d.Restart {
				if ctx.Err() == nil {
					events <- simEvent{node: n.i, err: fmt.Errorf("fail: %+v, %v", d, err)}
				}
				return
			}
		}
	}
}

// errorsIsClosed reports the end the test itself brings: the job closed
// with success (shutdown) or the node closed. A node that declared etcd
// lost is not that.
func errorsIsClosed(err error) bool {
	var jc *JobClosedError
	if errors.As(err, &jc) {
		return jc.Kind == verdict.Succeeded
	}
	return errors.Is(err, ErrClosed)
}

// join is Next and the agent's bookkeeping of the assignment (agent.joining,
// parked, promoted).
func (n *simNode) join(ctx context.Context) (Assignment, error) {
	a, err := n.e.Next(ctx)
	if err != nil {
		return a, err
	}
	n.mu.Lock()
	wasSpare := n.spare
	n.asg, n.spare = a, a.Standby
	n.mu.Unlock()
	b := n.book
	if a.Standby {
		b.End(ctx, ledger.Active, ledger.Reassigned, "parked as a spare in round "+itoa(a.Round))
		b.Begin(ctx, ledger.Spare, -1, a.Round)
		b.Begin(ctx, ledger.Filler, -1, a.Round)
		return a, nil
	}
	if wasSpare {
		detail := "promoted to group rank " + itoa(a.GroupRank) + " in round " + itoa(a.Round)
		b.End(ctx, ledger.Filler, ledger.ReclaimedBySpare, detail)
		b.End(ctx, ledger.Spare, ledger.Swap, detail)
	}
	if cur, ok := b.Current(ledger.Active); ok && cur.GroupRank != a.GroupRank {
		b.End(ctx, ledger.Active, ledger.Reassigned, "group rank "+itoa(a.GroupRank)+" in round "+itoa(a.Round))
	}
	b.Begin(ctx, ledger.Active, a.GroupRank, a.Round)
	return a, nil
}

// roundEnded is the agent's decideRoundEnded: the peer's loss goes into
// the verdict's quarantine list and the job's ledger.
func (n *simNode) roundEnded(ctx context.Context, end RoundEnd) {
	switch end.Cause {
	case policy.NodeLost, policy.NodeExcluded:
		n.mu.Lock()
		n.quarantined = append(n.quarantined, end.Node)
		n.mu.Unlock()
	}
	if end.LedgerBy != "" { // recorded with the end (agent.peerEnded)
		n.book.Closed(ctx, end.Ledger)
		return
	}
	switch end.Cause {
	case policy.NodeLost:
		n.book.CloseOther(ctx, end.Node, ledger.NodeFailure, end.Reason)
	case policy.NodeExcluded:
		n.book.CloseOther(ctx, end.Node, ledger.Excluded, end.Reason)
	}
}

func itoa(i int) string { return fmt.Sprint(i) }

// live returns the nodes still running.
func (j *simJob) live() []*simNode {
	var out []*simNode
	for _, n := range j.nodes {
		select {
		case <-n.done:
		default:
			if n.stop != nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// awaitRound collects round r's assignment from each of want nodes and
// returns them by node (other rounds' events are dropped) and the time of
// the last one.
func (j *simJob) awaitRound(ctx context.Context, r, want int) (map[int]Assignment, time.Time) {
	j.t.Helper()
	got := map[int]Assignment{}
	var last time.Time
	for len(got) < want {
		select {
		case <-ctx.Done():
			j.t.Fatalf("round %d: %d of %d nodes assigned: %v", r, len(got), want, ctx.Err())
		case ev := <-j.events:
			if ev.err != nil {
				j.t.Fatalf("node %d: %v", ev.node, ev.err)
			}
			if ev.asg.Round != r {
				continue
			}
			got[ev.node] = ev.asg
			last = ev.at
		}
	}
	return got, last
}

// checkRound asserts one consistent assignment: every node in the same
// round, each active group rank once, the standbys counted.
func (j *simJob) checkRound(as map[int]Assignment, spares int) {
	j.t.Helper()
	list := make([]Assignment, 0, len(as))
	standby := 0
	for _, a := range as {
		list = append(list, a)
		if a.Standby {
			standby++
		}
	}
	checkConsistent(j.t, list, j.cfg.nproc, j.cfg.nodes)
	if standby != spares {
		j.t.Fatalf("round %d: %d standbys, want %d", list[0].Round, standby, spares)
	}
}

// phase is one measured step of a job.
type phase struct {
	name  string
	took  time.Duration // trigger -> last node assigned (bookkeeping done)
	load  loadSnap
	round int
	// fromOpen is the time from the round's opening (the end record of
	// the previous round) to the last node assigned.
	fromOpen time.Duration
}

// sinceOpened is last minus the opening time the assignments carry.
func sinceOpened(as map[int]Assignment, last time.Time) time.Duration {
	for _, a := range as {
		if !a.OpenedAt.IsZero() {
			return last.Sub(a.OpenedAt)
		}
	}
	return 0
}

// firstRound runs every node's loop and waits for round 0.
func (j *simJob) firstRound(ctx context.Context) (phase, map[int]Assignment) {
	before := j.load.snap()
	t0 := time.Now()
	j.runAll(ctx)
	as, last := j.awaitRound(ctx, 0, len(j.nodes))
	j.checkRound(as, j.cfg.spares)
	return phase{name: "first round", took: last.Sub(t0), load: j.load.snap().since(before), round: 0}, as
}

// rankFailure crashes a rank on the active node with group rank 1 in round
// r and waits for round r+1 on every live node.
func (j *simJob) rankFailure(ctx context.Context, name string, r int, as map[int]Assignment) (phase, map[int]Assignment) {
	victim := nodeWithRank(as, 1)
	before := j.load.snap()
	t0 := time.Now()
	j.nodes[victim].crash <- struct{}{}
	live := j.live()
	nas, last := j.awaitRound(ctx, r+1, len(live))
	j.checkRound(nas, len(live)-j.cfg.nodes)
	if nas[victim].GroupRank != 1 {
		j.t.Fatalf("round %d: the node that crashed has group rank %d, want 1 (ranks are kept)", r+1, nas[victim].GroupRank)
	}
	return phase{name: name, took: last.Sub(t0), load: j.load.snap().since(before), round: r + 1,
		fromOpen: sinceOpened(nas, last)}, nas
}

// nodeLoss kills the active node with group rank 1 in round r (Close
// revokes its lease: its keys go at once, as when a launcher dies and its
// loss is confirmed) and waits for round r+1, where a spare takes rank 1.
func (j *simJob) nodeLoss(ctx context.Context, r int, as map[int]Assignment) (phase, map[int]Assignment, string) {
	victim := nodeWithRank(as, 1)
	if j.cfg.victim != nil {
		victim = j.cfg.victim(as)
	}
	g := as[victim].GroupRank
	v := j.nodes[victim]
	before := j.load.snap()
	t0 := time.Now()
	v.stop()
	v.e.Close()
	<-v.done
	live := j.live()
	nas, last := j.awaitRound(ctx, r+1, len(live))
	j.checkRound(nas, len(live)-j.cfg.nodes)
	promoted := nodeWithRank(nas, g)
	if !as[promoted].Standby {
		j.t.Fatalf("round %d: group rank %d went to node %d, which was not a spare in round %d", r+1, g, promoted, r)
	}
	return phase{name: "swap after a node loss", took: last.Sub(t0), load: j.load.snap().since(before), round: r + 1,
		fromOpen: sinceOpened(nas, last)}, nas, v.e.NodeID()
}

func nodeWithRank(as map[int]Assignment, g int) int {
	for i, a := range as {
		if !a.Standby && a.GroupRank == g {
			return i
		}
	}
	return -1
}

// shutdown closes the job from one live node and waits for every loop.
func (j *simJob) shutdown(ctx context.Context) {
	live := j.live()
	if err := live[0].e.Shutdown(ctx, verdict.Succeeded, 0, "scale test done"); err != nil {
		j.t.Fatalf("shutdown: %v", err)
	}
	for _, n := range live {
		select {
		case <-n.done:
		case <-ctx.Done():
			j.t.Fatalf("node %d still running after the job closed", n.i)
		}
	}
}

// heapInUse is the live heap after a GC.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// TestScaleSmallJob runs the scale scenario with 100 simulated nodes and 3
// spares against the embedded etcd, asserting behaviour only: one
// consistent assignment per round, ranks kept across a restart, a spare
// swapped in for a lost node, the loss quarantined and in the ledger.
func TestScaleSmallJob(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j := newSimJob(t, []string{m.Endpoint()}, simConfig{nodes: 100, spares: 3, clients: 4})
	j.start(ctx)
	p, as := j.firstRound(ctx)
	if n := p.load["Range"].Calls; n < 100 {
		t.Fatalf("first round: %d reads, want at least one rank read per node", n)
	}
	// A round that changes no rank (a restart) or a few (a swap) is read
	// from the summary's delta: the closer's few reads, not one per node.
	p, as = j.rankFailure(ctx, "restart after a rank crash", 0, as)
	if n := p.load["Range"].Calls; n > 20 {
		t.Fatalf("restart round: %d reads, want the rank entries from the summary's delta (at most 20)", n)
	}
	// The nodes follow the round's assignment and closer keys on their one
	// ctl watch: no watch is opened per node and round (the closer's own
	// member watch and the three loss watchers' are a few).
	if n := p.load["Watch"].Calls; n > 20 {
		t.Fatalf("restart round: %d watch requests, want no watch per node and round (at most 20)", n)
	}
	p, as, lost := j.nodeLoss(ctx, 1, as)
	if n := p.load["Range"].Calls; n > 20 {
		t.Fatalf("swap round: %d reads, want the rank entries from the summary's delta (at most 20)", n)
	}
	for r := 2; r < 6; r++ {
		_, as = j.rankFailure(ctx, "restart after the swap", r, as)
	}
	j.checkLedger(ctx, lost)
	j.checkOldRoundsGone(ctx, 6)
	j.shutdown(ctx)
	if n := j.ledgerE.Load(); n > 0 {
		t.Fatalf("%d ledger writes failed", n)
	}
}

// TestScaleSmallJobRelays: the same job with relays (one per 16 nodes),
// and the node lost is a relay: every round closes, the relays register
// their members (one txn for several), and the lost relay's members
// register directly from then on.
func TestScaleSmallJobRelays(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const g = 16
	var lostRelay int
	j := newSimJob(t, []string{m.Endpoint()}, simConfig{nodes: 100, spares: 3, clients: 4, relayGroup: g,
		victim: func(as map[int]Assignment) int {
			for i := 0; i < 96; i += g { // an active relay of 15 members
				if a, ok := as[i]; ok && !a.Standby {
					lostRelay = i
					return i
				}
			}
			t.Fatal("no active relay to lose")
			return -1
		}})
	j.start(ctx)
	st0 := j.relayStats()
	_, as := j.firstRound(ctx)
	st := j.relayStats()
	// 7 relays, 96 members; a first round also reads their ranks. (A
	// member slow enough to miss the round, or its relay's handshake, on a
	// loaded machine registers itself; one that joins again registers
	// twice, harmlessly: the counts are not exact.)
	if st.Registered-st0.Registered == 0 || st.Ranks-st0.Ranks == 0 {
		t.Fatalf("first round: relay stats %+v; want members registered and their ranks read through their relays", st)
	}
	if st.RegisterTxns >= st.Registered {
		t.Fatalf("relay stats %+v: no batch held more than one member", st)
	}
	_, as = j.rankFailure(ctx, "restart after a rank crash", 0, as)
	_, as, lost := j.nodeLoss(ctx, 1, as)
	before := j.relayStats()
	for r := 2; r < 5; r++ {
		_, as = j.rankFailure(ctx, "restart after the swap", r, as)
	}
	after := j.relayStats()
	// Each of those rounds closed with every live node (awaitRound): the
	// lost relay's 15 members registered directly, the other six relays
	// still registered theirs.
	if n := after.Registered - before.Registered; n == 0 {
		t.Fatalf("after relay %d was lost: no registration through the other relays in 3 rounds", lostRelay)
	}
	// The lost relay's members read its loss in the swap round's end
	// record and dropped it (its node is quarantined).
	for k := lostRelay + 1; k < lostRelay+g; k++ {
		if c := j.nodes[k].e.parts.relay; c == nil || !c.isGone() {
			t.Fatalf("node %d, a member of lost relay %d, still asks it", k, lostRelay)
		}
	}
	for k := lostRelay + g; k < 96; k += g {
		if c := j.nodes[k+1].e.parts.relay; c == nil || c.isGone() {
			t.Fatalf("node %d, a member of relay %d (not lost), dropped it", k+1, k)
		}
	}
	j.checkLedger(ctx, lost)
	j.shutdown(ctx)
	if n := j.ledgerE.Load(); n > 0 {
		t.Fatalf("%d ledger writes failed", n)
	}
}

// checkLedger asserts the job's ledger after the swap: the lost node's
// Active lease ended with NodeFailure, exactly one Spare lease ended with
// Swap, and the lost node's address is quarantined.
func (j *simJob) checkLedger(ctx context.Context, lost string) {
	j.t.Helper()
	recs, _, err := j.live()[0].e.LedgerStore().(interface { // a live node's: the lost one may be node 0
		List(context.Context) ([]ledger.Record, int64, error)
	}).List(ctx)
	if err != nil {
		j.t.Fatal(err)
	}
	var lostEnded, swaps, actives int
	for _, r := range recs {
		switch {
		case r.Node == lost && r.Role == ledger.Active:
			if r.Reason != ledger.NodeFailure || r.ClosedBy == "" {
				j.t.Fatalf("the lost node's lease: %+v", r)
			}
			lostEnded++
		case r.Role == ledger.Spare && r.Reason == ledger.Swap:
			swaps++
		case r.Role == ledger.Active && r.Open():
			actives++
		}
	}
	if lostEnded != 1 || swaps != 1 || actives != j.cfg.nodes {
		j.t.Fatalf("ledger: %d lost leases ended, %d swaps, %d open Active leases; want 1, 1, %d", lostEnded, swaps, actives, j.cfg.nodes)
	}
	q, err := j.nodes[0].e.round(0).quarantinedAddrs(ctx)
	if err != nil {
		j.t.Fatal(err)
	}
	if len(q) != 1 || !q[nodeAddr(lost)] {
		j.t.Fatalf("quarantined %v, want only %s", q, nodeAddr(lost))
	}
	recorded := 0
	for _, n := range j.live() {
		n.mu.Lock()
		if len(n.quarantined) == 1 && n.quarantined[0] == lost {
			recorded++
		}
		n.mu.Unlock()
	}
	if recorded != j.cfg.nodes-1 { // the survivors that were active
		j.t.Fatalf("%d nodes recorded the loss of %s in their verdict, want %d", recorded, lost, j.cfg.nodes-1)
	}
}

// checkOldRoundsGone asserts that after round r closed only rounds r-1,
// r and r+1 (spares register early) have keys: a long job keeps O(nodes)
// keys, not O(nodes x rounds).
func (j *simJob) checkOldRoundsGone(ctx context.Context, r int) {
	j.t.Helper()
	k := j.nodes[0].e.k
	seen := map[int]int{}
	// The rounds' own keys, and their assignment and closer keys under ctl/.
	for _, dir := range []string{k.base + "rounds/", k.ctlRounds()} {
		resp, err := j.clients[0].Get(ctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			j.t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			rest := strings.TrimPrefix(string(kv.Key), dir)
			n, err := strconv.Atoi(rest[:strings.IndexByte(rest, '/')])
			if err != nil {
				j.t.Fatalf("unexpected key %s", kv.Key)
			}
			seen[n]++
		}
	}
	for n := range seen {
		if n < r-1 {
			j.t.Fatalf("after round %d closed, round %d still has %d keys (rounds with keys: %v)", r, n, seen[n], seen)
		}
	}
}

// embeddedCluster starts members embedded etcd servers in this process
// (1, or 3 forming one cluster) and returns their client URLs.
func embeddedCluster(t testing.TB, members int) []string {
	t.Helper()
	if members == 1 {
		return []string{startEmbedded(t).Endpoint()}
	}
	peers := make([]string, members)
	var cluster []string
	for i := range peers {
		p, err := FreePort("127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		peers[i] = fmt.Sprintf("http://127.0.0.1:%d", p)
		cluster = append(cluster, fmt.Sprintf("m%d=%s", i, peers[i]))
	}
	eps := make([]string, members)
	errs := make([]error, members)
	var wg sync.WaitGroup
	for i := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			s, err := etcdserver.Start(ctx, etcdserver.Options{Dir: t.TempDir(), ClientURL: "http://127.0.0.1:0", PeerURL: peers[i],
				Name: fmt.Sprintf("m%d", i), InitialCluster: strings.Join(cluster, ","), ClusterToken: "scale", Logger: testLogger(t)})
			if err != nil {
				errs[i] = err
				return
			}
			t.Cleanup(func() { s.Close() })
			eps[i] = s.Endpoint()
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("start embedded member: %v", err)
		}
	}
	return eps
}

// dbSize is the etcd backend size reported by the first endpoint.
func dbSize(ctx context.Context, cli *clientv3.Client, ep string) int64 {
	u, err := url.Parse(ep)
	if err == nil && u.Host != "" {
		ep = u.Host
	}
	st, err := cli.Status(ctx, ep)
	if err != nil {
		return -1
	}
	return st.DbSize
}

// warnHandler passes the simulated nodes' warnings and errors to the
// test's log and drops the rest unformatted.
type warnHandler struct {
	t     testing.TB
	attrs []slog.Attr
}

func (h warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (h warnHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	for _, a := range h.attrs {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
	}
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.t.Logf("node %s: %s%s", r.Level, r.Message, b.String())
	return nil
}
func (h warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return warnHandler{t: h.t, attrs: append(slices.Clip(h.attrs), as...)}
}
func (h warnHandler) WithGroup(string) slog.Handler { return h }

// serverMetrics sums the etcd server's Prometheus metrics named in
// FTL_SCALE_METRICS (comma list) over their label sets, read from
// <endpoint>/metrics; nil when none are asked for or the read fails.
func serverMetrics(ep string) map[string]float64 {
	names := strings.Split(os.Getenv("FTL_SCALE_METRICS"), ",")
	if names[0] == "" {
		return nil
	}
	resp, err := http.Get(strings.TrimSuffix(ep, "/") + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 || strings.HasPrefix(f[0], "#") {
			continue
		}
		name, _, _ := strings.Cut(f[0], "{")
		if slices.Contains(names, name) {
			v, _ := strconv.ParseFloat(f[1], 64)
			out[name] += v
		}
	}
	return out
}

// metricsDelta is "name=after-before ..." in the order asked for.
func metricsDelta(before, after map[string]float64) string {
	if after == nil {
		return ""
	}
	var b strings.Builder
	for _, name := range strings.Split(os.Getenv("FTL_SCALE_METRICS"), ",") {
		fmt.Fprintf(&b, " %s=%.4g", name, after[name]-before[name])
	}
	return "; etcd metrics:" + b.String()
}

// TestScaleMeasure is the opt-in scale measurement (FTL_SCALE_BENCH=1):
// for each server kind and node count it runs FTL_SCALE_REPS jobs (first
// round, restart after a rank crash, swap after a node loss, restart
// again) and prints, per phase, the p50 and worst time, the etcd requests
// and bytes, and the memory per simulated node. See docs/benchmarks.md.
//
//	FTL_SCALE_BENCH=1 FTL_SCALE_NODES=100,1000,4000 FTL_SCALE_SERVERS=embedded1,embedded3,debian \
//	  [FTL_SCALE_DEBIAN_FLAGS="--experimental-backend-bbolt-freelist-type=map"] \
//	  [FTL_SCALE_METRICS=etcd_debugging_mvcc_slow_watcher_total,etcd_disk_backend_commit_duration_seconds_sum] \
//	  FTL_SCALE_REPS=5 go test -count=1 -run TestScaleMeasure -v -timeout 60m ./rendezvous/
func TestScaleMeasure(t *testing.T) {
	scaleBenchOnly(t)
	nodes := envInts(t, "FTL_SCALE_NODES", "100,1000,4000")
	reps := envInts(t, "FTL_SCALE_REPS", "5")[0]
	servers := strings.Split(envOr("FTL_SCALE_SERVERS", "embedded1,embedded3,debian"), ",")
	for _, srv := range servers {
		t.Run(srv, func(t *testing.T) {
			var eps []string
			serverPid := 0 // an etcd out of this process, whose CPU time counts too
			switch srv {
			case "embedded1":
				eps = embeddedCluster(t, 1)
			case "embedded3":
				eps = embeddedCluster(t, 3)
			case "debian":
				// FTL_SCALE_DEBIAN_FLAGS: extra etcd flags, e.g.
				// --experimental-backend-bbolt-freelist-type=map.
				p := startEtcdProcWith(t, "http", strings.Fields(os.Getenv("FTL_SCALE_DEBIAN_FLAGS"))...)
				eps, serverPid = []string{p.clientURL}, p.cmd.Process.Pid
			default:
				t.Fatalf("FTL_SCALE_SERVERS: unknown server %q (embedded1, embedded3, debian)", srv)
			}
			for _, n := range nodes {
				t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) { measureScale(t, eps, serverPid, n, reps) })
			}
		})
	}
}

// scaleRow is one phase of one rep.
type scaleRow struct {
	took, fromOpen, cpu time.Duration
	srvCPU              time.Duration
	reqs, sentB, recvB  int64
	load                loadSnap
}

func measureScale(t *testing.T, eps []string, serverPid, n, reps int) {
	spares := max(2, n/200)
	// FTL_SCALE_LEASE_TTL (seconds) lengthens the leases where a loaded
	// machine answers renewals later than the default 6 s TTL.
	leaseTTL := time.Duration(envInts(t, "FTL_SCALE_LEASE_TTL", "6")[0]) * time.Second
	// FTL_SCALE_RELAY (nodes per relay, default 0: none) runs the job with
	// the two-level join (relay.go).
	relayGroup := 0
	if v := os.Getenv("FTL_SCALE_RELAY"); v != "" {
		relayGroup = envInts(t, "FTL_SCALE_RELAY", "")[0]
	}
	names := []string{"start (NewEtcd)", "first round", "restart after a rank crash", "swap after a node loss", "restart after the swap"}
	rows := map[string][]scaleRow{}
	var heapPer, heapRoundPer []float64
	var goPer []float64
	var dbGrowth []int64
	// FTL_SCALE_IDLE (seconds, default 10): after the rounds, how long the
	// lease renewals alone are counted (no round going on).
	idle := time.Duration(envInts(t, "FTL_SCALE_IDLE", "10")[0]) * time.Second
	var idleRate, idleCPU []float64
	for rep := range reps {
		func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			h0, g0 := heapInUse(), runtime.NumGoroutine()
			j := newSimJob(t, eps, simConfig{nodes: n, spares: spares, clients: 8, leaseTTL: leaseTTL, relayGroup: relayGroup})
			snap0 := j.load.snap()
			took := j.start(ctx)
			st := j.load.snap().since(snap0)
			r, s, rc := st.totals()
			rows[names[0]] = append(rows[names[0]], scaleRow{took: took, reqs: r, sentB: s, recvB: rc, load: st})
			h1, g1 := heapInUse(), runtime.NumGoroutine()
			heapPer = append(heapPer, float64(h1-h0)/float64(n+spares))
			goPer = append(goPer, float64(g1-g0)/float64(n+spares))
			db0 := dbSize(ctx, j.clients[0], eps[0])
			cpu0, srv0 := cpuTime(serverPid), procCPU(serverPid)
			met0 := serverMetrics(eps[0])
			lease0 := leaseSnapOf(t, j.met)
			relay0 := j.relayStats()
			add := func(p phase, as map[int]Assignment) {
				r, s, rc := p.load.totals()
				cpu1, srv1 := cpuTime(serverPid), procCPU(serverPid)
				met1 := serverMetrics(eps[0])
				lease1 := leaseSnapOf(t, j.met)
				t.Logf("rep %d %s: %s", rep, p.name, lease1.since(lease0))
				if relayGroup > 0 {
					relay1 := j.relayStats()
					t.Logf("rep %d %s: relays: %d registered in %d txns, %d ranks read in %d txns, %d requests declined (done directly), %d connections opened", rep, p.name,
						relay1.Registered-relay0.Registered, relay1.RegisterTxns-relay0.RegisterTxns, relay1.Ranks-relay0.Ranks,
						relay1.RankTxns-relay0.RankTxns, relay1.Declined-relay0.Declined, relay1.Conns-relay0.Conns)
					relay0 = relay1
				}
				defer func() { met0, lease0 = met1, lease1 }()
				row := scaleRow{took: p.took, reqs: r, sentB: s, recvB: rc, load: p.load, cpu: cpu1 - cpu0, srvCPU: srv1 - srv0}
				cpu0, srv0 = cpu1, srv1
				row.fromOpen = p.fromOpen
				rows[p.name] = append(rows[p.name], row)
				t.Logf("rep %d %s: %v, CPU %v (etcd process %v), %d requests, %s out, %s in;%s%s", rep, p.name, p.took.Round(time.Millisecond),
					row.cpu.Round(time.Millisecond), row.srvCPU.Round(time.Millisecond), r, kib(s), kib(rc), p.load, metricsDelta(met0, met1))
			}
			var real *realLauncher
			if bin := os.Getenv("FTL_SCALE_LAUNCHER"); bin != "" && rep == 0 {
				real = startRealLauncher(t, bin, eps[0], j.run, n, spares)
			}
			// FTL_SCALE_PROFILE (a folder): a CPU profile of each phase.
			prof := func(name string) func() {
				dir := os.Getenv("FTL_SCALE_PROFILE")
				if dir == "" {
					return func() {}
				}
				f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%d-%d-%s.prof", n, rep, strings.ReplaceAll(name, " ", "-"))))
				if err != nil {
					t.Fatalf("FTL_SCALE_PROFILE: %v", err)
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					t.Fatalf("FTL_SCALE_PROFILE: %v", err)
				}
				return func() { pprof.StopCPUProfile(); f.Close() }
			}
			stop := prof(names[1])
			p, as := j.firstRound(ctx)
			stop()
			add(p, as)
			real.sample("after round 0")
			h2 := heapInUse()
			heapRoundPer = append(heapRoundPer, float64(h2-h0)/float64(n+spares))
			stop = prof(names[2])
			p, as = j.rankFailure(ctx, names[2], 0, as)
			stop()
			add(p, as)
			var lost string
			stop = prof(names[3])
			p, as, lost = j.nodeLoss(ctx, 1, as)
			stop()
			add(p, as)
			stop = prof(names[4])
			p, as = j.rankFailure(ctx, names[4], 2, as)
			stop()
			add(p, as)
			real.sample("after the swap and a restart")
			if idle > 0 {
				s0, c0 := j.load.snap(), cpuTime(serverPid)
				time.Sleep(idle)
				ka := j.load.snap().since(s0)["LeaseKeepAlive"]
				cpu := (cpuTime(serverPid) - c0).Seconds() / idle.Seconds()
				idleRate = append(idleRate, float64(ka.Calls)/idle.Seconds())
				idleCPU = append(idleCPU, cpu)
				t.Logf("rep %d idle %v: %d lease renewals (%.0f/s, %.2f per node per second; %s out, %s in), CPU %.2f s/s",
					rep, idle, ka.Calls, float64(ka.Calls)/idle.Seconds(), float64(ka.Calls)/idle.Seconds()/float64(n+spares),
					kib(ka.SentB), kib(ka.RecvB), cpu)
			}
			if n := j.ledgerE.Load(); n > 0 {
				// Each ledger write is bounded to 2 s and then skipped (the
				// ledger never holds a round): on an overloaded machine some are.
				t.Logf("rep %d: %d ledger writes failed; ledger not checked", rep, n)
			} else {
				j.checkLedger(ctx, lost)
			}
			dbGrowth = append(dbGrowth, dbSize(ctx, j.clients[0], eps[0])-db0)
			j.shutdown(ctx)
			j.closeAll()
		}()
	}
	t.Logf("uptime: %s; lease TTL %v", loadAvg(), leaseTTL)
	t.Logf("| %s | nodes %d + %d spares | heap/node %.1f KiB after start, %.1f KiB after round 0 | goroutines/node %.1f | db growth over 3 rounds %v |",
		strings.Join(eps, ","), n, spares, median(heapPer)/1024, median(heapRoundPer)/1024, median(goPer), dbGrowth)
	if len(idleRate) > 0 {
		t.Logf("| %d | idle: lease renewals | %.0f/s (%.2f per node per second) | CPU %.2f s/s |", n, median(idleRate),
			median(idleRate)/float64(n+spares), median(idleCPU))
	}
	for _, name := range names {
		rs := rows[name]
		var ds []float64
		for _, r := range rs {
			ds = append(ds, r.took.Seconds())
		}
		last := rs[len(rs)-1]
		var fo, cpu, srv []float64
		for _, r := range rs {
			fo = append(fo, r.fromOpen.Seconds())
			cpu = append(cpu, r.cpu.Seconds())
			srv = append(srv, r.srvCPU.Seconds())
		}
		t.Logf("| %d | %s | %.3f | %.3f | %.3f | %.2f (etcd %.2f) | %d | %s | %s |", n, name, median(ds), slices.Max(ds), median(fo),
			median(cpu), median(srv), last.reqs, kib(last.sentB), kib(last.recvB))
	}
}

// scaleBenchOnly skips an opt-in scale measurement unless FTL_SCALE_BENCH=1.
func scaleBenchOnly(t *testing.T) {
	t.Helper()
	testenv.SkipShort(t, "runs an etcd server")
	if os.Getenv("FTL_SCALE_BENCH") != "1" {
		// Not an environment skip: an opt-in measurement of minutes, not a test.
		t.Skip("opt-in measurement: set FTL_SCALE_BENCH=1 (docs/benchmarks.md)")
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInts(t testing.TB, k, def string) []int {
	var out []int
	for _, f := range strings.Split(envOr(k, def), ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			t.Fatalf("%s: %q is not a list of positive integers", k, os.Getenv(k))
		}
		out = append(out, v)
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// realLauncher is one real ft-launcher process joining the simulated job
// as an extra spare (FTL_SCALE_LAUNCHER=path): its memory is that of a
// launcher in a job of that size. It binds 127.0.0.2, so it sorts after
// the simulated nodes (127.0.0.1) and stays a spare; it runs no ranks.
type realLauncher struct {
	t   testing.TB
	cmd *exec.Cmd
}

func startRealLauncher(t testing.TB, bin, ep, run string, n, spares int) *realLauncher {
	t.Helper()
	u, err := url.Parse(ep)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--rdzv-backend", "etcd", "--rdzv-endpoint", u.Host, "--rdzv-id", run,
		"--nnodes", fmt.Sprintf("%d:%d", n, n+spares), "--nproc-per-node", "8", "--max-restarts", "1000",
		"--local-addr", "127.0.0.2", "--log-dir", t.TempDir(), "--no-python", "/bin/sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	// It registers in round 0 before the simulated nodes join (it sorts
	// last either way: this only keeps it from arriving after the round
	// closed, as a standby of round 1).
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{u.Host}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	defer cli.Close()
	key := runKeys{base: "/ft-launcher/" + run + "/"}.gen(0).member(0, fmt.Sprintf("127.0.0.2/%d", cmd.Process.Pid))
	settle(t, "the real launcher registered in round 0", func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if resp, err := cli.Get(ctx, key, clientv3.WithCountOnly()); err != nil || resp.Count == 0 {
			return fmt.Sprintf("no key %s (err %v)", key, err)
		}
		return ""
	})
	return &realLauncher{t: t, cmd: cmd}
}

// sample logs the launcher's resident memory now and at its peak.
func (l *realLauncher) sample(when string) {
	if l == nil {
		return
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", l.cmd.Process.Pid))
	if err != nil {
		l.t.Logf("real launcher %s: %v", when, err)
		return
	}
	var rss, hwm string
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			rss = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			hwm = strings.TrimSpace(v)
		}
	}
	l.t.Logf("real launcher %s: VmRSS %s, VmHWM %s", when, rss, hwm)
}

// cpuTime is the CPU time (user and system) of this process, plus that of
// process pid when it is not 0 (an etcd server out of process): the work a
// phase costs, which unlike its duration does not depend on the machine's
// load.
func cpuTime(pid int) time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) + procCPU(pid)
}

// procCPU is the CPU time of process pid (0: none).
func procCPU(pid int) time.Duration {
	var d time.Duration
	if pid != 0 {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
			// Fields after the command name: state is field 3, utime 14, stime 15 (clock ticks, 100/s).
			f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
			if len(f) > 12 {
				u, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				d += time.Duration(u+st) * 10 * time.Millisecond
			}
		}
	}
	return d
}

// leaseSnap is the simulated nodes' lease renewals so far, from their
// shared metrics: how many were answered, how many late, how close to the
// fence, how many failed.
type leaseSnap struct {
	renewals, over250ms, overSecond uint64 // answered; round trip over 0.256 s, over 1.024 s
	headroom                        []bucket
	failures                        float64 // every reason
}

// bucket is a histogram bucket: its upper bound and cumulative count.
type bucket struct {
	le float64
	n  uint64
}

func leaseSnapOf(t testing.TB, m *metrics.Metrics) leaseSnap {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var s leaseSnap
	for _, mf := range mfs {
		switch mf.GetName() {
		case "ftlauncher_lease_renewal_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			s.renewals = h.GetSampleCount()
			for _, b := range h.GetBucket() {
				switch b.GetUpperBound() {
				case 0.256:
					s.over250ms = s.renewals - b.GetCumulativeCount()
				case 1.024:
					s.overSecond = s.renewals - b.GetCumulativeCount()
				}
			}
		case "ftlauncher_lease_fence_headroom_seconds":
			h := mf.GetMetric()[0].GetHistogram()
			for _, b := range h.GetBucket() {
				s.headroom = append(s.headroom, bucket{b.GetUpperBound(), b.GetCumulativeCount()})
			}
			s.headroom = append(s.headroom, bucket{math.Inf(1), h.GetSampleCount()})
		case "ftlauncher_lease_renewal_failures_total":
			for _, c := range mf.GetMetric() {
				s.failures += c.GetCounter().GetValue()
			}
		}
	}
	return s
}

// since describes the renewals between before and s: the least headroom
// is the smallest bucket bound that gained a sample.
func (s leaseSnap) since(before leaseSnap) string {
	was := func(i int) uint64 {
		if i < len(before.headroom) {
			return before.headroom[i].n
		}
		return 0
	}
	least, n := "none", uint64(0)
	for i, b := range s.headroom {
		if b.n > was(i) {
			least = fmt.Sprintf("<= %g s", b.le)
			break
		}
	}
	if last := len(s.headroom) - 1; last >= 0 { // the +Inf bucket: every sample
		n = s.headroom[last].n - was(last)
	}
	return fmt.Sprintf("lease renewals: %d answered, %d took over 0.256 s, %d over 1.024 s; least headroom before the fence %s (of %d observed); %v failed",
		s.renewals-before.renewals, s.over250ms-before.over250ms, s.overSecond-before.overSecond, least, n, s.failures-before.failures)
}

// relayStats sums the job's relays' counts.
func (j *simJob) relayStats() relayStats {
	var t relayStats
	for _, n := range j.nodes {
		if n == nil || n.e.relay == nil {
			continue
		}
		st := n.e.relay.statsNow()
		t.Registered += st.Registered
		t.RegisterTxns += st.RegisterTxns
		t.Ranks += st.Ranks
		t.RankTxns += st.RankTxns
		t.Declined += st.Declined
		t.Refused += st.Refused
		t.Conns += st.Conns
	}
	return t
}

// pipeNet is an in-memory network of relay listeners (net.Pipe), by name.
type pipeNet struct {
	mu sync.Mutex
	ls map[string]*pipeListener
}

func (p *pipeNet) listen(name string) net.Listener {
	l := &pipeListener{name: name, conns: make(chan net.Conn), done: make(chan struct{})}
	p.mu.Lock()
	p.ls[name] = l
	p.mu.Unlock()
	return l
}

func (p *pipeNet) dial(ctx context.Context, addr string) (net.Conn, error) {
	p.mu.Lock()
	l := p.ls[addr]
	p.mu.Unlock()
	if l == nil {
		return nil, fmt.Errorf("pipe %s: no such listener", addr)
	}
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, fmt.Errorf("pipe %s: closed", addr)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

type pipeListener struct {
	name  string
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr(l.name) }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }
