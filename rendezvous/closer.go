package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimCloser tries to become the node that closes round r. The closer key
// is under our lease, so a dead closer is replaced by the next claimant.
func (rd *round) claimCloser(ctx context.Context) (bool, error) {
	resp, err := rd.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rd.k.closer(rd.r)), "=", 0), rd.genCmp).
		Then(clientv3.OpPut(rd.k.closer(rd.r), rd.o.NodeID, clientv3.WithLease(rd.sess.current()))).Commit()
	if err != nil {
		return false, fmt.Errorf("claim closer of round %d: %w", rd.r, err)
	}
	return resp.Succeeded, nil
}

// closerRun is the state of one closer: its round's members as watched,
// the population view of a restart round (gate) and the timer of the
// next deadline of the round-closing rule (decideClose). It depends on its
// round alone (the client, the keys, the view, the detector's suspects),
// not on the node that made it.
type closerRun struct {
	rd      *round
	present map[string]bool
	wch     clientv3.WatchChan
	// cancelWatch ends wch (replaced at each list).
	cancelWatch context.CancelFunc
	timer       *time.Timer
	minMetAt    time.Time            // when MIN members were first present
	suspects    map[string]time.Time // first seen suspected by this node's gossip
	gate        *rejoinGate
}

// closeStep is what one attempt to close the round led to.
type closeStep int

const (
	closeWait  closeStep = iota // not yet: wait for an event
	closeRetry                  // a write failed: pause, then try again
	closeDone                   // the assignment is written
)

// runCloser counts round r's members (watch, no polling) and writes the
// assignment once round r is open and the round-closing rule (decideClose)
// says so.
func (rd *round) runCloser(ctx context.Context) {
	// The closer holds the key: giving up here would leave the round with
	// no closer until this node goes, so a failed read (etcd overloaded by
	// a whole job registering at once) is retried while the round waits.
	c := &closerRun{rd: rd, present: map[string]bool{}, suspects: map[string]time.Time{}}
	for !c.list(ctx) {
		if ctx.Err() != nil || !sleepCtx(ctx, retryPause) {
			return
		}
	}
	defer c.stop()
	for {
		ch, closed, cur := rd.view.snapshot()
		if closed != nil || cur > rd.r {
			return
		}
		step := closeWait
		if cur == rd.r && rd.r > 0 && c.gate == nil {
			// The previous round's actives are known once round r is open.
			step = c.openGate(ctx)
		}
		if cur == rd.r && step == closeWait {
			step = c.tryClose(ctx)
		}
		switch step {
		case closeDone:
			return
		case closeRetry:
			if ctx.Err() != nil || !sleepCtx(ctx, retryPause) {
				return
			}
			continue
		}
		if !c.wait(ctx, ch) {
			return
		}
	}
}

// openGate sets up the rejoin gate of restart round r.
func (c *closerRun) openGate(ctx context.Context) closeStep {
	g, err := c.rd.newRejoinGate(ctx)
	if err != nil {
		c.rd.log.Warn("closer: rejoin gate", "round", c.rd.r, "err", err)
		return closeRetry
	}
	c.gate = g
	return closeWait
}

// tryClose writes the assignment when the round-closing rule says so, and
// otherwise arms the timer for its next deadline.
func (c *closerRun) tryClose(ctx context.Context) closeStep {
	o := c.rd.o
	now := time.Now()
	n := len(c.present)
	if n >= o.MinNodes && c.minMetAt.IsZero() {
		c.minMetAt = now
	}
	in := closeInput{Min: o.MinNodes, Max: o.MaxNodes, Present: n, FirstRound: c.gate == nil, Now: now,
		Opened: now, MinMetAt: c.minMetAt, LastCall: o.LastCall, RejoinWait: o.RejoinWait, DetectBound: c.rd.loss.bound()}
	if c.gate != nil {
		in.Opened = c.gate.opened
	}
	// Below MIN the rule only waits: the population (O(n)) is not looked at
	// for each of the n registrations of a large round.
	if c.gate != nil && n >= o.MinNodes {
		in.Missing = c.gate.missing(c.present, c.rd.loss.suspects())
		for i := range in.Missing {
			p := &in.Missing[i]
			if p.State != peerSuspect {
				delete(c.suspects, p.ID)
				continue
			}
			if _, ok := c.suspects[p.ID]; !ok {
				c.suspects[p.ID] = now
			}
			p.Since = c.suspects[p.ID]
		}
	}
	d := decideClose(in)
	if d.Close {
		for _, p := range in.Missing {
			if p.PrevActive && p.State != peerDead {
				c.rd.log.Warn("closing the round without a previous active node (its wait is over)", "round", c.rd.r,
					"node", p.ID, "state", p.State.String())
			}
		}
		if err := c.rd.writeAssignment(ctx); err != nil {
			c.rd.log.Warn("closer: write assignment", "round", c.rd.r, "err", err)
			return closeRetry
		}
		c.rd.log.Debug("closer: round closes", "round", c.rd.r, "why", d.Why)
		return closeDone
	}
	c.arm(now, d.Until)
	if len(d.Waiting) > 0 {
		c.rd.log.Debug("closer: waiting", "round", c.rd.r, "why", d.Why)
	}
	return closeWait
}

// arm sets the timer for deadline until (zero: none).
func (c *closerRun) arm(now, until time.Time) {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if !until.IsZero() {
		c.timer = time.NewTimer(until.Sub(now))
	}
}

// resyncEvery bounds how long a closer trusts its watches alone while it
// waits with no deadline of the rule armed (below MIN, or its round not
// open in its view): a watch of a loaded etcd cluster that stalls or
// breaks must not hold a round whose nodes have all registered.
const resyncEvery = 2 * time.Second

// list reads round r's members (keys only) and the revision they were read
// at, takes them as the closer's view, and watches them from there; false
// when the read failed. A view that differs from what the watch had built
// is logged: the watch missed events.
func (c *closerRun) list(ctx context.Context) bool {
	rd, r := c.rd, c.rd.r
	get, err := rd.cli.Get(ctx, rd.k.nodes(r), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		rd.log.Debug("closer: list members", "round", r, "err", err)
		return false
	}
	present := make(map[string]bool, len(get.Kvs))
	for _, kv := range get.Kvs {
		present[strings.TrimPrefix(string(kv.Key), rd.k.nodes(r))] = true
	}
	if c.wch != nil && len(present) != len(c.present) {
		rd.log.Warn("closer: the members watch was behind; resynced", "round", r,
			"watched", len(c.present), "listed", len(present))
	}
	if c.cancelWatch != nil {
		c.cancelWatch()
	}
	wctx, cancel := context.WithCancel(ctx)
	c.present, c.cancelWatch = present, cancel
	c.wch = rd.cli.Watch(wctx, rd.k.nodes(r), clientv3.WithPrefix(), clientv3.WithRev(get.Header.Revision+1))
	return true
}

// resync re-lists the members and re-reads the job's round.
func (c *closerRun) resync(ctx context.Context) {
	before := c.rd.view.round()
	if _, err := c.rd.node.loadCtl(ctx); err != nil {
		c.rd.log.Debug("closer: read the job's round", "round", c.rd.r, "err", err)
	} else if after := c.rd.view.round(); after != before {
		c.rd.log.Warn("closer: the job's round watch was behind; resynced", "round", c.rd.r, "watched", before, "read", after)
	}
	c.list(ctx)
}

// wait blocks for the next event; false means the closer should stop.
func (c *closerRun) wait(ctx context.Context, changed <-chan struct{}) bool {
	var deadline <-chan time.Time
	resync := false
	if c.timer != nil {
		deadline = c.timer.C
	} else {
		t := time.NewTimer(resyncEvery)
		defer t.Stop()
		deadline, resync = t.C, true
	}
	var gateCh <-chan struct{}
	if c.gate != nil {
		gateCh = c.gate.changed
	}
	select {
	case <-ctx.Done():
		return false
	case <-changed:
	case <-deadline:
		if resync {
			c.resync(ctx)
		} else {
			c.timer = nil
		}
	case <-gateCh:
		c.gate.refresh()
	case wr, ok := <-c.wch:
		if !ok || wr.Err() != nil {
			// The stream broke (no leader, compaction): list again, and
			// watch from there.
			if ctx.Err() != nil {
				return false
			}
			if !c.list(ctx) && !sleepCtx(ctx, retryPause) {
				return false
			}
			return true
		}
		for _, ev := range wr.Events {
			id := strings.TrimPrefix(string(ev.Kv.Key), c.rd.k.nodes(c.rd.r))
			if ev.Type == clientv3.EventTypeDelete {
				delete(c.present, id)
			} else {
				c.present[id] = true
			}
		}
	}
	return true
}

func (c *closerRun) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
	if c.cancelWatch != nil {
		c.cancelWatch()
	}
	if c.gate != nil {
		c.gate.stop()
	}
}

// writeAssignment orders the members, writes each rank key (batches within
// etcd's default 128 ops per txn) and then the summary, which is what the
// waiting nodes watch. Every txn is fenced on the round and on our closer key.
func (rd *round) writeAssignment(ctx context.Context) error {
	ms, rev, err := rd.readCandidates(ctx)
	if err != nil {
		return err
	}
	prevInfo, err := rd.previousRanks(ctx)
	if err != nil {
		return err
	}
	prev, pinned := map[string]int{}, map[string]int{}
	for id, ri := range prevInfo {
		prev[id] = ri.Order
		if !ri.Standby {
			pinned[id] = ri.GroupRank
		}
	}
	orderMembers(ms, prev)
	ranks, sum, err := assign(ms, rd.o.MinNodes, pinned)
	if err != nil {
		return err
	}
	sum.Round, sum.MembersRev = rd.r, rev
	rankDelta(&sum, prevInfo, ranks)
	// Fenced below on ctl/round == r, and the count only changes with the
	// round: this is the count round r opened with.
	if sum.RestartsUsed, err = rd.readRestarts(ctx); err != nil {
		return err
	}
	if err := rd.writeRanks(ctx, ms, ranks, sum); err != nil {
		return err
	}
	rd.log.Info("closed rendezvous round", "round", rd.r, "active", sum.GroupWorldSize, "standby", sum.Standbys,
		"world_size", sum.WorldSize, "master", sum.MasterNode)
	return nil
}

// readCandidates lists round r's members and the revision they were read at.
func (rd *round) readCandidates(ctx context.Context) ([]memberInfo, int64, error) {
	get, err := rd.cli.Get(ctx, rd.k.nodes(rd.r), clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("list members: %w", err)
	}
	bad, err := rd.quarantinedAddrs(ctx)
	if err != nil {
		return nil, 0, err
	}
	ms := make([]memberInfo, 0, len(get.Kvs))
	for _, kv := range get.Kvs {
		var m memberInfo
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			rd.log.Warn("skip unreadable member", "key", string(kv.Key), "err", err)
			continue
		}
		if bad[nodeAddr(m.NodeID)] {
			rd.log.Warn("leaving a quarantined node out of the round", "round", rd.r, "node", m.NodeID)
			continue
		}
		ms = append(ms, m)
	}
	return ms, get.Header.Revision, nil
}

// previousRanks reads round r-1's rank entries by node: their order and
// group ranks decide this round's (actives keep their slot), and the
// summary lists the nodes whose entry changes (rankDelta).
func (rd *round) previousRanks(ctx context.Context) (map[string]rankInfo, error) {
	prev := map[string]rankInfo{}
	if rd.r == 0 {
		return prev, nil
	}
	pg, err := rd.cli.Get(ctx, rd.k.ranks(rd.r-1), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("read previous ranks: %w", err)
	}
	for _, kv := range pg.Kvs {
		var ri rankInfo
		if json.Unmarshal(kv.Value, &ri) == nil {
			prev[strings.TrimPrefix(string(kv.Key), rd.k.ranks(rd.r-1))] = ri
		}
	}
	return prev, nil
}

// writeRanks writes every rank key, then the summary, in fenced batches.
// The rank batches go out concurrently (a few at a time): etcd commits
// concurrent proposals together, so 4,000 nodes' ranks (34 batches) cost a
// few disk syncs instead of 34 in a row. The summary, which the waiting
// nodes watch, goes last, once every rank key is written.
func (rd *round) writeRanks(ctx context.Context, ms []memberInfo, ranks map[string]rankInfo, sum roundSummary) error {
	fence := []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(rd.k.round()), "=", fmt.Sprint(rd.r)),
		clientv3.Compare(clientv3.Value(rd.k.closer(rd.r)), "=", rd.o.NodeID),
		clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), "=", 0),
		rd.genCmp,
	}
	write := func(ops []clientv3.Op) error {
		resp, err := rd.cli.Txn(ctx).If(fence...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("write ranks: %w", err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("round %d moved on or closer changed", rd.r)
		}
		return nil
	}
	const batch, inFlight = 120, 8 // etcd's default limit is 128 ops per txn
	var batches [][]clientv3.Op
	for i, m := range ms {
		if i%batch == 0 {
			batches = append(batches, make([]clientv3.Op, 0, batch))
		}
		b, _ := json.Marshal(ranks[m.NodeID])
		batches[len(batches)-1] = append(batches[len(batches)-1], clientv3.OpPut(rd.k.rank(rd.r, m.NodeID), string(b)))
	}
	errs := make([]error, len(batches))
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for i, ops := range batches {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = write(ops)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	sb, _ := json.Marshal(sum)
	ops := []clientv3.Op{clientv3.OpPut(rd.k.assignment(rd.r), string(sb))}
	if rd.r >= 2 {
		// Round r-2 is over for good (r-1 is still read: previous ranks,
		// the rejoin gate): drop its keys, or a job keeps N rank keys per
		// round it ever ran (docs/rendezvous.md, Scale).
		ops = append(ops, clientv3.OpDelete(rd.k.roundDir(rd.r-2), clientv3.WithPrefix()),
			clientv3.OpDelete(rd.k.ctlRoundDir(rd.r-2), clientv3.WithPrefix()))
	}
	return write(ops)
}
