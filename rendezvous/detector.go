package rendezvous

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// lossDetector turns the evidence that a peer is gone into loss reports. It
// owns this node's gossip member (memberlist: a member declared dead, and
// each member's last ack, the evidence of life a detection time is
// measured from), its stream listener and the stream connections it holds
// to its ring neighbours (a connection closed without a bye, then a
// refused dial), the stream probe that checks a gossip death
// (answersOnStream), and the first evidence of each loss until the loss is
// reported. What the evidence means for the job (is the node active in the
// round, did it finish, is its lease gone at etcd) it asks the rendezvous
// through lossJudge, which also carries the confirmed loss out (ends the
// round).
//
// Lock: mu guards the fields below it and is a leaf: it is never held
// while the detector calls memberlist, the network or the judge, and the
// detector takes no other lock. The façade does not call it with Etcd.mu
// held.
type lossDetector struct {
	self    string // this node's id (its gossip name)
	timings GossipTimings
	log     *slog.Logger
	judge   lossJudge
	wg      *sync.WaitGroup // the rendezvous's: its goroutines end at Close

	mu         sync.Mutex
	ml         *memberlist.Memberlist
	gossipAddr string
	stream     *streamServer
	streamAddr string
	lastAck    map[string]time.Time // last gossip ack from each member (evidence of life)
	// evidence is when gossip first declared each node dead (its last
	// ack): a loss confirmed later by its lease's expiry keeps it for the
	// record's detection time.
	evidence map[string]time.Time
	// seen are the addresses of every gossip member seen (joined or
	// updated), never forgotten; local this host's. The stream port
	// answers only them (stream.go).
	seen  map[netip.Addr]struct{}
	local []netip.Addr
}

// lossJudge is what the detector asks of the rendezvous (Etcd implements
// it): the job's facts about a suspected node, and the report of a loss.
type lossJudge interface {
	// currentCtlRound is the job's round as last seen.
	currentCtlRound() int
	// departureExpected: node id leaving in round r is part of an ending.
	departureExpected(r int, id string) bool
	// memberStreamAddr is the stream listener node id's membership of
	// round r names ("" when gone or unknown).
	memberStreamAddr(r int, id string) string
	// awaitLeaseExpiry waits until id's membership of r is gone at etcd
	// (true), or the wait is moot (false).
	awaitLeaseExpiry(r int, id string, evidence time.Time) bool
	// nodeLostAt ends round r for id's loss, if id was active in it.
	nodeLostAt(r int, id, how string, evidence time.Time)
	// markDead records id's death for later rounds' closers.
	markDead(id string)
}

func newLossDetector(self string, t GossipTimings, log *slog.Logger, judge lossJudge, wg *sync.WaitGroup) *lossDetector {
	return &lossDetector{self: self, timings: t, log: log, judge: judge, wg: wg,
		lastAck: map[string]time.Time{}, evidence: map[string]time.Time{}, seen: map[netip.Addr]struct{}{}}
}

// start opens the stream listener and joins no one yet: the gossip member
// binds addr:port (0 picks a free one). A non-nil key encrypts gossip.
func (d *lossDetector) start(addr string, port int, key []byte) error {
	if err := d.startStream(addr); err != nil {
		return fmt.Errorf("rendezvous: stream listener on %s: %w", addr, err)
	}
	c := gossipConfig(d.self, addr, port, d.timings)
	if err := withGossipKey(c, key); err != nil {
		return err
	}
	c.Events = gossipEvents{d: d}
	c.Ping = gossipEvents{d: d}
	ml, err := memberlist.Create(c)
	if err != nil {
		return fmt.Errorf("rendezvous: start gossip on %s:%d: %w", addr, port, err)
	}
	port = int(ml.LocalNode().Port)
	d.mu.Lock()
	d.ml = ml
	d.gossipAddr = net.JoinHostPort(addr, strconv.Itoa(port))
	d.mu.Unlock()
	return nil
}

// addrs are the gossip and stream addresses this node registers ("" off).
func (d *lossDetector) addrs() (gossip, stream string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gossipAddr, d.streamAddr
}

// bound is how long a closer waits for a node gossip suspects: the rest of
// its suspicion, the news of its death and the stream check that confirms
// it.
func (d *lossDetector) bound() time.Duration {
	n := 1
	d.mu.Lock()
	if d.ml != nil {
		n = d.ml.NumMembers()
	}
	d.mu.Unlock()
	return d.timings.Suspicion(n) + 2*d.timings.ProbeInterval + d.timings.StreamCheck()
}

// members is this node's gossip view now (nil without gossip).
func (d *lossDetector) members() []*memberlist.Node {
	d.mu.Lock()
	ml := d.ml
	d.mu.Unlock()
	if ml == nil {
		return nil
	}
	return ml.Members()
}

// alive tells whether this node's gossip holds id alive again: it refuted
// its death (a higher incarnation) while the stream check waited.
func (d *lossDetector) alive(id string) bool {
	for _, m := range d.members() {
		if m.Name == id {
			return m.State == memberlist.StateAlive
		}
	}
	return false
}

// suspects are the members this node's gossip suspects now (nil without
// gossip).
func (d *lossDetector) suspects() map[string]bool {
	var out map[string]bool
	for _, m := range d.members() {
		if m.State == memberlist.StateSuspect {
			if out == nil {
				out = map[string]bool{}
			}
			out[m.Name] = true
		}
	}
	return out
}

// join contacts the round's seeds (best effort, asynchronously).
func (d *lossDetector) join(seeds []string) {
	d.mu.Lock()
	ml, self := d.ml, d.gossipAddr
	d.mu.Unlock()
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
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if _, err := ml.Join(others); err != nil {
			d.log.Warn("gossip join", "seeds", others, "err", err)
		}
	}()
}

// stopGossip leaves (when graceful) and shuts memberlist down.
func (d *lossDetector) stopGossip(graceful bool) {
	d.mu.Lock()
	ml := d.ml
	d.ml = nil
	d.mu.Unlock()
	if ml == nil {
		return
	}
	if graceful {
		_ = ml.Leave(300 * time.Millisecond)
	}
	_ = ml.Shutdown()
}

// acked records an ack from member name (evidence of life).
func (d *lossDetector) acked(name string) {
	d.mu.Lock()
	d.lastAck[name] = time.Now()
	d.mu.Unlock()
}

// takeAck returns and forgets member name's last ack.
func (d *lossDetector) takeAck(name string) time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	t := d.lastAck[name]
	delete(d.lastAck, name)
	return t
}

// noteEvidence keeps t as the first evidence of id's loss unless one is
// kept already (t zero: nothing to keep).
func (d *lossDetector) noteEvidence(id string, t time.Time) {
	d.mu.Lock()
	if _, seen := d.evidence[id]; !seen && !t.IsZero() {
		d.evidence[id] = t
	}
	d.mu.Unlock()
}

// firstEvidence returns the earlier of evidence and the kept first evidence
// of id's loss; how says so when gossip saw it first and the lease's expiry
// confirmed it.
func (d *lossDetector) firstEvidence(id, how string, evidence time.Time) (string, time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if first, ok := d.evidence[id]; ok && (evidence.IsZero() || first.Before(evidence)) {
		evidence = first
		if how == "lease expired" {
			how = "gossip, lease expired"
		}
	}
	return how, evidence
}

// dropEvidence forgets id's first evidence (the loss was reported, or the
// node proved alive).
func (d *lossDetector) dropEvidence(id string) {
	d.mu.Lock()
	delete(d.evidence, id)
	d.mu.Unlock()
}

// gossipLeft judges a member that gossip declared dead or that left: it
// ends the round if the member was active and not done, unless it answers
// on its stream port, refuted in gossip, or its lease outlived the
// evidence (then it is alive to etcd).
func (d *lossDetector) gossipLeft(n *memberlist.Node) {
	r := d.judge.currentCtlRound()
	how := "gossip"
	if n.State == memberlist.StateLeft {
		how = "gossip: left"
	}
	evidence := d.takeAck(n.Name)
	go func() {
		if n.State != memberlist.StateLeft && d.judge.departureExpected(r, n.Name) {
			// The job is over, or the node finished its part: peers shut
			// their gossip down as they exit, and a probe that fails then
			// is no accusation worth a warning (it used to print four such
			// WARN lines on every clean multi-node end).
			d.log.Debug("gossip: a node departed at the end of the job", "node", n.Name, "round", r)
			return
		}
		if n.State != memberlist.StateLeft && (d.answersOnStream(r, n.Name) || d.alive(n.Name)) {
			// A dead message can be stale: a node that was cut off declares
			// everyone else dead, and its queued messages arrive when the
			// partition heals. The accused refutes it in gossip; here it
			// must not end a round.
			d.log.Warn("gossip declared a node dead, but it answers on its stream port or refuted in gossip: not lost", "node", n.Name, "round", r)
			return
		}
		if n.State != memberlist.StateLeft {
			// Gossip alone proves no death: a node cut off from us may
			// still run its ranks. Only once its lease expired at etcd is
			// it certain that it fenced itself (fence.go), so the round
			// ends then, not before (docs/rendezvous.md, "Fencing").
			d.noteEvidence(n.Name, evidence)
			if !d.judge.awaitLeaseExpiry(r, n.Name, evidence) {
				return
			}
			how = "gossip, lease expired"
		}
		d.judge.nodeLostAt(r, n.Name, how, evidence)
		d.judge.markDead(n.Name)
	}()
}

// answersOnStream reports whether node id of round r answers on the
// stream listener its membership of r names, within the stream check.
func (d *lossDetector) answersOnStream(r int, id string) bool {
	addr := d.judge.memberStreamAddr(r, id)
	if addr == "" {
		return false // gone from etcd, or etcd away: trust gossip
	}
	return streamAnswers(addr, d.timings.StreamCheck())
}

// gossipEvents are the detector's memberlist delegates.
type gossipEvents struct{ d *lossDetector }

func (g gossipEvents) NotifyJoin(n *memberlist.Node)   { g.d.sawMember(n.Addr) }
func (g gossipEvents) NotifyUpdate(n *memberlist.Node) { g.d.sawMember(n.Addr) }

// AckPayload and NotifyPingComplete (memberlist.PingDelegate) record each
// member's last ack: the evidence of life a loss's detection time is
// measured from.
func (g gossipEvents) AckPayload() []byte { return nil }

func (g gossipEvents) NotifyPingComplete(n *memberlist.Node, _ time.Duration, _ []byte) {
	g.d.acked(n.Name)
}

// NotifyLeave fires for dead and for cleanly departed members; both end the
// round if the member was active and not done (gossipLeft).
func (g gossipEvents) NotifyLeave(n *memberlist.Node) { g.d.gossipLeft(n) }
