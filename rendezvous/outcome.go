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

// Fail reports a local failure in round r: one txn opens round r+1 if the
// budget allows, else closes the job. A stale report is a no-op.
func (e *Etcd) Fail(ctx context.Context, round int, f policy.Failure, reason string) (Decision, error) {
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.k.member(round, e.o.NodeID)), ">", 0)}
	d, err := e.endRound(ctx, round, fmt.Sprintf("node %s failed: %s", e.o.NodeID, reason), conds)
	if err != nil {
		return Decision{}, err
	}
	return d, nil
}

// endRound is the single fenced txn that ends round r: open r+1 when the
// job-wide budget allows (restarts used == r), else close the job with 1.
func (e *Etcd) endRound(ctx context.Context, r int, reason string, extra []clientv3.Cmp) (Decision, error) {
	e.mu.Lock()
	maxRestarts := e.o.MaxRestarts
	if e.cfg != nil {
		maxRestarts = e.cfg.MaxRestarts
	}
	e.mu.Unlock()
	conds := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(r)),
		clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0),
		e.genCmp(),
	}, extra...)
	var ops []clientv3.Op
	var dec Decision
	if r < maxRestarts {
		le, _ := json.Marshal(endInfo{Round: r, Reason: reason, Node: e.o.NodeID})
		ops = []clientv3.Op{clientv3.OpPut(e.k.lastEnd(), string(le)), clientv3.OpPut(e.k.round(), strconv.Itoa(r+1))}
		dec = Decision{Restart: true, Reason: reason}
	} else {
		ci := closeInfo{Kind: verdict.RestartBudgetExhausted, Code: 1, Reason: fmt.Sprintf("restart budget exhausted (%d of %d restarts used): %s", r, maxRestarts, reason), Node: e.o.NodeID}
		cb, _ := json.Marshal(ci)
		ops = []clientv3.Op{clientv3.OpPut(e.k.closed(), string(cb))}
		dec = Decision{Restart: false, Code: 1, Reason: ci.Reason}
	}
	resp, err := e.cli.Txn(ctx).If(conds...).Then(ops...).
		Else(clientv3.OpGet(e.k.round()), clientv3.OpGet(e.k.closed())).Commit()
	if err != nil {
		return Decision{}, fmt.Errorf("rendezvous: end round %d: %w", r, err)
	}
	if resp.Succeeded {
		e.log.Info("rendezvous round ended", "round", r, "restart", dec.Restart, "reason", dec.Reason)
		return dec, nil
	}
	// Lost the race or fenced out: report what the job did instead.
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		var ci closeInfo
		_ = json.Unmarshal(kvs[0].Value, &ci)
		return Decision{Restart: false, Code: ci.Code, Reason: ci.Reason}, nil
	}
	cur := -1
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		cur, _ = strconv.Atoi(string(kvs[0].Value))
	}
	if cur > r {
		return Decision{Restart: true, Reason: fmt.Sprintf("round %d already superseded by round %d", r, cur)}, nil
	}
	if cur < r {
		return Decision{}, fmt.Errorf("rendezvous: round %d reported but the job is at round %d", r, cur)
	}
	return Decision{Restart: true, Reason: fmt.Sprintf("node %s no longer belongs to round %d (membership expired)", e.o.NodeID, r)}, nil
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

// Leave withdraws this node: it drops its lease (so its membership keys
// go now) and leaves gossip; the job goes on and others see a node loss.
func (e *Etcd) Leave(ctx context.Context, reason string) error {
	e.mu.Lock()
	e.closeLocally("left: " + reason)
	lease := e.lease
	e.mu.Unlock()
	e.log.Warn("leaving the job", "reason", reason)
	e.stopGossip(true)
	if lease != 0 && e.ownsLease {
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			return fmt.Errorf("rendezvous: revoke lease on leave: %w", err)
		}
		return nil
	}
	// A shared lease must survive: delete our own keys instead.
	e.mu.Lock()
	r := e.lastRound
	e.mu.Unlock()
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
