package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
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

// withGossipKey makes c encrypt and authenticate every packet with key
// (memberlist's keyring, AES-GCM; it verifies incoming and outgoing
// packets both): a member without the key is neither heard nor answered.
// A nil key leaves gossip plain.
func withGossipKey(c *memberlist.Config, key []byte) error {
	if key == nil {
		return nil
	}
	if n := len(key); n != 16 && n != 24 && n != 32 {
		return fmt.Errorf("rendezvous: gossip key of %d bytes, want 16, 24 or 32", n)
	}
	c.SecretKey = key
	return nil
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
	if err := retry(ctx, e.log, func(ctx context.Context) (err error) {
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
	e.loss.dropEvidence(id)
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
	// memberlist binds and advertises only an IP: a host name given as
	// the local address is resolved here.
	ips, err := (Resolver{}).Resolve(e.o.LocalAddr)
	if err != nil {
		return fmt.Errorf("rendezvous: gossip address: %w", err)
	}
	return e.loss.start(ips[0], e.o.GossipPort, e.o.GossipKey)
}

// stopGossip leaves gossip (when graceful) and shuts it down.
func (e *Etcd) stopGossip(graceful bool) { e.loss.stopGossip(graceful) }

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

// memberStreamAddr is the stream listener node id's membership of round r
// names: "" when it is gone from etcd, names none, or etcd is away.
func (e *Etcd) memberStreamAddr(r int, id string) string {
	ctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.k.member(r, id))
	if err != nil || len(resp.Kvs) == 0 {
		return ""
	}
	var m memberInfo
	if json.Unmarshal(resp.Kvs[0].Value, &m) != nil {
		return ""
	}
	return m.StreamAddr
}
