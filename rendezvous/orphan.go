package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
)

// An orphaned round (docs/rendezvous.md, "etcd loss"): round r is the job's
// current round and assigned, and none of its active nodes that has not
// finished still holds its membership of r. Each of them lost its lease
// (expired or revoked), so each stopped its ranks first (its fence, or the
// watchdog of a frozen launcher) or is gone: nothing of round r runs, yet
// nothing ends it. Its loss watchers are its own active nodes, which stop
// watching at their fence, and a fenced node's report (Fail) is fenced on
// its own membership, which is gone.
//
// It is what an etcd stall longer than the lease TTL leaves (SIGSTOP, a VM
// pause, a long fsync, the embedded etcd's host frozen): every node fences,
// and when etcd resumes it expires every lease (a restarted etcd extends
// them, a resumed one does not). Such a round used to hold the job forever,
// every node waiting for round r+1.
//
// So a node that left round r while it was still open (its fence, or a
// report that found its membership gone) watches round r while it waits
// for round r+1 (orphanWatch says how), and ends it once orphaned: a
// restart in place, charged to nobody (cause node_stopped: no evidence, no
// quarantine). The state only grows (no membership of an assigned round is
// ever put again), so what the watch saw cannot be undone before the end
// txn, which is fenced on the round as every end is.

// orphanGrace is how long a node that left an open round without a fence of
// its own waits before it watches the round: a round ended by someone else
// reaches its ctl watch well within it, so a healthy restart costs no read.
const orphanGrace = time.Second

// orphaned is the rule: some active node of the round has not finished,
// and none of those holds its membership any more.
func orphaned(actives, present, done map[string]bool) bool {
	waiting := 0
	for id := range actives {
		if done[id] {
			continue
		}
		if present[id] {
			return false
		}
		waiting++
	}
	return waiting > 0
}

// orphanWatch says whether and how this node watches round r for
// orphanhood while it waits for round r+1: it must have been active in r
// and have left r while r is still the job's round. One of r's loss
// watchers (group rank below lossWatchers) follows r's keys (full), at
// once after its own fence, after orphanGrace otherwise. Any other active
// node only counts r's memberships and done markers every lease TTL (two
// count-only reads): at thousands of nodes every node left the round
// after an etcd stall, and a full read each would be O(N^2); the count is
// the fallback for a stall during which the three watchers died.
func (e *Etcd) orphanWatch(r int) orphanPlan {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lastRound != r || e.rankRound != r || e.rank.Standby || e.rank.GroupRank < 0 {
		return orphanPlan{}
	}
	p := orphanPlan{ok: true, delay: orphanGrace, full: true, actives: e.assigned[r].GroupWorldSize}
	switch {
	case e.rank.GroupRank >= lossWatchers:
		p.delay, p.full = e.o.LeaseTTL, false
	case e.fence.round == r:
		p.delay = 0
	}
	return p
}

// orphanPlan is how a node watches the round it left for orphanhood
// (orphanWatch): after delay, following its keys (full) or counting them
// every lease TTL; actives is its number of active nodes. ok false: not at
// all.
type orphanPlan struct {
	delay   time.Duration
	full    bool
	actives int
	ok      bool
}

// countOrphans is the non-watchers' check of round r: every lease TTL, a
// round with no membership left at all and fewer done markers than active
// nodes (gws) is orphaned.
func (rd *round) countOrphans(ctx context.Context, delay time.Duration, gws int) {
	for sleepCtx(ctx, delay) {
		delay = rd.o.LeaseTTL
		if _, closed, cur := rd.view.snapshot(); closed != nil || cur != rd.r {
			return
		}
		resp, err := rd.cli.Txn(ctx).Then(
			clientv3.OpGet(rd.k.assignment(rd.r), clientv3.WithCountOnly()),
			clientv3.OpGet(rd.k.nodes(rd.r), clientv3.WithPrefix(), clientv3.WithCountOnly()),
			clientv3.OpGet(rd.k.dones(rd.r), clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
		if err != nil {
			rd.log.Debug("orphan count", "round", rd.r, "err", err)
			continue
		}
		count := func(i int) int64 { return resp.Responses[i].GetResponseRange().GetCount() }
		if count(0) > 0 && count(1) == 0 && count(2) < int64(gws) {
			rd.endOrphaned(ctx, gws)
			return
		}
	}
}

// roundMembers is round r's population as one read saw it.
type roundMembers struct {
	assigned bool
	actives  map[string]bool // active in r (its rank entry)
	present  map[string]bool // membership of r held
	done     map[string]bool // finished in r
}

// readRoundMembers reads round r's rank entries, memberships and done
// markers at one revision.
func (rd *round) readRoundMembers(ctx context.Context) (roundMembers, int64, error) {
	resp, err := rd.cli.Txn(ctx).Then(
		clientv3.OpGet(rd.k.assignment(rd.r), clientv3.WithCountOnly()),
		clientv3.OpGet(rd.k.ranks(rd.r), clientv3.WithPrefix()),
		clientv3.OpGet(rd.k.nodes(rd.r), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(rd.k.dones(rd.r), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return roundMembers{}, 0, fmt.Errorf("rendezvous: read round %d's members: %w", rd.r, err)
	}
	m := roundMembers{assigned: resp.Responses[0].GetResponseRange().GetCount() > 0,
		actives: map[string]bool{}, present: map[string]bool{}, done: map[string]bool{}}
	for _, kv := range resp.Responses[1].GetResponseRange().GetKvs() {
		var ri rankInfo
		if json.Unmarshal(kv.Value, &ri) == nil && !ri.Standby {
			m.actives[strings.TrimPrefix(string(kv.Key), rd.k.ranks(rd.r))] = true
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().GetKvs() {
		m.present[strings.TrimPrefix(string(kv.Key), rd.k.nodes(rd.r))] = true
	}
	for _, kv := range resp.Responses[3].GetResponseRange().GetKvs() {
		m.done[strings.TrimPrefix(string(kv.Key), rd.k.dones(rd.r))] = true
	}
	return m, resp.Header.Revision, nil
}

// watchOrphans watches round r (one read, then the deletions of its
// memberships and its done markers) until it is no longer the job's round,
// and ends it once it is orphaned, as p says. ctx ends with the wait for
// round r+1.
func (rd *round) watchOrphans(ctx context.Context, p orphanPlan) {
	delay := p.delay
	if !p.full {
		rd.countOrphans(ctx, delay, p.actives)
		return
	}
	if delay > 0 && !sleepCtx(ctx, delay) {
		return
	}
	for ctx.Err() == nil {
		if _, closed, cur := rd.view.snapshot(); closed != nil || cur != rd.r {
			return
		}
		m, rev, err := rd.readRoundMembers(ctx)
		if err != nil {
			rd.log.Debug("orphan watch", "round", rd.r, "err", err)
			if !sleepCtx(ctx, retryPause) {
				return
			}
			continue
		}
		if !m.assigned {
			return // an open round's own closer and joiners settle it
		}
		if rd.followOrphan(ctx, m, rev) {
			return
		}
	}
}

// followOrphan applies round r's changes from revision rev on to m and ends
// the round once orphaned; false when its watch broke (read again).
func (rd *round) followOrphan(ctx context.Context, m roundMembers, rev int64) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := rd.cli.Watch(wctx, rd.k.roundDir(rd.r), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for {
		if orphaned(m.actives, m.present, m.done) {
			rd.endOrphaned(ctx, len(m.actives))
			return true
		}
		ch, closed, cur := rd.view.snapshot()
		if closed != nil || cur != rd.r {
			return true
		}
		select {
		case <-ctx.Done():
			return true
		case <-ch:
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return ctx.Err() != nil
			}
			for _, ev := range wr.Events {
				key := string(ev.Kv.Key)
				switch {
				case ev.Type == clientv3.EventTypeDelete && strings.HasPrefix(key, rd.k.nodes(rd.r)):
					delete(m.present, strings.TrimPrefix(key, rd.k.nodes(rd.r)))
				case ev.Type == clientv3.EventTypePut && strings.HasPrefix(key, rd.k.dones(rd.r)):
					m.done[strings.TrimPrefix(key, rd.k.dones(rd.r))] = true
				}
			}
		}
	}
}

// endOrphaned ends orphaned round r (fenced on the round, its assignment
// and the job being open, as every end): a restart in place that spends a
// restart, with nobody to blame.
func (rd *round) endOrphaned(ctx context.Context, actives int) {
	reason := fmt.Sprintf("round %d orphaned: none of its %d active nodes holds its membership any more "+
		"(their leases expired: etcd stalled or was unreachable longer than the lease TTL %v, and each node stopped its ranks first)",
		rd.r, actives, rd.o.LeaseTTL)
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), ">", 0)}
	var d Decision
	err := retry(ctx, rd.log, func(ctx context.Context) (err error) {
		d, err = rd.endRound(ctx, policy.NodeStopped, "", reason, time.Time{}, conds)
		return err
	})
	if err != nil {
		rd.log.Warn("end an orphaned round", "round", rd.r, "err", err)
		return
	}
	// d is this node's end, or the one that won the race to it.
	rd.log.Warn("round orphaned: every active node's lease had expired; its end reported", "round", rd.r,
		"action", string(d.Action), "restarts_used", d.RestartsUsed, "reason", d.Reason)
}
