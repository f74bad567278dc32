// Package prewarm starts ranks in interpreters that have already imported
// the heavy modules (--prewarm torch,torch.distributed), so that a restart
// goes straight to the user's code instead of paying for the interpreter
// and its imports again.
//
// A Starter starts the ranks of each cycle (the launcher adapts it to the
// agent's RankStarter). For every local rank it keeps one
// standby: a Python interpreter started through spawn exactly like a rank
// (its own process group, parent-death signal, reaped by the launcher)
// running a small embedded program (standby.py) that imports the modules
// and waits on a control socket. StartGroup hands each ready standby its
// rank: working directory, argv, environment and the rank's stdout and
// stderr as file descriptors; the standby then runs the script as
// `python -u script.py args` or `python -u -m module args` would. A rank
// whose standby is still importing waits for it or has it stopped and
// starts cold, whichever should be sooner (decideImporting); a rank whose
// standby is missing or broken starts cold (plain spawn); the launcher
// says which path each rank took and why. Waits and handovers are
// bounded, so a stuck standby never stalls a restart for long. New
// standbys are started in the background after the ranks started.
// docs/prewarm.md lists what a warm rank can observe differently from a
// cold one.
package prewarm

import (
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

//go:embed standby.py
var standbyProgram string

// The kinds of the records given to Options.OnEvent (eventlog's Prewarm*
// records, components.go).
const (
	EventFallback = eventlog.PrewarmFallback // a rank did not start warm at once
	EventWarm     = eventlog.PrewarmStarted  // ranks handed to standbys
	EventDisabled = eventlog.PrewarmDisabled // the modules cannot be imported
	EventReady    = eventlog.PrewarmReady    // a standby has imported the modules
	EventWaiting  = eventlog.PrewarmWaiting  // a restart waits for a standby's import
	EventPaused   = eventlog.PrewarmPaused   // standbys still importing, not needed by a cycle, paused while it starts
	EventResumed  = eventlog.PrewarmResumed  // the paused standbys go on importing
	EventLearned  = eventlog.PrewarmLearned  // --prewarm auto: the list learned from a cycle's ranks
	EventUnsafe   = eventlog.PrewarmUnsafe   // --prewarm auto: a module a standby must not import, dropped
)

// DefaultHandoverTimeout bounds one handover: past it the standby is
// killed and the rank starts cold.
const DefaultHandoverTimeout = 2 * time.Second

// DefaultRefillDelay keeps the new standbys' imports (a CPU-second each
// for torch) off the CPU while the restarted ranks reach their first step.
const DefaultRefillDelay = 2 * time.Second

// Options configure a Starter.
type Options struct {
	Reaper  *spawn.Reaper
	Modules []string // imported by every standby, in order
	// Auto (--prewarm auto; Modules must be empty): the modules are
	// learned from what the ranks import (learn.go) and kept here.
	Auto   *Learner
	Logger *slog.Logger
	// OnEvent receives the event-log records, eventlog's Prewarm* (nil:
	// none).
	OnEvent func(eventlog.Record)
	// HandoverTimeout bounds one handover (0: DefaultHandoverTimeout).
	HandoverTimeout time.Duration
	// RefillDelay is how long after a cycle started its new standbys
	// start (0: DefaultRefillDelay; negative: at once), so that their
	// imports do not compete for CPU with the ranks' first steps.
	RefillDelay time.Duration
	// Importing says what a restart does with a standby still importing
	// ("": ImportingAuto).
	Importing Importing
	// Started, when set, is told each rank's pid as soon as it is known:
	// for a rank handed to a standby right before the handover, so before
	// the rank runs any of its code (the standby's pid; again with the
	// cold rank's when the handover fails), for a cold rank right after
	// it is started (its first milliseconds may come first). StartGroup
	// returns only once every rank started, which can be seconds after a
	// ready standby took its rank when another rank waits for its
	// standby's import; the launcher passes the rank monitors' Expect so
	// that a rank that connects meanwhile is held, not refused. Called
	// from several goroutines at once.
	Started func(localRank, pid int)
	// SpareRestarts bounds how many times the standbys of one local rank
	// of a parked spare (Park) that died are started again (0:
	// DefaultSpareRestarts; negative: never).
	SpareRestarts int
	// HookDirs are PYTHONPATH entries of the launcher's own (the stacks
	// hook): a rank's command key leaves them out, so what is learned
	// holds for the next launcher, whose hook sits elsewhere.
	HookDirs []string
}

var moduleName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)

// ValidModule reports whether name is a dotted Python module name.
func ValidModule(name string) bool { return moduleName.MatchString(name) }

// Starter starts ranks on standbys where it can (see the package doc).
type Starter struct {
	o   Options
	log *slog.Logger

	mu       sync.Mutex
	standby  map[int]*standby // local rank -> its standby (ready or not)
	closed   bool
	closing  chan struct{} // closed by Close: ends a refill's delay
	disabled string        // why no more standbys are started
	seen     bool          // a cycle was started (the first one has no standbys)
	// lastImport is the last completed standby import (zero: none yet).
	lastImport importStats
	refills    sync.WaitGroup
	auto       *autoState // --prewarm auto; nil otherwise
	// spare is the parked hot spare's state (park.go); nil when the node
	// is not parked. wasParked: it was, so a missing standby is not the
	// first cycle's. spareRestarts are, per local rank, the restart
	// budgets of the standbys that died while parked.
	spare         *spareState
	wasParked     bool
	spareRestarts map[int]*policy.RestartTracker
	// prio: whether standbys import at a lower priority (priority.go).
	prio priority
	// ready: which ranks of the cycle last started are training yet
	// (ready.go); its refill stops waiting once they all are.
	ready atomic.Pointer[cycleReady]
}

// NewStarter returns a Starter. The first cycle's ranks start cold; their
// standbys start once they run.
func NewStarter(o Options) (*Starter, error) {
	if o.Reaper == nil {
		return nil, errors.New("prewarm: no reaper")
	}
	if len(o.Modules) == 0 && o.Auto == nil {
		return nil, errors.New("prewarm: no modules to import")
	}
	if len(o.Modules) > 0 && o.Auto != nil {
		return nil, errors.New("prewarm: modules named with auto")
	}
	for _, m := range o.Modules {
		if !ValidModule(m) {
			return nil, fmt.Errorf("prewarm: %q is not a Python module name", m)
		}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.HandoverTimeout <= 0 {
		o.HandoverTimeout = DefaultHandoverTimeout
	}
	if o.RefillDelay == 0 {
		o.RefillDelay = DefaultRefillDelay
	}
	if o.Importing == "" {
		o.Importing = ImportingAuto
	}
	if o.SpareRestarts == 0 {
		o.SpareRestarts = DefaultSpareRestarts
	}
	if _, err := ParseImporting(string(o.Importing)); err != nil {
		return nil, fmt.Errorf("prewarm: importing policy %w", err)
	}
	st := &Starter{o: o, log: o.Logger, standby: map[int]*standby{}, closing: make(chan struct{}), spareRestarts: map[int]*policy.RestartTracker{}, prio: probePriority()}
	if st.prio.low {
		st.log.Debug("prewarm: standbys import at low priority and are raised to the launcher's at the handover", "nice", standbyNice, "launcher_nice", st.prio.base)
	} else {
		st.log.Info("prewarm: standbys import at the launcher's priority", "reason", st.prio.why)
	}
	if o.Auto != nil {
		a, err := newAutoState(o.Auto, o.HookDirs)
		if err != nil {
			return nil, err
		}
		st.auto = a
	}
	return st, nil
}

// Path is the way a rank takes at a cycle's start (the prewarm_fallback
// record's "path"; docs/prewarm.md). The event log's type, so the record
// carries it as is.
type Path = eventlog.PrewarmPath

// The paths.
const (
	PathWarm    = eventlog.PrewarmPathWarm    // handed to its ready standby at once
	PathWaited  = eventlog.PrewarmPathWaited  // its standby was still importing: waited for it, then handed over
	PathStopped = eventlog.PrewarmPathStopped // its standby was still importing: stopped, the rank started cold
	PathCold    = eventlog.PrewarmPathCold    // no usable standby (or a wait or handover failed): started cold
)

// plan is how one rank of a cycle starts.
type plan struct {
	spec    spawn.Spec
	s       *standby  // the standby the rank is handed to; nil: cold
	wait    *choice   // the standby is still importing and the rank waits for it
	stopped *choice   // the standby was still importing and is stopped
	at      importing // how far the importing standby was at the restart
	path    Path
	reason  string        // why not warm at once
	waited  time.Duration // how long the rank waited for its standby
	unended bool          // the wait ran out with the import still going
	err     error         // the wait or the handover failed
}

// hooked returns specs with --prewarm auto's import hook added to each
// (specs itself without auto).
func (st *Starter) hooked(specs []spawn.Spec) []spawn.Spec {
	if st.auto == nil {
		return specs
	}
	out := make([]spawn.Spec, len(specs))
	for i, sp := range specs {
		out[i] = st.auto.withHook(sp)
	}
	return out
}

// StartGroup starts the ranks of one cycle: each on its ready standby; on
// its standby still importing when decideImporting says to wait for it;
// the others cold, at once. cmd/ft-launcher adapts it to the agent's
// RankStarter.
func (st *Starter) StartGroup(specs []spawn.Spec) (*Group, error) {
	started := time.Now()
	if st.auto != nil {
		st.takeReports(specs)
	}
	specs = st.hooked(specs)
	// Armed before any rank runs: a warm rank may heartbeat before
	// StartGroup returns.
	ready := newCycleReady(specs)
	st.ready.Store(ready)
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return nil, errors.New("prewarm: starter is closed")
	}
	parked := st.unparkLocked() // a parked spare promoted: its standbys take the ranks
	// A standby paused by an earlier cycle that this one needs goes on
	// first: its rank may wait for its import.
	for _, sp := range specs {
		if s := st.standby[sp.LocalRank]; s != nil && s.paused {
			st.resumeLocked([]*standby{s})
		}
	}
	plans := make([]*plan, len(specs))
	var cold []spawn.Spec
	for i, sp := range specs {
		p := &plan{spec: sp, path: PathCold}
		plans[i] = p
		s := st.standby[sp.LocalRank]
		delete(st.standby, sp.LocalRank)
		st.plan(p, s, started)
		if p.s == nil {
			if s != nil {
				s.kill()
			}
			cold = append(cold, sp)
		}
	}
	st.seen = true
	paused := st.pauseIdleLocked()
	st.mu.Unlock()
	round := envValue(specs, "TORCHELASTIC_RESTART_COUNT")
	if len(paused) > 0 {
		lrs := localRanks(paused)
		st.log.Info("pausing standbys still importing: this cycle does not need them", "local_ranks", lrs)
		st.event(eventlog.PrewarmPausedEvent{Round: round, LocalRanks: lrs})
	}

	// The cold ranks start first: nothing they do waits on a standby.
	var parts []*spawn.Group
	killAll := func() {
		for _, p := range plans {
			if p.s != nil {
				p.s.kill()
			}
		}
		for _, g := range parts {
			g.Stop(syscall.SIGKILL, 0)
		}
	}
	startCold := func(specs []spawn.Spec) error {
		if len(specs) == 0 {
			return nil
		}
		g, err := st.o.Reaper.StartGroup(specs)
		if err != nil {
			killAll()
			return err
		}
		parts = append(parts, g)
		for lr, pid := range g.PIDs() {
			st.started(lr, pid)
		}
		return nil
	}
	if err := startCold(cold); err != nil {
		st.refill(nil, nil, paused, nil, st.o.RefillDelay)
		return nil, err
	}
	for _, p := range plans {
		if p.wait != nil { // said now: the wait may last seconds
			st.log.Info("waiting for a standby's import", "local_rank", p.spec.LocalRank, "pid", p.s.pid,
				"max_wait", p.wait.MaxWait, "reason", p.reason)
			st.event(eventlog.PrewarmWaitingEvent{Round: round, LocalRank: p.spec.LocalRank, PID: p.s.pid,
				MaxWaitMS: ms(p.wait.MaxWait), Reason: p.reason})
		}
	}
	var wg sync.WaitGroup
	for _, p := range plans {
		if p.s != nil {
			wg.Go(func() { p.err = st.take(p) })
		}
	}
	wg.Wait()
	var warm []*standby
	var late []spawn.Spec
	for _, p := range plans {
		switch {
		case p.s == nil:
		case p.err != nil:
			if p.unended {
				st.mu.Lock()
				if st.lastImport.CPU <= 0 {
					st.lastImport.Unended = p.waited
				}
				st.mu.Unlock()
			}
			p.s.kill()
			why := p.err.Error()
			if p.wait != nil {
				why = p.reason + "; " + why
			}
			p.s, p.path, p.reason = nil, PathCold, why
			late = append(late, p.spec)
		default:
			warm = append(warm, p.s)
		}
	}
	handoverDone := time.Since(started)
	if err := startCold(late); err != nil {
		st.refill(nil, nil, paused, nil, st.o.RefillDelay)
		return nil, err
	}
	launched := slices.ContainsFunc(warm, func(s *standby) bool { return s.launched })
	st.report(specs, plans, warm, handoverDone, parked, launched)
	var coldPIDs []int
	for _, g := range parts {
		for _, pid := range g.PIDs() {
			coldPIDs = append(coldPIDs, pid)
		}
	}
	gate, delay := st.refillGate(len(warm), len(coldPIDs), len(paused), launched, ready)
	st.refill(specs, coldPIDs, paused, gate, delay)
	return newGroup(parts, warm, len(specs)), nil
}

func localRanks(ss []*standby) []int {
	lrs := make([]int, len(ss))
	for i, s := range ss {
		lrs[i] = s.localRank
	}
	slices.Sort(lrs)
	return lrs
}

// plan decides how p's rank starts, given its standby s (may be nil).
// Called with st.mu held.
func (st *Starter) plan(p *plan, s *standby, now time.Time) {
	c, why := warmable(p.spec)
	switch {
	case why != "":
	case s == nil:
		why = "no standby"
		if !st.seen && !st.wasParked {
			why = "no standby yet (standbys start once the first ranks run)"
		}
		if st.disabled != "" {
			why += " (" + st.disabled + ")"
		}
	case s.mode != c.mode || s.target != c.target:
		why = "the standby was warmed for another command"
	default:
		ok, w := s.usable()
		if ok {
			p.s, p.path = s, PathWarm
			return
		}
		why = w
		if w != stillImporting {
			break
		}
		p.at = s.progress(now)
		ch := decideImporting(st.o.Importing, p.at, st.lastImport)
		if s.launched && st.o.Importing != ImportingStop {
			ch = launchedChoice()
		}
		if ch.Wait {
			p.s, p.wait, p.path, p.reason = s, &ch, PathWaited, w+": waiting for it: "+ch.Reason
			return
		}
		p.stopped, p.path, why = &ch, PathStopped, w+": stopped it: "+ch.Reason
	}
	p.reason = why
}

// take hands p's rank to its standby, first waiting, bounded, for the end
// of the standby's import when p says so.
func (st *Starter) take(p *plan) error {
	// First of all: a standby waited for should finish its import at the
	// rank's priority, and the rank must run at it.
	if err := st.raise(p.s); err != nil {
		return err
	}
	if p.wait != nil {
		begin := time.Now()
		t := time.NewTimer(p.wait.MaxWait)
		select {
		case <-p.s.ready:
		case <-p.s.done:
		case <-t.C:
		case <-st.closing:
		}
		t.Stop()
		p.waited = time.Since(begin)
		if ok, why := p.s.usable(); !ok {
			if why == stillImporting {
				p.unended = true
				why = fmt.Sprintf("its import had not ended (at most %s)", p.wait.MaxWait.Round(time.Millisecond))
			}
			return fmt.Errorf("waited %s for the standby: %s", p.waited.Round(time.Millisecond), why)
		}
	}
	// The rank's pid is the standby's: said before the standby runs the
	// rank's code, not when StartGroup returns (after the other ranks'
	// waits), so its monitor holds its connection until registered.
	st.started(p.spec.LocalRank, p.s.pid)
	return p.s.handover(p.spec, st.o.HandoverTimeout)
}

// started tells Options.Started that pid is local rank's process.
func (st *Starter) started(localRank, pid int) {
	if st.o.Started != nil {
		st.o.Started(localRank, pid)
	}
}

// raise sets every thread of a lowered standby, and of the processes of
// its process group (any it started), to the launcher's nice value, what
// a cold rank inherits.
func (st *Starter) raise(s *standby) error {
	if !s.lowered {
		return nil
	}
	pids := []int{s.pid}
	if procs, err := procfs.List(); err == nil {
		for _, p := range procs {
			if p.PGID == s.pid && p.PID != s.pid && !p.Dead() {
				pids = append(pids, p.PID)
			}
		}
	}
	for _, pid := range pids {
		if err := setNiceAll(pid, st.prio.base); err != nil && !(pid != s.pid && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("raise the standby to the launcher's priority: %w", err)
		}
	}
	s.lowered = false
	return nil
}

// report logs and records how each rank started.
// parked > 0: the node was a parked spare that long and is promoted.
func (st *Starter) report(specs []spawn.Spec, plans []*plan, warm []*standby, took, parked time.Duration, launched bool) {
	round := envValue(specs, "TORCHELASTIC_RESTART_COUNT")
	if len(warm) > 0 {
		lrs := make([]int, len(warm))
		for i, s := range warm {
			lrs[i] = s.localRank
		}
		msg := "ranks started on prewarmed standbys"
		switch {
		case parked > 0:
			msg = "promoted spare: ranks started on the standbys it kept while parked"
		case launched:
			msg = "first cycle: ranks started on the standbys started at launch"
		}
		st.log.Info(msg, append([]any{"local_ranks", lrs, "handover", took}, spareLogAttrs(parked)...)...)
		rec := eventlog.PrewarmStartedEvent{Round: round, LocalRanks: lrs, HandoverMS: ms(took)}
		if parked > 0 {
			rec.Spare, rec.ParkedMS = true, eventlog.Opt(ms(parked))
		}
		rec.Launched = launched
		st.event(rec)
	}
	for _, p := range plans {
		if p.path == PathWarm {
			continue
		}
		rec := eventlog.PrewarmFallbackEvent{Round: round, LocalRank: p.spec.LocalRank, Path: p.path, Reason: p.reason}
		attrs := []any{"local_rank", p.spec.LocalRank, "path", p.path, "reason", p.reason}
		ch := p.wait
		if ch == nil {
			ch = p.stopped
		}
		if ch != nil {
			rec.StandbyElapsedMS, rec.StandbyCPUMS = eventlog.Opt(ms(p.at.Elapsed)), eventlog.Opt(ms(p.at.CPU))
			attrs = append(attrs, "standby_elapsed", p.at.Elapsed, "standby_cpu", p.at.CPU)
		}
		if p.wait != nil {
			rec.WaitMS, rec.MaxWaitMS = eventlog.Opt(ms(p.waited)), eventlog.Opt(ms(p.wait.MaxWait))
			attrs = append(attrs, "wait", p.waited, "max_wait", p.wait.MaxWait)
			if p.wait.Estimate > 0 {
				rec.ExpectedWaitCPUMS = eventlog.Opt(ms(p.wait.Estimate))
			}
		}
		switch p.path {
		case PathWaited:
			st.log.Info("rank started on its standby after waiting for its import", attrs...)
		default:
			st.log.Info("rank starts cold", attrs...)
		}
		st.event(rec)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (st *Starter) event(rec eventlog.Record) {
	if st.o.OnEvent != nil {
		st.o.OnEvent(rec)
	}
}

// Close kills every standby and waits, bounded, until they are reaped.
// Call it before closing the reaper.
func (st *Starter) Close() {
	st.mu.Lock()
	if !st.closed {
		close(st.closing)
	}
	st.closed = true
	st.mu.Unlock()
	st.refills.Wait()
	st.mu.Lock()
	all := st.standby
	st.standby = map[int]*standby{}
	st.mu.Unlock()
	if st.auto != nil {
		defer st.auto.remove()
		defer st.learnLast() // the last cycle's ranks have ended: what they imported is for the next job
	}
	timeout := time.After(5 * time.Second)
	for _, s := range all {
		s.kill()
	}
	for _, s := range all {
		select {
		case <-s.done:
		case <-timeout:
			st.log.Warn("prewarm: a standby was not reaped after SIGKILL", "local_rank", s.localRank, "pid", s.pid)
			return
		}
	}
}

func envValue(specs []spawn.Spec, k string) string {
	for _, sp := range specs {
		for i := len(sp.Env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(sp.Env[i], k+"="); ok {
				return v
			}
		}
	}
	return ""
}
