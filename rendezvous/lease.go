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
// most one round.

// leaseReplaced is the session's OnReplaced: the keys that hung on the
// expired lease are put again under the new one, lease.
func (e *Etcd) leaseReplaced(lease clientv3.LeaseID) {
	e.reputAlive(lease)
	// A node waiting for a round lost its membership with the old lease:
	// wake it so that it registers again (waitAssignment).
	e.mu.Lock()
	e.broadcastLocked()
	e.mu.Unlock()
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
	old, cur, err := e.sess.reincarnate(ctx)
	if err != nil {
		return fmt.Errorf("rendezvous: new lease after being declared lost: %w", err)
	}
	e.mu.Lock()
	e.reborn = last // once per loss, even if Next is called again
	e.mu.Unlock()
	e.log.Warn("this node was declared lost; rejoining with a new lease", "round", last,
		"old_lease", fmt.Sprintf("%x", old), "lease", fmt.Sprintf("%x", cur), "incarnation", e.sess.incarnation())
	e.reputAlive(cur)
	rctx, cancel := e.lostTimeout(2 * time.Second)
	defer cancel()
	e.sess.revoke(rctx, old)
	if _, err := e.cli.Delete(rctx, e.k.dead(e.o.NodeID)); err != nil {
		e.log.Debug("remove this node's death record", "err", err)
	}
	return nil
}

// deathState says whether reincarnate has anything to check (need), the
// last round this node was assigned, and whether that round's end record
// already declared this node lost.
func (e *Etcd) deathState() (last int, declared, need bool) {
	owns := e.sess.owns()
	e.mu.Lock()
	defer e.mu.Unlock()
	last = e.lastRound
	if last < 0 || e.reborn == last || !owns {
		return last, false, false
	}
	le, seen := e.view.lastEnd(last)
	return last, seen && le.Node == e.o.NodeID && le.Cause == policy.NodeLost, true
}

// needDeathRead: the registration checks this node's death record.
func (e *Etcd) needDeathRead() bool {
	_, declared, need := e.deathState()
	return need && !declared
}

// reputAlive registers this node as alive again under lease, a re-granted
// one, unless its job is closed (or its generation superseded). Before the
// node joined a generation there is nothing to put again: joinGeneration
// registers under the current lease.
func (e *Etcd) reputAlive(lease clientv3.LeaseID) {
	e.mu.Lock() // the session's keep-alive loop may call it while joinGeneration sets k
	k, gen, joined := e.k, e.gen, e.k.base != ""
	e.mu.Unlock()
	if !joined || e.view.closedInfo() != nil {
		return
	}
	ctx, cancel := e.lostTimeout(5 * time.Second)
	defer cancel()
	if _, err := e.cli.Txn(ctx).If(genFence(e.rk, gen), clientv3.Compare(clientv3.CreateRevision(k.closed()), "=", 0)).
		Then(clientv3.OpPut(k.alive(e.o.NodeID), "", clientv3.WithLease(lease))).Commit(); err != nil {
		e.log.Debug("re-register alive key", "err", err)
	}
}
