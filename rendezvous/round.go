package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Next joins the next round and blocks until it closes. Once the job is
// closed it returns a *JobClosedError with the job's outcome (which also
// matches ErrRendezvousLost when etcd was lost).
func (e *Etcd) Next(ctx context.Context) (Assignment, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	a, err := e.next(ctx)
	return a, e.callErr(err)
}

func (e *Etcd) next(ctx context.Context) (Assignment, error) {
	e.mu.Lock()
	if closed := e.view.closedInfo(); closed != nil {
		e.mu.Unlock()
		return Assignment{}, &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
	}
	if e.state == stateClosed {
		e.mu.Unlock()
		return Assignment{}, ErrClosed
	}
	e.setStateLocked(stateJoining, "next")
	needCfg := e.cfg == nil
	e.mu.Unlock()

	if needCfg {
		if err := e.retry(ctx, e.checkConfig); err != nil {
			return Assignment{}, err
		}
	}
	if e.o.HealthCheck != nil {
		if err := e.o.HealthCheck(ctx); err != nil {
			reason := fmt.Sprintf("health check failed: %v", err)
			if lerr := e.Leave(ctx, reason); lerr != nil {
				e.log.Warn("leave after failed health check", "err", lerr)
			}
			return Assignment{}, fmt.Errorf("rendezvous: node %s kept out: %w: %w", e.o.NodeID, ErrHealthCheck, err)
		}
	}
	for {
		// Back from being declared lost (a stall, a partition): come back
		// as a new incarnation, so the old lease's expiry cannot end the
		// next round. A loss the last round's end record declared is known
		// here; one recorded only in etcd stops the registration below.
		if _, declared, need := e.deathState(); need && declared {
			if err := e.retry(ctx, func(ctx context.Context) error { return e.reincarnate(ctx, false) }); err != nil {
				return Assignment{}, err
			}
		}
		e.mu.Lock()
		target := max(e.view.round(), e.lastRound+1)
		e.mu.Unlock()
		a, retarget, err := e.joinRound(ctx, target)
		if transient(err) && sleepCtx(ctx, retryPause) {
			continue // etcd away: join again (registering twice is harmless)
		}
		// A node the job replaced or that left with evidence stays out: it
		// parks until the job ends and then exits with the job's code.
		var q *QuarantineError
		if errors.As(err, &q) {
			return Assignment{}, e.parkQuarantined(ctx, q)
		}
		if errors.Is(err, errDeclaredDead) {
			if err := e.retry(ctx, func(ctx context.Context) error { return e.reincarnate(ctx, true) }); err != nil {
				return Assignment{}, err
			}
			continue
		}
		if err != nil {
			return Assignment{}, err
		}
		if !retarget {
			return a, nil
		}
	}
}

// wantConfig is the job config this node asks for.
func (e *Etcd) wantConfig() (jobConfig, string) {
	want := jobConfig{NProcPerNode: e.o.NProcPerNode, MinNodes: e.o.MinNodes, MaxNodes: e.o.MaxNodes, MaxRestarts: e.o.MaxRestarts}
	b, _ := json.Marshal(want)
	return want, string(b)
}

// checkConfig creates the job config once, or refuses a node that differs.
// It runs in Next only when joining the generation (registerAlive, which
// creates or reads the config in its own txn) did not settle it.
func (e *Etcd) checkConfig(ctx context.Context) error {
	want, b := e.wantConfig()
	// A plain read first: every node but the first finds the config, and
	// a txn with a write branch is a raft round even when it only reads
	// (one per node: 4,000 at 4,000 nodes).
	get, err := e.cli.Get(ctx, e.k.config())
	if err != nil {
		return fmt.Errorf("rendezvous: read job config: %w", err)
	}
	kvs := get.Kvs
	created := false
	if len(kvs) == 0 {
		resp, err := e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.k.config()), "=", 0), e.genCmp()).
			Then(clientv3.OpPut(e.k.config(), b), clientv3.OpPut(e.k.round(), "0")).
			Else(clientv3.OpGet(e.k.config())).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous: write job config: %w", err)
		}
		created = resp.Succeeded
		if !created {
			kvs = resp.Responses[0].GetResponseRange().Kvs
		}
	}
	if !created && len(kvs) == 0 {
		return e.supersededErr(ctx)
	}
	return e.adoptConfig(want, created, kvs)
}

// adoptConfig takes the job's config: want when this node created it,
// else the stored one (kvs), if this node is compatible with it.
func (e *Etcd) adoptConfig(want jobConfig, created bool, kvs []*mvccpb.KeyValue) error {
	got := want
	if !created {
		if len(kvs) == 0 {
			return errors.New("rendezvous: no job config")
		}
		if err := json.Unmarshal(kvs[0].Value, &got); err != nil {
			return fmt.Errorf("rendezvous: bad job config %q: %w", kvs[0].Value, err)
		}
		if err := e.compatible(want, got); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.cfg = &got
	e.view.atLeast(0)
	e.mu.Unlock()
	return nil
}

// compatible refuses a node whose sizes differ from the job's; a different
// restart budget is only logged (the job's wins).
func (e *Etcd) compatible(want, got jobConfig) error {
	if got.NProcPerNode != want.NProcPerNode {
		return fmt.Errorf("rendezvous: node %s refused: nproc_per_node=%d but the job has nproc_per_node=%d",
			e.o.NodeID, want.NProcPerNode, got.NProcPerNode)
	}
	if got.MinNodes != want.MinNodes || got.MaxNodes != want.MaxNodes {
		return fmt.Errorf("rendezvous: node %s refused: nnodes=%d:%d but the job has nnodes=%d:%d",
			e.o.NodeID, want.MinNodes, want.MaxNodes, got.MinNodes, got.MaxNodes)
	}
	if got.MaxRestarts != want.MaxRestarts {
		e.log.Warn("max_restarts differs from the job's; using the job's", "mine", want.MaxRestarts, "job", got.MaxRestarts)
	}
	return nil
}

// joinRound registers this node in round target and waits for its
// assignment. retarget is true when the job moved past target meanwhile.
func (e *Etcd) joinRound(ctx context.Context, target int) (Assignment, bool, error) {
	start := time.Now()
	seen, err := e.register(ctx, target)
	if err != nil {
		return Assignment{}, false, err
	}
	sumRaw, retarget, err := e.waitAssignment(ctx, target, seen)
	if err != nil || retarget {
		return Assignment{}, retarget, err
	}
	var sum roundSummary
	if err := json.Unmarshal(sumRaw, &sum); err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: bad assignment for round %d: %w", target, err)
	}
	ri, err := e.roundRank(ctx, target, sum)
	if err != nil {
		return Assignment{}, false, err
	}
	a := e.adopt(target, sum, ri)
	if !a.Standby && a.GroupRank == 0 {
		a.NodeAddrs = e.roundNodeAddrs(ctx, target)
	}
	e.o.Metrics.RoundCompleted(target, a.WorldSize, time.Since(start))
	e.log.Info("rendezvous round closed", "round", target, "group_rank", a.GroupRank,
		"group_world_size", a.GroupWorldSize, "world_size", a.WorldSize, "standby", a.Standby,
		"master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort), "took", time.Since(start))
	return a, false, nil
}

// roundRead is the round's assignment and closer keys as the registration
// txn read them, and the revision to watch them from.
type roundRead struct {
	kvs   []*mvccpb.KeyValue
	rev   int64
	lease clientv3.LeaseID // the lease the membership was put under
}

// register writes rounds/<target>/nodes/<id> under the lease, fenced on the
// round not being assigned and the job not closed, and reads the round's
// assignment and closer keys in the same txn (either branch): one request
// per node and round instead of two. A fenced-out registration is not an
// error: waitAssignment reports what happened.
func (e *Etcd) register(ctx context.Context, target int) (roundRead, error) {
	var port int
	var err error
	if e.o.MasterPort != nil {
		port, err = e.o.MasterPort(target)
	} else {
		port, err = FreePort(e.o.LocalAddr)
	}
	if err != nil {
		return roundRead{}, fmt.Errorf("rendezvous: master port for round %d: %w", target, err)
	}
	gossipAddr, streamAddr := e.loss.addrs()
	mi := memberInfo{NodeID: e.o.NodeID, Addr: e.o.LocalAddr, InfraRank: e.o.InfraRank,
		NProc: e.o.NProcPerNode, MasterPort: port, GossipAddr: gossipAddr, StreamAddr: streamAddr,
		ReplicaAddr: e.o.ReplicaAddr}
	b, _ := json.Marshal(mi)
	// One read covers the assignment and the closer key (adjacent keys).
	read := clientv3.OpGet(e.k.assignment(target), clientv3.WithRange(e.k.closer(target)+"\x00"))
	// The node registers only if it is not quarantined and, once it has
	// had a round, not recorded dead; otherwise the Else branch reads why.
	quarantine := e.k.quarantine(nodeAddr(e.o.NodeID))
	guard := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.k.assignment(target)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp(),
		clientv3.Compare(clientv3.CreateRevision(quarantine), "=", 0)}
	why := []clientv3.Op{read, clientv3.OpGet(quarantine)}
	if e.needDeathRead() {
		guard = append(guard, clientv3.Compare(clientv3.CreateRevision(e.k.dead(e.o.NodeID)), "=", 0))
		why = append(why, clientv3.OpGet(e.k.dead(e.o.NodeID), clientv3.WithCountOnly()))
	}
	put := func(lease clientv3.LeaseID) (*clientv3.TxnResponse, error) {
		then := []clientv3.Op{clientv3.OpPut(e.k.member(target, e.o.NodeID), string(b), clientv3.WithLease(lease))}
		if target >= 2 {
			// Our membership two rounds back is certainly stale; drop it so
			// long jobs do not pile up keys. (One round back may still be live.)
			then = append(then, clientv3.OpDelete(e.k.member(target-2, e.o.NodeID)))
		}
		return e.cli.Txn(ctx).If(guard...).Then(append(then, read)...).Else(why...).Commit()
	}
	lease := e.sess.current()
	resp, err := put(lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// We were cut off longer than the lease TTL (a partition that
		// healed): take a new lease and register with it.
		if rerr := e.sess.replace(ctx, lease); rerr != nil {
			return roundRead{}, fmt.Errorf("rendezvous: join round %d: renew expired lease: %w", target, rerr)
		}
		lease = e.sess.current()
		resp, err = put(lease)
	}
	if err != nil {
		return roundRead{}, fmt.Errorf("rendezvous: join round %d: %w", target, err)
	}
	if !resp.Succeeded {
		if q := resp.Responses[1].GetResponseRange().GetKvs(); len(q) > 0 {
			var qi quarantineInfo
			_ = json.Unmarshal(q[0].Value, &qi)
			return roundRead{}, &QuarantineError{Addr: nodeAddr(e.o.NodeID), Cause: qi.Cause, Reason: qi.Reason, Round: qi.Round, RecordAt: qi.At}
		}
		if len(resp.Responses) > 2 && resp.Responses[2].GetResponseRange().GetCount() > 0 {
			return roundRead{}, errDeclaredDead
		}
		e.log.Debug("round already closed or job closed when joining", "round", target)
	}
	e.mu.Lock()
	e.setStateLocked(stateWaiting, "registered in round "+strconv.Itoa(target))
	e.mu.Unlock()
	// The round keys' read is the last response of either branch.
	read0 := resp.Responses[len(resp.Responses)-1].GetResponseRange()
	if !resp.Succeeded {
		read0 = resp.Responses[0].GetResponseRange()
	}
	return roundRead{kvs: read0.GetKvs(), rev: resp.Header.Revision, lease: lease}, nil
}

// errDeclaredDead: this node's registration found its death record (its
// peers declared it lost while it stalled); it must come back as a new
// incarnation first.
var errDeclaredDead = errors.New("rendezvous: this node was declared lost")

// waitAssignment waits for round target's assignment, closing the round
// itself when it wins the closer key. retarget is true when the job moved
// past target (or the watch must be re-read).
func (e *Etcd) waitAssignment(ctx context.Context, target int, seen roundRead) (sum []byte, retarget bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	cl := &closerSlot{e: e, r: target}
	orphans := make(chan struct{})
	orphanWatched := false
	defer func() {
		cancel()
		cl.wait()
		if orphanWatched {
			<-orphans
		}
	}()
	// The registration read the assignment and the closer key; one watch
	// covers both from there.
	closerHeld := false
	for _, kv := range seen.kvs {
		if string(kv.Key) == e.k.assignment(target) {
			return kv.Value, false, nil
		}
		closerHeld = true
	}
	wch := e.cli.Watch(wctx, e.k.assignment(target), clientv3.WithRange(e.k.closer(target)+"\x00"),
		clientv3.WithRev(seen.rev+1))
	// Claim only while nobody holds the closer key: each claim is a write
	// (a raft round). Nodes that arrive together (a first round) wait a
	// random part of MaxNodes x 100 us first (400 ms at 4,000 nodes, 500 ms
	// at most), so that the first claim's key reaches the others' watch
	// before they claim too. The first claim still comes about
	// spread/N after the first registrations (the earliest of N draws), and
	// a round of N nodes takes longer than that to gather them.
	var claimC <-chan time.Time
	if !closerHeld {
		spread := min(time.Duration(e.o.MaxNodes)*100*time.Microsecond, 500*time.Millisecond)
		ct := time.NewTimer(rand.N(spread + 1))
		defer ct.Stop()
		claimC = ct.C
	}
	var timers roundTimers
	defer timers.stop()
	for {
		ch, closed, cur := e.view.snapshot()
		if closed != nil {
			return nil, false, &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
		}
		if cur > target {
			return nil, true, nil
		}
		if e.sess.current() != seen.lease {
			// The lease expired while we waited (etcd answered renewals
			// too late) and our membership went with it: register again
			// under the new one, or the round may never see MIN nodes.
			e.log.Warn("membership lease replaced while waiting for a round; registering again", "round", target)
			return nil, true, nil
		}
		if cur == target && !timers.armed() {
			timers.arm(e.o, target)
		}
		if cur == target-1 && !orphanWatched {
			// This node left round cur while it is still open (its fence,
			// or a report that found its membership gone): if every active
			// node of it did, nobody else ends it (orphan.go).
			if delay, full, ok := e.orphanWatch(cur); ok {
				orphanWatched = true
				go func() {
					defer close(orphans)
					e.watchOrphans(wctx, cur, delay, full)
				}()
			}
		}
		select {
		case <-ctx.Done():
			e.withdraw(target)
			return nil, false, fmt.Errorf("rendezvous: waiting for round %d: %w", target, ctx.Err())
		case <-timers.shortC():
			e.checkShortage(wctx, target, &timers)
		case <-timers.joinC():
			e.withdraw(target)
			return nil, false, fmt.Errorf("rendezvous: round %d did not close within %v (need %d nodes): %w", target, e.o.JoinTimeout, e.o.MinNodes, ErrJoinTimeout)
		case <-ch:
		case <-claimC:
			claimC = nil
			if !cl.held {
				cl.try(wctx)
			}
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					continue
				}
				return nil, false, errors.New("rendezvous: watch closed")
			}
			if err := wr.Err(); err != nil {
				return nil, true, nil // compacted or similar: re-read from scratch
			}
			if sum := e.roundEvents(wctx, target, wr.Events, cl); sum != nil {
				return sum, false, nil
			}
		}
	}
}

// roundEvents handles the assignment/closer watch: it returns the
// assignment once written, and claims the closer key when its holder died.
func (e *Etcd) roundEvents(ctx context.Context, target int, evs []*clientv3.Event, cl *closerSlot) []byte {
	var sum []byte
	for _, ev := range evs {
		switch string(ev.Kv.Key) {
		case e.k.assignment(target):
			if ev.Type == clientv3.EventTypePut {
				sum = ev.Kv.Value
			}
		case e.k.closer(target):
			cl.held = ev.Type == clientv3.EventTypePut
			if !cl.held {
				cl.try(ctx)
			}
		}
	}
	return sum
}

// closerSlot runs this node's closer for one round, at most once.
type closerSlot struct {
	e       *Etcd
	r       int
	running bool
	held    bool // the closer key was seen held (by anyone)
	done    chan struct{}
}

// try claims the closer key and, when won, closes the round in background.
func (c *closerSlot) try(ctx context.Context) {
	if c.running {
		return
	}
	won, err := c.e.claimCloser(ctx, c.r)
	if err != nil {
		c.e.log.Debug("claim closer", "round", c.r, "err", err)
		return
	}
	if won {
		c.running, c.done = true, make(chan struct{})
		go func() {
			defer close(c.done)
			c.e.runCloser(ctx, c.r)
		}()
	}
}

// wait returns once the closer (if any) has stopped.
func (c *closerSlot) wait() {
	if c.running {
		<-c.done
	}
}

// roundRank is this node's rank entry in round target: the previous
// round's when the summary says it did not change, else read from its key.
func (e *Etcd) roundRank(ctx context.Context, target int, sum roundSummary) (rankInfo, error) {
	e.mu.Lock()
	kept, ri := sum.Delta && e.rankRound == target-1 && !slices.Contains(sum.Changed, e.o.NodeID), e.rank
	e.mu.Unlock()
	keyed := true
	if !kept {
		var err error
		if ri, keyed, err = e.readRank(ctx, target); err != nil {
			return rankInfo{}, err
		}
	}
	e.mu.Lock()
	e.rankRound, e.rank = -1, rankInfo{}
	if keyed {
		e.rankRound, e.rank = target, ri
	}
	e.mu.Unlock()
	return ri, nil
}

// readRank reads this node's rank entry; a node not listed (keyed false)
// arrived after the round closed and is a standby.
func (e *Etcd) readRank(ctx context.Context, target int) (ri rankInfo, keyed bool, err error) {
	rresp, err := e.cli.Get(ctx, e.k.rank(target, e.o.NodeID))
	if err != nil {
		return rankInfo{}, false, fmt.Errorf("rendezvous: read rank for round %d: %w", target, err)
	}
	ri = rankInfo{GroupRank: -1, Standby: true}
	if len(rresp.Kvs) == 0 {
		return ri, false, nil
	}
	if err := json.Unmarshal(rresp.Kvs[0].Value, &ri); err != nil {
		return rankInfo{}, false, fmt.Errorf("rendezvous: bad rank for round %d: %w", target, err)
	}
	return ri, true, nil
}

// adopt records the assignment of round target and, for an active node
// of a still current round, starts its loss watchers and joins gossip.
func (e *Etcd) adopt(target int, sum roundSummary, ri rankInfo) Assignment {
	e.mu.Lock()
	maxRestarts := e.o.MaxRestarts
	if e.cfg != nil {
		maxRestarts = e.cfg.MaxRestarts
	}
	prevEnd, _ := e.view.lastEnd(target - 1) // zero for round 0 or an end record not seen
	a := Assignment{OpenedAt: prevEnd.At, Detection: time.Duration(prevEnd.DetectMS * float64(time.Millisecond)), RunID: e.o.RunID, Round: target, GroupRank: ri.GroupRank, GroupWorldSize: sum.GroupWorldSize,
		RankBase: ri.RankBase, WorldSize: sum.WorldSize, MasterAddr: sum.MasterAddr, MasterPort: sum.MasterPort,
		MaxRestarts: maxRestarts, RestartsUsed: sum.RestartsUsed, Standby: ri.Standby, ReplicaRing: ri.Replicas, ReplicaFrom: ri.ReplicaFrom}
	e.lastRound = target
	e.assigned[target] = sum
	e.view.assigned(target)
	e.pruneLocked()
	if a.Standby {
		e.setStateLocked(stateStandby, "parked in round "+strconv.Itoa(target))
	} else {
		e.setStateLocked(stateActive, "assigned in round "+strconv.Itoa(target))
	}
	if e.roundStop != nil {
		e.roundStop()
	}
	rctx, rcancel := context.WithCancel(e.lost)
	e.roundStop, e.roundCtx, e.roundCtxOf = rcancel, rctx, target
	_, closed, cur := e.view.snapshot()
	stale := cur > target || closed != nil
	e.mu.Unlock()
	if !a.Standby {
		e.sess.fenceIfUnproven() // the lease is not proven valid now: fence at once (fence.go)
	}
	if stale {
		rcancel()
	} else if !a.Standby {
		if a.GroupRank < lossWatchers {
			e.wg.Add(1)
			go e.watchLoss(rctx, target, sum)
		}
		e.wg.Add(1)
		go e.loss.watchStreams(rctx, target, ri.Watch)
		e.loss.join(sum.Seeds)
	}
	return a
}

// withdraw removes this node's registration in an unassigned round.
func (e *Etcd) withdraw(r int) {
	ctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	_, _ = e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.assignment(r)), "=", 0)).
		Then(clientv3.OpDelete(e.k.member(r, e.o.NodeID))).Commit()
}
