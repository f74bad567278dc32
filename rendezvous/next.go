package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
		if err := retry(ctx, e.log, e.checkConfig); err != nil {
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
	unprovenLogged, overloadLogged := false, false
	for {
		// Back from being declared lost (a stall, a partition): come back
		// as a new incarnation, so the old lease's expiry cannot end the
		// next round. A loss the last round's end record declared is known
		// here; one recorded only in etcd stops the registration below.
		if _, declared, need := e.deathState(); need && declared {
			if err := retry(ctx, e.log, func(ctx context.Context) error { return e.reincarnate(ctx, false) }); err != nil {
				return Assignment{}, err
			}
		}
		// Back from a freeze or a cut shorter than the TTL: the lease
		// still holds, but its last renewal is older than the fence
		// deadline. Register once a renewal proves it valid again, or the
		// round this node joins fences at its assignment (session.go).
		if !e.sess.awaitProven(ctx, e.sess.renewTimeout()) && ctx.Err() == nil && !unprovenLogged {
			unprovenLogged = true // once per call: an etcd outage loops here
			e.log.Warn("joining the next round with the lease not renewed since the fence deadline: if active in it, this node fences at once",
				"waited", e.sess.renewTimeout())
		}
		e.mu.Lock()
		target := max(e.view.round(), e.lastRound+1)
		e.mu.Unlock()
		a, retarget, err := e.joinRound(ctx, target)
		if transient(err) {
			logRetry(e.log, err, &overloadLogged, "etcd unavailable; joining again")
			if sleepCtx(ctx, retryWait(err)) {
				continue // etcd away: join again (registering twice is harmless)
			}
		}
		// A node the job replaced or that left with evidence stays out: it
		// parks until the job ends and then exits with the job's code.
		var q *QuarantineError
		if errors.As(err, &q) {
			return Assignment{}, e.parkQuarantined(ctx, q)
		}
		if errors.Is(err, errDeclaredDead) {
			if err := retry(ctx, e.log, func(ctx context.Context) error { return e.reincarnate(ctx, true) }); err != nil {
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
	want := e.o.jobConfig()
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
		// Into a zero config: a field the job's config lacks (written by an
		// older launcher) is absent, not this node's.
		got = jobConfig{}
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
	if got.Layout != want.Layout {
		layout := func(l int) int { return max(l, 1) }
		return fmt.Errorf("rendezvous: node %s refused: this launcher uses key layout %d but the job was started by a launcher using key layout %d; "+
			"every node of a job must run a launcher of the same key layout (docs/rendezvous.md, Keys): restart the job with one version, or use another run id",
			e.o.NodeID, layout(want.Layout), layout(got.Layout))
	}
	if got.NProcPerNode != want.NProcPerNode {
		return fmt.Errorf("rendezvous: node %s refused: nproc_per_node=%d but the job has nproc_per_node=%d",
			e.o.NodeID, want.NProcPerNode, got.NProcPerNode)
	}
	if got.MinNodes != want.MinNodes || got.MaxNodes != want.MaxNodes {
		return fmt.Errorf("rendezvous: node %s refused: nnodes=%d:%d but the job has nnodes=%d:%d",
			e.o.NodeID, want.MinNodes, want.MaxNodes, got.MinNodes, got.MaxNodes)
	}
	if got.MaxRestarts != want.MaxRestarts || got.RestartWindowS != want.RestartWindowS || got.RestartDelayS != want.RestartDelayS {
		e.log.Warn("the restart budget differs from the job's; using the job's",
			"mine", fmt.Sprintf("max_restarts=%d window=%gs delay=%gs", want.MaxRestarts, want.RestartWindowS, want.RestartDelayS),
			"job", fmt.Sprintf("max_restarts=%d window=%gs delay=%gs", got.MaxRestarts, got.RestartWindowS, got.RestartDelayS))
	}
	return nil
}

// joinRound joins round target (round.join: it registers this node and
// waits for the round's assignment) and takes the assignment. retarget is
// true when the job moved past target meanwhile.
func (e *Etcd) joinRound(ctx context.Context, target int) (Assignment, bool, error) {
	start := time.Now()
	rd := e.round(target)
	sumRaw, retarget, err := rd.join(ctx, joinFacts{deathRead: e.needDeathRead(), orphan: e.orphanWatch(target - 1)})
	if err != nil || retarget {
		return Assignment{}, retarget, err
	}
	var sum roundSummary
	if err := json.Unmarshal(sumRaw, &sum); err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: bad assignment for round %d: %w", target, err)
	}
	ri, err := e.roundRank(ctx, rd, sum)
	if err != nil {
		return Assignment{}, false, err
	}
	a := e.adopt(target, sum, ri)
	if !a.Standby && a.GroupRank == 0 {
		a.NodeAddrs = rd.roundNodeAddrs(ctx)
	}
	e.o.Metrics.RoundCompleted(target, a.WorldSize, time.Since(start))
	attrs := []any{"round", target, "group_rank", a.GroupRank,
		"group_world_size", a.GroupWorldSize, "world_size", a.WorldSize, "standby", a.Standby,
		"master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort), "took", time.Since(start)}
	if rd.relayed {
		attrs = append(attrs, "registered_by_relay", e.o.Relay)
	}
	e.log.Info("rendezvous round closed", attrs...)
	return a, false, nil
}

// roundRank is this node's rank entry in round rd: the previous round's
// when the summary says it did not change, else read from its key.
func (e *Etcd) roundRank(ctx context.Context, rd *round, sum roundSummary) (rankInfo, error) {
	e.mu.Lock()
	kept, ri := sum.Delta && e.rankRound == rd.r-1 && !slices.Contains(sum.Changed, e.o.NodeID), e.rank
	e.mu.Unlock()
	keyed := true
	if !kept {
		var ok bool
		if ri, keyed, ok = rd.rankViaRelay(ctx); !ok {
			var err error
			if ri, keyed, err = rd.readRank(ctx); err != nil {
				return rankInfo{}, err
			}
		}
	}
	e.mu.Lock()
	e.rankRound, e.rank = -1, rankInfo{}
	if keyed {
		e.rankRound, e.rank = rd.r, ri
	}
	e.mu.Unlock()
	return ri, nil
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
		MaxRestarts: maxRestarts, RestartsUsed: sum.RestartsUsed, Standby: ri.Standby, Standbys: sum.Standbys, ReplicaRing: ri.Replicas, ReplicaFrom: ri.ReplicaFrom}
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
			go func() {
				defer e.wg.Done()
				e.round(target).watchLoss(rctx, sum)
			}()
		}
		e.wg.Add(1)
		go e.loss.watchStreams(rctx, target, ri.Watch)
		e.loss.join(sum.Seeds)
	}
	return a
}
