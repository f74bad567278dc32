package monitor

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// ringManager is a one-rank monitor with drain interval p (time.Hour: the
// poller never runs, so the ring is read only before a deadline is
// evaluated and on RankStatus); mut edits the FT config, whose timeouts are
// all disabled to start with.
func ringManager(t *testing.T, p time.Duration, mut func(*configs.FaultTolerance)) *Manager {
	t.Helper()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	ft.InitialRankHeartbeatTimeout = nil
	ft.RankHeartbeatTimeout = nil
	ft.RankSectionTimeouts = map[string]*float64{}
	ft.RankOutOfSectionTimeout = nil
	if mut != nil {
		mut(&ft)
	}
	return startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, DrainInterval: p})
}

// selfClient connects the test process itself as rank 0 (no hang can be
// declared: every timeout is disabled in these tests).
func selfClient(t *testing.T, m *Manager, o ftclient.Options) *ftclient.Client {
	t.Helper()
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := ftclient.ConnectPath(ctx, m.RankSocket(0), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestRingExactOpenTimes: a section event through the ring is applied at
// the client's time, not when the monitor read it (P = 1 h here, so the
// read happens only at RankStatus, 100 ms later); and never before the
// call. Every kind of event is exercised; an old client (socket sections)
// still works, with its open time the read time.
func TestRingExactOpenTimes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		o          ftclient.Options
		ring, late bool
	}{
		{"ring", ftclient.Options{GlobalRank: 0}, true, false},
		{"socket sections (old client)", ftclient.Options{GlobalRank: 0, SocketSections: true}, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := ringManager(t, time.Hour, nil)
			c := selfClient(t, m, tc.o)
			if c.SectionRing() != tc.ring {
				t.Fatalf("SectionRing() = %v, want %v", c.SectionRing(), tc.ring)
			}
			before := time.Now()
			if err := c.StartSectionAt("step", 5); err != nil {
				t.Fatal(err)
			}
			if err := c.StartSection("a"); err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			time.Sleep(100 * time.Millisecond)
			s := m.RankStatus(0)
			if fmt.Sprint(s.OpenSections) != "[a step]" {
				t.Fatalf("open sections %v, want [a step]", s.OpenSections)
			}
			for _, name := range []string{"a", "step"} {
				at := s.OpenedAt[name]
				if at.Before(before) {
					t.Errorf("%s opened at %v, before the call (%v early)", name, at, before.Sub(at))
				}
				if late := at.Sub(after); (late > 50*time.Millisecond) != tc.late {
					t.Errorf("%s opened %v after the call returned; want late=%v", name, late, tc.late)
				}
			}
			if err := c.EndSection("a"); err != nil {
				t.Fatal(err)
			}
			if err := c.StartSection("b"); err != nil {
				t.Fatal(err)
			}
			if err := c.EndAllSections(); err != nil {
				t.Fatal(err)
			}
			s = m.RankStatus(0)
			if len(s.OpenSections) != 0 || s.SectionCloses["a"] != 1 || s.SectionCloses["b"] != 1 || s.SectionCloses["step"] != 1 {
				t.Fatalf("after close and close_all: open %v, closes %v", s.OpenSections, s.SectionCloses)
			}
			iter := r0Iter(m)
			if iter != 5 {
				t.Errorf("iteration %d, want 5", iter)
			}
		})
	}
}

// r0Iter is rank 0's current training iteration.
func r0Iter(m *Manager) int64 {
	r := m.ranks[0]
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.currentIter
}

// TestRingWrapAndFull: many more events than the ring holds, with the
// poller off (P = 1 h) so the ring fills and the client must wait for the
// drains RankStatus does; and with the default P, where the adaptive
// interval keeps up. No event is lost or reordered: a reordered close would
// find its section not open and leave it open, a lost one would miss a count.
func TestRingWrapAndFull(t *testing.T) {
	t.Parallel()
	for _, p := range []time.Duration{time.Hour, 0} {
		t.Run(fmt.Sprint(p), func(t *testing.T) {
			t.Parallel()
			m := ringManager(t, p, nil)
			c := selfClient(t, m, ftclient.Options{GlobalRank: 0})
			if !c.SectionRing() {
				t.Fatal("no section ring")
			}
			const rounds, names = 3000, 7 // 12000 events
			var wg sync.WaitGroup
			errc := make(chan error, 1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < rounds; i++ {
					n := fmt.Sprintf("s%d", i%names)
					if err := c.StartSectionAt("step", int64(i)); err != nil {
						errc <- err
						return
					}
					if err := c.StartSection(n); err != nil {
						errc <- err
						return
					}
					if err := c.EndSection(n); err != nil {
						errc <- err
						return
					}
					if i%2 == 0 {
						err := c.EndSection("step")
						if err == nil {
							continue
						}
						errc <- err
						return
					}
					if err := c.EndAllSections(); err != nil {
						errc <- err
						return
					}
				}
			}()
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			deadline := time.After(60 * time.Second)
		loop:
			for {
				select {
				case <-done:
					break loop
				case <-deadline:
					t.Fatal("client did not finish")
				case <-time.After(2 * time.Millisecond):
					if p == time.Hour {
						m.RankStatus(0) // the only drain
					}
				}
			}
			select {
			case err := <-errc:
				t.Fatal(err)
			default:
			}
			s := m.RankStatus(0)
			if len(s.OpenSections) != 0 {
				t.Errorf("open sections %v, want none", s.OpenSections)
			}
			if s.SectionCloses["step"] != rounds {
				t.Errorf("step closed %d times, want %d", s.SectionCloses["step"], rounds)
			}
			for i := 0; i < names; i++ {
				n := fmt.Sprintf("s%d", i)
				want := rounds / names
				if i < rounds%names {
					want++
				}
				if s.SectionCloses[n] != want {
					t.Errorf("%s closed %d times, want %d", n, s.SectionCloses[n], want)
				}
			}
			iter := r0Iter(m)
			if iter != rounds-1 {
				t.Errorf("iteration %d, want %d", iter, rounds-1)
			}
		})
	}
}

// TestRingHangs: deadlines of section events sent through the ring, in a
// separate rank process, with the default P: detection is never early, and
// a clock started by a ring event starts at the client's time.
func TestRingHangs(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	tests := []struct {
		name    string
		ft      func(*configs.FaultTolerance)
		script  string
		quiet   time.Duration // no hang for this long after "go"
		late    time.Duration // how late a clock may start: socket events are stamped when read (≤ P)
		kind    HangKind
		section string
		timeout time.Duration
	}{
		{
			name:   "section held open",
			ft:     func(ft *configs.FaultTolerance) { ft.RankSectionTimeouts = map[string]*float64{"a": fptr(0.5)} },
			script: "connect;ring;open a;mark go;sleep 60s",
			kind:   KindSection, section: "a", timeout: 500 * time.Millisecond,
		},
		{
			name: "old client: section held open",
			ft:   func(ft *configs.FaultTolerance) { ft.RankSectionTimeouts = map[string]*float64{"a": fptr(0.5)} },
			// The ring line reads false for this client.
			script: "connectold;open a;mark go;sleep 60s",
			kind:   KindSection, section: "a", timeout: 500 * time.Millisecond, late: time.Second,
		},
		{
			name: "out of section after a close",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(0.4)}
				ft.RankOutOfSectionTimeout = fptr(0.6)
			},
			// The section would expire at 0.4 s if the close were lost.
			script: "connect;open step;sleep 300ms;close step;mark go;sleep 60s",
			kind:   KindOutOfSection, timeout: 600 * time.Millisecond, quiet: 400 * time.Millisecond,
		},
		{
			name: "close_all",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(0.4), "b": fptr(0.4)}
				ft.RankOutOfSectionTimeout = fptr(0.6)
			},
			script: "connect;open step;open b;sleep 300ms;closeall;mark go;sleep 60s",
			kind:   KindOutOfSection, timeout: 600 * time.Millisecond, quiet: 400 * time.Millisecond,
		},
		{
			// Two warmup iterations get the warmup timeout (2 s), the third
			// the step timeout (0.4 s).
			name: "warmup",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(0.4), "warmup": fptr(2)}
				ft.NumWarmupIterations = 2
			},
			script: "connect;open step 10;sleep 700ms;close step;open step 11;sleep 700ms;close step;open step 12;mark go;sleep 60s",
			kind:   KindSection, section: "step", timeout: 400 * time.Millisecond,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := ringManager(t, 0, tc.ft)
			p := startRank(t, m, tc.script)
			m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
			p.waitLine(t, "go", 30*time.Second)
			seen := time.Now()
			if tc.quiet > 0 {
				noHang(t, m, tc.quiet)
			}
			h := waitHang(t, m, 30*time.Second)
			if h.Kind != tc.kind || h.Section != tc.section || h.Timeout != tc.timeout {
				t.Fatalf("hang %s %q %v, want %s %q %v", h.Kind, h.Section, h.Timeout, tc.kind, tc.section, tc.timeout)
			}
			if h.Elapsed < h.Timeout {
				t.Errorf("declared after %v, before the %v timeout", h.Elapsed, h.Timeout)
			}
			// The clock started before "go" was printed, so it expired
			// by seen + timeout.
			// Ring events carry the client's own time, converted with an
			// offset sampled once so that any error makes them late: by
			// the sampling's length, more than microseconds when the
			// machine is busy and the sampling thread is preempted.
			if late := h.ExpiredAt.Sub(seen.Add(h.Timeout)); late > max(tc.late, 50*time.Millisecond) {
				t.Errorf("deadline %v after the latest possible one", late)
			}
			if d := h.SignalledAt.Sub(h.ExpiredAt); d < 0 || d > 5*time.Second {
				t.Errorf("signalled %v after the deadline", d)
			}
			p.exited(t, 30*time.Second)
		})
	}
}
