package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Fail reports a local failure of kind f in round r: the restart policy
// opens round r+1 or closes the job (endRound). A stale report is a no-op
// that returns what the job did instead.
func (e *Etcd) Fail(ctx context.Context, round int, f policy.Failure, reason string) (Decision, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if closed := e.view.closedInfo(); closed != nil {
		d := Decision{Action: policy.CloseJob, Close: closed.Kind, Code: closed.Code, Reason: closed.Reason}
		return d, e.lostErr(closed)
	}
	// Fenced on the caller's own membership: a node whose lease expired
	// (partitioned away) cannot end the round of the others.
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.k.member(round, e.o.NodeID)), ">", 0)}
	// A node that fenced itself (EndFenced) and reaches etcd with its lease
	// still valid (etcd was away for everyone, or only slow) reports that
	// it stopped: the round ends as for a departed node (a spare takes its
	// place, or the round restarts in place), and nothing is quarantined.
	// When its lease expired first, a peer has ended the round already and
	// this report, fenced on the membership, learns how.
	lost, what := "", "failed"
	if f == policy.NodeStopped || f == policy.NodeLost {
		lost, what = e.o.NodeID, "stopped"
	}
	var d Decision
	err := retry(ctx, e.log, func(ctx context.Context) (err error) {
		d, err = e.round(round).endRound(ctx, f, lost, fmt.Sprintf("node %s %s: %s", e.o.NodeID, what, reason), time.Time{}, conds)
		return err
	})
	if err = e.callErr(err); errors.Is(err, ErrRendezvousLost) {
		d = Decision{Action: policy.CloseJob, Close: verdict.RendezvousLost, Code: 1, Reason: err.Error()}
	}
	return d, err
}

// Succeed marks this node done in round and waits for the job's outcome.
func (e *Etcd) Succeed(ctx context.Context, round int) (int, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if e.view.closedInfo() == nil { // else the job is over: no marker to write, the loop reports the outcome
		e.mu.Lock()
		sum, ok := e.assigned[round]
		e.mu.Unlock()
		var assigned *roundSummary
		if ok {
			assigned = &sum
		}
		rd := e.round(round)
		if err := retry(ctx, e.log, func(ctx context.Context) error { return rd.markDone(ctx, assigned) }); err != nil {
			return 1, e.callErr(err)
		}
	}
	for {
		ch, closed, cur := e.view.snapshot()
		var err error
		if closed != nil {
			err = e.lostErr(closed)
		}
		if closed != nil {
			return closed.Code, err
		}
		if cur > round {
			return 1, ErrRoundRestarted
		}
		select {
		case <-ctx.Done():
			return 1, e.callErr(fmt.Errorf("rendezvous: waiting for other nodes to finish round %d: %w", round, ctx.Err()))
		case <-ch:
		}
	}
}

// markDone writes done/<id> for the round (fenced on it being current
// and open); the last node to do so sees every marker and closes the job
// with success. sum is the round's assignment as this node got it (nil:
// none).
func (rd *round) markDone(ctx context.Context, sum *roundSummary) error {
	resp, err := rd.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(rd.k.round()), "=", strconv.Itoa(rd.r)),
			clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0), rd.genCmp).
		Then(clientv3.OpPut(rd.k.done(rd.r, rd.o.NodeID), "1")).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous: mark done in round %d: %w", rd.r, err)
	}
	if !resp.Succeeded {
		return nil // the round or the job is over: the caller reads which
	}
	if sum == nil {
		return fmt.Errorf("rendezvous: Succeed for round %d, which this node was not assigned", rd.r)
	}
	cnt, err := rd.cli.Get(ctx, rd.k.dones(rd.r), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("rendezvous: count done nodes: %w", err)
	}
	if int(cnt.Count) < sum.GroupWorldSize {
		return nil
	}
	cb, _ := json.Marshal(closeInfo{Kind: verdict.Succeeded, Code: 0, Reason: "all nodes succeeded", Node: rd.o.NodeID})
	if _, err := rd.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(rd.k.closed()), "=", 0),
			clientv3.Compare(clientv3.Value(rd.k.round()), "=", strconv.Itoa(rd.r)), rd.genCmp).
		Then(clientv3.OpPut(rd.k.closed(), string(cb))).Commit(); err != nil {
		return fmt.Errorf("rendezvous: close job: %w", err)
	}
	return nil
}

// Shutdown closes the job for every node with kind, code and reason; the
// first close record wins. On a job that is already over it does nothing.
func (e *Etcd) Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	cb, _ := json.Marshal(closeInfo{Kind: kind, Code: code, Reason: reason, Node: e.o.NodeID})
	for first := true; ; first = false {
		ch, closed, _ := e.view.snapshot()
		var err error
		if closed != nil {
			err = e.lostErr(closed)
		}
		if closed != nil {
			return err // Ended has fired: the watcher saw the close
		}
		if first {
			if err := retry(ctx, e.log, func(ctx context.Context) error {
				_, err := e.cli.Txn(ctx).
					If(clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
					Then(clientv3.OpPut(e.k.closed(), string(cb))).Commit()
				return err
			}); err != nil {
				return e.callErr(fmt.Errorf("rendezvous: close job: %w", err))
			}
			continue
		}
		select {
		case <-ctx.Done():
			return e.callErr(fmt.Errorf("rendezvous: waiting for job close: %w", ctx.Err()))
		case <-ch:
		}
	}
}

// Leave withdraws this node (ExcludeThisNode, a failed health check)
// without closing the job for others. It first records why under
// excluded/<id>, so that peers report policy.NodeExcluded with this reason
// rather than an anonymous loss, then leaves gossip and drops its lease (its
// membership keys go at once). For this node the job is then over with
// kind verdict.NodeExcluded.
func (e *Etcd) Leave(ctx context.Context, reason string) error {
	e.log.Warn("leaving the job", "reason", reason)
	return e.withdrawNode(ctx, excludeInfo{Reason: reason, Cause: policy.NodeExcluded},
		closeInfo{Kind: verdict.NodeExcluded, Code: 1, Reason: "node left the job: " + reason, Cause: policy.NodeExcluded})
}

// Depart withdraws this node because its launcher was stopped by a signal
// (reason says which, e.g. "SIGTERM"). Like Leave it records why before it
// leaves gossip and drops its lease, with cause policy.NodeStopped: peers
// end the round with that cause and "node <id> stopped: <reason>", a spare
// takes the node's place without spending a restart, and no evidence is
// held against the node. For this node the job is then over (kind
// verdict.Signaled); the job goes on for the others.
func (e *Etcd) Depart(ctx context.Context, reason string) error {
	e.log.Warn("departing from the job", "reason", reason)
	if e.sess.unreachableNow() {
		// A courtesy that cannot be delivered now: the peers' gossip and
		// the lease notice the node's absence; do not hold its exit.
		e.mu.Lock()
		e.closeLocally("departed while etcd was unreachable: " + reason)
		e.mu.Unlock()
		return fmt.Errorf("rendezvous: etcd at %s unreachable: departure not recorded", e.endpoints())
	}
	return e.withdrawNode(ctx, excludeInfo{Reason: reason, Cause: policy.NodeStopped},
		closeInfo{Kind: verdict.Signaled, Code: 1, Reason: "node stopped: " + reason, Cause: policy.NodeStopped})
}

// withdrawNode closes this node's state with ci (unless the job is already
// closed), writes the record x that peers read when they see it go, leaves
// gossip and drops its keys.
func (e *Etcd) withdrawNode(ctx context.Context, x excludeInfo, ci closeInfo) error {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	e.mu.Lock()
	r := e.lastRound
	ci.Node = e.o.NodeID
	e.view.closeLocal(ci)
	e.closeLocally(string(x.Cause) + ": " + x.Reason)
	e.broadcastLocked()
	e.mu.Unlock()
	var errs []error
	x.Round = r
	xb, _ := json.Marshal(x)
	if err := retry(ctx, e.log, func(ctx context.Context) error {
		_, err := e.cli.Txn(ctx).If(e.genCmp()).Then(clientv3.OpPut(e.k.excluded(e.o.NodeID), string(xb))).Commit()
		return err
	}); err != nil {
		// Peers then see an anonymous node loss; leaving goes on.
		errs = append(errs, fmt.Errorf("rendezvous: record why this node leaves: %w", err))
	}
	e.stopGossip(true)
	e.stopStream()
	if err := retry(ctx, e.log, func(ctx context.Context) error { return e.dropKeys(ctx, r) }); err != nil {
		errs = append(errs, err)
	}
	return e.callErr(errors.Join(errs...))
}

// dropKeys removes this node's keys: an owned lease is revoked (everything
// under it goes); a shared one must survive, so the keys are deleted.
func (e *Etcd) dropKeys(ctx context.Context, r int) error {
	if lease := e.sess.current(); lease != 0 && e.sess.owns() {
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			return fmt.Errorf("rendezvous: revoke lease on leave: %w", err)
		}
		return nil
	}
	if _, err := e.cli.Delete(ctx, e.k.alive(e.o.NodeID)); err != nil {
		return fmt.Errorf("rendezvous: remove alive key on leave: %w", err)
	}
	for _, rr := range []int{r, r + 1} {
		if rr < 0 {
			continue
		}
		if _, err := e.cli.Delete(ctx, e.k.member(rr, e.o.NodeID)); err != nil {
			return fmt.Errorf("rendezvous: remove membership on leave: %w", err)
		}
	}
	return nil
}

// Close stops watchers and gossip, revokes an owned lease and closes an
// owned client. It does not close the job. Every step is bounded (gossip
// leave 300 ms, revoke 2 s, skipped once etcd is lost), so Close returns
// within seconds with etcd gone; it then reports the loss (the lease was
// left to expire).
func (e *Etcd) Close() error {
	e.mu.Lock()
	if e.state != stateClosed {
		e.closeLocally("closed")
	}
	e.mu.Unlock()
	e.sess.stopFence()
	lease, owns := e.sess.current(), e.sess.owns()
	lerr := e.lossErr() // before cancel: the loss cause stays, but read it once
	e.stopGossip(true)
	e.stopStream()
	if e.relay != nil {
		e.relay.stop()
	}
	if e.parts != nil && e.parts.relay != nil {
		e.parts.relay.close()
	}
	e.cancel()
	e.wg.Wait()
	e.sess.wait()
	var errs []error
	switch {
	case lerr != nil:
		errs = append(errs, fmt.Errorf("rendezvous: lease left to expire: %w", lerr))
	case owns && lease != 0 && e.cli != nil:
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			e.log.Debug("revoke lease on close", "err", err)
		}
		cancel()
	}
	if e.ownsClient && e.cli != nil {
		if err := e.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("rendezvous: close etcd client: %w", err))
		}
	}
	return errors.Join(errs...)
}
