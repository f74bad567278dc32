package prewarm

import (
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// Standbys on a parked hot spare.
//
// A spare never ran ranks, so without Park it would have no standby when
// it is promoted after a node loss, and its ranks would pay the
// interpreter start and `import torch` (3-9 s) on the swap's critical
// path. Its launch line (entrypoint, arguments, nproc-per-node) is the
// active nodes', so the rank commands are known before any assignment:
// Park starts one standby per local rank from them, after RefillDelay,
// with the spare's environment minus the assignment's values (the agent
// builds the specs; the handover gives every per-rank value, as for any
// restart). While the node stays parked a standby that dies is started
// again after a wait (spareBudget: 1 s, 2 s, 3 s, 5 s, 9 s... at most a
// minute), SpareRestarts times per local rank at most, then given up with
// a log line: its rank will start cold. Close kills them with the others.

// Event kinds of a parked spare's standbys.
const (
	EventSpareReady = eventlog.PrewarmSpareReady // every standby of a parked spare is ready
	EventSpareDied  = eventlog.PrewarmSpareDied  // a parked spare's standby ended: restarted after a backoff, or given up
)

// DefaultSpareRestarts bounds how many times a parked spare's standbys of
// one local rank are started again after dying.
const DefaultSpareRestarts = 5

// spareBudget bounds the restarts of one local rank's standbys of a
// parked spare (policy.RestartBudget): each waits 1 s, and each further
// one 1 s more, doubling, up to a minute in all; limit restarts in the
// node's life (a standby that keeps dying is given up for good, across
// parks).
func spareBudget(limit int) policy.RestartBudget {
	return policy.RestartBudget{Limit: max(limit, 0), Delay: time.Second, Backoff: time.Second, MaxBackoff: 59 * time.Second}
}

// spareState is what the Starter keeps of the node while it is parked.
// Under Starter.mu.
type spareState struct {
	since     time.Time
	ranks     []int    // its local ranks
	modules   []string // what their standbys import
	announced bool     // EventSpareReady was written for this park
}

// Park keeps a standby for every rank of specs while this node is a
// parked hot spare, so that the ranks of its promotion start warm. specs
// are the ranks the node would start, without the values of an
// assignment it does not have yet; they are started after RefillDelay (off
// the CPU while the active nodes' ranks start, when they share a
// machine). Ranks that already have a standby keep it. Park is idempotent:
// a spare parked again in a later round keeps what it has. The next
// StartGroup ends the parked state.
func (st *Starter) Park(specs []spawn.Spec) {
	if len(specs) == 0 {
		return
	}
	specs = st.hooked(specs)
	st.mu.Lock()
	if st.closed {
		st.mu.Unlock()
		return
	}
	if st.spare == nil {
		st.spare = &spareState{since: time.Now()}
	}
	st.wasParked = true
	sp := st.spare
	sp.ranks = make([]int, 0, len(specs))
	for _, s := range specs {
		sp.ranks = append(sp.ranks, s.LocalRank)
	}
	slices.Sort(sp.ranks)
	ranks := slices.Clone(sp.ranks)
	modules := st.o.Modules
	if st.auto != nil {
		modules = st.auto.learner.Modules(st.auto.keyOf(specs[0]))
	}
	sp.modules = slices.Clone(modules)
	disabled := st.disabled
	missing := 0
	for _, lr := range ranks {
		if st.standby[lr] == nil {
			missing++
		}
	}
	var why string
	if _, w := warmable(specs[0]); w != "" {
		why = w
	}
	// Standbys started at launch (Launch) and still importing: the node
	// turned out a spare, and its imports would take the CPU from the
	// active nodes' first cycle where they share a machine (a nice value
	// does not order processes of different sessions). They go on after
	// RefillDelay, as a parked spare's standbys start.
	paused := st.pauseIdleLocked()
	for _, s := range st.standby {
		s.launched = false // a parked spare's from now on: its promotion is no first cycle
	}
	st.mu.Unlock()
	if len(paused) > 0 {
		lrs := localRanks(paused)
		st.log.Info("parked spare: pausing the standbys started at launch while the active nodes start", "local_ranks", lrs, "for", st.o.RefillDelay)
		st.event(eventlog.PrewarmPausedEvent{LocalRanks: lrs})
		st.resumeParked(paused)
	}
	switch {
	case disabled != "":
		st.log.Info("parked spare: no standbys: "+disabled, "local_ranks", ranks)
		return
	case why != "":
		st.log.Info("parked spare: no standbys: "+why, "local_ranks", ranks)
		return
	}
	attrs := []any{"local_ranks", ranks, "modules", strings.Join(modules, ","), "after", st.o.RefillDelay}
	if st.auto != nil {
		c := st.auto.learner.Get(st.auto.keyOf(specs[0]))
		attrs = append(attrs, "learned", c.learned(), "state_file", st.auto.learner.Path())
	}
	if missing == 0 { // parked again (a later round): it has them
		st.log.Debug("parked spare: keeps its standbys", attrs...)
		st.announceSpare()
		return
	}
	st.log.Info("parked spare: starting standbys for its ranks, so that a promotion starts them warm", attrs...)
	st.startParked(sp, specs)
	st.announceSpare() // all may be ready already (parked again)
}

// startParked starts, after RefillDelay and in the background, the
// standbys of specs that the parked spare sp lacks, unless the node was
// promoted meanwhile (then the cycle's own refill starts them, once its
// ranks are past their imports).
func (st *Starter) startParked(sp *spareState, specs []spawn.Spec) {
	st.mu.Lock()
	defer st.mu.Unlock() // held across refills.Go: Close's Wait cannot begin before it
	if st.closed {
		return
	}
	st.refills.Go(func() {
		if !st.refillWait(nil, nil, st.o.RefillDelay) {
			return
		}
		for _, s := range specs {
			st.mu.Lock()
			still := st.spare == sp
			st.mu.Unlock()
			if !still {
				return
			}
			st.startOne(s)
		}
	})
}

// resumeParked continues, after RefillDelay and in the background, the
// standbys Park paused (a promotion meanwhile resumes those it needs).
func (st *Starter) resumeParked(paused []*standby) {
	st.mu.Lock()
	defer st.mu.Unlock() // held across refills.Go: Close's Wait cannot begin before it
	if st.closed {
		return
	}
	since := time.Now()
	st.refills.Go(func() {
		if st.refillWait(nil, nil, st.o.RefillDelay) {
			st.resume(paused, since)
		}
	})
}

// unparkLocked ends the parked state when a cycle starts (the spare was
// promoted); it returns how long the node was parked (0: it was not).
// Called with st.mu held.
func (st *Starter) unparkLocked() time.Duration {
	if st.spare == nil {
		return 0
	}
	d := time.Since(st.spare.since)
	st.spare = nil
	return max(d, time.Nanosecond)
}

// announceSpare writes EventSpareReady once per park, when every rank of
// the parked spare has a ready standby.
func (st *Starter) announceSpare() {
	st.mu.Lock()
	sp := st.spare
	if sp == nil || sp.announced || st.closed {
		st.mu.Unlock()
		return
	}
	var pids []int
	for _, lr := range sp.ranks {
		s := st.standby[lr]
		if s == nil {
			st.mu.Unlock()
			return
		}
		if ok, _ := s.usable(); !ok {
			st.mu.Unlock()
			return
		}
		pids = append(pids, s.pid)
	}
	sp.announced = true
	ranks, modules, took := slices.Clone(sp.ranks), sp.modules, time.Since(sp.since)
	st.mu.Unlock()
	st.log.Info("parked spare: its standbys are ready; a promotion starts its ranks warm",
		"local_ranks", ranks, "pids", pids, "modules", strings.Join(modules, ","), "since_parked", took)
	st.event(eventlog.PrewarmSpareReadyEvent{LocalRanks: ranks, PIDs: pids, Modules: modules, ReadyMS: ms(took)})
}

// spareStandbyEnded handles the end of standby s of a parked spare that
// was not handed over (it still is the rank's standby): it is dropped,
// and started again after a backoff, or given up past SpareRestarts. It
// reports whether it handled s (false: not parked, closed, or s is no
// longer the rank's standby).
func (st *Starter) spareStandbyEnded(s *standby, why string) bool {
	st.mu.Lock()
	defer st.mu.Unlock() // held across refills.Go: Close's Wait cannot begin before it
	sp := st.spare
	if sp == nil || st.closed || st.disabled != "" || st.standby[s.localRank] != s || !slices.Contains(sp.ranks, s.localRank) {
		return false
	}
	delete(st.standby, s.localRank)
	sp.announced = false
	tr := st.spareRestarts[s.localRank] // kept across parks: a standby that keeps dying is given up for good
	if tr == nil {
		tr = &policy.RestartTracker{Budget: spareBudget(st.o.SpareRestarts)}
		st.spareRestarts[s.localRank] = tr
	}
	n := tr.Restarts() + 1 // its deaths, this one included
	wait, ok := tr.Next(time.Now(), time.Time{})
	rec := eventlog.PrewarmSpareDiedEvent{LocalRank: s.localRank, PID: s.pid, Reason: why, Deaths: n}
	attrs := []any{"local_rank", s.localRank, "pid", s.pid, "reason", why, "deaths", n, "output", s.diag.String()}
	if !ok {
		rec.GaveUp = true
		st.log.Warn("parked spare: a standby ended again; giving up on it: its rank will start cold if this spare is promoted", attrs...)
		st.event(rec)
		return true
	}
	rec.RestartInMS = eventlog.Opt(ms(wait))
	st.log.Warn("parked spare: a standby ended while waiting; starting it again", append(attrs, "in", wait)...)
	st.event(rec)
	spec := s.spec
	st.refills.Go(func() {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-st.closing:
			return
		}
		st.mu.Lock()
		still := st.spare == sp
		st.mu.Unlock()
		if still { // promoted meanwhile: the cycle's refill starts it
			st.startOne(spec)
		}
	})
	return true
}

// watchSpare follows a ready standby of a parked spare until it ends,
// so that one that dies while the node waits (hours, maybe) is replaced
// (spareStandbyEnded); one handed over to a rank ends as that rank.
func (st *Starter) watchSpare(s *standby) {
	<-s.done
	<-s.diagDone
	_, why := s.usable()
	st.spareStandbyEnded(s, why)
}

// spareLogAttrs are the attributes of a promotion's warm start.
func spareLogAttrs(parked time.Duration) []any {
	if parked <= 0 {
		return nil
	}
	return []any{"spare", true, "parked", parked.Round(time.Millisecond)}
}
