package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// round is this node's part in one round of the job, as etcd's
// concurrency.Election is a session's part in one election: it is made from
// what every round shares (roundParts: the session, the control view, the
// client and the generation's keys) and the round's number, and owns the
// round's life as seen from this node: the join (register, then wait for
// the assignment, closing the round itself when it wins the closer key:
// closer.go), the checks of a round that waits (fixed.go, and orphan.go for
// the round before) and the end (decide.go: the one fenced txn that ends
// it, for a failure, a loss or an orphaned round; loss.go).
//
// A round holds no lock and no state of its own beyond what one call
// builds: what it needs of the node's own state (the rendezvous life under
// Etcd.mu) goes through roundNode, whose methods take Etcd.mu themselves,
// so a round is never called with it held.
type round struct {
	*roundParts
	r int
	// relayed: this node's registration in r went through its relay.
	relayed bool
}

// roundParts are what every round of a node shares, fixed once the node
// joined its job generation.
type roundParts struct {
	cli    *clientv3.Client
	k      keys
	gen    int
	genCmp clientv3.Cmp // fences a write on the node's generation still being current
	o      EtcdOptions
	log    *slog.Logger
	sess   *session
	view   *ctlView
	loss   *lossDetector
	node   roundNode
	relay  *relayClient // this node's relay (relay.go); nil registers directly
}

// roundNode is what a round asks of the node that made it (Etcd implements
// it; each method takes Etcd.mu itself).
type roundNode interface {
	// registered: the node is registered in round r and waits for it.
	registered(r int)
	// loadCtl re-reads the job's control records (a closer that suspects
	// its ctl watch is behind); it returns the revision it read at.
	loadCtl(ctx context.Context) (int64, error)
	// jobConfig is the job's configuration (its restart budget) as the
	// node knows it.
	jobConfig() jobConfig
}

// round makes this node's round r (after start).
func (e *Etcd) round(r int) *round { return &round{roundParts: e.parts, r: r} }

// at is round r of the same node (the round before, an orphan watch's).
func (rd *round) at(r int) *round { return &round{roundParts: rd.roundParts, r: r} }

// joinFacts are what the node knew of itself as it went to join a round.
type joinFacts struct {
	// deathRead: the registration checks the node's death record
	// (Etcd.needDeathRead).
	deathRead bool
	// orphan says whether and how the wait watches the round before for
	// orphanhood (Etcd.orphanWatch).
	orphan orphanPlan
}

// join registers this node in the round and waits for its assignment (the
// round's summary). retarget is true when the job moved past the round
// meanwhile (or the registration must be made again).
func (rd *round) join(ctx context.Context, f joinFacts) (sum []byte, retarget bool, err error) {
	seen, err := rd.register(ctx, f.deathRead)
	if err != nil {
		return nil, false, err
	}
	return rd.waitAssignment(ctx, seen, f.orphan)
}

// roundRead is the round's assignment and closer keys as the registration
// txn read them, and the revision to watch them from.
type roundRead struct {
	kvs   []*mvccpb.KeyValue
	rev   int64
	lease clientv3.LeaseID // the lease the membership was put under
}

// register writes rounds/<r>/nodes/<id> under the lease, fenced on the
// round not being assigned and the job not closed, and reads the round's
// assignment and closer keys in the same txn (either branch): one request
// per node and round instead of two. A fenced-out registration is not an
// error: waitAssignment reports what happened.
func (rd *round) register(ctx context.Context, deathRead bool) (roundRead, error) {
	var port int
	var err error
	if rd.o.MasterPort != nil {
		port, err = rd.o.MasterPort(rd.r)
	} else {
		port, err = FreePort(rd.o.LocalAddr)
	}
	if err != nil {
		return roundRead{}, fmt.Errorf("rendezvous: master port for round %d: %w", rd.r, err)
	}
	gossipAddr, streamAddr := rd.loss.addrs()
	mi := memberInfo{NodeID: rd.o.NodeID, Addr: rd.o.LocalAddr, InfraRank: rd.o.InfraRank,
		NProc: rd.o.NProcPerNode, MasterPort: port, GossipAddr: gossipAddr, StreamAddr: streamAddr,
		ReplicaAddr: rd.o.ReplicaAddr}
	b, _ := json.Marshal(mi)
	read := rd.roundKeysRead()
	// The node registers only if it is not quarantined and, once it has
	// had a round, not recorded dead; otherwise the Else branch reads why.
	guard := append(rd.joinGuard(), rd.nodeGuard(rd.o.NodeID, deathRead)...)
	quarantine := rd.k.quarantine(nodeAddr(rd.o.NodeID))
	why := []clientv3.Op{read, clientv3.OpGet(quarantine)}
	if deathRead {
		why = append(why, clientv3.OpGet(rd.k.dead(rd.o.NodeID), clientv3.WithCountOnly()))
	}
	put := func(lease clientv3.LeaseID) (*clientv3.TxnResponse, error) {
		then := rd.membership(rd.o.NodeID, string(b), lease)
		return rd.cli.Txn(ctx).If(guard...).Then(append(then, read)...).Else(why...).Commit()
	}
	lease := rd.sess.current()
	if seen, ok := rd.registerViaRelay(ctx, string(b), lease, deathRead); ok {
		rd.relayed = true
		rd.node.registered(rd.r)
		return seen, nil
	}
	resp, err := put(lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// We were cut off longer than the lease TTL (a partition that
		// healed): take a new lease and register with it.
		if rerr := rd.sess.replace(ctx, lease); rerr != nil {
			return roundRead{}, fmt.Errorf("rendezvous: join round %d: renew expired lease: %w", rd.r, rerr)
		}
		lease = rd.sess.current()
		resp, err = put(lease)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			// The new lease expired before etcd took the registration:
			// etcd is slower than the TTL (overloaded). Next tries again.
			err = fmt.Errorf("%w: the lease taken for it expired first (%w)", errEtcdSlow, err)
		}
	}
	if err != nil {
		return roundRead{}, fmt.Errorf("rendezvous: join round %d: %w", rd.r, err)
	}
	if !resp.Succeeded {
		if q := resp.Responses[1].GetResponseRange().GetKvs(); len(q) > 0 {
			var qi quarantineInfo
			_ = json.Unmarshal(q[0].Value, &qi)
			return roundRead{}, &QuarantineError{Addr: nodeAddr(rd.o.NodeID), Cause: qi.Cause, Reason: qi.Reason, Round: qi.Round, RecordAt: qi.At}
		}
		if len(resp.Responses) > 2 && resp.Responses[2].GetResponseRange().GetCount() > 0 {
			return roundRead{}, errDeclaredDead
		}
		rd.log.Debug("round already closed or job closed when joining", "round", rd.r)
	}
	rd.node.registered(rd.r)
	// The round keys' read is the last response of either branch.
	read0 := resp.Responses[len(resp.Responses)-1].GetResponseRange()
	if !resp.Succeeded {
		read0 = resp.Responses[0].GetResponseRange()
	}
	return roundRead{kvs: read0.GetKvs(), rev: resp.Header.Revision, lease: lease}, nil
}

// roundKeysRead reads the round's assignment and closer keys (adjacent
// keys: one op).
func (rd *round) roundKeysRead() clientv3.Op {
	return clientv3.OpGet(rd.k.assignment(rd.r), clientv3.WithRange(rd.k.closer(rd.r)+"\x00"))
}

// joinGuard is what every registration in round rd.r is fenced on: the
// round not assigned, the job not closed, the generation current.
func (rd *round) joinGuard() []clientv3.Cmp {
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0), rd.genCmp}
}

// nodeGuard is what node id's registration is fenced on besides: not
// quarantined and, with deathRead, not recorded dead.
func (rd *round) nodeGuard(id string, deathRead bool) []clientv3.Cmp {
	g := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rd.k.quarantine(nodeAddr(id))), "=", 0)}
	if deathRead {
		g = append(g, clientv3.Compare(clientv3.CreateRevision(rd.k.dead(id)), "=", 0))
	}
	return g
}

// membership is the ops that register node id in round rd.r: its member
// key under its lease, and its membership two rounds back dropped
// (certainly stale, and long jobs must not pile up keys; one round back
// may still be live).
func (rd *round) membership(id, value string, lease clientv3.LeaseID) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpPut(rd.k.member(rd.r, id), value, clientv3.WithLease(lease))}
	if rd.r >= 2 {
		ops = append(ops, clientv3.OpDelete(rd.k.member(rd.r-2, id)))
	}
	return ops
}

// errDeclaredDead: this node's registration found its death record (its
// peers declared it lost while it stalled); it must come back as a new
// incarnation first.
var errDeclaredDead = errors.New("rendezvous: this node was declared lost")

// waitAssignment waits for round r's assignment, closing the round
// itself when it wins the closer key. retarget is true when the job moved
// past r (or the watch must be re-read).
func (rd *round) waitAssignment(ctx context.Context, seen roundRead, orphan orphanPlan) (sum []byte, retarget bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	cl := &closerSlot{rd: rd}
	orphans := make(chan struct{})
	orphanWatched := false
	defer func() {
		cancel()
		cl.wait()
		if orphanWatched {
			<-orphans
		}
	}()
	// The registration read the assignment and the closer key; from there
	// the node's ctl watch (the view) follows both: no watch per node and
	// round (at 16,000 nodes each new watch started behind etcd's current
	// revision and waited for etcd to catch it up, 512 watches per 100 ms).
	for _, kv := range seen.kvs {
		if string(kv.Key) == rd.k.assignment(rd.r) {
			return kv.Value, false, nil
		}
		cl.held = true
	}
	rk0, _ := rd.view.roundKeys(rd.r)
	cl.released = rk0.released
	// Claim only while nobody holds the closer key: each claim is a write
	// (a raft round). Nodes that arrive together (a first round, a restart)
	// wait a random part of MaxNodes x 100 us first (400 ms at 4,000 nodes,
	// 500 ms at most), so that the first claim's key reaches the others'
	// watch before they claim too; and in a job of more than
	// claimCandidates nodes only about claimCandidates of them claim then
	// (claimDelay): at 16,000 nodes the first claim's key reached the others
	// too late and 11,000 claims failed, each a raft write.
	var claimC <-chan time.Time
	var ct *time.Timer
	armClaim := func(d time.Duration) {
		if ct == nil {
			ct = time.NewTimer(d)
		} else {
			ct.Reset(d)
		}
		claimC = ct.C
	}
	defer func() {
		if ct != nil {
			ct.Stop()
		}
	}()
	if !cl.held {
		armClaim(claimDelay(rd.o.NodeID, rd.o.MaxNodes))
	}
	var timers roundTimers
	defer timers.stop()
	for {
		ch, closed, cur := rd.view.snapshot()
		if closed != nil {
			return nil, false, &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
		}
		if cur > rd.r {
			return nil, true, nil
		}
		if rd.sess.current() != seen.lease {
			// The lease expired while we waited (etcd answered renewals
			// too late) and our membership went with it: register again
			// under the new one, or the round may never see MIN nodes.
			rd.log.Warn("membership lease replaced while waiting for a round; registering again", "round", rd.r)
			return nil, true, nil
		}
		if sum := rd.roundKeysChanged(wctx, seen.rev, cl); sum != nil {
			return sum, false, nil
		}
		if cur == rd.r && !timers.armed() {
			timers.arm(rd.o, rd.r)
		}
		if cur == rd.r-1 && !orphanWatched {
			// This node left round cur while it is still open (its fence,
			// or a report that found its membership gone): if every active
			// node of it did, nobody else ends it (orphan.go).
			if orphan.ok {
				orphanWatched = true
				go func() {
					defer close(orphans)
					rd.at(cur).watchOrphans(wctx, orphan)
				}()
			}
		}
		if err := cl.failed; err != nil && claimC == nil {
			// etcd refused or lost this node's claim (overloaded, a cut):
			// claim again after a pause, or a round whose claimants all
			// failed together would be left with no closer.
			cl.failed = nil
			armClaim(retryWait(err))
		}
		select {
		case <-ctx.Done():
			rd.withdraw()
			return nil, false, fmt.Errorf("rendezvous: waiting for round %d: %w", rd.r, ctx.Err())
		case <-timers.shortC():
			rd.checkShortage(wctx, &timers)
		case <-timers.joinC():
			rd.withdraw()
			return nil, false, fmt.Errorf("rendezvous: round %d did not close within %v (need %d nodes): %w", rd.r, rd.o.JoinTimeout, rd.o.MinNodes, ErrJoinTimeout)
		case <-ch:
		case <-claimC:
			claimC = nil
			if !cl.held {
				cl.try(wctx)
			}
		}
	}
}

// claimCandidates is about how many nodes of a round claim its closer key
// as soon as they registered.
const claimCandidates = 16

// claimDelay is how long a node that registered waits before it claims the
// round's closer key when nobody holds it: a random part of the spread
// (MaxNodes x 100 us, 500 ms at most) for a candidate (one node in
// MaxNodes/claimCandidates, chosen by a hash of its id: the same nodes in
// every round, spread over the job); for the others one to two spreads
// more and 500 ms (in all, one to three spreads and 500 ms): a backstop
// for a round whose candidates are all absent.
func claimDelay(nodeID string, maxNodes int) time.Duration {
	spread := min(time.Duration(maxNodes)*100*time.Microsecond, 500*time.Millisecond)
	d := rand.N(spread + 1)
	h := fnv.New32a()
	h.Write([]byte(nodeID))
	if every := maxNodes / claimCandidates; every > 1 && h.Sum32()%uint32(every) != 0 {
		d += spread + rand.N(spread+1) + 500*time.Millisecond
	}
	return d
}

// roundKeysChanged follows the round's keys in the view: it returns the
// assignment once written, and claims the closer key when its holder died:
// a deletion of the key seen since the wait began (with no holder now), or
// a key seen held that the view, as new as the registration's read (rev)
// or newer, no longer holds (a watch that broke and re-read the keys).
// A claim while somebody holds the key fails, harmlessly (a guarded txn).
func (rd *round) roundKeysChanged(ctx context.Context, rev int64, cl *closerSlot) []byte {
	rk, seen := rd.view.roundKeys(rd.r)
	if rk.assignment != nil {
		return rk.assignment
	}
	released := rk.released > cl.released && !rk.closerHeld
	cl.released = rk.released
	if seen >= rev {
		released = released || (cl.held && !rk.closerHeld)
		cl.held = rk.closerHeld
	}
	if released {
		cl.held = false
		cl.try(ctx)
	}
	return nil
}

// closerSlot runs this node's closer for one round, at most once.
type closerSlot struct {
	rd      *round
	running bool
	held    bool // the closer key was seen held (by anyone)
	// released is the view's count of the closer key's deletions last seen.
	released int
	done     chan struct{}
	// failed is the last claim's transient error (etcd unavailable or
	// overloaded), cleared when the wait re-arms the claim.
	failed error
}

// try claims the closer key and, when won, closes the round in background.
func (c *closerSlot) try(ctx context.Context) {
	if c.running {
		return
	}
	won, err := c.rd.claimCloser(ctx)
	if err != nil {
		c.rd.log.Debug("claim closer", "round", c.rd.r, "err", err)
		if transient(err) {
			c.failed = err
		}
		return
	}
	if won {
		c.running, c.done = true, make(chan struct{})
		go func() {
			defer close(c.done)
			c.rd.runCloser(ctx)
		}()
	}
}

// wait returns once the closer (if any) has stopped.
func (c *closerSlot) wait() {
	if c.running {
		<-c.done
	}
}

// readRank reads this node's rank entry; a node not listed (keyed false)
// arrived after the round closed and is a standby.
func (rd *round) readRank(ctx context.Context) (ri rankInfo, keyed bool, err error) {
	rresp, err := rd.cli.Get(ctx, rd.k.rank(rd.r, rd.o.NodeID))
	if err != nil {
		return rankInfo{}, false, fmt.Errorf("rendezvous: read rank for round %d: %w", rd.r, err)
	}
	var v []byte
	if len(rresp.Kvs) > 0 {
		v = rresp.Kvs[0].Value
	}
	return rd.decodeRank(v, len(rresp.Kvs) > 0)
}

// decodeRank is this node's rank entry from its key's value; a node with
// no entry (found false) is a standby.
func (rd *round) decodeRank(v []byte, found bool) (rankInfo, bool, error) {
	ri := rankInfo{GroupRank: -1, Standby: true}
	if !found {
		return ri, false, nil
	}
	if err := json.Unmarshal(v, &ri); err != nil {
		return rankInfo{}, false, fmt.Errorf("rendezvous: bad rank for round %d: %w", rd.r, err)
	}
	return ri, true, nil
}

// withdraw removes this node's registration in an unassigned round.
func (rd *round) withdraw() {
	ctx, cancel := context.WithTimeout(rd.sess.Lost(), 2*time.Second)
	defer cancel()
	_, _ = rd.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), "=", 0)).
		Then(clientv3.OpDelete(rd.k.member(rd.r, rd.o.NodeID))).Commit()
}
