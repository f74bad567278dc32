package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Gossip (SWIM via hashicorp/memberlist) confirms a silent node's loss
// (power-off, partition, a stall) within the detection bound; a launcher
// that dies while its host lives is confirmed sooner by its peers' stream
// connections (stream.go). Timings come from GossipTimings; seeds come from
// the round's assignment.
func gossipConfig(name, addr string, port int, t GossipTimings) *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.Name = name
	c.BindAddr = addr
	c.BindPort = port
	c.AdvertiseAddr = addr
	c.AdvertisePort = port
	c.ProbeInterval = t.ProbeInterval
	c.ProbeTimeout = t.ProbeTimeout
	c.SuspicionMult = t.SuspicionMult
	c.IndirectChecks = t.IndirectChecks
	c.GossipInterval = 100 * time.Millisecond
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.LogOutput = io.Discard
	return c
}

// GossipTimings are the failure detector's settings (--rdzv-conf
// gossip_probe_interval, gossip_probe_timeout, gossip_suspicion_mult,
// gossip_indirect_checks). Zero fields take the defaults.
type GossipTimings struct {
	ProbeInterval  time.Duration // each member probes one other this often (default 200ms)
	ProbeTimeout   time.Duration // a direct probe's ack wait before indirect probes (default 100ms)
	SuspicionMult  int           // suspicion lasts SuspicionMult * max(1, log10(n)) probe intervals (default 2)
	IndirectChecks int           // members asked to probe a node that missed a direct probe (0: default 3; negative: none)
}

// DefaultGossipTimings are the defaults (docs/rendezvous.md, "Detection").
var DefaultGossipTimings = GossipTimings{ProbeInterval: 200 * time.Millisecond, ProbeTimeout: 100 * time.Millisecond,
	SuspicionMult: 2, IndirectChecks: 3}

func (t *GossipTimings) defaults() {
	d := DefaultGossipTimings
	if t.ProbeInterval <= 0 {
		t.ProbeInterval = d.ProbeInterval
	}
	if t.ProbeTimeout <= 0 {
		t.ProbeTimeout = min(d.ProbeTimeout, t.ProbeInterval/2)
	}
	if t.SuspicionMult <= 0 {
		t.SuspicionMult = d.SuspicionMult
	}
	switch {
	case t.IndirectChecks == 0:
		t.IndirectChecks = d.IndirectChecks
	case t.IndirectChecks < 0:
		t.IndirectChecks = 0
	}
}

// Suspicion is how long a member of a cluster of n stays suspected before
// it is declared dead, at most (memberlist shortens it with independent
// confirmations when SuspicionMult > 2).
func (t GossipTimings) Suspicion(n int) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	d := time.Duration(float64(t.SuspicionMult) * scale * float64(t.ProbeInterval))
	if t.SuspicionMult > 2 {
		d *= 6 // memberlist's SuspicionMaxTimeoutMult: the bound without confirmations
	}
	return d
}

// Bound is the detection bound of a silent node in a cluster of n: a
// probe interval until a member probes it (each member probes one per
// interval, so with several members one comes about every interval), one
// for the failed direct and indirect probes, the suspicion, then the
// stream check (answersOnStream).
func (t GossipTimings) Bound(n int) time.Duration {
	return 2*t.ProbeInterval + t.Suspicion(n) + t.StreamCheck()
}

// StreamCheck is how long a survivor waits for the greeting of a node that
// gossip declared dead before it takes the death for true: two probe
// intervals (at least the probe timeout). A launcher that is alive but
// starved of CPU greets late; with 0.1 s a 2-node job on a busy 2-core
// machine lost a live node this way (no indirect probes or suspicion
// confirmations with one peer). A frozen or cut-off node never greets, so
// this only adds to its detection time; a dead launcher's refused dial ends
// the check at once.
func (t GossipTimings) StreamCheck() time.Duration {
	return max(t.ProbeTimeout, 2*t.ProbeInterval, 50*time.Millisecond)
}

// detectBound is how long a closer waits for a node gossip suspects: the
// rest of its suspicion, the news of its death and the stream check that
// confirms it.
func (e *Etcd) detectBound() time.Duration {
	n := 1
	e.mu.Lock()
	if e.ml != nil {
		n = e.ml.NumMembers()
	}
	e.mu.Unlock()
	return e.o.Gossip.Suspicion(n) + 2*e.o.Gossip.ProbeInterval + e.o.Gossip.StreamCheck()
}

// gossipMembers is this node's gossip view now (nil without gossip).
func (e *Etcd) gossipMembers() []*memberlist.Node {
	e.mu.Lock()
	ml := e.ml
	e.mu.Unlock()
	if ml == nil {
		return nil
	}
	return ml.Members()
}

// gossipAlive tells whether this node's gossip holds id alive again: it
// refuted its death (a higher incarnation) while the stream check waited.
func (e *Etcd) gossipAlive(id string) bool {
	for _, m := range e.gossipMembers() {
		if m.Name == id {
			return m.State == memberlist.StateAlive
		}
	}
	return false
}

// gossipSuspects are the members this node's gossip suspects now (nil
// without gossip).
func (e *Etcd) gossipSuspects() map[string]bool {
	var out map[string]bool
	for _, m := range e.gossipMembers() {
		if m.State == memberlist.StateSuspect {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.Name] = true
		}
	}
	return out
}

type gossipEvents struct{ e *Etcd }

func (g gossipEvents) NotifyJoin(n *memberlist.Node)   {}
func (g gossipEvents) NotifyUpdate(n *memberlist.Node) {}

// AckPayload and NotifyPingComplete (memberlist.PingDelegate) record each
// member's last ack: the evidence of life a loss's detection time is
// measured from.
func (g gossipEvents) AckPayload() []byte { return nil }

func (g gossipEvents) NotifyPingComplete(n *memberlist.Node, _ time.Duration, _ []byte) {
	g.e.mu.Lock()
	g.e.lastAck[n.Name] = time.Now()
	g.e.mu.Unlock()
}

// NotifyLeave fires for dead and for cleanly departed members; both end the
// round if the member was active and not done (nodeLost checks).
func (g gossipEvents) NotifyLeave(n *memberlist.Node) {
	e := g.e
	r := e.view.round()
	how := "gossip"
	if n.State == memberlist.StateLeft {
		how = "gossip: left"
	}
	e.mu.Lock()
	evidence := e.lastAck[n.Name]
	delete(e.lastAck, n.Name)
	e.mu.Unlock()
	go func() {
		if n.State != memberlist.StateLeft && e.departureExpected(r, n.Name) {
			// The job is over, or the node finished its part: peers shut
			// their gossip down as they exit, and a probe that fails then
			// is no accusation worth a warning (issue 27: four such WARN
			// lines on every clean multi-node end).
			e.log.Debug("gossip: a node departed at the end of the job", "node", n.Name, "round", r)
			return
		}
		if n.State != memberlist.StateLeft && (e.answersOnStream(r, n.Name) || e.gossipAlive(n.Name)) {
			// A dead message can be stale: a node that was cut off declares
			// everyone else dead, and its queued messages arrive when the
			// partition heals. The accused refutes it in gossip; here it
			// must not end a round.
			e.log.Warn("gossip declared a node dead, but it answers on its stream port or refuted in gossip: not lost", "node", n.Name, "round", r)
			return
		}
		if n.State != memberlist.StateLeft {
			// Gossip alone proves no death: a node cut off from us may
			// still run its ranks. Only once its lease expired at etcd is
			// it certain that it fenced itself (fence.go), so the round
			// ends then, not before (docs/rendezvous.md, "Fencing").
			if !e.awaitLeaseExpiry(r, n.Name, evidence) {
				return
			}
			how = "gossip, lease expired"
		}
		e.nodeLostAt(r, n.Name, how, evidence)
		e.markDead(n.Name)
	}()
}

// departureExpected reports whether node id leaving gossip in round r is
// part of an ending: this node is closed or knows the job closed, or etcd
// records the job's close or id's success in r (done/). A loss then ends
// no round (nodeLost requires neither), so it is only logged at debug.
func (e *Etcd) departureExpected(r int, id string) bool {
	e.mu.Lock()
	local := e.view.closedInfo() != nil || e.state == stateClosed
	e.mu.Unlock()
	if local {
		return true
	}
	ctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	resp, err := e.cli.Txn(ctx).Then(clientv3.OpGet(e.k.closed(), clientv3.WithCountOnly()),
		clientv3.OpGet(e.k.done(r, id), clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false // etcd away: judge as before
	}
	for _, x := range resp.Responses {
		if x.GetResponseRange().Count > 0 {
			return true
		}
	}
	return false
}

// awaitLeaseExpiry waits, after gossip declared node id of round r dead
// (first evidence at evidence), until its membership of r is gone from etcd
// (its lease expired, or it left): then it returns true. It returns false
// when the round ends or this node leaves it first, or when the membership
// outlives the lease TTL after the evidence (plus slack for etcd's expiry
// check): the node renewed its lease meanwhile, so it is alive to etcd
// and, fenced or not, not lost by gossip's word; its lease's expiry, if it
// comes later, is the loss watchers' (watchLoss).
func (e *Etcd) awaitLeaseExpiry(r int, id string, evidence time.Time) bool {
	e.mu.Lock()
	ctx := e.roundCtx
	if e.roundCtxOf != r || ctx == nil {
		ctx = nil
	}
	if _, seen := e.lossEvidence[id]; !seen && !evidence.IsZero() {
		e.lossEvidence[id] = evidence
	}
	e.mu.Unlock()
	if ctx == nil || ctx.Err() != nil {
		return false // not active in r (or r is over): others decide
	}
	start := evidence
	if start.IsZero() {
		start = time.Now()
	}
	wait := time.Until(start.Add(e.o.LeaseTTL + expirySlack))
	ctx, cancel := context.WithTimeout(ctx, max(wait, time.Second))
	defer cancel()
	e.log.Warn("gossip declared a node dead; waiting for its lease to expire at etcd before ending the round",
		"node", id, "round", r, "wait_at_most", max(wait, time.Second).Round(time.Millisecond))
	var resp *clientv3.GetResponse
	if err := e.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = e.cli.Get(ctx, e.k.member(r, id), clientv3.WithKeysOnly())
		return err
	}); err != nil {
		return false
	}
	if len(resp.Kvs) == 0 {
		return true
	}
	wch := e.cli.Watch(ctx, e.k.member(r, id), clientv3.WithFilterPut(), clientv3.WithRev(resp.Header.Revision+1))
	for wr := range wch {
		if wr.Err() != nil {
			return false
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return true
			}
		}
	}
	if ctx.Err() == context.DeadlineExceeded {
		e.log.Warn("gossip declared a node dead, but its lease was renewed: not lost", "node", id, "round", r)
	}
	e.mu.Lock()
	delete(e.lossEvidence, id)
	e.mu.Unlock()
	return false
}

// expirySlack is how long past a lease's TTL etcd may take to revoke it
// and delete its keys (its expiry check runs every 500 ms, then a raft
// round trip), on a loaded machine.
const expirySlack = 3 * time.Second

func (e *Etcd) startGossip() error {
	// Port 0: memberlist binds a free TCP port and its UDP twin itself,
	// trying again when the twin is taken. Picking a free port here and
	// binding it later lost races to other sockets (an outgoing
	// connection's ephemeral port): "bind: address already in use".
	port := e.o.GossipPort
	// memberlist binds and advertises only an IP: a host name given as
	// the local address is resolved here.
	ips, err := (Resolver{}).Resolve(e.o.LocalAddr)
	if err != nil {
		return fmt.Errorf("rendezvous: gossip address: %w", err)
	}
	addr := ips[0]
	if err := e.startStream(addr); err != nil {
		return fmt.Errorf("rendezvous: stream listener on %s: %w", addr, err)
	}
	c := gossipConfig(e.o.NodeID, addr, port, e.o.Gossip)
	c.Events = gossipEvents{e: e}
	c.Ping = gossipEvents{e: e}
	ml, err := memberlist.Create(c)
	if err != nil {
		return fmt.Errorf("rendezvous: start gossip on %s:%d: %w", addr, port, err)
	}
	port = int(ml.LocalNode().Port)
	e.mu.Lock()
	e.ml = ml
	e.gossipAddr = net.JoinHostPort(addr, strconv.Itoa(port))
	e.mu.Unlock()
	return nil
}

// gossipJoin contacts the round's seeds (best effort, asynchronously).
func (e *Etcd) gossipJoin(seeds []string) {
	e.mu.Lock()
	ml, self := e.ml, e.gossipAddr
	e.mu.Unlock()
	if ml == nil {
		return
	}
	others := make([]string, 0, len(seeds))
	for _, s := range seeds {
		if s != self {
			others = append(others, s)
		}
	}
	if len(others) == 0 {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if _, err := ml.Join(others); err != nil {
			e.log.Warn("gossip join", "seeds", others, "err", err)
		}
	}()
}

// stopGossip leaves (when graceful) and shuts memberlist down.
func (e *Etcd) stopGossip(graceful bool) {
	e.mu.Lock()
	ml := e.ml
	e.ml = nil
	e.mu.Unlock()
	if ml == nil {
		return
	}
	if graceful {
		_ = ml.Leave(300 * time.Millisecond)
	}
	_ = ml.Shutdown()
}

// markDead records that gossip declared node id gone, so that a restart
// round's closer (often a standby outside the gossip cluster) does not wait
// for it (see rejoinGate). The record is under our lease: it only has to
// outlive the dead node's own lease.
func (e *Etcd) markDead(id string) {
	closed := e.view.closedInfo() != nil
	if id == e.o.NodeID || closed {
		return
	}
	ctx, cancel := e.lostTimeout(5 * time.Second)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.k.dead(id), e.o.NodeID, clientv3.WithLease(e.sess.current())); err != nil {
		e.log.Debug("record gossip death", "node", id, "err", err)
	}
}

// answersOnStream reports whether node id of round r answers on the
// stream listener its membership of r names, within the probe timeout.
func (e *Etcd) answersOnStream(r int, id string) bool {
	ctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.k.member(r, id))
	if err != nil || len(resp.Kvs) == 0 {
		return false // gone from etcd, or etcd away: trust gossip
	}
	var m memberInfo
	if json.Unmarshal(resp.Kvs[0].Value, &m) != nil || m.StreamAddr == "" {
		return false
	}
	return streamAnswers(m.StreamAddr, e.o.Gossip.StreamCheck())
}
