package monitor

import (
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

const sec = int64(time.Second)

// TestStallLog: which gaps between sightings of the launcher are stalls,
// and which intervals they exclude.
func TestStallLog(t *testing.T) {
	type query struct {
		from, to, now int64
		want          bool
	}
	ticks := func(from, to, step int64) []int64 {
		var s []int64
		for v := from; v <= to; v += step {
			s = append(s, v)
		}
		return s
	}
	tests := []struct {
		name    string
		seen    []int64 // sightings (observe), in order; the log starts at 0
		windows []stallWindow
		queries []query
		grace   map[int64]int64 // now → graceEnd(now)
	}{
		{
			name: "regular ticks: no stall", seen: ticks(sec/10, 3*sec, sec/10),
			queries: []query{{0, 3 * sec, 3 * sec, false}},
			grace:   map[int64]int64{3 * sec: 3 * sec},
		},
		{
			name: "a gap of exactly the threshold is not a stall", seen: []int64{sec, 2 * sec},
			queries: []query{{0, 2 * sec, 2 * sec, false}},
		},
		{
			name: "a 5 s SIGSTOP", seen: []int64{sec, 6 * sec, 6*sec + sec/10},
			windows: []stallWindow{{sec, 6 * sec}},
			queries: []query{
				{sec / 2, 6*sec + sec/20, 7 * sec, true},        // read late, after the stall
				{sec / 5, sec * 9 / 10, 7 * sec, false},         // wholly before it
				{6*sec + sec/20, 6*sec + sec/5, 7 * sec, false}, // wholly after it
				{2 * sec, 3 * sec, 7 * sec, true},               // a client time inside it
			},
			grace: map[int64]int64{6*sec + sec/10: 7 * sec, 7*sec + 1: 7*sec + 1},
		},
		{
			// The first check after the stall records it, before the
			// detector's own tick: the interval it checks is excluded.
			name: "a pending stall is recorded by the check", seen: []int64{sec},
			windows: []stallWindow{{sec, 4 * sec}},
			queries: []query{{sec / 2, 4 * sec, 4 * sec, true}, {sec / 2, sec * 3 / 4, 4 * sec, false}},
		},
		{
			name: "two stalls", seen: []int64{sec, 3 * sec, 3*sec + sec/10, 10 * sec},
			windows: []stallWindow{{sec, 3 * sec}, {3*sec + sec/10, 10 * sec}},
			queries: []query{
				{3*sec + sec/20, 3*sec + sec/10 - 1, 10 * sec, false}, // between the two
				{3*sec + sec/20, 10 * sec, 10 * sec, true},
			},
			grace: map[int64]int64{10 * sec: 11 * sec},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newStallLog(stallThreshold, 0)
			for _, v := range tc.seen {
				s.observe(v)
			}
			for _, q := range tc.queries {
				if got := s.overlaps(q.from, q.to, q.now); got != q.want {
					t.Errorf("overlaps(%v, %v) at %v = %v, want %v", time.Duration(q.from), time.Duration(q.to), time.Duration(q.now), got, q.want)
				}
			}
			if !slices.Equal(s.windows, tc.windows) {
				t.Errorf("stalls %v, want %v", s.windows, tc.windows)
			}
			if rep := s.takeUnreported(); !slices.Equal(rep, tc.windows) {
				t.Errorf("reported %v, want %v", rep, tc.windows)
			}
			if rep := s.takeUnreported(); len(rep) != 0 {
				t.Errorf("reported twice: %v", rep)
			}
			for now, want := range tc.grace {
				if got := s.graceEnd(now); got != want {
					t.Errorf("graceEnd(%v) = %v, want %v", time.Duration(now), time.Duration(got), time.Duration(want))
				}
			}
		})
	}
}

// TestStallLogBounded: past maxStallWindows the oldest stalls merge (so
// they still exclude what they covered), and BeginCycle's prune forgets
// those that ended before the cycle.
func TestStallLogBounded(t *testing.T) {
	s := newStallLog(stallThreshold, 0)
	now := int64(0)
	for i := 0; i < maxStallWindows+10; i++ {
		now += 2 * sec
		s.observe(now)
	}
	if len(s.windows) != maxStallWindows {
		t.Fatalf("%d stalls remembered, want %d", len(s.windows), maxStallWindows)
	}
	if s.windows[0].start != 0 || !s.overlaps(sec/2, sec, now) {
		t.Errorf("the oldest stall was forgotten, not merged: first window %v", s.windows[0])
	}
	s.prune(now - sec)
	if len(s.windows) != 1 || s.windows[0].end != now {
		t.Errorf("after prune: %v, want only the stall that ended at %v", s.windows, time.Duration(now))
	}
}

// recordStall enters a stall as the detector would have (the tests cannot
// freeze their own process; integration/timeouts_test.go SIGSTOPs a real
// launcher).
func recordStall(s *stallLog, w stallWindow) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.windows = append(s.windows, w)
	s.unreported = append(s.unreported, w)
	if w.end > s.lastEnd.Load() {
		s.lastEnd.Store(w.end)
	}
}

// TestStallNotLearned: a rank pauses 2 s (heartbeats and an open "step");
// when a launcher stall covers the pause, the pause is not learned: the
// computed heartbeat and step timeouts come from the intervals observed
// on time. Socket and shared-memory clients alike.
func TestStallNotLearned(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	// 85 heartbeats (84 intervals); the steps after the pause start 2.5 s
	// after the stall below ends (less the delay of the "pause" line).
	const script = "hbn 12 50ms;open step;mark pause;sleep 2s;hb;close step;hbn 60 50ms;" +
		"open step;sleep 30ms;close step;open step;sleep 30ms;close step;open step;sleep 30ms;close step;hbn 12 50ms;exit 0"
	tests := []struct {
		name    string
		connect string
		stall   bool
	}{
		{"socket, no stall", "connectsock", false},
		{"socket, stall over the pause", "connectsock", true},
		{"shared memory, no stall", "connect", false},
		{"shared memory, stall over the pause", "connect", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// On a loaded machine the test's own launcher may really stall
			// (a tick more than stallThreshold late), which excludes
			// intervals the no-stall case counts: such a run says nothing
			// about the pause, so it is run again (at most three times).
			for attempt := 1; ; attempt++ {
				if !runStallNotLearned(t, tc.connect+";"+script, tc.stall) {
					return
				}
				if attempt == 3 {
					t.Fatalf("the test's launcher stalled in each of %d runs (machine overloaded): nothing shown", attempt)
				}
				t.Logf("run %d: the launcher really stalled; running again", attempt)
			}
		})
	}
}

// runStallNotLearned runs one rank through the script and checks what was
// learned. It reports whether the no-stall case saw a real launcher stall,
// in which case it checked nothing.
func runStallNotLearned(t *testing.T, script string, stall bool) (realStall bool) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "ft_state.json")
	m := newManager(t, 1, func(ft *configs.FaultTolerance) {
		ft.CalculateTimeouts = true
		ft.SafetyFactor = 5
		ft.RankSectionTimeouts = map[string]*float64{"step": fptr(60)}
	}, state)
	p := startRank(t, m, script)
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "pause", 30*time.Second)
	if stall {
		// The launcher "stalls" from just before the pause until
		// after it: what the rank did meanwhile is read late.
		now := m.mono()
		recordStall(m.stalls, stallWindow{now - int64(20*time.Millisecond), now + int64(2500*time.Millisecond)})
	}
	if st := p.exited(t, 60*time.Second); !st.Success() {
		t.Fatalf("rank ended with %v", st)
	}
	if !stall {
		m.stalls.mu.Lock()
		realStall = len(m.stalls.windows) > 0
		m.stalls.mu.Unlock()
		if realStall {
			m.EndCycleWith(false)
			return true
		}
	}
	m.EndCycleWith(true)
	sf := readState(t, state)
	hb, st := sf.CurrentTimeouts.Heartbeat, sf.CurrentTimeouts.Section
	if hb == nil || hb.Subsequent == nil || st == nil || st.Section["step"] == nil {
		t.Fatalf("nothing computed: %+v", sf.CurrentTimeouts)
	}
	obs := sf.FTLauncher.Observed
	t.Logf("max heartbeat interval %.3fs over %d → %.2fs; step max %.3fs over %d → %.2fs",
		obs.HeartbeatIntervalMax, obs.HeartbeatIntervals, *hb.Subsequent,
		obs.SectionMax["step"], obs.SectionCloses["step"], *st.Section["step"])
	if stall {
		// 5 × intervals of ~50 ms; generous for a loaded machine.
		if *hb.Subsequent > 5 || *st.Section["step"] > 5 {
			t.Errorf("the pause under a launcher stall was learned: heartbeat %.2fs, step %.2fs", *hb.Subsequent, *st.Section["step"])
		}
		if obs.HeartbeatIntervals >= 84 || obs.SectionCloses["step"] != 3 {
			t.Errorf("%d intervals and %d steps counted; the ones across the stall must not be", obs.HeartbeatIntervals, obs.SectionCloses["step"])
		}
	} else if *hb.Subsequent < 9.5 || *st.Section["step"] < 9.5 || obs.HeartbeatIntervals != 84 {
		t.Errorf("without a stall the 2 s pause must be learned (≥ 10 s): heartbeat %.2fs, step %.2fs, %d intervals (want 84)", *hb.Subsequent, *st.Section["step"], obs.HeartbeatIntervals)
	}
	return false
}

// TestStallGraceDefersHang: a deadline that passed during a launcher stall
// is judged only stallGrace after the stall ended (the rank's input may be
// unread), and a rank that is really hung is still declared hung then. The
// stall is recorded, logged and given to OnEvent once.
func TestStallGraceDefersHang(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	var (
		mu     sync.Mutex
		events []eventlog.LauncherStallEvent
	)
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	ft.RankHeartbeatTimeout = fptr(0.3)
	m := startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, OnEvent: func(rec eventlog.Record) {
		if e, ok := rec.(eventlog.LauncherStallEvent); ok {
			mu.Lock()
			events = append(events, e)
			mu.Unlock()
		}
	}})
	p := startRank(t, m, "connectsock;mark started;hbn 100000 50ms")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "started", 30*time.Second)
	eventually(t, 10*time.Second, "heartbeats", func() bool { return m.RankStatus(0).Heartbeats >= 3 })
	// The rank hangs (stopped), and the launcher has just resumed from a
	// 2 s stall: the rank's deadline (last heartbeat + 0.3 s) passes
	// within the grace.
	if err := syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	end := m.mono()
	recordStall(m.stalls, stallWindow{end - 2*sec, end})
	h := waitHang(t, m, 30*time.Second)
	judged := h.SignalledAt.Sub(m.wall(end))
	t.Logf("hang %s (timeout %v) signalled %v after the stall ended", h.Kind, h.Timeout, judged)
	if h.Kind != KindHeartbeat || judged < stallGrace-50*time.Millisecond {
		t.Errorf("hang %s signalled %v after the stall ended, want a heartbeat hang no sooner than the %v grace", h.Kind, judged, stallGrace)
	}
	eventually(t, 5*time.Second, "the stall event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) > 0
	})
	time.Sleep(3 * stallTick)
	mu.Lock()
	defer mu.Unlock()
	n := 0 // a loaded machine may add real stalls of its own
	for _, e := range events {
		if e.DurationMS == 2000 {
			n++
		}
	}
	if n != 1 {
		t.Errorf("launcher_stall events %v, want exactly one of 2000 ms", events)
	}
}
