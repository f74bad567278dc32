package rendezvous

import (
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Fencing: never two rounds at once (docs/rendezvous.md). A node's round
// membership hangs on its lease, and its peers may start a round without it
// only once that lease has expired at etcd (a loss seen by gossip alone
// waits for the expiry; a refused stream dial proves the launcher dead). So
// a node that cannot renew its lease stops its ranks before the lease can
// expire: each renewal's local send time s plus the TTL etcd granted is an
// instant until which the lease is certainly valid at etcd (etcd starts the
// TTL when it receives the renewal, after s), and the node fences at that
// instant minus FenceMargin when no later renewal came through.

// renewsPerTTL is how many renewals the keep-alive loop sends per TTL: 3,
// clientv3's cadence (one every 2 s with the default 6 s TTL: 0.5 a
// second, what clientv3's KeepAlive sent at the 5 s TTL it replaced), so
// that the fence costs no more renewal traffic than clientv3 did. A cut
// must last TTL - TTL/3 - FenceMargin (2.8 s by default) before a node
// fences: the documented free blip (2 s) keeps its slack. The default TTL
// went from 5 s to 6 s for that (every TTL/4 at 5 s sent 0.8 a second;
// every TTL/3 at 5 s would fence a cut after 2.33 s): a silent node loss
// is confirmed by its lease's expiry up to 1 s later (docs/rendezvous.md,
// "Fencing"). Each renewal is one message on the node's LeaseKeepAlive
// stream (renewStream), as clientv3's are.
const renewsPerTTL = 3

// fenceState is this node's last fence out of a round, under e.mu. The
// lease's validity and the fence timer are the session's (session.go).
type fenceState struct {
	lease      clientv3.LeaseID // the lease that was not renewed in time
	validUntil time.Time        // it was certainly valid at etcd until then
	round      int              // the round this node fenced itself out of; -1 none
	at         time.Time        // when it fenced (zero: never)
}

// FenceDeadline is the instant at which a node whose lease is certainly
// valid until validUntil stops its ranks, absent a newer renewal:
// margin before the lease can expire at etcd.
func FenceDeadline(validUntil time.Time, margin time.Duration) time.Time {
	return validUntil.Add(-margin)
}

// LeaseValidUntil is the instant until which a lease renewed by a request
// sent at sent, for which etcd granted ttl seconds, is certainly valid at
// etcd: etcd counts the TTL from when it handles the request, which is
// after it was sent. A ttl <= 0 means the lease is gone.
func LeaseValidUntil(sent time.Time, ttl int64) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return sent.Add(time.Duration(ttl) * time.Second)
}

// maxRenewals bounds the renewals in flight; retryRenewal is the pause
// after a failed one.
const (
	maxRenewals  = 3
	retryRenewal = 250 * time.Millisecond
)

// leaseRenewed is the session's OnRenewed: the validity goes to
// OnLeaseRenewed unless the job is closed.
func (e *Etcd) leaseRenewed(validUntil time.Time) {
	if e.view.closedInfo() == nil && e.o.OnLeaseRenewed != nil {
		e.o.OnLeaseRenewed(validUntil)
	}
}

// fenceDue runs at the fence deadline: unless a renewal moved it meanwhile,
// an active node fences itself out of its round. The agent learns it from
// Ended(round) (EndFenced) and kills its ranks at once. lease is the lease
// last proven valid, until validUntil (the session's, read before mu: the
// session's lock never nests with it).
func (e *Etcd) fenceDue(lease clientv3.LeaseID, validUntil time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := &e.fence
	now := time.Now()
	deadline := FenceDeadline(validUntil, e.o.FenceMargin)
	if now.Before(deadline) || e.view.closedInfo() != nil || e.state != stateActive || f.round == e.lastRound {
		return // renewed meanwhile, or nothing runs here to fence
	}
	r := e.lastRound
	f.round, f.at, f.lease, f.validUntil = r, now, lease, validUntil
	e.setStateLocked(stateFenced, "lease not renewed; fenced out of round "+strconv.Itoa(r))
	e.log.Error("fenced: the membership lease could not be renewed and may expire at etcd soon; stopping this node's ranks",
		"round", r, "lease", fmt.Sprintf("%x", f.lease), "valid_until", f.validUntil.UTC().Format(time.RFC3339Nano),
		"margin", e.o.FenceMargin, "late_by", now.Sub(deadline).Round(time.Millisecond))
	if e.roundStop != nil {
		e.roundStop() // its loss watchers: it is out of the round
		e.roundStop = nil
	}
	e.view.fence(r, validUntil)
}

// Fenced reports the round this node fenced itself out of last and when
// (ok false when it never fenced).
func (e *Etcd) Fenced() (round int, at time.Time, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fence.round, e.fence.at, !e.fence.at.IsZero()
}
