package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/internal/etcdtest"
	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/metrics"
)

// sessionRecorder collects what a session reports through its hooks.
type sessionRecorder struct {
	mu       sync.Mutex
	renewed  []time.Time
	replaced int
	fenced   int
	lostAt   time.Time
	fenceAt  time.Time
	changed  chan struct{}
	log      *slog.Logger // the session's (nil: discarded)
}

func (r *sessionRecorder) note(f func()) {
	r.mu.Lock()
	f()
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
}

// until waits (generously: the machine is loaded) for cond on r's records.
func (r *sessionRecorder) until(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("%s: not within %v", what, d)
		}
	}
}

// newTestSession starts a session with its own lease on a client of
// endpoint (no gossip, no rendezvous around it); its context ends at the
// test's end.
func newTestSession(t *testing.T, endpoint string, cfg sessionConfig, rec *sessionRecorder) (*session, *clientv3.Client, context.CancelFunc) {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cfg.Endpoints = func() string { return endpoint }
	if cfg.FenceMargin == 0 {
		cfg.FenceMargin = cfg.TTL / 5
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = 100 * time.Millisecond
	}
	if cfg.LossBound == 0 {
		cfg.LossBound = time.Minute
	}
	var s *session
	cfg.OnRenewed = func(v time.Time) { rec.note(func() { rec.renewed = append(rec.renewed, v) }) }
	cfg.OnReplaced = func(clientv3.LeaseID) { rec.note(func() { rec.replaced++ }) }
	cfg.OnFenceDue = func(clientv3.LeaseID, time.Time) { rec.note(func() { rec.fenced++; rec.fenceAt = time.Now() }) }
	cfg.OnLost = func() {
		rec.note(func() { rec.lostAt = time.Now() })
		s.lose(fmt.Errorf("%w: test", ErrRendezvousLost))
	}
	gctx, gcancel := context.WithTimeout(ctx, 60*time.Second)
	defer gcancel()
	log := rec.log
	if log == nil {
		log = testLogger(t)
	}
	s, err = newSession(gctx, ctx, cli, 0, cfg, log)
	if err != nil {
		cancel()
		cli.Close()
		t.Fatalf("new session: %v", err)
	}
	t.Cleanup(func() {
		cancel()
		s.wait()
		cli.Close()
	})
	return s, cli, cancel
}

// TestSessionLeaseLifecycle: a session grants its lease (incarnation 1)
// and reports its validity; the keep-alive loop renews it with validities
// that only move forward; a lease revoked behind its back (as etcd does
// after an outage longer than the TTL) is replaced exactly once and
// OnReplaced is called; reincarnate takes a further lease and revoke ends
// the earlier one at etcd; after Close's stopFence no fence fires.
func TestSessionLeaseLifecycle(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	rec := &sessionRecorder{changed: make(chan struct{}, 1)}
	s, cli, _ := newTestSession(t, m.Endpoint(), sessionConfig{TTL: 2 * time.Second}, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	first := s.current()
	if first == 0 || !s.owns() || s.incarnation() != 1 {
		t.Fatalf("after grant: lease %x owns %v incarnation %d, want a lease, owned, incarnation 1", first, s.owns(), s.incarnation())
	}
	rec.until(t, "the grant reported as the first renewal", 10*time.Second, func() bool { return len(rec.renewed) >= 1 })
	s.startProbe("/session-test/probe")
	rec.until(t, "three renewals", 20*time.Second, func() bool { return len(rec.renewed) >= 3 })
	rec.mu.Lock()
	for i := 1; i < len(rec.renewed); i++ {
		if !rec.renewed[i].After(rec.renewed[i-1]) {
			t.Errorf("renewal %d: validity %v not after the previous %v", i, rec.renewed[i], rec.renewed[i-1])
		}
	}
	rec.mu.Unlock()
	if lease, v := s.validity(); lease != first || time.Until(v) <= 0 {
		t.Errorf("validity: lease %x until %v from now, want %x and a future instant", lease, time.Until(v), first)
	}
	if s.unreachableNow() {
		t.Errorf("unreachableNow with etcd answering")
	}

	// Etcd forgets the lease (as after an outage longer than its TTL): the
	// keep-alive loop takes a new one, once.
	if _, err := cli.Revoke(ctx, first); err != nil {
		t.Fatalf("revoke behind the session's back: %v", err)
	}
	rec.until(t, "the expired lease replaced", 20*time.Second, func() bool { return rec.replaced >= 1 })
	second := s.current()
	if second == first || s.incarnation() != 2 {
		t.Fatalf("after the replacement: lease %x (was %x), incarnation %d, want a new lease and incarnation 2", second, first, s.incarnation())
	}
	// A second replace of the same old lease (a join that found it gone at
	// the same time) is a no-op.
	if err := s.replace(ctx, first); err != nil || s.current() != second || s.incarnation() != 2 {
		t.Fatalf("replace of an already replaced lease: err %v, lease %x, incarnation %d; want no change", err, s.current(), s.incarnation())
	}
	rec.mu.Lock()
	replaced := rec.replaced
	rec.mu.Unlock()
	if replaced != 1 {
		t.Errorf("OnReplaced called %d times, want 1", replaced)
	}
	rec.until(t, "the new lease renewed", 20*time.Second, func() bool {
		l, _ := s.validity()
		return l == second
	})

	// Declared lost: a new incarnation, and the old lease is revoked.
	old, cur, err := s.reincarnate(ctx)
	if err != nil {
		t.Fatalf("reincarnate: %v", err)
	}
	if old != second || cur == second || cur != s.current() || s.incarnation() != 3 {
		t.Fatalf("reincarnate: old %x cur %x (current %x, incarnation %d), want old %x, a new current lease, incarnation 3",
			old, cur, s.current(), s.incarnation(), second)
	}
	s.revoke(ctx, old)
	ttl, err := cli.TimeToLive(ctx, old)
	if err != nil || ttl.TTL != -1 {
		t.Fatalf("the old incarnation's lease after revoke: ttl %+v err %v, want gone (TTL -1)", ttl, err)
	}
	if ttl, err := cli.TimeToLive(ctx, cur); err != nil || ttl.TTL <= 0 {
		t.Fatalf("the new incarnation's lease: ttl %+v err %v, want alive", ttl, err)
	}
	s.stopFence()
	rec.mu.Lock()
	fenced := rec.fenced
	rec.mu.Unlock()
	if fenced != 0 {
		t.Errorf("the fence fired %d times with etcd answering, want 0", fenced)
	}
	if s.Lost().Err() != nil {
		t.Errorf("Lost ended with etcd answering: %v", context.Cause(s.Lost()))
	}
}

// TestSessionFenceThenLost: with etcd gone, an owned lease's fence fires
// at its last proven validity minus the margin (well before the lease can
// expire at etcd), the session reports etcd unreachable, and once the
// loss bound passed OnLost runs and Lost() ends with ErrRendezvousLost;
// the probe then stops and nothing more is renewed.
func TestSessionFenceThenLost(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	rec := &sessionRecorder{changed: make(chan struct{}, 1)}
	cfg := sessionConfig{TTL: 2 * time.Second, FenceMargin: 400 * time.Millisecond, ProbeInterval: 100 * time.Millisecond, LossBound: 3 * time.Second}
	s, _, _ := newTestSession(t, m.Endpoint(), cfg, rec)
	s.startProbe("/session-test/probe")
	rec.until(t, "two renewals", 20*time.Second, func() bool { return len(rec.renewed) >= 2 })

	if err := m.Close(); err != nil {
		t.Fatalf("stop etcd: %v", err)
	}
	stopped := time.Now()
	rec.until(t, "the fence", 20*time.Second, func() bool { return rec.fenced > 0 })
	_, validUntil := s.validity()
	rec.mu.Lock()
	fenceAt := rec.fenceAt
	rec.mu.Unlock()
	if deadline := FenceDeadline(validUntil, cfg.FenceMargin); fenceAt.Before(deadline) {
		t.Errorf("fenced %v before the deadline (validity minus margin)", deadline.Sub(fenceAt))
	}
	if fenceAt.Sub(stopped) > cfg.TTL+5*time.Second {
		t.Errorf("fenced %v after etcd stopped, want within the TTL (plus slack for load)", fenceAt.Sub(stopped))
	}
	rec.until(t, "etcd reported unreachable", 20*time.Second, func() bool { return s.unreachableNow() })

	select {
	case <-s.Lost().Done():
	case <-time.After(cfg.LossBound + 30*time.Second):
		t.Fatalf("Lost() did not end within the loss bound (plus slack) of etcd stopping")
	}
	if cause := context.Cause(s.Lost()); !errors.Is(cause, ErrRendezvousLost) {
		t.Fatalf("Lost() cause %v, want ErrRendezvousLost", cause)
	}
	rec.mu.Lock()
	lostAt, n := rec.lostAt, len(rec.renewed)
	rec.mu.Unlock()
	if lostAt.Sub(stopped) < cfg.LossBound {
		t.Errorf("declared lost %v after etcd stopped, before the loss bound %v", lostAt.Sub(stopped), cfg.LossBound)
	}
	s.wait() // the probe and the keep-alive loop end with Lost()
	rec.mu.Lock()
	after := len(rec.renewed)
	rec.mu.Unlock()
	if after != n {
		t.Errorf("%d renewals reported after the loss", after-n)
	}
}

// TestSessionRenewalMetrics: each renewal's round trip and its headroom
// before the fence are observed; etcd frozen right after a renewal, past
// most of the next one's headroom, makes that renewal's answer come late
// (or time out): a headroom under TTL/6 is observed, the node warns, and
// the late answer's round trip (or the timeout) is counted.
func TestSessionRenewalMetrics(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	srv := etcdtest.Start(t)
	defer func() { _ = srv.Signal(syscall.SIGCONT) }()
	var logs lockedbuf.Buffer
	rec := &sessionRecorder{changed: make(chan struct{}, 1), log: slog.New(slog.NewTextHandler(&logs, nil))}
	m := metrics.New()
	// Renewals every 1 s, fence margin 0.6 s: an answer normally comes
	// 1.4 s before the previous proof's fence deadline; warned under 0.5 s.
	cfg := sessionConfig{TTL: 3 * time.Second, Metrics: m}
	newTestSession(t, srv.ClientURL, cfg, rec)
	rec.until(t, "three renewals", 30*time.Second, func() bool { return len(rec.renewed) >= 3 })
	if n := histogram(t, m, "ftlauncher_lease_renewal_seconds").count; n < 2 {
		t.Fatalf("%d renewal round trips observed after three renewals, want at least 2", n)
	}
	before := histogram(t, m, "ftlauncher_lease_fence_headroom_seconds")
	if before.count < 1 {
		t.Fatalf("no headroom observed after three renewals")
	}
	rec.mu.Lock()
	n := len(rec.renewed)
	rec.mu.Unlock()
	rec.until(t, "a renewal", 30*time.Second, func() bool { return len(rec.renewed) > n })
	logged := len(logs.String())
	// The proof just renewed fences 2.4 s after its send; the next renewal
	// goes 1 s after it and is answered once etcd runs again, 2.1 s after.
	srv.Freeze(t)
	time.Sleep(2100 * time.Millisecond)
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	rec.until(t, "a renewal after the freeze", 30*time.Second, func() bool { return len(rec.renewed) > n+1 })
	after := histogram(t, m, "ftlauncher_lease_fence_headroom_seconds")
	if after.upTo(0.4) <= before.upTo(0.4) {
		t.Errorf("no headroom of 0.4 s or less observed after the freeze (buckets before %v, after %v)", before.buckets, after.buckets)
	}
	if !strings.Contains(logs.String()[logged:], "lease renewals answered close to the fence deadline") {
		t.Errorf("no warning of renewals close to the fence after the freeze; log:\n%s", logs.String()[logged:])
	}
	rtt := histogram(t, m, "ftlauncher_lease_renewal_seconds")
	timeouts := counter(t, m, "ftlauncher_lease_renewal_failures_total", "timeout")
	if rtt.count-rtt.upTo(0.512) < 1 && timeouts < 1 {
		t.Errorf("neither a round trip over 0.5 s nor a timeout counted across a 2.1 s freeze (round trips %v)", rtt.buckets)
	}
}

// histo is one histogram's samples as gathered: count, and the cumulative
// count of each bucket by its upper bound.
type histo struct {
	count   uint64
	buckets map[float64]uint64
}

// upTo is the number of samples in the buckets up to le (one of its bounds).
func (h histo) upTo(le float64) uint64 { return h.buckets[le] }

func histogram(t *testing.T, m *metrics.Metrics, name string) histo {
	t.Helper()
	ms := metricSeries(t, m, name)
	if len(ms) == 0 {
		t.Fatalf("no metric %s", name)
	}
	h := ms[0].GetHistogram()
	out := histo{count: h.GetSampleCount(), buckets: map[float64]uint64{}}
	for _, b := range h.GetBucket() {
		out.buckets[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	return out
}

// counter is the value of name's series whose one label has value label (0
// when absent).
func counter(t *testing.T, m *metrics.Metrics, name, label string) float64 {
	t.Helper()
	for _, s := range metricSeries(t, m, name) {
		if lp := s.GetLabel(); len(lp) == 1 && lp[0].GetValue() == label {
			return s.GetCounter().GetValue()
		}
	}
	return 0
}
