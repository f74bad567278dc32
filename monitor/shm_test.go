package monitor

import (
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// shmManager is a monitor with only heartbeat timeouts: initial 2 s,
// subsequent hb, and a drain interval P (time.Hour: the poller never runs,
// so heartbeats are read only when a deadline is evaluated or on status).
func shmManager(t *testing.T, hb float64, p time.Duration) *Manager {
	t.Helper()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	ft.InitialRankHeartbeatTimeout = fptr(2)
	ft.RankHeartbeatTimeout = fptr(hb)
	ft.RankSectionTimeouts = map[string]*float64{}
	ft.RankOutOfSectionTimeout = nil
	return startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, DrainInterval: p})
}

// TestShmHeartbeats: heartbeats stored in shared memory (Go client default)
// and heartbeats written to the socket (connectsock, an older client) are
// both counted, with the time they were sent, and both detect a rank that
// stops heartbeating, never before its timeout.
func TestShmHeartbeats(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	for _, tc := range []struct {
		name, connect, shm string
	}{
		{"shared memory", "connect", "shm=true"},
		{"socket", "connectsock", "shm=false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := shmManager(t, 0.5, 0) // P = 10 ms
			p := startRank(t, m, tc.connect+";shm;hbn 20 20ms;mark done;sleep 60s")
			m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
			p.waitLine(t, tc.shm, 30*time.Second)
			p.waitLine(t, "done", 30*time.Second)
			s := m.RankStatus(0)
			doneAt := m.mono()
			if !s.Connected || s.Heartbeats != 20 {
				t.Errorf("status %+v, want connected with 20 heartbeats", s)
			}
			r := m.ranks[0]
			last := r.lastHB.Load()
			// The last heartbeat was sent 20 ms (one sleep) before "done".
			if last <= 0 || last > doneAt || doneAt-last > int64(5*time.Second) {
				t.Errorf("last heartbeat at %v, done at %v", time.Duration(last), time.Duration(doneAt))
			}
			if n := r.nIv.Load(); n != 19 {
				t.Errorf("%d heartbeat intervals, want 19", n)
			}
			// Intervals shorter than P may be merged, but 19 intervals span
			// at least 19 × 20 ms, so the longest is at least 20 ms.
			if iv := time.Duration(r.maxIv.Load()); iv < 20*time.Millisecond {
				t.Errorf("max interval %v, shorter than the 20 ms sleep", iv)
			}
			h := waitHang(t, m, 20*time.Second)
			if h.Kind != KindHeartbeat {
				t.Fatalf("hang kind %q, want %q", h.Kind, KindHeartbeat)
			}
			if h.Elapsed < h.Timeout {
				t.Errorf("declared after %v, before the %v timeout", h.Elapsed, h.Timeout)
			}
			if exp := time.Duration(last) + h.Timeout; h.ExpiredAt.Sub(m.epoch) != exp {
				t.Errorf("expired at %v, want last heartbeat + timeout = %v", h.ExpiredAt.Sub(m.epoch), exp)
			}
		})
	}
}

// TestShmNoEarlyHang: a client heartbeating through shared memory every
// 50 ms for 3 s against a 300 ms timeout is never declared hung, with the
// poller off (heartbeats read only at deadlines) and at the default P; it is
// declared hung once it stops, and not before last heartbeat + timeout.
func TestShmNoEarlyHang(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	for _, p := range []time.Duration{time.Hour, 0} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			m := shmManager(t, 0.3, p)
			pr := startRank(t, m, "connect;shm;hbn 60 50ms;mark done;sleep 60s")
			began := time.Now()
			m.BeginCycle(0, map[int]int{0: pr.cmd.Process.Pid})
			pr.waitLine(t, "shm=true", 30*time.Second)
			done := make(chan struct{})
			go func() {
				defer close(done)
				pr.waitLine(t, "done", 30*time.Second)
			}()
			select {
			case h := <-m.Hangs():
				t.Fatalf("hang while heartbeating: %+v", h)
			case <-done:
			}
			h := waitHang(t, m, 20*time.Second)
			if h.Kind != KindHeartbeat {
				t.Fatalf("hang kind %q, want %q", h.Kind, KindHeartbeat)
			}
			// 60 heartbeats 50 ms apart: the last is >= 2.95 s after BeginCycle.
			if got := h.ExpiredAt.Sub(began); got < 2950*time.Millisecond+h.Timeout {
				t.Errorf("expired %v after BeginCycle, want >= 3.25 s", got)
			}
			if lat := h.SignalledAt.Sub(h.ExpiredAt); lat < 0 {
				t.Errorf("signalled %v before the expiry", -lat)
			}
		})
	}
}

// TestShmFallback: when the monitor cannot offer shared memory the client
// falls back to socket heartbeats, which are counted as before.
func TestShmFallback(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := shmManager(t, 5, 0)
	m.shmOK = false // as when CLOCK_MONOTONIC could not be sampled
	p := startRank(t, m, "connect;shm;hbn 5 10ms;mark done;sleep 60s")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "shm=false", 30*time.Second)
	p.waitLine(t, "done", 30*time.Second)
	if s := m.RankStatus(0); s.Heartbeats != 5 {
		t.Errorf("counted %d heartbeats, want 5", s.Heartbeats)
	}
}
