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
	_, closed, cur := e.view.snapshot()
	skip := closed != nil || cur != r
	// Gossip saw it first; the lease's expiry confirmed it.
	how, evidence = e.loss.firstEvidence(id, how, evidence)
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
	e.loss.dropEvidence(id)
	e.o.Metrics.NodeFailed()
	e.log.Warn("node lost", "lost", id, "how", how, "round", r, "action", string(d.Action), "reason", d.Reason)
}
