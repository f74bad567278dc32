package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
)

// A node's lease is its incarnation: every key that says the node is there
// (alive, its round memberships, the closer key it holds) hangs on it. A
// node that the others declared lost must not come back on the lease it had
// then: that lease may still expire (it was frozen about as long as the
// TTL), and the expiry would delete the membership of the round it rejoined
// and end that round too. So a node declared lost takes a new lease before
// it joins again (reincarnate) and revokes the old one: one stall ends at
// most one round (issue 12).

func (e *Etcd) grantLease(ctx context.Context) error {
	ttl := int64((e.o.LeaseTTL + time.Second - 1) / time.Second)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := e.cli.Grant(actx, ttl)
	if err != nil {
		return fmt.Errorf("etcd lease at %s: %w", e.endpoints(), err)
	}
	// A grant is the new lease's first renewal: a node that rejoins with a
	// new lease (reincarnate) may start ranks before its keep-alive loop
	// renewed it, and the fence watchdog must know the lease is valid.
	if e.o.OnLeaseRenewed != nil && e.o.Lease == 0 {
		e.o.OnLeaseRenewed(sent.Add(time.Duration(resp.TTL) * time.Second))
	}
	e.mu.Lock()
	e.lease = resp.ID
	stop := e.kaStop
	e.mu.Unlock()
	if stop != nil {
		stop() // the keep-alive loop moves to the new lease at once
	}
	return nil
}

// renewLease replaces an expired lease old with a new one, unless another
// goroutine already did (then it is a no-op), and re-registers what hangs on
// the lease. Both the keep-alive loop and a join that finds its lease gone
// call it, so exactly one new lease is granted.
func (e *Etcd) renewLease(ctx context.Context, old clientv3.LeaseID) error {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if e.currentLease() != old {
		return nil
	}
	e.log.Warn("membership lease expired; taking a new one", "lease", fmt.Sprintf("%x", old))
	if err := e.grantLease(ctx); err != nil {
		return err
	}
	e.reputAlive()
	// A node waiting for a round lost its membership with the old lease:
	// wake it so that it registers again (waitAssignment).
	e.mu.Lock()
	e.broadcastLocked()
	e.mu.Unlock()
	return nil
}

// reincarnate gives this node a new lease when the round it last ran in
// ended because it was declared lost (the end record names it), or when
// its registration found a gossip death record of it (recorded); the old
// lease is revoked and the death record removed, so later restart rounds
// wait for the node again. It does nothing for a shared lease, which
// others' keys hang on.
func (e *Etcd) reincarnate(ctx context.Context, recorded bool) error {
	last, declared, need := e.deathState()
	if !need || !(declared || recorded) {
		return nil
	}
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	old := e.currentLease()
	if err := e.grantLease(ctx); err != nil {
		return fmt.Errorf("rendezvous: new lease after being declared lost: %w", err)
	}
	e.mu.Lock()
	e.reborn = last // once per loss, even if Next is called again
	e.mu.Unlock()
	e.log.Warn("this node was declared lost; rejoining with a new lease", "round", last,
		"old_lease", fmt.Sprintf("%x", old), "lease", fmt.Sprintf("%x", e.currentLease()))
	e.reputAlive()
	rctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	if _, err := e.cli.Revoke(rctx, old); err != nil {
		e.log.Debug("revoke the lease of the lost incarnation", "err", err) // it expires by itself
	}
	if _, err := e.cli.Delete(rctx, e.k.dead(e.o.NodeID)); err != nil {
		e.log.Debug("remove this node's death record", "err", err)
	}
	return nil
}

// deathState says whether reincarnate has anything to check (need), the
// last round this node was assigned, and whether that round's end record
// already declared this node lost.
func (e *Etcd) deathState() (last int, declared, need bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	last = e.lastRound
	if last < 0 || e.reborn == last || !e.ownsLease {
		return last, false, false
	}
	le, seen := e.lastEnds[last]
	return last, seen && le.Node == e.o.NodeID && le.Cause == policy.NodeLost, true
}

// needDeathRead: the registration checks this node's death record.
func (e *Etcd) needDeathRead() bool {
	_, declared, need := e.deathState()
	return need && !declared
}

func (e *Etcd) currentLease() clientv3.LeaseID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// renewLoop renews lease every TTL/3 until ctx ends or the lease cannot be
// renewed for a whole TTL (or etcd says it is gone). Each renewal is one
// request whose send time is known, so OnLeaseRenewed gets the lease's
// validity from it: the instant before the request left plus the TTL etcd
// granted, a lower bound of the expiry etcd's leader counts from the
// renewal's arrival. (clientv3's KeepAlive stream hides when it sends.)
func (e *Etcd) renewLoop(ctx context.Context, lease clientv3.LeaseID) {
	interval := max(e.o.LeaseTTL/3, 100*time.Millisecond)
	lastOK := time.Now()
	for ctx.Err() == nil {
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, e.o.LeaseTTL)
		resp, err := e.cli.KeepAliveOnce(rctx, lease)
		cancel()
		switch {
		case err == nil && resp.TTL > 0:
			lastOK = sent
			e.heard() // a renewal is an answer from etcd's leader: no probe needed
			if e.o.OnLeaseRenewed != nil {
				e.o.OnLeaseRenewed(sent.Add(time.Duration(resp.TTL) * time.Second))
			}
			if !sleepCtx(ctx, time.Until(sent.Add(interval))) {
				return
			}
		case errors.Is(err, rpctypes.ErrLeaseNotFound) || (err == nil && resp.TTL <= 0):
			return // expired: the caller takes a new lease
		default:
			if ctx.Err() != nil || time.Since(lastOK) > e.o.LeaseTTL {
				return // the caller checks whether it expired
			}
			if !sleepCtx(ctx, 500*time.Millisecond) {
				return
			}
		}
	}
}

// keepAlive keeps the owned lease alive, following it when it is replaced;
// if etcd reports it gone (we were away longer than its TTL) a new one is
// granted for later rounds. It stops once etcd is lost.
func (e *Etcd) keepAlive() {
	defer e.wg.Done()
	for e.lost.Err() == nil {
		e.mu.Lock()
		lease := e.lease
		kctx, stop := context.WithCancel(e.lost)
		e.kaStop = stop
		e.mu.Unlock()
		e.renewLoop(kctx, lease)
		stop()
		if e.lost.Err() != nil {
			return
		}
		if e.currentLease() != lease {
			continue // replaced: keep the new one alive at once
		}
		if !sleepCtx(e.lost, 500*time.Millisecond) {
			return
		}
		ctx, cancel := e.lostTimeout(2 * time.Second)
		ttl, err := e.cli.TimeToLive(ctx, lease)
		cancel()
		if err == nil && ttl.TTL <= 0 {
			if err := e.renewLease(e.lost, lease); err != nil {
				e.log.Warn("re-grant lease", "err", err)
			}
		}
	}
}

// reputAlive registers this node as alive again under a re-granted lease,
// unless its job is closed (or its generation superseded).
func (e *Etcd) reputAlive() {
	e.mu.Lock()
	closed := e.closed != nil
	e.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := e.lostTimeout(5 * time.Second)
	defer cancel()
	if _, err := e.cli.Txn(ctx).If(e.genCmp(), clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0)).
		Then(clientv3.OpPut(e.k.alive(e.o.NodeID), "", clientv3.WithLease(e.currentLease()))).Commit(); err != nil {
		e.log.Debug("re-register alive key", "err", err)
	}
}
