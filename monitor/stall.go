package monitor

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// Launcher stalls (docs/timeouts.md, "Launcher stalls").
//
// The rank monitors are goroutines of the launcher: when the launcher is
// frozen (SIGSTOP, a cgroup freezer, a host that does not schedule it) they
// observe nothing, and whatever they read afterwards is stamped late. An
// interval measured across such a stall is the launcher's gap, not the
// rank's: counting it would learn a heartbeat timeout of safety_factor × the
// stall (measured before this: a 5 s SIGSTOP turned a 10 s timeout into
// 26.9 s, 60 s into 5 min). So the launcher watches its own monotonic clock: a ticker every
// stallTick that fires more than stallThreshold after the previous sighting
// of the launcher running means the launcher did not run in between, and
// that window is a stall. Every check also looks at the clock itself, so a
// stall is known to the first goroutine that runs after it, before the
// detector's own tick.
const (
	stallTick = 100 * time.Millisecond
	// stallThreshold: a gap between two sightings longer than this is a
	// stall. Shorter gaps (GC, a loaded node) stay counted; at 1 s they
	// cost at most safety_factor × 1 s of a computed timeout.
	stallThreshold = time.Second
	// stallGrace: a deadline is judged only once the launcher has run this
	// long since its last stall ended, so the input ranks sent meanwhile
	// (buffered in sockets whose readers were frozen too) is read first.
	stallGrace = time.Second
	// maxStallWindows bounds the stalls remembered per cycle; beyond it the
	// two oldest are merged (excluding more, never less).
	maxStallWindows = 64
)

// stallWindow is a time (m.mono()) the launcher was not seen running: from
// its last sighting before the gap to its first one after.
type stallWindow struct{ start, end int64 }

// stallLog records the launcher's stalls. last and lastEnd are atomics so
// the heartbeat hot path checks them without a lock; windows and unreported
// change only under mu.
type stallLog struct {
	threshold int64
	last      atomic.Int64 // latest sighting of the launcher running
	lastEnd   atomic.Int64 // end of the latest recorded stall; 0: none

	mu         sync.Mutex
	windows    []stallWindow // oldest first, at most maxStallWindows
	unreported []stallWindow // recorded but not yet logged
}

func newStallLog(threshold time.Duration, now int64) *stallLog {
	s := &stallLog{threshold: int64(threshold)}
	s.last.Store(now)
	return s
}

// observe is a sighting of the launcher running at now. A gap since the
// previous sighting longer than the threshold is recorded as a stall; it
// reports whether this call recorded one.
func (s *stallLog) observe(now int64) bool {
	prev := s.last.Load()
	if now-prev <= s.threshold {
		if now > prev {
			s.last.CompareAndSwap(prev, now) // lost: someone saw it later
		}
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev = s.last.Load() // another caller may have recorded it meanwhile
	recorded := false
	if now-prev > s.threshold {
		w := stallWindow{prev, now}
		if len(s.windows) == maxStallWindows {
			s.windows[1].start = s.windows[0].start
			s.windows = s.windows[1:]
		}
		s.windows = append(s.windows, w)
		s.unreported = append(s.unreported, w)
		s.lastEnd.Store(now)
		recorded = true
	}
	if now > prev {
		// Stored after the window: whoever sees this sighting also sees
		// lastEnd and the window.
		s.last.Store(now)
	}
	return recorded
}

// overlaps reports whether [from, to] overlaps a stall, now being the
// current time (a stall still pending, not yet recorded, is recorded first).
func (s *stallLog) overlaps(from, to, now int64) bool {
	if now-s.last.Load() > s.threshold { // read-only unless stalled: a hot path
		s.observe(now)
	}
	if from >= s.lastEnd.Load() {
		return false // began after every recorded stall ended (or none)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.windows {
		if w.start < to && w.end > from {
			return true
		}
	}
	return false
}

// graceEnd returns when a deadline that passed before now may be judged:
// now, unless the launcher stalled up to stallGrace before now.
func (s *stallLog) graceEnd(now int64) int64 {
	s.observe(now)
	if end := s.lastEnd.Load(); end > 0 && now < end+int64(stallGrace) {
		return end + int64(stallGrace)
	}
	return now
}

// prune forgets stalls that ended before t: nothing measured from t on
// can overlap them (BeginCycle resets every clock).
func (s *stallLog) prune(t int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := 0
	for i < len(s.windows) && s.windows[i].end < t {
		i++
	}
	s.windows = append(s.windows[:0], s.windows[i:]...)
}

// takeUnreported returns the stalls recorded since the last call.
func (s *stallLog) takeUnreported() []stallWindow {
	s.mu.Lock()
	defer s.mu.Unlock()
	u := s.unreported
	s.unreported = nil
	return u
}

// watchStalls ticks every stallTick until the manager closes, so a stall
// is recorded even while no rank is monitored, and logs and records every
// stall (whoever noticed it first).
func (m *Manager) watchStalls() {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-m.ctx.Done():
			return
		}
		m.stalls.observe(m.mono())
		for _, w := range m.stalls.takeUnreported() {
			d := time.Duration(w.end - w.start)
			m.log.Warn("launcher stalled: intervals across the stall are not used for computed timeouts, and deadlines that passed are judged after a grace",
				"stalled_for", d.Round(time.Millisecond), "from", m.wall(w.start), "to", m.wall(w.end), "grace", stallGrace)
			m.emit(eventlog.LauncherStallEvent{From: m.wall(w.start), To: m.wall(w.end),
				DurationMS: float64(d.Microseconds()) / 1000})
		}
	}
}
