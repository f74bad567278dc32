package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/metrics"
)

// session is this node's incarnation at etcd, as concurrency.Session is an
// etcd client's: it owns the lease that every key of the node hangs on and
// what is proven about it. It grants the lease, renews it (keepAlive),
// replaces it when etcd reports it gone (replace) or when the node was
// declared lost (reincarnate: a new incarnation), records until when the
// lease is certainly valid at etcd and arms the fence timer for that
// instant, probes etcd's reachability, and ends Lost() once etcd has been
// unreachable past the loss bound or the rendezvous closes.
//
// It knows nothing of rounds or of the job: the façade (Etcd) learns of
// what the session sees through hooks (OnRenewed, OnFenceDue, OnLost,
// OnReplaced) and decides what it means for the node.
//
// Locks: renewMu serializes lease replacements (exactly one new lease per
// expiry; it is held across the Grant call) and is taken before mu; mu
// guards the fields below it and is never held across a call to etcd.
// Neither is held while a hook runs, and the session never takes a lock of
// the façade, so the façade's Etcd.mu and the session's locks never nest.
type session struct {
	cli       *clientv3.Client
	cfg       sessionConfig
	log       *slog.Logger
	ctx       context.Context // ends on Close
	lost      context.Context // ends on Close, or with an ErrRendezvousLost cause once etcd is lost
	lose      context.CancelCauseFunc
	kick      chan struct{} // moves the keep-alive loop to a replaced lease
	wg        sync.WaitGroup
	renewMu   sync.Mutex // serializes replacements (keepAlive, a join that finds its lease gone, reincarnate)
	mu        sync.Mutex
	lease     clientv3.LeaseID
	owned     bool // this session granted the lease (false: a shared one from the options, never replaced by keepAlive nor revoked)
	grants    int  // leases granted so far: the incarnation
	validOf   clientv3.LeaseID
	validTill time.Time     // validOf is certainly valid at etcd until then
	fence     *time.Timer   // fires OnFenceDue at FenceDeadline(validTill)
	fenceOff  bool          // Close disarmed the fence for good
	proven    chan struct{} // closed (and cleared) at the next renewal: awaitProven waits on it
	lastHeard time.Time     // the last answer from etcd (a probe read, a renewal)
}

// sessionConfig are a session's settings and hooks.
type sessionConfig struct {
	TTL           time.Duration // lease TTL (rounded up to whole seconds at etcd)
	FenceMargin   time.Duration
	ProbeInterval time.Duration
	LossBound     time.Duration // etcd unreachable longer than this ends Lost()
	Endpoints     func() string // for error messages
	// OnRenewed is called when the own lease is proven valid until a later
	// instant than before (a renewal, a grant), unless Lost() ended.
	OnRenewed func(validUntil time.Time)
	// OnFenceDue is called when FenceDeadline of the last proven validity
	// passed with no newer renewal (or at once, see fenceIfUnproven), with
	// that lease and validity.
	OnFenceDue func(lease clientv3.LeaseID, validUntil time.Time)
	// OnReplaced is called after replace granted lease for an expired
	// one: what hung on the old one must be put again.
	OnReplaced func(lease clientv3.LeaseID)
	// OnLost is called once when the probe found etcd unreachable past
	// LossBound; it is to cancel Lost() (lose) with the loss's reason.
	OnLost func()
	// Metrics gets each renewal's round trip, its headroom before the
	// fence, and the failures (nil: none kept).
	Metrics *metrics.Metrics
}

// newSession returns a live session on cli, or an error: with shared == 0
// it grants its own lease (reported as the first renewal) and starts the
// keep-alive loop; else it adopts shared, a lease granted and kept alive by
// someone else; ctx bounds the grant. Its own contexts derive from life
// (the rendezvous's, which ends at Close). The reachability probe is started apart (startProbe), once
// the caller knows which key to read.
func newSession(ctx, life context.Context, cli *clientv3.Client, shared clientv3.LeaseID, cfg sessionConfig, log *slog.Logger) (*session, error) {
	s := &session{cli: cli, cfg: cfg, log: log, ctx: life, kick: make(chan struct{}, 1)}
	s.lost, s.lose = context.WithCancelCause(life)
	if shared != 0 {
		s.lease = shared
		return s, nil
	}
	s.owned = true
	v, ok, err := s.grant(ctx)
	if err != nil {
		s.lose(err)
		return nil, err
	}
	if ok {
		s.report(v)
	}
	s.wg.Add(1)
	go s.keepAlive()
	return s, nil
}

// Lost ends on Close, or with an ErrRendezvousLost cause once etcd has been
// unreachable past the loss bound (context.Cause says which).
func (s *session) Lost() context.Context { return s.lost }

// current is the lease this node's keys hang on now.
func (s *session) current() clientv3.LeaseID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lease
}

// owns reports whether the session granted its lease (false for a shared
// one, or after abandon).
func (s *session) owns() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.owned
}

// incarnation is how many leases this session granted (0 with a shared one).
func (s *session) incarnation() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants
}

// validity is the lease last proven valid and until when.
func (s *session) validity() (clientv3.LeaseID, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.validOf, s.validTill
}

// grant takes a new lease and makes it current. A grant is the new
// lease's first renewal: ok says that the caller is to report v (once no
// lock is held): a node that rejoins with a new lease (reincarnate) may
// start ranks before the keep-alive loop renewed it, and the fence (here
// and in the watchdog) must know the lease is valid.
func (s *session) grant(ctx context.Context) (v time.Time, ok bool, err error) {
	ttl := int64((s.cfg.TTL + time.Second - 1) / time.Second)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := s.cli.Grant(actx, ttl)
	if err != nil {
		if actx.Err() != nil && ctx.Err() == nil {
			// Its own bound ran out, not the caller's: etcd is slow.
			err = fmt.Errorf("%w (%w)", errEtcdSlow, err)
		}
		return v, false, fmt.Errorf("etcd lease at %s: %w", s.cfg.Endpoints(), err)
	}
	s.mu.Lock()
	s.lease = resp.ID
	s.grants++
	owned := s.owned
	s.mu.Unlock()
	v = LeaseValidUntil(sent, resp.TTL)
	if owned {
		ok, _ = s.renewed(resp.ID, v)
	}
	select {
	case s.kick <- struct{}{}: // the keep-alive loop moves to the new lease at once
	default:
	}
	return v, ok, nil
}

// report hands a forward-moved validity to OnRenewed (not once lost).
func (s *session) report(v time.Time) {
	if s.cfg.OnRenewed != nil && s.lost.Err() == nil {
		s.cfg.OnRenewed(v)
	}
}

// replace replaces an expired lease old with a new one, unless another
// goroutine already did (then it is a no-op), and calls OnReplaced so that
// what hung on the lease is put again. Both the keep-alive loop and a join
// that finds its lease gone call it, so exactly one new lease is granted.
func (s *session) replace(ctx context.Context, old clientv3.LeaseID) error {
	s.renewMu.Lock()
	if s.current() != old {
		s.renewMu.Unlock()
		return nil
	}
	s.log.Warn("membership lease expired; taking a new one", "lease", fmt.Sprintf("%x", old))
	v, ok, err := s.grant(ctx)
	s.renewMu.Unlock()
	if err != nil {
		return err
	}
	if ok {
		s.report(v)
	}
	if s.cfg.OnReplaced != nil {
		s.cfg.OnReplaced(s.current())
	}
	return nil
}

// reincarnate grants a new lease whatever the current one's state (the
// node was declared lost: its old lease may still expire and must not take
// the new round's keys along). It returns the old and the new lease; the
// caller re-puts its keys, then revokes old (revoke).
func (s *session) reincarnate(ctx context.Context) (old, cur clientv3.LeaseID, err error) {
	s.renewMu.Lock()
	old = s.current()
	v, ok, err := s.grant(ctx)
	cur = s.current()
	s.renewMu.Unlock()
	if ok {
		s.report(v)
	}
	return old, cur, err
}

// revoke revokes a lease of an earlier incarnation (best effort: it
// expires by itself).
func (s *session) revoke(ctx context.Context, old clientv3.LeaseID) {
	if _, err := s.cli.Revoke(ctx, old); err != nil {
		s.log.Debug("revoke the lease of the lost incarnation", "err", err)
	}
}

// renewTimeout bounds one renewal. A late answer still proves the lease
// valid until its send time plus the TTL, so it is waited for long (an etcd
// busy with thousands of nodes, on a loaded machine, answers in seconds);
// a new attempt would queue behind it on the same connection anyway.
func (s *session) renewTimeout() time.Duration {
	return s.cfg.TTL / 2
}

// keepAlive keeps this node's own lease alive with one renewal every
// TTL/renewsPerTTL (sooner after a failure), following it when it is
// replaced; if etcd reports it gone (we were away longer than its TTL) a
// new one is granted for later rounds. After each renewal it records the
// lease's validity (the fence) and calls OnRenewed. It stops once etcd is
// lost or at Close.
//
// Renewals are messages on one LeaseKeepAlive stream (renewStream), as
// clientv3's KeepAlive sends them. A renewal is not waited for before the
// next one is sent, and one that hangs (a member that lost its leader, a
// connection being replaced) must not hold back the next: when the oldest
// renewal on the stream has waited a whole interval, the next goes on a new
// stream, which may reach another member, and the old one still takes its
// late answers, which still prove the lease valid until their own send
// time plus the TTL. At most maxRenewals are in flight, each bounded by
// renewTimeout.
func (s *session) keepAlive() {
	defer s.wg.Done()
	interval := s.cfg.TTL / renewsPerTTL
	results := make(chan renewResult, maxRenewals)
	inFlight := 0
	var cur *renewStream
	send := func(lease clientv3.LeaseID) {
		if cur != nil && cur.stale(interval) {
			cur.retire()
			cur = nil
		}
		if cur == nil {
			cur = openRenewStream(s.lost, s.cli, results, s.renewTimeout())
		}
		inFlight++
		if !cur.send(lease) {
			// The stream ended before this renewal went on it (etcd
			// refused it as it opened): the renewal fails now, and the
			// retry opens another. Room in results: at most maxRenewals
			// are in flight, this one included.
			cur = nil
			results <- renewResult{renewal: renewal{lease: lease, sent: time.Now()}, err: errRenewStreamEnded}
		}
	}
	defer func() {
		for ; inFlight > 0; inFlight-- {
			<-results // each renewal ends by its timeout or with s.lost
		}
	}()
	next := time.NewTimer(0)
	defer next.Stop()
	var slow slowRenewals
	for {
		select {
		case <-s.lost.Done():
			return
		case <-s.kick:
			next.Reset(0)
		case <-next.C:
			if inFlight < maxRenewals {
				send(s.current())
			}
			next.Reset(interval)
		case r := <-results:
			inFlight--
			switch {
			case r.err == nil && r.ttl > 0:
				s.heard() // a renewal is an answer from etcd's leader: no probe needed
				v := LeaseValidUntil(r.sent, r.ttl)
				moved, h := s.renewed(r.lease, v)
				rtt := time.Since(r.sent)
				s.cfg.Metrics.LeaseRenewed(rtt, moved, h.known, h.left)
				if moved && h.known {
					slow.note(s.log, s.cfg.TTL, rtt, h.left)
				}
				if moved {
					s.report(v)
				}
			case r.err == nil || errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				s.cfg.Metrics.LeaseRenewalFailed("expired")
				s.heard()
				if s.current() == r.lease {
					if err := s.replace(s.lost, r.lease); err != nil {
						s.log.Warn("re-grant lease", "err", err)
					}
				}
				next.Reset(0) // renew the new lease at once: that records its validity
			case s.lost.Err() == nil:
				s.cfg.Metrics.LeaseRenewalFailed(renewFailure(r.err))
				// Unreachable for now: try again soon, so that a short cut
				// is bridged as soon as it heals (the fence is the deadline).
				s.log.Debug("lease renewal failed", "err", r.err, "took", time.Since(r.sent).Round(time.Millisecond))
				next.Reset(min(interval, retryRenewal))
			}
		}
	}
}

// renewed records that lease is certainly valid at etcd until validUntil
// and (re)arms the fence for that instant. It returns false for a renewal
// of a lease that was replaced meanwhile, or one a later-sent renewal's
// answer overtook (OnRenewed sees only instants that move forward), and
// how long before the fence deadline of the lease's previous proof it came.
func (s *session) renewed(lease clientv3.LeaseID, validUntil time.Time) (bool, headroom) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lease != s.lease {
		return false, headroom{}
	}
	if s.validOf == lease && !validUntil.After(s.validTill) {
		return false, headroom{} // an older answer overtaken by a newer one: no change
	}
	var h headroom
	if s.validOf == lease {
		h = headroom{known: true, left: time.Until(FenceDeadline(s.validTill, s.cfg.FenceMargin))}
	}
	s.validOf, s.validTill = lease, validUntil
	if s.proven != nil {
		close(s.proven)
		s.proven = nil
	}
	if s.fenceOff {
		return true, h
	}
	d := time.Until(FenceDeadline(validUntil, s.cfg.FenceMargin))
	if s.fence == nil {
		s.fence = time.AfterFunc(d, s.fenceDue)
	} else {
		s.fence.Reset(d)
	}
	return true, h
}

// headroom is how long before the fence deadline of the lease's previous
// proof a renewal's answer came (left < 0: after it); known is false for a
// lease's first proof.
type headroom struct {
	known bool
	left  time.Duration
}

// renewFailure names a failed renewal's error for the metrics.
func renewFailure(err error) string {
	switch {
	case errors.Is(err, errRenewTimeout):
		return "timeout"
	case errors.Is(err, errRenewStreamEnded):
		return "stream_ended"
	}
	return "unreachable"
}

// slowRenewals warns, at most once per slowWarnEvery, when renewals come
// close to the fence: their answer left less than TTL/6 (1 s at the
// default 6 s, against 2.8 s normally) before the deadline of
// the proof before them. etcd is answering lease renewals late (overloaded,
// a slow disk or network on its leader); a little later still and this
// node fences its ranks. Only the keep-alive loop uses it.
type slowRenewals struct {
	n      int           // slow renewals since the last warning
	least  time.Duration // the least headroom among them
	warned time.Time
}

const slowWarnEvery = 30 * time.Second

func (w *slowRenewals) note(log *slog.Logger, ttl, rtt, left time.Duration) {
	if left >= ttl/6 {
		return
	}
	if w.n == 0 || left < w.least {
		w.least = left
	}
	w.n++
	if !w.warned.IsZero() && time.Since(w.warned) < slowWarnEvery {
		return
	}
	log.Warn("lease renewals answered close to the fence deadline: etcd is slow to renew leases (overloaded, or a slow disk or network on its leader); "+
		"later still and this node fences its ranks (docs/rendezvous.md, Fencing; metric ftlauncher_lease_fence_headroom_seconds)",
		"renewal_took", rtt.Round(time.Millisecond), "headroom", w.least.Round(time.Millisecond), "slow_renewals", w.n,
		"warn_below", (ttl / 6).Round(time.Millisecond))
	w.n, w.warned = 0, time.Now()
}

func (s *session) fenceDue() {
	if s.cfg.OnFenceDue != nil {
		s.cfg.OnFenceDue(s.validity())
	}
}

// fenceIfUnproven fires the fence at once when the lease is not proven
// valid now (a node assigned ranks after its deadline passed).
func (s *session) fenceIfUnproven() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.unprovenLocked() {
		s.fence.Reset(0)
	}
}

// unprovenLocked reports whether the fence is armed and its deadline has
// passed with no newer renewal: ranks started now would have to stop at
// once.
func (s *session) unprovenLocked() bool {
	return s.fence != nil && !s.fenceOff && !time.Now().Before(FenceDeadline(s.validTill, s.cfg.FenceMargin))
}

// awaitProven waits, at most bound, until the lease is proven valid now
// (a renewal answered since the fence deadline passed). A node that comes
// back from a freeze or a cut shorter than the TTL still holds its lease,
// but its last proof is stale; joining a round before the keep-alive loop
// renews it would get it assigned and fenced at once (fenceIfUnproven),
// ending that round too: two restarts for one stall. It reports whether
// the lease is proven (false: the bound or ctx ended first; joining then
// is still safe, the fence acts as before).
func (s *session) awaitProven(ctx context.Context, bound time.Duration) bool {
	next, proven := s.nextProof()
	if proven {
		return true
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		select {
		case <-next:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
		if next, proven = s.nextProof(); proven {
			return true
		}
	}
}

// nextProof reports whether the lease is proven valid now; if not, it
// returns a channel closed at the next renewal.
func (s *session) nextProof() (<-chan struct{}, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.unprovenLocked() {
		return nil, true
	}
	if s.proven == nil {
		s.proven = make(chan struct{})
	}
	return s.proven, false
}

// stopFence disarms the fence for good (at Close).
func (s *session) stopFence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fenceOff = true
	if s.fence != nil {
		s.fence.Stop()
	}
}

// startProbe starts the reachability probe, reading key.
func (s *session) startProbe(key string) {
	s.mu.Lock()
	s.lastHeard = time.Now()
	s.mu.Unlock()
	s.wg.Add(1)
	go s.probe(key)
}

// probe checks etcd reachability; past LossBound it calls OnLost (which
// closes the job locally, kind RendezvousLost, and cancels Lost(), ending
// every etcd call in flight) so that the agent stops instead of running
// blind.
func (s *session) probe(key string) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ProbeInterval)
	defer t.Stop()
	skipped, upTo := false, time.Time{} // upTo: etcd presumed up until then
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		fresh := time.Since(s.lastHeard) < s.heardWindowLocked()
		s.mu.Unlock()
		if fresh {
			// The lease's keep-alives answered lately (heard): a read would
			// only add load (one per node per second: 4,000/s at 4,000 nodes).
			skipped = true
			continue
		}
		// A slow answer is an answer: an etcd busy with thousands of
		// nodes may take seconds, which is not an outage (up to 5 s with
		// the default 60 s bound; 1 s at least).
		to := max(s.cfg.ProbeInterval, time.Second, min(s.cfg.LossBound/4, 5*time.Second))
		ctx, cancel := context.WithTimeout(s.ctx, to)
		_, err := s.cli.Get(ctx, key)
		cancel()
		s.mu.Lock()
		if err != nil && skipped {
			// Count the outage from the previous tick, as a read then
			// would have: the skips do not shorten the loss bound.
			upTo = time.Now().Add(-s.cfg.ProbeInterval)
		}
		skipped = false
		if err == nil {
			if !s.lastHeard.IsZero() && time.Since(s.lastHeard) > s.staleAfterLocked() {
				s.log.Info("etcd reachable again", "down_for", time.Since(s.lastHeard).Round(time.Millisecond))
			}
			s.lastHeard = time.Now()
			s.mu.Unlock()
			continue
		}
		down := time.Since(s.lastHeard)
		if upTo.After(s.lastHeard) {
			down = time.Since(upTo)
		}
		s.mu.Unlock()
		if s.ctx.Err() != nil {
			return
		}
		if down > s.cfg.LossBound {
			if s.cfg.OnLost != nil {
				s.cfg.OnLost() // final: this node's job is over
			}
			return
		}
		s.log.Warn("etcd unreachable", "for", down.Round(time.Millisecond), "bound", s.cfg.LossBound, "err", err)
	}
}

// heard records an answer from etcd other than the probe's (a lease
// renewal): etcd is reachable now.
func (s *session) heard() {
	s.mu.Lock()
	s.lastHeard = time.Now()
	s.mu.Unlock()
}

// unreachableNow reports whether the last reachability probes failed (etcd
// is away now, though maybe not yet past the loss bound): courtesy writes
// (a departure, ledger records at exit) are skipped then.
func (s *session) unreachableNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.lastHeard.IsZero() && time.Since(s.lastHeard) > s.staleAfterLocked()
}

// heardWindowLocked is how recent an answer from etcd lets the probe skip
// its read: an owned lease is renewed every TTL/renewsPerTTL (fence.go),
// and each renewal is an answer. The window is that TTL/3 plus slack: a
// busy etcd answers renewals late, and each probe read it saves counts at
// 4,000 nodes.
func (s *session) heardWindowLocked() time.Duration {
	if !s.owned {
		return 0
	}
	return s.cfg.ProbeInterval + s.cfg.TTL/3 + 500*time.Millisecond
}

// staleAfterLocked is how long without an answer means etcd is away for now.
func (s *session) staleAfterLocked() time.Duration {
	return max(2*s.cfg.ProbeInterval+time.Second, s.heardWindowLocked()+s.cfg.ProbeInterval)
}

// abandon makes the session leave its lease to expire: Close no longer
// revokes it (a crash, in tests).
func (s *session) abandon() {
	s.mu.Lock()
	s.owned = false
	s.mu.Unlock()
}

// wait waits for the session's goroutines (after its context ended).
func (s *session) wait() { s.wg.Wait() }
