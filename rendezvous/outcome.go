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
	// Fenced on the caller's own membership: a node whose lease expired
	// (partitioned away) cannot end the round of the others.
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.k.member(round, e.o.NodeID)), ">", 0)}
	return e.endRound(ctx, round, f, "", fmt.Sprintf("node %s failed: %s", e.o.NodeID, reason), conds)
}

// Succeed marks this node done in round and waits for the job's outcome.
func (e *Etcd) Succeed(ctx context.Context, round int) (int, error) {
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(round)),
			clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.done(round, e.o.NodeID), "1")).Commit()
	if err != nil {
		return 1, fmt.Errorf("rendezvous: mark done in round %d: %w", round, err)
	}
	if resp.Succeeded {
		e.mu.Lock()
		sum, ok := e.assigned[round]
		e.mu.Unlock()
		if !ok {
			return 1, fmt.Errorf("rendezvous: Succeed for round %d, which this node was not assigned", round)
		}
		// The last node to mark done sees every marker and closes the job.
		cnt, err := e.cli.Get(ctx, e.k.dones(round), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 1, fmt.Errorf("rendezvous: count done nodes: %w", err)
		}
		if int(cnt.Count) >= sum.GroupWorldSize {
			cb, _ := json.Marshal(closeInfo{Kind: verdict.Succeeded, Code: 0, Reason: "all nodes succeeded", Node: e.o.NodeID})
			if _, err := e.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0),
					clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(round)), e.genCmp()).
				Then(clientv3.OpPut(e.k.closed(), string(cb))).Commit(); err != nil {
				return 1, fmt.Errorf("rendezvous: close job: %w", err)
			}
		}
	}
	for {
		e.mu.Lock()
		ch, closed, cur := e.changed, e.closed, e.ctlRound
		e.mu.Unlock()
		if closed != nil {
			return closed.Code, nil
		}
		if cur > round {
			return 1, ErrRoundRestarted
		}
		select {
		case <-ctx.Done():
			return 1, fmt.Errorf("rendezvous: waiting for other nodes to finish round %d: %w", round, ctx.Err())
		case <-ch:
		}
	}
}

// Shutdown closes the job for every node; the first close record wins.
func (e *Etcd) Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error {
	cb, _ := json.Marshal(closeInfo{Kind: kind, Code: code, Reason: reason, Node: e.o.NodeID})
	if _, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.closed(), string(cb))).Commit(); err != nil {
		return fmt.Errorf("rendezvous: close job: %w", err)
	}
	// Wait until the watcher has seen it so Ended fires before we return.
	for {
		e.mu.Lock()
		ch, closed := e.changed, e.closed
		e.mu.Unlock()
		if closed != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rendezvous: waiting for job close: %w", ctx.Err())
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
	e.mu.Lock()
	r := e.lastRound
	if e.closed == nil {
		e.closed = &closeInfo{Kind: verdict.NodeExcluded, Code: 1, Reason: "node left the job: " + reason,
			Node: e.o.NodeID, Cause: policy.NodeExcluded}
	}
	e.closeLocally("left: " + reason)
	e.broadcastLocked()
	e.mu.Unlock()
	e.log.Warn("leaving the job", "reason", reason)
	var errs []error
	xb, _ := json.Marshal(excludeInfo{Round: r, Reason: reason})
	if _, err := e.cli.Txn(ctx).If(e.genCmp()).Then(clientv3.OpPut(e.k.excluded(e.o.NodeID), string(xb))).Commit(); err != nil {
		// Peers then see an anonymous node loss; leaving goes on.
		errs = append(errs, fmt.Errorf("rendezvous: record exclusion: %w", err))
	}
	e.stopGossip(true)
	if err := e.dropKeys(ctx, r); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dropKeys removes this node's keys: an owned lease is revoked (everything
// under it goes); a shared one must survive, so the keys are deleted.
func (e *Etcd) dropKeys(ctx context.Context, r int) error {
	if lease := e.currentLease(); lease != 0 && e.ownsLease {
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
// owned client. It does not close the job.
func (e *Etcd) Close() error {
	e.mu.Lock()
	if e.state != stateClosed {
		e.closeLocally("closed")
	}
	lease := e.lease
	e.mu.Unlock()
	e.stopGossip(true)
	e.cancel()
	e.wg.Wait()
	var errs []error
	if e.ownsLease && lease != 0 && e.cli != nil {
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
