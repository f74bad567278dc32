package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// In a fixed allocation (Slurm with MIN == MAX) no new node can come to
// replace one that is gone, so a restart round short of MIN live nodes with
// no spare would only wait for JoinTimeout (10 min by default). Instead
// every node waiting for the round checks, MinNodesWait after the round
// opened and then every LeaseTTL, how many nodes of the job are alive (their
// alive keys: a stalled node whose lease expired is back once it renews);
// below MIN, the first to notice closes the job with kind NotEnoughNodes.

// roundTimers are the deadlines of one wait for a round's assignment, armed
// once the round is the job's current one.
type roundTimers struct {
	join, short *time.Timer
}

func (t *roundTimers) armed() bool { return t.join != nil }

// arm starts the join timeout and, for a restart round of a fixed
// allocation, the shortage check.
func (t *roundTimers) arm(o EtcdOptions, target int) {
	t.join = time.NewTimer(o.JoinTimeout)
	if o.FixedAllocation && target > 0 {
		t.short = time.NewTimer(o.MinNodesWait)
	}
}

func (t *roundTimers) joinC() <-chan time.Time {
	if t.join == nil {
		return nil
	}
	return t.join.C
}

func (t *roundTimers) shortC() <-chan time.Time {
	if t.short == nil {
		return nil
	}
	return t.short.C
}

func (t *roundTimers) stop() {
	for _, tm := range []*time.Timer{t.join, t.short} {
		if tm != nil {
			tm.Stop()
		}
	}
}

// liveNodes counts the job's nodes that are alive and not confirmed lost:
// alive keys (under each node's lease) less those of nodes with a death
// record (dead/, written with the end of the round they were lost in, or
// by gossip). A launcher that died alone keeps its alive key until its
// lease expires (lease_ttl); its death record makes it not count at once.
// A stalled node that comes back deletes its death record as it rejoins
// (reincarnate) and counts again. Death records are few, so the alive keys
// are only counted, not listed (thousands of nodes).
func (rd *round) liveNodes(ctx context.Context) (int, error) {
	resp, err := rd.cli.Txn(ctx).Then(
		clientv3.OpGet(rd.k.alives(), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(rd.k.deads(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return 0, err
	}
	alive := int(resp.Responses[0].GetResponseRange().Count)
	deads := resp.Responses[1].GetResponseRange().Kvs
	if len(deads) == 0 {
		return alive, nil
	}
	ops := make([]clientv3.Op, 0, len(deads))
	for _, kv := range deads {
		// At the first read's revision: one consistent view.
		ops = append(ops, clientv3.OpGet(rd.k.alive(strings.TrimPrefix(string(kv.Key), rd.k.deads())),
			clientv3.WithCountOnly(), clientv3.WithRev(resp.Header.Revision)))
	}
	both, err := rd.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return 0, err
	}
	for _, r := range both.Responses {
		if r.GetResponseRange().Count > 0 {
			alive--
		}
	}
	return alive, nil
}

// checkShortage closes the job with kind NotEnoughNodes when fewer than MIN
// nodes of the job are alive (liveNodes) while round r waits for its
// assignment; otherwise it re-arms the check. The close is fenced on the
// round still being current, unassigned and open (another node may have
// closed it).
func (rd *round) checkShortage(ctx context.Context, t *roundTimers) {
	live, err := rd.liveNodes(ctx)
	if err != nil || live >= rd.o.MinNodes {
		t.short.Reset(rd.o.LeaseTTL)
		return
	}
	le, _ := rd.view.lastEnd(rd.r - 1)
	reason := fmt.Sprintf("only %d of the %d nodes needed are left in a fixed allocation with no spare, and none came back within min_nodes_wait=%v",
		live, rd.o.MinNodes, rd.o.MinNodesWait)
	if le.Reason != "" {
		reason += " (round " + strconv.Itoa(rd.r-1) + " ended: " + le.Reason + ")"
	}
	cb, _ := json.Marshal(closeInfo{Kind: verdict.NotEnoughNodes, Code: 1, Reason: reason, Node: le.Node, Cause: le.Cause})
	tr, err := rd.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0),
			clientv3.Compare(clientv3.Value(rd.k.round()), "=", strconv.Itoa(rd.r)),
			clientv3.Compare(clientv3.CreateRevision(rd.k.assignment(rd.r)), "=", 0), rd.genCmp).
		Then(clientv3.OpPut(rd.k.closed(), string(cb))).Commit()
	if err != nil || !tr.Succeeded {
		t.short.Reset(rd.o.LeaseTTL) // the watch reports what happened instead
		return
	}
	rd.log.Error("closing the job: not enough nodes", "round", rd.r, "alive", live, "min", rd.o.MinNodes)
}
