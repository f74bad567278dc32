package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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

// renewsPerTTL is how many renewals the keep-alive loop sends per TTL: 4
// (one every 1.25 s with the 5 s TTL), a third more than clientv3's TTL/3,
// so that a cut must last TTL - TTL/4 - FenceMargin (2.75 s by default)
// before a node fences.
const renewsPerTTL = 4

// renewTimeout bounds one renewal. A late answer still proves the lease
// valid until its send time plus the TTL, so it is waited for long (an etcd
// busy with thousands of nodes, on a loaded machine, answers in seconds);
// a new attempt would queue behind it on the same connection anyway.
func (e *Etcd) renewTimeout() time.Duration {
	return e.o.LeaseTTL / 2
}

// fenceState is this node's own lease validity and its fence, under e.mu.
type fenceState struct {
	lease      clientv3.LeaseID
	validUntil time.Time   // the lease is certainly valid at etcd until then
	timer      *time.Timer // fires at fenceDeadline(validUntil)
	round      int         // the round this node fenced itself out of; -1 none
	at         time.Time   // when it fenced (zero: never)
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

// keepAlive keeps this node's own lease alive with one KeepAliveOnce every
// LeaseTTL/renewsPerTTL (sooner after a failure), following it when it is
// replaced; if etcd reports it gone (we were away longer than its TTL) a
// new one is granted for later rounds. After each renewal it records the
// lease's validity (fence) and calls OnLeaseRenewed. It stops once etcd is
// lost or at Close.
//
// A renewal is not waited for before the next one is sent: one that hangs
// (a member that lost its leader, a connection being replaced) must not
// hold back the next, which may go to another member, and a late answer
// still proves the lease valid until its own send time plus the TTL. At
// most maxRenewals are in flight, each bounded by renewTimeout.
func (e *Etcd) keepAlive(kick chan struct{}) {
	defer e.wg.Done()
	interval := e.o.LeaseTTL / renewsPerTTL
	type result struct {
		lease clientv3.LeaseID
		sent  time.Time
		ttl   int64
		err   error
	}
	results := make(chan result, maxRenewals)
	inFlight := 0
	send := func(lease clientv3.LeaseID) {
		inFlight++
		sent := time.Now()
		go func() {
			ctx, cancel := context.WithTimeout(e.lost, e.renewTimeout())
			defer cancel()
			resp, err := e.cli.KeepAliveOnce(ctx, lease)
			r := result{lease: lease, sent: sent, err: err}
			if err == nil {
				r.ttl = resp.TTL
			}
			results <- r
		}()
	}
	defer func() {
		for ; inFlight > 0; inFlight-- {
			<-results // each attempt ends by its timeout or with e.lost
		}
	}()
	next := time.NewTimer(0)
	defer next.Stop()
	for {
		select {
		case <-e.lost.Done():
			return
		case <-kick:
			next.Reset(0)
		case <-next.C:
			if inFlight < maxRenewals {
				send(e.currentLease())
			}
			next.Reset(interval)
		case r := <-results:
			inFlight--
			switch {
			case r.err == nil && r.ttl > 0:
				e.heard() // a renewal is an answer from etcd's leader: no probe needed
				v := LeaseValidUntil(r.sent, r.ttl)
				if e.renewed(r.lease, v) && e.o.OnLeaseRenewed != nil && e.lost.Err() == nil {
					e.o.OnLeaseRenewed(v)
				}
			case r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				e.heard()
				if e.currentLease() == r.lease {
					if err := e.renewLease(e.lost, r.lease); err != nil {
						e.log.Warn("re-grant lease", "err", err)
					}
				}
				next.Reset(0) // renew the new lease at once: that records its validity
			case e.lost.Err() == nil:
				// Unreachable for now: try again soon, so that a short cut
				// is bridged as soon as it heals (the fence is the deadline).
				e.log.Debug("lease renewal failed", "err", r.err, "took", time.Since(r.sent).Round(time.Millisecond))
				next.Reset(min(interval, retryRenewal))
			}
		}
	}
}

// maxRenewals bounds the renewals in flight; retryRenewal is the pause
// after a failed one.
const (
	maxRenewals  = 3
	retryRenewal = 250 * time.Millisecond
)

// renewed records that lease is certainly valid at etcd until validUntil
// and (re)arms the fence for that instant. It returns false for a renewal
// of a lease that was replaced meanwhile, or one a later-sent renewal's
// answer overtook (OnLeaseRenewed sees only instants that move forward).
func (e *Etcd) renewed(lease clientv3.LeaseID, validUntil time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if lease != e.lease || e.closed != nil {
		return false
	}
	f := &e.fence
	if f.lease == lease && !validUntil.After(f.validUntil) {
		return false // an older answer overtaken by a newer one: no change
	}
	f.lease, f.validUntil = lease, validUntil
	d := time.Until(FenceDeadline(validUntil, e.o.FenceMargin))
	if f.timer == nil {
		f.timer = time.AfterFunc(d, e.fenceDue)
	} else {
		f.timer.Reset(d)
	}
	return true
}

// fenceDue runs at the fence deadline: unless a renewal moved it meanwhile,
// an active node fences itself out of its round. The agent learns it from
// Ended(round) (EndFenced) and kills its ranks at once.
func (e *Etcd) fenceDue() {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := &e.fence
	now := time.Now()
	deadline := FenceDeadline(f.validUntil, e.o.FenceMargin)
	if now.Before(deadline) || e.closed != nil || e.state != stateActive || f.round == e.lastRound {
		return // renewed meanwhile, or nothing runs here to fence
	}
	r := e.lastRound
	f.round, f.at = r, now
	e.setStateLocked(stateFenced, "lease not renewed; fenced out of round "+strconv.Itoa(r))
	e.log.Error("fenced: the membership lease could not be renewed and may expire at etcd soon; stopping this node's ranks",
		"round", r, "lease", fmt.Sprintf("%x", f.lease), "valid_until", f.validUntil.UTC().Format(time.RFC3339Nano),
		"margin", e.o.FenceMargin, "late_by", now.Sub(deadline).Round(time.Millisecond))
	if e.roundStop != nil {
		e.roundStop() // its loss watchers: it is out of the round
		e.roundStop = nil
	}
	if s, ok := e.ends[r]; ok {
		e.fireLocked(r, s)
	}
}

// Fenced reports the round this node fenced itself out of last and when
// (ok false when it never fenced).
func (e *Etcd) Fenced() (round int, at time.Time, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.fence.round, e.fence.at, !e.fence.at.IsZero()
}

// stopFence disarms the fence timer (at Close).
func (e *Etcd) stopFenceLocked() {
	if e.fence.timer != nil {
		e.fence.timer.Stop()
	}
}
