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
// when ctx ends (the round ends).
func (rd *round) watchLoss(ctx context.Context, sum roundSummary) {
	wch := rd.cli.Watch(ctx, rd.k.nodes(rd.r), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(sum.MembersRev+1))
	for wr := range wch {
		if wr.Err() != nil {
			return
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypeDelete {
				continue
			}
			id := strings.TrimPrefix(string(ev.Kv.Key), rd.k.nodes(rd.r))
			go rd.nodeLost(id, "lease expired")
		}
	}
}

// nodeLost ends round r because node id is gone, if id was active in r and
// had not finished: the policy sees a node loss (or an exclusion, when the
// node left on purpose), which a live spare absorbs without spending a
// restart. Several survivors may race; the txn decides.
func (rd *round) nodeLost(id, how string) { rd.nodeLostAt(id, how, time.Time{}) }

// nodeLostAt is the detector's report (lossJudge): round r's nodeLostAt.
func (e *Etcd) nodeLostAt(r int, id, how string, evidence time.Time) {
	e.round(r).nodeLostAt(id, how, evidence)
}

// nodeLostAt is nodeLost with the time of the detector's first evidence.
func (rd *round) nodeLostAt(id, how string, evidence time.Time) {
	if id == rd.o.NodeID {
		return
	}
	ctx := rd.sess.Lost() // retried until reported, etcd lost or Close
	_, closed, cur := rd.view.snapshot()
	skip := closed != nil || cur != rd.r
	// Gossip saw it first; the lease's expiry confirmed it.
	how, evidence = rd.loss.firstEvidence(id, how, evidence)
	if skip {
		return
	}
	var rk *clientv3.GetResponse
	err := retry(ctx, rd.log, func(ctx context.Context) (err error) {
		rk, err = rd.cli.Get(ctx, rd.k.rank(rd.r, id))
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
		clientv3.Compare(clientv3.CreateRevision(rd.k.done(rd.r, id)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), ">", 0),
	}
	var d Decision
	err = retry(ctx, rd.log, func(ctx context.Context) (err error) {
		d, err = rd.endRound(ctx, policy.NodeLost, id, fmt.Sprintf("node %s lost (%s)", id, how), evidence, conds)
		return err
	})
	if err != nil {
		rd.log.Warn("report node loss", "lost", id, "err", err)
		return
	}
	rd.loss.dropEvidence(id)
	rd.o.Metrics.NodeFailed()
	rd.log.Warn("node lost", "lost", id, "how", how, "round", rd.r, "action", string(d.Action), "reason", d.Reason)
}
