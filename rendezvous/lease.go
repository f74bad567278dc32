package rendezvous

import (
	"context"
	"fmt"
	"time"

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
	e.mu.Lock()
	e.lease = resp.ID
	e.mu.Unlock()
	// A grant is the new lease's first renewal: a node that rejoins with a
	// new lease (reincarnate) may start ranks before the keep-alive loop
	// renewed it, and the fence (here and in the watchdog) must know the
	// lease is valid.
	if v := LeaseValidUntil(sent, resp.TTL); e.o.Lease == 0 && e.renewed(resp.ID, v) && e.o.OnLeaseRenewed != nil && e.lost.Err() == nil {
		e.o.OnLeaseRenewed(v)
	}
	select {
	case e.kaKick <- struct{}{}: // the keep-alive loop moves to the new lease at once
	default:
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
