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

// probe checks etcd reachability; past EtcdLossBound it closes the job
// locally (kind RendezvousLost, code 1) so the agent stops instead of
// running blind, and cancels e.lost, which ends every etcd call in flight.
func (e *Etcd) probe() {
	defer e.wg.Done()
	t := time.NewTicker(e.o.ProbeInterval)
	defer t.Stop()
	skipped, upTo := false, time.Time{} // upTo: etcd presumed up until then
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		fresh := time.Since(e.lastProbe) < e.heardWindow()
		e.mu.Unlock()
		if fresh {
			// The lease's keep-alives answered lately (heard): a read would
			// only add load (one per node per second: 4,000/s at 4,000 nodes).
			skipped = true
			continue
		}
		// A slow answer is an answer: an etcd busy with thousands of
		// nodes may take seconds, which is not an outage (up to 5 s with
		// the default 60 s bound; 1 s at least).
		to := max(e.o.ProbeInterval, time.Second, min(e.o.EtcdLossBound/4, 5*time.Second))
		ctx, cancel := context.WithTimeout(e.ctx, to)
		_, err := e.cli.Get(ctx, e.k.round())
		cancel()
		e.mu.Lock()
		if err != nil && skipped {
			// Count the outage from the previous tick, as a read then
			// would have: the skips do not shorten the loss bound.
			upTo = time.Now().Add(-e.o.ProbeInterval)
		}
		skipped = false
		if err == nil {
			if !e.lastProbe.IsZero() && time.Since(e.lastProbe) > e.staleAfter() {
				e.log.Info("etcd reachable again", "down_for", time.Since(e.lastProbe).Round(time.Millisecond))
			}
			e.lastProbe = time.Now()
			e.mu.Unlock()
			continue
		}
		down := time.Since(e.lastProbe)
		if upTo.After(e.lastProbe) {
			down = time.Since(upTo)
		}
		if e.ctx.Err() != nil {
			e.mu.Unlock()
			return
		}
		if down > e.o.EtcdLossBound {
			e.declareLostLocked() // final: this node's job is over
			e.mu.Unlock()
			return
		}
		e.log.Warn("etcd unreachable", "for", down.Round(time.Millisecond), "bound", e.o.EtcdLossBound, "err", err)
		e.mu.Unlock()
	}
}

// lossWatchers is how many active nodes (group ranks 0 to lossWatchers-1)
// watch a round's member keys for deletion. Three independent watchers
// keep the backstop when one or two of them are among the lost; the other
// nodes learn of the end through the ctl watch. (Every node watching group
// rank 0's key, as before, cost each node a watch created and cancelled per
// round, a catch-up read of the round's writes for each of those watches
// in etcd, and on group rank 0's loss one end-round txn per node.)
const lossWatchers = 3

// watchLoss is the lease-expiry backstop for node loss in active round r,
// run by group ranks 0 to lossWatchers-1: it watches every member key of
// the round for deletion from the revision the membership was read at.
// Puts are filtered out server-side, so it costs O(lost) events. It stops
// when the round ends.
func (e *Etcd) watchLoss(ctx context.Context, r int, sum roundSummary) {
	defer e.wg.Done()
	wch := e.cli.Watch(ctx, e.k.nodes(r), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(sum.MembersRev+1))
	for wr := range wch {
		if wr.Err() != nil {
			return
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypeDelete {
				continue
			}
			id := strings.TrimPrefix(string(ev.Kv.Key), e.k.nodes(r))
			go e.nodeLost(r, id, "lease expired")
		}
	}
}

// nodeLost ends round r because node id is gone, if id was active in r and
// had not finished: the policy sees a node loss (or an exclusion, when the
// node left on purpose), which a live spare absorbs without spending a
// restart. Several survivors may race; the txn decides.
func (e *Etcd) nodeLost(r int, id, how string) { e.nodeLostAt(r, id, how, time.Time{}) }

// nodeLostAt is nodeLost with the time of the detector's first evidence.
func (e *Etcd) nodeLostAt(r int, id, how string, evidence time.Time) {
	if id == e.o.NodeID {
		return
	}
	ctx := e.lost // retried until reported, etcd lost or Close
	e.mu.Lock()
	skip := e.closed != nil || e.ctlRound != r
	if first, ok := e.lossEvidence[id]; ok && (evidence.IsZero() || first.Before(evidence)) {
		// Gossip saw it first; the lease's expiry confirmed it.
		evidence = first
		if how == "lease expired" {
			how = "gossip, lease expired"
		}
	}
	e.mu.Unlock()
	if skip {
		return
	}
	var rk *clientv3.GetResponse
	err := e.retry(ctx, func(ctx context.Context) (err error) {
		rk, err = e.cli.Get(ctx, e.k.rank(r, id))
		return err
	})
	if err != nil || len(rk.Kvs) == 0 {
		return
	}
	var ri rankInfo
	if json.Unmarshal(rk.Kvs[0].Value, &ri) != nil || ri.Standby {
		return
	}
	conds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(e.k.done(r, id)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(e.k.assignment(r)), ">", 0),
	}
	var d Decision
	err = e.retry(ctx, func(ctx context.Context) (err error) {
		d, err = e.endRound(ctx, r, policy.NodeLost, id, fmt.Sprintf("node %s lost (%s)", id, how), evidence, conds)
		return err
	})
	if err != nil {
		e.log.Warn("report node loss", "lost", id, "err", err)
		return
	}
	e.mu.Lock()
	delete(e.lossEvidence, id)
	e.mu.Unlock()
	e.o.Metrics.NodeFailed()
	e.log.Warn("node lost", "lost", id, "how", how, "round", r, "action", string(d.Action), "reason", d.Reason)
}

// heard records an answer from etcd other than the probe's (a lease
// renewal): etcd is reachable now.
func (e *Etcd) heard() {
	e.mu.Lock()
	e.lastProbe = time.Now()
	e.mu.Unlock()
}

// unreachableNow reports whether the last reachability probes failed (etcd
// is away now, though maybe not yet past the loss bound): courtesy writes
// (a departure, ledger records at exit) are skipped then.
func (e *Etcd) unreachableNow() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.lastProbe.IsZero() && time.Since(e.lastProbe) > e.staleAfter()
}

// heardWindow is how recent an answer from etcd lets the probe skip its
// read: an owned lease is renewed every LeaseTTL/renewsPerTTL (fence.go),
// and each renewal is an answer. The window keeps the TTL/3 of clientv3's
// cadence it was sized for: a busy etcd answers renewals late, and each
// probe read it saves counts at 4,000 nodes.
func (e *Etcd) heardWindow() time.Duration {
	if !e.ownsLease {
		return 0
	}
	return e.o.ProbeInterval + e.o.LeaseTTL/3 + 500*time.Millisecond
}

// staleAfter is how long without an answer means etcd is away for now.
func (e *Etcd) staleAfter() time.Duration {
	return max(2*e.o.ProbeInterval+time.Second, e.heardWindow()+e.o.ProbeInterval)
}
