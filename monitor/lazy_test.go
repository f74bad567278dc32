package monitor

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestDrainBeforeDeadline: with a poller that never runs (P = 1 h), the
// heartbeats are read only when a deadline is evaluated. None may be missed:
// the rank heartbeats for 4 s against a 0.5 s timeout and must only be
// declared hung after it stops.
func TestDrainBeforeDeadline(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	ft.InitialRankHeartbeatTimeout = fptr(1)
	ft.RankHeartbeatTimeout = fptr(0.5)
	ft.RankSectionTimeouts = map[string]*float64{}
	ft.RankOutOfSectionTimeout = nil
	m, err := New(Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, DrainInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })

	p := startRank(t, m, "connect;hbn 40 100ms;mark done;sleep 60s")
	began := time.Now()
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "done", 30*time.Second)
	if n := m.RankStatus(0).Heartbeats; n != 40 {
		t.Errorf("RankStatus counted %d heartbeats, want 40 (it must drain first)", n)
	}
	h := waitHang(t, m, 20*time.Second)
	if h.Kind != KindHeartbeat {
		t.Fatalf("hang kind %q, want %q", h.Kind, KindHeartbeat)
	}
	// The rank heartbeated for >= 3.9 s after connecting: an expiry before
	// began+4s means heartbeats were missed.
	if got := h.ExpiredAt.Sub(began); got < 4*time.Second {
		t.Errorf("hang expired %v after BeginCycle, want >= 4s: heartbeats were lost", got)
	}
	if h.Elapsed < h.Timeout {
		t.Errorf("declared after %v, before the %v timeout", h.Elapsed, h.Timeout)
	}
}

// lazyStream is every post-handshake message type, in order.
func lazyStream() []byte {
	var b []byte
	b = ftwire.AppendDefineSection(b, 0, "step")
	b = ftwire.AppendSectionOpenIter(b, 0, 300)
	b = append(b, ftwire.MsgHeartbeat)
	b = ftwire.AppendSectionOp(b, ftwire.MsgSectionClose, 0)
	b = ftwire.AppendFrame(b, 0x7f, []byte("unknown, skipped"))
	b = append(b, ftwire.MsgHeartbeat)
	b = ftwire.AppendSectionOp(b, ftwire.MsgSectionOpen, 0)
	b = append(b, ftwire.MsgSectionCloseAll)
	return b
}

// newLazySession returns a connected session of rank 0 without a socket and
// with no clock armed (every timeout disabled), for feeding bytes to
// processLocked.
func newLazySession(t *testing.T) (*Manager, *lazyConn) {
	m := newManager(t, 1, nil, "")
	r := m.ranks[0]
	r.begin(0, noSuchPID, Timeouts{}, 0, false)
	c1, c2 := net.Pipe()
	t.Cleanup(func() { c1.Close(); c2.Close() })
	gen := r.install(c1)
	if !r.init(gen, initInfo{globalRank: 0}) {
		t.Fatal("init refused")
	}
	return m, &lazyConn{m: m, r: r, gen: gen, fd: -1, done: make(chan struct{}), names: map[uint64]string{}}
}

// TestLazySplitMessages feeds the stream cut at every position (messages
// split across reads) and byte by byte.
func TestLazySplitMessages(t *testing.T) {
	t.Parallel()
	stream := lazyStream()
	check := func(t *testing.T, m *Manager, lc *lazyConn) {
		t.Helper()
		s := m.ranks[0].status()
		if s.Heartbeats != 2 || s.SectionCloses["step"] != 2 || len(s.OpenSections) != 0 || lc.msgs != 8 || len(lc.pending) != 0 {
			t.Errorf("state %+v, %d messages, %d pending bytes", s, lc.msgs, len(lc.pending))
		}
		if it := m.ranks[0].currentIter; it != 300 {
			t.Errorf("iteration %d, want 300", it)
		}
	}
	for cut := 0; cut <= len(stream); cut++ {
		m, lc := newLazySession(t)
		lc.mu.Lock()
		for _, part := range [][]byte{stream[:cut], stream[cut:]} {
			if err := lc.processLocked(part, m.mono()); err != nil {
				t.Fatalf("cut %d: %v", cut, err)
			}
		}
		lc.mu.Unlock()
		check(t, m, lc)
	}
	m, lc := newLazySession(t)
	lc.mu.Lock()
	for i := range stream {
		if err := lc.processLocked(stream[i:i+1], m.mono()); err != nil {
			t.Fatalf("byte %d: %v", i, err)
		}
	}
	lc.mu.Unlock()
	check(t, m, lc)
}

func TestLazyProtocolErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"unknown fixed type", []byte{0x10}, "unknown message type"},
		{"undefined section", ftwire.AppendSectionOp(nil, ftwire.MsgSectionOpen, 9), "never defined"},
		{"payload too large", []byte{ftwire.MsgDefineSection, 0x80, 0x80, 0x80, 0x01}, "exceeds"},
		{"bad timeouts", ftwire.AppendFrame(nil, ftwire.MsgSetTimeouts, []byte("{")), "decode timeouts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, lc := newLazySession(t)
			lc.mu.Lock()
			err := lc.processLocked(tc.in, m.mono())
			lc.mu.Unlock()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestDrainInterval(t *testing.T) {
	tests := []struct {
		name string
		to   Timeouts
		want time.Duration
	}{
		{"none enabled", Timeouts{}, 10 * time.Millisecond},
		{"long timeouts", Timeouts{Heartbeat: time.Minute, InitialHeartbeat: time.Hour}, 10 * time.Millisecond},
		{"100 ms section", Timeouts{Heartbeat: time.Minute, Sections: map[string]time.Duration{"s": 100 * time.Millisecond}}, 5 * time.Millisecond},
		{"tiny", Timeouts{OutOfSection: 5 * time.Millisecond}, time.Millisecond},
	}
	for _, tc := range tests {
		if got := drainIntervalFor(&tc.to); got != tc.want {
			t.Errorf("%s: P = %v, want %v", tc.name, got, tc.want)
		}
	}
	// A connection sending faster than targetBatch per P shortens it.
	if got := nextInterval(10*time.Millisecond, 640, 10*time.Millisecond); got != time.Millisecond {
		t.Errorf("busy: next = %v, want 1ms", got)
	}
	if got := nextInterval(10*time.Millisecond, 10, 10*time.Millisecond); got != 10*time.Millisecond {
		t.Errorf("quiet: next = %v, want 10ms", got)
	}
	if got := nextInterval(10*time.Millisecond, 1e6, 10*time.Millisecond); got != minBusyInterval {
		t.Errorf("flood: next = %v, want %v", got, minBusyInterval)
	}
}
