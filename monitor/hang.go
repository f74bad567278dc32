package monitor

import (
	"math"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// HangKind is which clock of a rank expired. Its values are the strings
// the event log (rank_hang's timeout_kind), the logs and the metrics carry.
type HangKind = eventlog.HangKind

// Hang kinds.
const (
	KindInitialHeartbeat = eventlog.HangInitialHeartbeat
	KindHeartbeat        = eventlog.HangHeartbeat
	KindSection          = eventlog.HangSection
	KindOutOfSection     = eventlog.HangOutOfSection
)

// expiry is one armed clock.
type expiry struct {
	kind     HangKind
	section  string
	timeout  time.Duration
	start    int64 // when the clock started
	deadline int64
	def      bool // a default clock (defaults.go)
}

// earliestLocked returns the clock that expires first.
func (r *rankMon) earliestLocked() (expiry, bool) {
	best := expiry{deadline: math.MaxInt64}
	consider := func(kind HangKind, section string, start int64, timeout time.Duration, def bool) {
		if timeout <= 0 {
			return
		}
		d := start + int64(timeout)
		if def {
			d = max(d, r.deferTo) // the rank was busy past it (defaults.go)
		}
		d = max(d, r.spareTo) // it waits for a culprit being killed (judge.go)
		if d < best.deadline {
			best = expiry{kind: kind, section: section, timeout: timeout, start: start, deadline: d, def: def}
		}
	}
	switch r.loadPhase() {
	case phaseHeartbeating:
		to, def := r.heartbeatTimeoutLocked()
		consider(KindHeartbeat, "", r.lastHB.Load(), to, def)
	case phaseInitial:
		to, def := r.initialTimeoutLocked()
		consider(KindInitialHeartbeat, "", r.initAt, to, def)
	default:
		return best, false
	}
	warmupTO, hasWarmup := r.to.Sections["warmup"]
	// Every open section counts, not just the last one iterated (nvrx bug).
	for name, at := range r.open {
		to := r.to.Sections[name]
		if name == "step" && hasWarmup && r.inWarmupLocked() {
			to = warmupTO
		}
		consider(KindSection, name, at, to, false)
	}
	if len(r.open) == 0 && !(len(r.to.Sections) > 0 && !hasWarmup && !r.stepSeen) {
		consider(KindOutOfSection, "", r.oosStart, r.to.OutOfSection, false)
	}
	return best, best.deadline != math.MaxInt64
}

// inWarmupLocked: the first num_warmup_iterations iterations of a session.
// Without iteration numbers the count of step openings stands in for them.
func (r *rankMon) inWarmupLocked() bool {
	if r.iterKnown {
		return r.currentIter-r.initialIter < r.warmupIters
	}
	return r.stepOpens <= r.warmupIters
}

// rearmLocked moves the timer earlier when the earliest deadline is before
// the armed one; later deadlines are picked up lazily when it fires.
func (r *rankMon) rearmLocked(now int64) {
	e, ok := r.earliestLocked()
	if !ok {
		return
	}
	if r.armed != 0 && r.armed <= e.deadline {
		return
	}
	r.armed = e.deadline
	r.timer.Reset(time.Duration(max(e.deadline-now, 0)))
}

// armEarliestLocked sets the timer for the earliest deadline in force,
// later or earlier than the armed one (rearmLocked only moves it earlier).
func (r *rankMon) armEarliestLocked() {
	if e, ok := r.earliestLocked(); ok {
		r.armAtLocked(e.deadline)
	}
}

// armAtLocked sets the timer for monotonic time at.
func (r *rankMon) armAtLocked(at int64) {
	r.armed = at
	r.timer.Reset(time.Duration(max(at-r.host.mono(), 0)))
}

// onTimer evaluates the deadlines. It first drains the native session so a
// message that arrived before now is never missed: everything read is
// stamped no earlier than now, so it can only push the deadline later.
func (r *rankMon) onTimer() {
	now := r.host.mono()
	r.drain()
	r.mu.Lock()
	r.armed = 0
	if r.judgingExpiry {
		r.mu.Unlock()
		return
	}
	e, ok := r.earliestLocked()
	if !ok {
		r.mu.Unlock()
		return
	}
	if now < e.deadline {
		r.armAtLocked(e.deadline)
		r.mu.Unlock()
		return
	}
	// A deadline that passed while the launcher itself was frozen is
	// judged only stallGrace after the launcher runs again: what the rank
	// sent meanwhile may still sit in a socket whose reader was frozen too.
	if g := r.cfg.stalls.graceEnd(now); g > now {
		r.armAtLocked(g)
		r.mu.Unlock()
		return
	}
	// A default clock is only the launcher's guess: a rank still computing
	// or writing is not hung (defaults.go). With the stacks, the
	// judgement checks that, on the rank they name (judge.go).
	if e.def && !r.host.judging() && r.busyLocked(now, e) {
		r.mu.Unlock()
		return
	}
	now = r.host.mono()
	h := r.hangLocked(e, now)
	pid := r.pid
	if r.host.judging() {
		r.judgingExpiry = true
		r.mu.Unlock()
		r.host.expired(r, h, pid)
		return
	}
	r.setPhaseLocked(phaseHung)
	r.hang = &h
	r.mu.Unlock()
	r.host.hung(h, pid)
}

// hangLocked describes clock e of the rank as hung at now.
func (r *rankMon) hangLocked(e expiry, now int64) Hang {
	h := Hang{
		Cycle: r.cycle, LocalRank: r.local, GlobalRank: r.globalRank, Kind: e.kind, Section: e.section,
		Timeout: e.timeout, Elapsed: time.Duration(now - e.start),
		ExpiredAt: r.host.wall(min(e.deadline, now)),
		Signal:    r.cfg.signal, DefaultTimeout: e.def,
	}
	if hb := r.lastHB.Load(); hb != 0 {
		h.LastHeartbeat = r.host.wall(hb)
	}
	return h
}

// hangNow describes the rank as hung now, by the clock nearest to
// expiring: a culprit named by the stacks before its own clock ran out.
func (r *rankMon) hangNow() Hang {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.host.mono()
	e, ok := r.earliestLocked()
	if !ok {
		e = expiry{kind: KindHeartbeat, start: now, deadline: now}
	}
	h := r.hangLocked(e, now)
	h.Judged = true
	return h
}

// confirmHang makes h, judged by j, the rank's hang and returns it with
// the pid to kill; false when the rank moved on meanwhile: the cycle
// ended, or it progressed (a heartbeat since the judgement began at
// start, or, for its own expired clock, a deadline now in the future).
func (r *rankMon) confirmHang(h Hang, j *Judgement, forced bool, start int64) (Hang, int, bool) {
	r.drain()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !forced {
		r.judgingExpiry = false
	}
	if r.cycle != h.Cycle || !r.loadPhase().inSession() {
		return h, 0, false
	}
	now := r.host.mono()
	if forced {
		if hb := r.lastHB.Load(); hb > start {
			return h, 0, false
		}
	} else if e, ok := r.earliestLocked(); !ok || now < e.deadline {
		if ok {
			r.armAtLocked(e.deadline)
		}
		return h, 0, false
	}
	h.Judgement = j
	r.setPhaseLocked(phaseHung)
	r.hang = &h
	return h, r.pid, true
}

// spare leaves the rank alive after its clock h expired: it waits in a
// collective for a culprit being killed. Its clocks start again from now.
// Only once a cycle: false when it was spared before (the culprit's death
// did not end its wait, so it is killed now) or moved on.
func (r *rankMon) spare(h Hang) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.spareTo != 0 {
		return false
	}
	r.judgingExpiry = false
	if r.cycle != h.Cycle || !r.loadPhase().inSession() {
		return true
	}
	now := r.host.mono()
	r.spareTo = now + int64(h.Timeout)
	r.cfg.log.Info("rank's clock expired while it waits in a collective for the rank that hung: not killed",
		"local_rank", r.local, "rank", r.globalRank, "cycle", r.cycle, "kind", h.Kind, "timeout", h.Timeout)
	r.armEarliestLocked()
	return true
}

// judged ends the rank's part in a judgement that found no hang.
func (r *rankMon) judged() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.judgingExpiry = false
	r.armEarliestLocked()
}

// wait pushes the rank's default clocks d from now (a judgement of cycle
// found it, or the rank it waits for, not hung).
func (r *rankMon) wait(cycle int, d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cycle != cycle || !r.loadPhase().inSession() {
		return
	}
	r.deferTo = max(r.deferTo, r.host.mono()+int64(d))
	r.armEarliestLocked()
}

// silence says whether the rank's clock expired this cycle, when it
// last heartbeated (Unix ms; 0: never) and by how much a later heartbeat
// shows progress (stacks.Summary.MarginMS).
func (r *rankMon) silence() (expired bool, last, marginMS int64) {
	r.drain()
	r.mu.Lock()
	defer r.mu.Unlock()
	if hb := r.lastHB.Load(); hb != 0 {
		last = r.host.wall(hb).UnixMilli()
	}
	to, _ := r.heartbeatTimeoutLocked()
	margin := max(time.Duration(r.maxIv.Load()), to/10)
	return r.judgingExpiry || r.loadPhase() == phaseHung, last, margin.Milliseconds()
}

// hung terminates a hung rank in a tracked goroutine (rankHost).
func (m *Manager) hung(h Hang, pid int) { m.goTracked(func() { m.terminate(h, pid) }) }

// terminate ends the hung rank through spawn.Terminate (the one owner of
// killing ranks) and reports the hang once the outcome is known. The hang is
// logged as soon as the signal is sent, not after the grace.
func (m *Manager) terminate(h Hang, pid int) {
	grace := time.Duration(m.opts.FT.TerminationGrace * float64(time.Second))
	t := spawn.Terminate(m.ctx, pid, h.Signal, spawn.TerminateOptions{Grace: grace,
		Signalled: func(t spawn.Termination) {
			m.log.Error("rank hang detected; terminating rank", "cycle", h.Cycle, "local_rank", h.LocalRank,
				"global_rank", h.GlobalRank, "kind", h.Kind, "section", h.Section, "timeout", h.Timeout,
				"elapsed", h.Elapsed, "signal", t.Signal.String(), "pid", pid,
				"detect_latency", t.SignalledAt.Sub(h.ExpiredAt), "kill_error", t.Err)
		}})
	h.Signal, h.SignalledAt, h.Escalated = t.Signal, t.SignalledAt, t.Escalated
	if t.Escalated {
		m.log.Warn("hung rank survived the termination signal; sent SIGKILL", "local_rank", h.LocalRank,
			"signal", t.Signal.String(), "grace", grace)
	}
	select {
	case m.hangs <- h:
	default:
		m.log.Error("hang channel full; dropping hang report", "local_rank", h.LocalRank, "kind", h.Kind)
	}
}
