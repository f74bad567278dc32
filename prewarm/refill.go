package prewarm

import (
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// pauseIdleLocked stops (SIGSTOP) every standby still importing whose rank
// the starting cycle does not start (those of an in-process restart's
// survivors), so that its import does not take CPU from the ranks that
// start: the replacement rank, or the standby it waits for. Called with
// st.mu held, after the cycle's standbys left st.standby.
func (st *Starter) pauseIdleLocked() []*standby {
	var paused []*standby
	for _, s := range st.standby {
		if s.paused {
			continue
		}
		if _, why := s.usable(); why != stillImporting {
			continue
		}
		s.g.SignalAll(syscall.SIGSTOP)
		s.paused, s.pausedAt = true, time.Now()
		paused = append(paused, s)
	}
	return paused
}

// resumeLocked continues (SIGCONT) the standbys of ss still paused.
// Called with st.mu held.
func (st *Starter) resumeLocked(ss []*standby) []*standby {
	var resumed []*standby
	for _, s := range ss {
		if !s.paused {
			continue
		}
		s.paused = false
		s.g.SignalAll(syscall.SIGCONT)
		s.pausedFor += time.Since(s.pausedAt)
		resumed = append(resumed, s)
	}
	return resumed
}

// refillGate is what a cycle's refill waits for besides RefillDelay and
// the cold ranks' imports: nothing when every rank of the cycle started
// warm, the cycle paused no standby and the standbys import at nice 19 (a
// closed channel), every rank's first heartbeat otherwise (ready.go). A
// cycle that paused standbys (pauseIdleLocked) keeps them paused for the
// delay, as that pause intends.
//
// The delay and the cold-import wait keep the new standbys' imports off the
// CPU while the ranks import; warm ranks have nothing left to import, and a
// nice-19 standby only takes what they leave idle. Measured
// (docs/benchmarks.md, "Prewarm"): starting at once after a warm restart
// (4 ranks on 2 cores, no idle core) moved the restart's next step from
// 0.31 to 0.345 s (p50), and a crash 4 s into a warm cycle found its next
// standbys ready (0.17 s to the next step) instead of waiting about 1 s
// for their imports; after a cold cycle starting at once cost the first
// step about 0.5 s, so a cycle with a cold rank keeps the wait.
//
// The first cycle of a job whose ranks took the standbys started at launch
// (launched) is the exception: its ranks have not trained yet (process
// group, first step), and on a machine shared with other nodes a nice
// value does not order processes of different sessions (the kernel's
// autogroups), so its refill waits for every rank's first heartbeat, at
// most refillHold, instead of the delay (delay is what refillWait waits).
func (st *Starter) refillGate(warm, cold, paused int, launched bool, ready *cycleReady) (<-chan struct{}, time.Duration) {
	if launched && cold == 0 && paused == 0 {
		return ready.done, refillHold
	}
	if warm > 0 && cold == 0 && paused == 0 && st.prio.low {
		now := make(chan struct{})
		close(now)
		return now, st.o.RefillDelay
	}
	return ready.done, st.o.RefillDelay
}

// refillWait waits delay, then for the cold ranks' imports
// (awaitColdImports), or until training is closed (every rank of the
// cycle sent its first heartbeat: ready.go); false when the Starter
// closed meanwhile.
func (st *Starter) refillWait(coldPIDs []int, training <-chan struct{}, delay time.Duration) bool {
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-training:
		case <-st.closing:
			return false
		}
	}
	st.awaitColdImports(coldPIDs, training)
	select {
	case <-st.closing:
		return false
	default:
		return true
	}
}

// refill starts, in the background and after delay, a standby for every rank of specs that
// has none, with that rank's environment and directory; with cold ranks
// (coldPIDs) it also waits, bounded, until they are likely past their own
// imports (awaitColdImports). At that point it also continues the standbys
// the cycle paused (pauseIdleLocked): then the cycle's ranks have what
// they need of the CPU.
func (st *Starter) refill(specs []spawn.Spec, coldPIDs []int, paused []*standby, training <-chan struct{}, delay time.Duration) {
	st.mu.Lock()
	defer st.mu.Unlock() // held across refills.Go: Close's Wait cannot begin before it
	if st.closed {
		return // Close kills every standby, paused ones too
	}
	var todo []spawn.Spec
	for _, sp := range specs {
		if st.disabled != "" {
			break
		}
		if _, ok := st.standby[sp.LocalRank]; ok {
			continue
		}
		if _, why := warmable(sp); why != "" {
			continue
		}
		todo = append(todo, sp)
	}
	learn := st.auto != nil && len(st.auto.pending) > 0
	if len(todo) == 0 && len(paused) == 0 && !learn {
		return
	}
	since := time.Now()
	st.refills.Go(func() {
		if !st.refillWait(coldPIDs, training, delay) {
			return // Close learns what is pending
		}
		if len(todo) > 0 {
			trained := false
			select {
			case <-training:
				trained = true
			default:
			}
			st.log.Debug("prewarm: starting new standbys", "local_ranks", len(todo), "after", time.Since(since),
				"every_rank_training", trained)
		}
		if learn {
			st.learnPending() // before the new standbys: they import the new list
		}
		st.resume(paused, since)
		for _, sp := range todo {
			st.startOne(sp)
		}
	})
}

// resume continues the standbys of paused still paused (since: when they
// were paused).
func (st *Starter) resume(paused []*standby, since time.Time) {
	st.mu.Lock()
	resumed := st.resumeLocked(paused)
	st.mu.Unlock()
	if len(resumed) > 0 {
		lrs := localRanks(resumed)
		st.log.Debug("prewarm: paused standbys go on importing", "local_ranks", lrs, "paused", time.Since(since))
		st.event(eventlog.PrewarmResumedEvent{LocalRanks: lrs, PausedMS: ms(time.Since(since))})
	}
}

// refillHold bounds how long a refill waits for cold ranks' imports.
const refillHold = 10 * time.Second

// awaitColdImports waits until every cold rank of a cycle has used as much
// CPU as the last whole standby import (so its own interpreter start and
// imports are likely done), at most refillHold, so that the new standbys'
// imports do not compete with the cold ranks' imports: with 4 ranks on 2
// cores those take seconds, longer than RefillDelay. Without a measured
// import it does not wait. A rank that ended counts as done.
func (st *Starter) awaitColdImports(pids []int, training <-chan struct{}) {
	st.mu.Lock()
	need := st.lastImport.CPU
	st.mu.Unlock()
	if need <= 0 || len(pids) == 0 {
		return
	}
	deadline := time.Now().Add(refillHold)
	for {
		pending := 0
		for _, pid := range pids {
			if cpu, err := processCPU(pid); err == nil && cpu < need {
				pending++
			}
		}
		if pending == 0 {
			return
		}
		if time.Now().After(deadline) {
			st.log.Debug("prewarm: refilling while cold ranks may still import", "ranks", pending, "waited", refillHold)
			return
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-t.C:
		case <-training:
			t.Stop()
			return
		case <-st.closing:
			t.Stop()
			return
		}
	}
}

// startOne starts the standby of one rank unless the Starter closed.
func (st *Starter) startOne(sp spawn.Spec) { st.startStandbyFor(sp, false) }

// startStandbyFor starts the standby of one rank unless the Starter
// closed; launched: it is one of Launch's, for the first cycle.
func (st *Starter) startStandbyFor(sp spawn.Spec, launched bool) {
	c, _ := warmable(sp)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.closed || st.disabled != "" || st.standby[sp.LocalRank] != nil {
		return
	}
	modules, env := st.o.Modules, sp.Env
	if st.auto != nil {
		modules, env = st.auto.learner.Modules(st.auto.keyOf(sp)), standbyEnv(sp.Env)
	}
	s, err := startStandby(st.o.Reaper, sp.LocalRank, c.python, env, sp.Dir, c.mode, c.target, modules, st.auto != nil)
	if err != nil {
		st.log.Warn("prewarm: could not start a standby; the rank will start cold", "local_rank", sp.LocalRank, "err", err)
		return
	}
	s.spec, s.launched = sp, launched
	if st.prio.low {
		// Its first milliseconds (the interpreter's start) run at the
		// launcher's priority; the imports after them at standbyNice.
		// Marked lowered even if that failed part-way: the handover then
		// raises whatever thread was lowered.
		s.lowered = true
		if err := setNiceAll(s.pid, standbyNice); err != nil {
			st.log.Debug("prewarm: could not lower a standby; it imports at the launcher's priority", "local_rank", sp.LocalRank, "err", err)
		}
	}
	st.standby[sp.LocalRank] = s
	go st.watch(s)
}

// watch reports a standby that fails before it is used; a failed import
// disables prewarming (every new standby would fail the same way).
func (st *Starter) watch(s *standby) {
	select {
	case <-s.ready:
		took := s.imported
		st.mu.Lock()
		// A paused standby was stopped, not importing: its pauses are no
		// part of what an import takes (the wall time bounds later waits).
		took.Wall = max(took.Wall-s.pausedFor, took.CPU)
		if took.CPU > 0 {
			st.lastImport = took
		}
		st.mu.Unlock()
		st.log.Debug("prewarm: standby ready", "local_rank", s.localRank, "pid", s.pid, "import", took.Wall, "import_cpu", took.CPU)
		st.event(eventlog.PrewarmReadyEvent{LocalRank: s.localRank, PID: s.pid,
			ImportMS: ms(took.Wall), ImportCPUMS: ms(took.CPU)})
		st.skipped(s)
		st.announceSpare()
		go st.watchSpare(s) // one that dies while the node is a parked spare is replaced
		return
	case <-s.done:
	}
	<-s.diagDone // its last words, for the message
	if s.unsafe != "" {
		st.unsafe(s)
		return
	}
	_, why := s.usable()
	if !s.importFailed() && st.spareStandbyEnded(s, why) {
		return
	}
	st.mu.Lock()
	if st.standby[s.localRank] == s {
		delete(st.standby, s.localRank)
	}
	closed := st.closed
	first := false
	if s.importFailed() && st.disabled == "" && !closed {
		st.disabled = "the --prewarm modules could not be imported: " + why
		first = true
	}
	st.mu.Unlock()
	if closed {
		return
	}
	if first {
		st.log.Error("prewarm: a standby could not import the --prewarm modules; ranks start cold from now on",
			"local_rank", s.localRank, "modules", strings.Join(st.o.Modules, ","), "reason", why, "output", s.diag.String())
		st.event(eventlog.PrewarmDisabledEvent{LocalRank: s.localRank, Reason: why})
		return
	}
	st.log.Warn("prewarm: a standby ended before it was used; its rank will start cold", "local_rank", s.localRank, "reason", why, "output", s.diag.String())
}
