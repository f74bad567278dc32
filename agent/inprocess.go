package agent

// In-process restarts (--restart-mode in-process, docs/inprocess.md): after
// a rank failure the surviving ranks keep their processes. The agent keeps
// them running instead of stopping them, reports the failure as usual, and
// once the next round closes it starts only the missing ranks, sends every
// survivor a Rejoin notice over its rank-monitor connection and watches,
// bounded by --inprocess-rejoin-timeout, that each one rejoins. Ranks that
// die together with the failed one (a settle window, then a liveness check
// of every candidate survivor) are replaced, never kept. A survivor that
// has not even opened its new monitor session at the bound is killed and
// replaced within the round; one that has but does not rejoin is killed,
// which ends the cycle with a failure during an in-process restart:
// policy.Survivors then escalates to the full restart.
//
// The decision is policy.Survivors (policy/survivors.go); the agent only
// gathers its facts (survivorFacts, keepSurvivors) and carries it out, in
// two states of its machine (states.go): keeping (settle, decide, keep or
// go to stopping) and rejoining (a round for kept survivors).

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Event kinds of in-process restarts.
const (
	// EventInProcessKept: the survivors of a failure stay in their
	// processes (round, survivors, failed, why).
	EventInProcessKept = eventlog.InProcessKept
	// EventInProcessNotice: a survivor was sent the next round's notice
	// (round, local_rank, rank, world_size, store_prefix, notice_ms).
	EventInProcessNotice = eventlog.InProcessNotice
	// EventInProcessRejoined: a survivor's new process group is up
	// (round, local_rank, teardown_s, rejoin_s).
	EventInProcessRejoined = eventlog.InProcessRejoined
	// EventInProcessFirstStep: a survivor finished its first step of the
	// round (round, local_rank, teardown_s, rejoin_s, restore_s,
	// first_step_s, since_failure_s).
	EventInProcessFirstStep = eventlog.InProcessFirstStep
	// EventInProcessFallback: an in-process restart fell back to the full
	// restart (round, why, local_rank when one survivor caused it).
	EventInProcessFallback = eventlog.InProcessFallback
	// EventInProcessReplaced: a kept survivor ended before its round
	// started (or could not take its notice and was killed), and was
	// started afresh like the failed rank (round, local_rank, exit).
	EventInProcessReplaced = eventlog.InProcessReplaced
)

// InProcessMonitors is what in-process restarts need of the rank monitors
// (*monitor.Manager); monitors without it mean the full restart.
type InProcessMonitors interface {
	InProcessCapable(localRank int) bool
	Silence(localRank int) (monitor.Silence, bool)
	Notify(localRank int, n ftwire.Rejoin) error
	InProcessReports() <-chan monitor.InProcessReport
	// ReplaceRank makes pid localRank's process in the running cycle (a
	// survivor that did not rejoin was replaced).
	ReplaceRank(localRank, pid int)
}

// rankSignaler signals one rank's process group (*spawn.Group, mixedGroup).
type rankSignaler interface {
	Signal(localRank int, sig syscall.Signal) error
}

// keptRanks are the survivors of a failure between the failure and the
// next round's start.
type keptRanks struct {
	group     RankGroup
	survivors []int // local ranks that stay
	failedAt  time.Time
	why       string
}

// rejoinWatch follows the survivors of an in-process restart from the
// notice until each has taken its first step.
type rejoinWatch struct {
	round     int
	failedAt  time.Time
	notices   map[int]time.Time // local rank -> notice sent
	waiting   map[int]bool      // survivors not yet rejoined
	stepping  map[int]bool      // survivors without a first step yet
	timer     *time.Timer
	overdue   bool
	phases    map[string]time.Duration // the slowest survivor's phase durations
	completed bool
	// specs and att: what a replacement of a survivor that does not
	// rejoin starts with (its log ends stay open until no replacement
	// can come); replaced: one was started, none more in this round.
	specs    map[int]spawn.Spec
	att      *ranklogs.Attempt
	replaced bool
}

// noReplacements closes the launcher's copies of the round's log ends
// once no survivor can be replaced any more, so that the tee readers see
// the ranks' end as soon as it comes (the attempt's Close does it at the
// latest).
func (w *rejoinWatch) noReplacements() {
	if w.att != nil {
		w.att.CloseParentEnds()
	}
	w.specs = nil
}

func (a *Agent) ipMonitors() InProcessMonitors {
	if a.cfg.RestartMode != configs.RestartInProcess || a.d.Monitors == nil {
		return nil
	}
	ipm, _ := a.d.Monitors.(InProcessMonitors)
	return ipm
}

// restartMode names how the coming restart restarts this node's ranks.
func (a *Agent) restartMode() string {
	if a.run.kept != nil {
		return policy.ModeInProcess
	}
	return policy.ModeFull
}

// restarted counts a restart of the job by the mode that restarts this
// node's ranks: in the metrics and on the node's Active lease in the
// ledger (kept in memory until the lease's next write).
func (a *Agent) restarted(ctx context.Context) {
	mode := a.restartMode()
	a.met.Restarted()
	a.met.RestartedMode(mode)
	if a.d.Ledger != nil {
		a.d.Ledger.Restarted(ctx, mode)
	}
}

// keeping is the state in which a cycle that may keep its survivors
// (policy.MaySurvive) settles the failure and asks policy.Survivors
// whether this node's surviving ranks stay: they stay (deciding reports
// the failure; the next round is rejoining), or every rank stops.
func (a *Agent) keeping() State {
	if a.keepSurvivors() {
		return StateDeciding
	}
	return StateStopping
}

// rejoining is the state of a round whose ranks are this node's kept
// survivors and fresh ranks for the missing ones: it starts them
// (startRejoin), then waits, as running does, for what ends the cycle
// while the survivors rejoin (rejoinWatch).
func (a *Agent) rejoining(ctx context.Context) State { return a.runCycle(ctx, a.startRejoin) }

// startRejoin prepares the round and starts it for the kept survivors.
func (a *Agent) startRejoin() error {
	specs, att, err := a.prepareCycle()
	if err != nil {
		return err
	}
	return a.startInProcess(specs, att)
}

// survivorFacts are the facts of the cycle's end that the survivors'
// decision needs and that are known before the ranks are counted.
func (a *Agent) survivorFacts() policy.SurvivorsInput {
	end := a.run.end
	in := policy.SurvivorsInput{InProcess: a.ipMonitors() != nil,
		NodeEnding:   a.run.pendingSignal != nil || a.run.pendingReq != nil || a.run.walltime != nil,
		RestartsUsed: a.run.asg.RestartsUsed, MaxRestarts: a.run.asg.MaxRestarts}
	switch {
	case end.kind == endRankFailure:
		in.Failure = policy.RankCrash
		if end.hang {
			in.Failure = policy.RankHang
		}
	case end.kind == endRoundEnded && end.rdzvEnd.Kind == rendezvous.EndRestart:
		// The rendezvous has already decided to restart the job: what
		// is decided here is only how this node's ranks restart.
		in.Failure, in.JobRestarts, in.RoundEndReason = end.rdzvEnd.Cause, true, end.rdzvEnd.Reason
		if in.Failure == "" {
			in.Failure = policy.RankCrash
		}
	}
	return in
}

// keepSurvivors settles the cycle's failure, gathers the rest of the
// facts and applies policy.Survivors; when the survivors stay it does the
// bookkeeping that stopCycle does for stopped ranks and returns true.
func (a *Agent) keepSurvivors() bool {
	in := a.survivorFacts()
	ipm := a.ipMonitors()
	if ipm == nil || !policy.MaySurvive(in) {
		return false
	}
	ending := a.settleSurvivors()
	end := a.run.end // with the exits seen while settling
	var survivors []int
	// Survivors rebuild their process group against the launcher's
	// store (policy.SurvivorsInput.AgentStore).
	in.AgentStore, in.AllCapable = a.d.Store != nil, true
	for lr := 0; lr < a.cfg.NProcPerNode; lr++ {
		if _, exited := end.exitCodes[lr]; exited || ending[lr] {
			continue
		}
		survivors = append(survivors, lr)
		in.AllCapable = in.AllCapable && ipm.InProcessCapable(lr)
	}
	in.Survivors = len(survivors)
	silent := ""
	if in.Failure == policy.RankHang && in.AgentStore && in.AllCapable {
		silent = silentSurvivor(ipm, survivors, a.hungStopped(end))
	}
	in.SurvivorSilent = silent != ""
	asg := a.run.asg
	w := a.run.rejoin
	a.run.rejoin = nil
	if w != nil && w.timer != nil {
		w.timer.Stop()
	}
	in.KeptIntoRound, in.RejoinOverdue = w != nil, w != nil && w.overdue
	in.FirstStepsTaken = w != nil && w.completed || w == nil && !a.freshRoundUnstepped()
	d := policy.Survivors(in)
	if d.RecordFallback {
		a.inProcessFallback("failure_during", -1, "a failure during the restart into round "+
			strconv.Itoa(asg.Round)+", before the job's first step: "+end.reason)
	}
	if !d.Stay {
		if !d.JobCloses {
			attrs := []any{"round", asg.Round, "why", d.Why}
			if silent != "" {
				attrs = append(attrs, "silent", silent)
			}
			a.log.Info("full restart of this node's ranks", attrs...)
		}
		return false
	}
	now := time.Now()
	a.run.cycle.stopStart = now
	a.run.kept = &keptRanks{group: a.run.group, survivors: survivors, failedAt: failureTime(end, now), why: d.Why}
	a.run.keptAtts = append(a.run.keptAtts, a.run.att) // the survivors still write to its pipes
	if a.d.Monitors != nil {
		a.d.Monitors.EndCycleWith(false)
	}
	if end.kind == endRankFailure {
		a.reportFailures(end.failures, a.run.att)
	}
	a.log.Warn("keeping the surviving ranks for an in-process restart", "round", asg.Round,
		"survivors", survivors, "why", d.Why)
	failed := slices.Sorted(maps.Keys(end.exitCodes))
	for lr := range ending { // still ending after the settle's bound: replaced too
		failed = append(failed, lr)
	}
	slices.Sort(failed)
	a.ev.Emit(eventlog.InProcessKeptEvent{Round: asg.Round, Survivors: survivors,
		Failed: failed, Why: d.Why})
	a.run.cycle.stopped = time.Now()
	a.run.group, a.run.att = nil, nil
	return true
}

// inProcessSettle is the reaping window of an in-process restart: after
// the exit of a failed rank, further exits are collected for this long
// before any rank is kept as a survivor, so ranks that die together (one
// kill of several pids, a cascade within milliseconds) are all replaced
// and spend one restart. It delays the report of every failure under
// --restart-mode in-process by as much.
const inProcessSettle = 100 * time.Millisecond

// settleSurvivors makes sure that no rank that died with the failure is
// kept as a survivor (docs/inprocess.md, "One incident, one restart"):
// after a rank failure of this node it collects further exits for
// inProcessSettle; then it checks the process of every rank not known to
// have exited (rankEnding: reaped, a zombie, in its exit, SIGKILL pending)
// and waits, up to survivorKillWait, for the exits of those ending. The
// exits are recorded as the cycle's. It returns the ranks still ending at
// that bound (stuck in their exit): they are not kept either, and are
// started afresh.
func (a *Agent) settleSurvivors() map[int]bool {
	end, g := &a.run.end, a.run.group
	if g == nil {
		return nil
	}
	if len(end.exitCodes) >= a.cfg.NProcPerNode {
		return nil // no rank left to keep
	}
	exits := g.Exits()
	if end.kind == endRankFailure {
		t := time.NewTimer(inProcessSettle)
	settle:
		for {
			select {
			case e := <-exits:
				a.recordExit(e, end)
			case <-t.C:
				break settle
			}
		}
	}
	ending := map[int]bool{}
	for lr := 0; lr < a.cfg.NProcPerNode; lr++ {
		if _, exited := end.exitCodes[lr]; !exited && rankEnding(g, lr) {
			ending[lr] = true
		}
	}
	if len(ending) == 0 {
		return nil
	}
	a.log.Warn("in-process: ranks are ending with the failed one; they are not kept", "round", a.run.asg.Round,
		"local_ranks", slices.Sorted(maps.Keys(ending)))
	deadline := time.NewTimer(survivorKillWait)
	defer deadline.Stop()
	for len(ending) > 0 {
		select {
		case e := <-exits:
			a.recordExit(e, end)
			delete(ending, e.LocalRank)
		case <-deadline.C:
			for lr := range ending {
				_ = signalRank(g, lr, syscall.SIGKILL)
			}
			a.log.Warn("in-process: ranks still ending after the bound; started afresh without their exit",
				"local_ranks", slices.Sorted(maps.Keys(ending)), "bound", survivorKillWait)
			return ending
		}
	}
	return nil
}

// freshRoundUnstepped reports, for a node whose ranks all started afresh
// in a round that a restart opened (a promoted spare, a node that
// restarted fully while other nodes' survivors stayed), whether a failure
// now comes during the job's restart: before each of its ranks took its
// first step of the round. The survivors on other nodes have not stepped
// either (a step is collective), so this node escalates to the full
// restart as theirs do, and the whole job decides alike. Ranks that never
// report a step (no API) are never kept anyway.
func (a *Agent) freshRoundUnstepped() bool {
	if a.run.asg.Round == 0 || a.cfg.RestartMode != configs.RestartInProcess {
		return false
	}
	return len(a.run.freshSteps) < a.cfg.NProcPerNode
}

// hungStopped returns, for a hang that ended the cycle, when the hung rank
// last showed progress as seen from a survivor with heartbeat timeout
// timeout: its last heartbeat when this node's monitor found it; for
// another node's hang (only the round's end is known here) the moment it
// was seen less the survivor's own timeout, which is exact when the nodes
// share their heartbeat timeouts.
func (a *Agent) hungStopped(end cycleEnd) func(timeout time.Duration) time.Time {
	seen := time.Now()
	if end.kind == endRankFailure && a.d.Monitors != nil {
		for lr := range end.exitCodes {
			h, fired := a.d.Monitors.FiredHang(a.run.asg.Round, lr)
			if !fired {
				continue
			}
			at := h.LastHeartbeat
			if at.IsZero() {
				at = h.ExpiredAt.Add(-h.Timeout)
			}
			return func(time.Duration) time.Time { return at }
		}
	}
	return func(timeout time.Duration) time.Time { return seen.Add(-timeout) }
}

// silentSurvivor names the first survivor that may be the hung rank
// itself, or is indistinguishable from it (policy.Input.SurvivorSilent):
// found hung by its own monitor, or whose last heartbeat did not come
// clearly (one heartbeat interval, at least a tenth of its timeout) after
// the hung rank's last one. In a job whose ranks meet in collectives every
// rank falls silent within milliseconds of a hang, so heartbeats cannot
// tell which one hung; a survivor that heartbeated later progressed after
// the hung rank stopped. "" when every survivor did.
func silentSurvivor(ipm InProcessMonitors, survivors []int, hungStopped func(timeout time.Duration) time.Time) string {
	for _, lr := range survivors {
		s, ok := ipm.Silence(lr)
		switch {
		case !ok: // no session: nothing says it progressed
			return fmt.Sprintf("local rank %d has no monitor session", lr)
		case s.Hung:
			return fmt.Sprintf("local rank %d was found hung too", lr)
		}
		margin := max(s.MaxInterval, s.Timeout/10)
		if after := s.Last.Sub(hungStopped(s.Timeout)); after < margin {
			return fmt.Sprintf("local rank %d's last heartbeat came %s after the hung rank's (under %s): it may be the hung rank or wait for it",
				lr, after.Round(time.Millisecond), margin.Round(time.Millisecond))
		}
	}
	return ""
}

// failureTime is when the cycle's first failure was seen.
func failureTime(end cycleEnd, now time.Time) time.Time {
	for _, f := range end.failures {
		if !f.Time.IsZero() && f.Time.Before(now) {
			now = f.Time
		}
	}
	return now
}

// startInProcess starts the round for kept survivors: the missing ranks
// start (from a standby when --prewarm has one), every survivor gets the
// round's notice, then the monitors begin the cycle (a survivor that
// reconnects after its notice waits for that, so nothing slow comes
// between the notices and BeginCycle).
//
// A survivor that ended while the round was forming (it gives up waiting
// for its notice after its notice_wait, e.g. while the round waits for a
// node to come back), or that has no monitor session to take the notice
// and ends when killed, is started afresh with the failed ranks: its end
// is not a failure of the new round and spends nothing more.
func (a *Agent) startInProcess(specs []spawn.Spec, att *ranklogs.Attempt) error {
	kept := a.run.kept
	a.run.kept = nil
	asg := a.run.asg
	ipm := a.ipMonitors()
	bound := a.cfg.InProcessRejoinTimeout
	gone := survivorsGone(kept, nil, 0)
	// A survivor that is ending now (killed while the round formed, its
	// exit not delivered yet) is started afresh, not sent a notice.
	var ending []int
	for _, lr := range kept.survivors {
		if _, ok := gone[lr]; !ok && rankEnding(kept.group, lr) {
			ending = append(ending, lr)
		}
	}
	if len(ending) > 0 {
		maps.Copy(gone, survivorsGone(kept, ending, survivorKillWait))
		for _, lr := range ending {
			if _, ok := gone[lr]; !ok { // stuck in its exit: its exit is not waited for
				gone[lr] = spawn.Exit{LocalRank: lr, PID: kept.group.PIDs()[lr], Code: -1, Signal: syscall.SIGKILL}
				_ = signalRank(kept.group, lr, syscall.SIGKILL)
			}
		}
	}
	var unreached []int
	stopped := map[int]bool{}
	for _, lr := range kept.survivors {
		if _, ok := gone[lr]; ok {
			continue
		}
		switch {
		case ipm == nil || !ipm.InProcessCapable(lr):
			a.log.Warn("in-process: a survivor has no monitor session to take its notice; killing it", "local_rank", lr)
		case rankStopped(kept.group, lr):
			// Stopped by a signal (a SIGSTOP: the fault campaign's hang):
			// it would not take its notice until the rejoin bound, so it
			// starts afresh now, as the ranks without a session do.
			stopped[lr] = true
			a.log.Warn("in-process: a survivor is stopped by a signal and cannot take its notice; killing it", "local_rank", lr)
		default:
			continue
		}
		_ = signalRank(kept.group, lr, syscall.SIGKILL)
		unreached = append(unreached, lr)
	}
	doomed := map[int]bool{}
	if len(unreached) > 0 {
		// No survivor is notified yet: whichever ends now starts afresh.
		maps.Copy(gone, survivorsGone(kept, unreached, survivorKillWait))
		for _, lr := range unreached {
			if _, ok := gone[lr]; !ok {
				// Still there after SIGKILL (stuck in the kernel): its end
				// will be a failure during the in-process restart, which
				// escalates to the full restart.
				doomed[lr] = true
				a.inProcessFallback("notice_failed", lr, fmt.Sprintf("local rank %d has no monitor session and did not end within %s of SIGKILL",
					lr, survivorKillWait))
			}
		}
	}
	for _, lr := range slices.Sorted(maps.Keys(gone)) {
		e := gone[lr]
		a.log.Warn("in-process: a kept survivor ended before its round; starting it afresh", "round", asg.Round,
			"local_rank", lr, "exit", e.String())
		rec := eventlog.InProcessReplacedEvent{Round: asg.Round, LocalRank: lr, Exit: eventlog.Opt(e.String())}
		if stopped[lr] {
			rec.Why = eventlog.Opt("stopped")
			rec.Reason = eventlog.Opt(fmt.Sprintf("local rank %d was stopped by a signal (process state T) when round %d began; killed and started afresh", lr, asg.Round))
		}
		a.ev.Emit(rec)
	}
	var stay []int
	keep := map[int]bool{}
	for _, lr := range kept.survivors {
		if _, ok := gone[lr]; !ok {
			stay = append(stay, lr)
			keep[lr] = true
		}
	}
	var fresh []spawn.Spec
	for _, s := range specs {
		if !keep[s.LocalRank] {
			fresh = append(fresh, s)
		}
	}
	a.run.cycle.spawnStart = time.Now()
	g := newMixedGroup()
	g.add(kept.group, stay)
	if len(fresh) > 0 {
		ng, err := a.d.Ranks.StartGroup(fresh)
		if err != nil {
			att.CloseParentEnds()
			att.Close()
			kept.survivors = stay
			a.run.kept = kept // stopped when the agent ends (stopKept)
			return fmt.Errorf("start replacement ranks: %w", err)
		}
		lrs := make([]int, len(fresh))
		for i, s := range fresh {
			lrs[i] = s.LocalRank
		}
		g.add(ng, lrs)
	}
	a.run.cycle.spawned = time.Now()
	a.run.group, a.run.att = g, att
	a.swapDone()
	w := &rejoinWatch{round: asg.Round, failedAt: kept.failedAt, notices: map[int]time.Time{},
		waiting: map[int]bool{}, stepping: map[int]bool{}, phases: map[string]time.Duration{},
		specs: map[int]spawn.Spec{}, att: att}
	for _, sp := range specs {
		if keep[sp.LocalRank] {
			w.specs[sp.LocalRank] = sp // the log ends a replacement would take
		}
	}
	for _, lr := range stay {
		if doomed[lr] {
			continue
		}
		n := ftwire.Rejoin{Round: asg.Round, Rank: asg.RankBase + lr, LocalRank: lr, WorldSize: asg.WorldSize,
			MasterAddr: asg.MasterAddr, MasterPort: asg.MasterPort, StorePrefix: StorePrefix(asg.Round),
			Reason: kept.why, DeadlineS: bound.Seconds()}
		err := fmt.Errorf("no in-process monitors")
		if ipm != nil {
			err = ipm.Notify(lr, n)
		}
		now := time.Now()
		if err != nil {
			// Its session went away since the check above (it is ending
			// as the ranks start): kill it; its exit is a failure during
			// the in-process restart, which escalates to the full restart.
			a.inProcessFallback("notice_failed", lr, "notice to local rank "+strconv.Itoa(lr)+" failed: "+err.Error())
			_ = g.Signal(lr, syscall.SIGKILL)
			continue
		}
		w.notices[lr], w.waiting[lr], w.stepping[lr] = now, true, true
		a.met.InProcessPhase("notice", now.Sub(kept.failedAt))
		a.ev.Emit(eventlog.InProcessNoticeEvent{Round: asg.Round, LocalRank: lr, Rank: n.Rank,
			WorldSize: n.WorldSize, StorePrefix: n.StorePrefix, NoticeMS: ms(now.Sub(kept.failedAt))})
	}
	pids := g.PIDs()
	if a.d.Monitors != nil {
		a.d.Monitors.BeginCycle(asg.Round, pids)
	}
	rec := eventlog.CycleStartedEvent{Round: asg.Round, GroupRank: asg.GroupRank,
		WorldSize: asg.WorldSize, PIDs: pidList(pids), MasterAddr: asg.MasterAddr, MasterPort: asg.MasterPort,
		RestartsUsed: asg.RestartsUsed}
	if len(stay) == 0 {
		// Every survivor ended: this node's ranks all start afresh.
		att.CloseParentEnds()
		a.run.cycleMode = policy.ModeFull
		a.log.Info("in-process restart: no survivor left on this node; every rank started afresh", "round", asg.Round)
		a.ev.Emit(rec)
		return nil
	}
	a.run.cycleMode = policy.ModeInProcess
	a.run.rejoin = w
	if len(w.waiting) > 0 {
		w.timer = time.NewTimer(bound)
	} else {
		w.noReplacements()
	}
	a.log.Info("in-process restart: survivors notified", "round", asg.Round, "survivors", stay,
		"replaced", len(fresh), "rejoin_timeout", bound)
	rec.Mode, rec.Survivors = policy.ModeInProcess, stay
	a.ev.Emit(rec)
	return nil
}

// survivorKillWait bounds the wait for a survivor that could not take its
// notice to end after SIGKILL (milliseconds, unless it is stuck in the
// kernel).
const survivorKillWait = 2 * time.Second

// survivorsGone collects the exits of kept survivors that have ended:
// those already reaped, and, for wait > 0, those of want that end within
// wait. The exits are consumed: the new round's group does not run them.
func survivorsGone(kept *keptRanks, want []int, wait time.Duration) map[int]spawn.Exit {
	gone := map[int]spawn.Exit{}
	isKept := map[int]bool{}
	for _, lr := range kept.survivors {
		isKept[lr] = true
	}
	missing := func() bool {
		for _, lr := range want {
			if _, ok := gone[lr]; !ok {
				return true
			}
		}
		return false
	}
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		var e spawn.Exit
		select {
		case e = <-kept.group.Exits():
		default: // nothing reaped now: wait only for a missing one of want
			if deadline == nil || !missing() {
				return gone
			}
			select {
			case e = <-kept.group.Exits():
			case <-deadline:
				return gone
			}
		}
		if isKept[e.LocalRank] {
			gone[e.LocalRank] = e
		}
	}
}

// StorePrefix is the c10d store prefix of a round's process group: the one
// torch's env:// rendezvous uses with the agent store, so fresh ranks and
// survivors of an in-process restart meet under it and nothing of an
// older round is visible.
func StorePrefix(round int) string { return "/worker/attempt_" + strconv.Itoa(round) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// rejoinTimer is the channel of the running in-process restart's bound.
func (a *Agent) rejoinTimer() <-chan time.Time {
	if w := a.run.rejoin; w != nil && w.timer != nil && !w.overdue && len(w.waiting) > 0 {
		return w.timer.C
	}
	return nil
}

// ipReports is the ranks' in-process reports channel. It is read in every
// restart mode: ranks that use the API report a fresh rank's first step in
// --restart-mode full too, and an unread channel would fill.
func (a *Agent) ipReports() <-chan monitor.InProcessReport {
	if ipm, ok := a.d.Monitors.(InProcessMonitors); ok {
		return ipm.InProcessReports()
	}
	return nil
}

// inProcessReport records a survivor's rejoin or first-step report.
func (a *Agent) inProcessReport(ctx context.Context, rep monitor.InProcessReport) {
	if rep.Phase == "first_step" && rep.Round == a.run.asg.Round && a.run.freshSteps != nil {
		a.run.freshSteps[rep.LocalRank] = true
	}
	w := a.run.rejoin
	if w == nil || rep.Round != w.round {
		return
	}
	lr := rep.LocalRank
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	switch rep.Phase {
	case "rejoined":
		if !w.waiting[lr] {
			return
		}
		delete(w.waiting, lr)
		a.ev.Emit(eventlog.InProcessRejoinedEvent{Round: w.round, LocalRank: lr,
			TeardownS: rep.TeardownS, RejoinS: rep.RejoinS})
		if len(w.waiting) == 0 {
			w.noReplacements()
			if w.timer != nil {
				w.timer.Stop()
			}
		}
	case "first_step":
		if !w.stepping[lr] {
			return
		}
		delete(w.stepping, lr)
		delete(w.waiting, lr)
		if len(w.waiting) == 0 {
			w.noReplacements()
		}
		since := time.Since(w.failedAt)
		for p, d := range map[string]time.Duration{"notice": w.notices[lr].Sub(w.failedAt), "teardown": sec(rep.TeardownS),
			"rejoin": sec(rep.RejoinS), "restore": sec(rep.RestoreS), "first_step": sec(rep.FirstStepS), "total": since} {
			if p != "notice" { // observed when the notice was sent
				a.met.InProcessPhase(p, d)
			}
			w.phases[p] = max(w.phases[p], d)
		}
		a.ev.Emit(eventlog.InProcessFirstStepEvent{Round: w.round, LocalRank: lr,
			TeardownS: rep.TeardownS, RejoinS: rep.RejoinS, RestoreS: rep.RestoreS,
			FirstStepS: rep.FirstStepS, SinceFailureS: since.Seconds()})
		if len(w.stepping) == 0 {
			w.completed = true
			if w.timer != nil {
				w.timer.Stop()
			}
			a.run.inProcessPhases = w.phases
			if a.d.Ledger != nil {
				a.d.Ledger.InProcessRestarted(ctx, w.phases)
			}
			a.log.Info("in-process restart complete: every survivor took its first step", "round", w.round,
				"since_failure", since.Round(time.Millisecond))
		}
	}
}

// survivorLeft ends the cycle as a failure when a survivor of the running
// in-process restart exits, even with code 0, before it rejoined: it never
// will (its training function had returned, say, and it was finishing when
// the peer failed), and the ranks of the round wait for it (a clean exit
// would leave them waiting until the store's timeout). The failure comes
// during the in-process restart, so the job falls back to the full
// restart. A survivor that rejoined and then exits 0 has finished.
func (a *Agent) survivorLeft(e spawn.Exit, end *cycleEnd) bool {
	w := a.run.rejoin
	if w == nil || !w.waiting[e.LocalRank] {
		return false
	}
	asg := a.run.asg
	end.kind = endRankFailure
	end.reason = fmt.Sprintf("local rank %d (rank %d) %s during the in-process restart of round %d, before it rejoined",
		e.LocalRank, asg.RankBase+e.LocalRank, exitText(e), w.round)
	end.failures = append(end.failures, ranklogs.Failure{LocalRank: e.LocalRank, GlobalRank: asg.RankBase + e.LocalRank,
		PID: e.PID, ExitCode: e.TorchExitCode(), Time: e.At})
	a.log.Warn("a survivor left during the in-process restart", "local_rank", e.LocalRank, "how", exitText(e))
	a.recordRankFailure(e, false)
	return true
}

// rejoinOverdue handles the survivors that have not rejoined within the
// bound. Those that have not even opened their new monitor session
// (stuck: they ignored the notice, or are blocked in a collective of the
// old group) are killed and replaced by fresh ranks within the round,
// once per round, and the bound starts again for the others, which wait
// in init_process_group for the replacements: the incident still spends
// one restart. Survivors that opened their session but did not rejoin,
// and any survivor overdue after a replacement, are killed; their exits
// end the cycle and the job falls back to the full restart.
func (a *Agent) rejoinOverdue(g RankGroup) {
	w := a.run.rejoin
	if w == nil {
		return
	}
	ipm := a.ipMonitors()
	var stuck []int
	for _, lr := range slices.Sorted(maps.Keys(w.waiting)) {
		if ipm == nil || !ipm.InProcessCapable(lr) {
			stuck = append(stuck, lr)
		}
	}
	if mg, ok := g.(*mixedGroup); ok && len(stuck) > 0 && !w.replaced && w.specs != nil {
		err := a.replaceStuck(w, mg, stuck)
		if err == nil {
			return
		}
		a.log.Warn("in-process: could not replace the survivors that did not rejoin", "local_ranks", stuck, "err", err)
	}
	w.overdue = true
	w.noReplacements()
	for _, lr := range slices.Sorted(maps.Keys(w.waiting)) {
		a.inProcessFallback("rejoin_timeout", lr, fmt.Sprintf("local rank %d did not rejoin round %d within %s; killing it",
			lr, w.round, a.cfg.InProcessRejoinTimeout))
		if s, ok := g.(rankSignaler); ok {
			if err := s.Signal(lr, syscall.SIGKILL); err != nil {
				a.log.Warn("killing a survivor that did not rejoin", "local_rank", lr, "err", err)
			}
		}
	}
}

// replaceStuck starts fresh ranks for the survivors in stuck (no session
// at the bound), makes them the round's ranks, then kills the stuck
// processes (their exits are not the round's) and restarts the bound for
// the survivors still waiting.
func (a *Agent) replaceStuck(w *rejoinWatch, g *mixedGroup, stuck []int) error {
	specs := make([]spawn.Spec, 0, len(stuck))
	for _, lr := range stuck {
		sp, ok := w.specs[lr]
		if !ok {
			return fmt.Errorf("no spec for local rank %d", lr)
		}
		specs = append(specs, sp)
	}
	olds := map[int]RankGroup{}
	for _, lr := range stuck {
		olds[lr] = g.ownerOf(lr)
	}
	ng, err := a.d.Ranks.StartGroup(specs)
	w.noReplacements() // the ends are the new ranks' now (or nobody's)
	w.replaced = true
	if err != nil {
		return fmt.Errorf("start replacements for local ranks %v: %w", stuck, err)
	}
	g.add(ng, stuck)
	pids := ng.PIDs()
	bound := a.cfg.InProcessRejoinTimeout
	for _, lr := range stuck {
		if err := signalRank(olds[lr], lr, syscall.SIGKILL); err != nil {
			a.log.Warn("in-process: killing a survivor that did not rejoin", "local_rank", lr, "err", err)
		}
		delete(w.waiting, lr)
		delete(w.stepping, lr)
		delete(w.notices, lr)
		if ipm := a.ipMonitors(); ipm != nil {
			ipm.ReplaceRank(lr, pids[lr])
		}
		reason := fmt.Sprintf("local rank %d did not open its monitor session of round %d within %s of its notice (stuck); killed and replaced by pid %d",
			lr, w.round, bound, pids[lr])
		a.log.Warn("in-process: a survivor that did not rejoin is replaced within the round", "round", w.round,
			"local_rank", lr, "pid", pids[lr])
		a.ev.Emit(eventlog.InProcessReplacedEvent{Round: w.round, LocalRank: lr, Why: eventlog.Opt("rejoin_timeout"),
			PID: eventlog.Opt(pids[lr]), Reason: eventlog.Opt(reason)})
	}
	if len(w.waiting) > 0 {
		w.timer.Reset(bound) // the survivors wait for the replacements
		a.log.Info("in-process: the rejoin bound starts again for the survivors that opened their session",
			"local_ranks", slices.Sorted(maps.Keys(w.waiting)), "rejoin_timeout", bound)
	}
	return nil
}

// inProcessFallback records that an in-process restart falls back to the
// full restart (localRank -1: not one survivor's doing).
func (a *Agent) inProcessFallback(why string, localRank int, reason string) {
	if a.run.cycleFallback == "" { // the first cause stands
		a.run.cycleFallback = why
	}
	a.met.InProcessFallback(why)
	rec := eventlog.InProcessFallbackEvent{Round: a.run.asg.Round, Why: why, Reason: reason}
	if localRank >= 0 {
		rec.LocalRank = eventlog.Opt(localRank)
	}
	a.log.Warn("in-process restart falls back to the full restart", "why", why, "reason", reason)
	a.ev.Emit(rec)
}

// closeKeptLogs closes the log attempts the survivors wrote to, once they
// are stopped.
func (a *Agent) closeKeptLogs() {
	for _, att := range a.run.keptAtts {
		att.Close()
	}
	a.run.keptAtts = nil
}

// stopKept stops survivors still kept when no round will start them: the
// job ends first (a close, a signal, a lost rendezvous), or this node is
// parked as a standby.
func (a *Agent) stopKept(why string) {
	k := a.run.kept
	if k == nil {
		return
	}
	a.run.kept = nil
	res := k.group.Stop(syscall.SIGTERM, a.cfg.WorkersStopTimeout)
	a.log.Info("stopped the kept survivors", "why", why, "exits", len(res.Exits))
	a.closeKeptLogs()
}

// mixedGroup is the ranks of an in-process round: survivors from an older
// group and the ranks started for this round (and, when a survivor did
// not rejoin, the rank that replaced it). Each local rank belongs to the
// group that runs it now; exits of ranks an older group no longer runs
// (the failed ones, a replaced survivor) are not delivered.
type mixedGroup struct {
	mu       sync.Mutex
	parts    []RankGroup
	owner    map[int]RankGroup // local rank -> the part that runs it now
	exits    chan spawn.Exit   // nil until Exits
	quit     chan struct{}     // closed by Stop: the forwarders end
	stopOnce sync.Once
}

func newMixedGroup() *mixedGroup {
	return &mixedGroup{owner: map[int]RankGroup{}, quit: make(chan struct{})}
}

// add makes g the group that runs ranks from now on; exits of those ranks
// from the group that ran them before are dropped.
func (m *mixedGroup) add(g RankGroup, ranks []int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !slices.Contains(m.parts, g) {
		m.parts = append(m.parts, g)
		if m.exits != nil {
			m.forward(g)
		}
	}
	for _, lr := range ranks {
		m.owner[lr] = g
	}
}

// ownerOf is the part that runs local rank lr now (nil: none).
func (m *mixedGroup) ownerOf(lr int) RankGroup {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.owner[lr]
}

// PIDs maps each local rank to the pid that runs it now.
func (m *mixedGroup) PIDs() map[int]int {
	m.mu.Lock()
	owner := maps.Clone(m.owner)
	m.mu.Unlock()
	out := map[int]int{}
	for lr, g := range owner {
		if pid, ok := g.PIDs()[lr]; ok {
			out[lr] = pid
		}
	}
	return out
}

// Exits merges the parts' exits of the ranks they run now.
func (m *mixedGroup) Exits() <-chan spawn.Exit {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exits == nil {
		m.exits = make(chan spawn.Exit, 64)
		for _, g := range m.parts {
			m.forward(g)
		}
	}
	return m.exits
}

// forward delivers g's exits of the ranks it runs now. Caller holds m.mu.
func (m *mixedGroup) forward(g RankGroup) {
	src, out, quit := g.Exits(), m.exits, m.quit
	go func() {
		for {
			select {
			case e := <-src:
				if m.ownerOf(e.LocalRank) != g {
					continue
				}
				select {
				case out <- e:
				case <-quit:
					return
				}
			case <-quit:
				return
			}
		}
	}()
}

// Stop stops every part at once and reports the current ranks' exits.
func (m *mixedGroup) Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult {
	m.mu.Lock()
	parts := slices.Clone(m.parts)
	owner := maps.Clone(m.owner)
	m.mu.Unlock()
	res := make([]spawn.StopResult, len(parts))
	var wg sync.WaitGroup
	for i, g := range parts {
		wg.Go(func() { res[i] = g.Stop(sig, grace) })
	}
	wg.Wait()
	m.stopOnce.Do(func() { close(m.quit) })
	var out spawn.StopResult
	for i, g := range parts {
		for _, e := range res[i].Exits {
			if owner[e.LocalRank] == g {
				out.Exits = append(out.Exits, e)
			}
		}
		for _, lr := range res[i].Escalated {
			if owner[lr] == g {
				out.Escalated = append(out.Escalated, lr)
			}
		}
		out.Leftover = append(out.Leftover, res[i].Leftover...)
	}
	slices.SortFunc(out.Exits, func(x, y spawn.Exit) int { return x.LocalRank - y.LocalRank })
	return out
}

// SignalAll signals every current rank.
func (m *mixedGroup) SignalAll(sig syscall.Signal) {
	for lr := range m.PIDs() {
		_ = m.Signal(lr, sig)
	}
}

// Signal signals one current rank's process group.
func (m *mixedGroup) Signal(localRank int, sig syscall.Signal) error {
	if g := m.ownerOf(localRank); g != nil {
		return signalRank(g, localRank, sig)
	}
	return fmt.Errorf("no local rank %d in the group", localRank)
}

// Ending reports whether the process of a current rank has ended or is
// ending (rankEnding).
func (m *mixedGroup) Ending(localRank int) bool {
	g := m.ownerOf(localRank)
	return g == nil || rankEnding(g, localRank)
}

// rankEnder is a group that can tell a rank whose exit is not delivered
// yet has ended or is ending (*spawn.Group, mixedGroup).
type rankEnder interface {
	Ending(localRank int) bool
}

// rankEnding reports whether local rank's process in g has ended or is
// ending, although its exit may not have been delivered: from g when it
// knows, else from /proc by its pid.
func rankEnding(g RankGroup, localRank int) bool {
	if e, ok := g.(rankEnder); ok {
		return e.Ending(localRank)
	}
	pid, ok := g.PIDs()[localRank]
	return !ok || procfs.Ending(pid)
}

// rankStopped reports a rank whose process is stopped by a signal
// (procfs.Stat.Stopped); false when it cannot be read (it ended: its exit
// tells).
func rankStopped(g RankGroup, localRank int) bool {
	pid, ok := g.PIDs()[localRank]
	if !ok || pid <= 0 {
		return false
	}
	st, err := procfs.Read(pid)
	return err == nil && st.Stopped()
}

// signalRank signals one rank's process group in g.
func signalRank(g RankGroup, localRank int, sig syscall.Signal) error {
	if s, ok := g.(rankSignaler); ok {
		return s.Signal(localRank, sig)
	}
	pid := g.PIDs()[localRank]
	if pid <= 0 {
		return fmt.Errorf("no pid for local rank %d", localRank)
	}
	return syscall.Kill(-pid, sig)
}

// recordCycleMode writes the finished cycle's restart mode and in-process
// phases into its verdict record.
func (r *runState) recordCycleMode(c *verdict.Cycle) {
	c.Mode = r.cycleMode
	if c.Mode == "" {
		c.Mode = policy.ModeFull
	}
	if c.Mode == policy.ModeInProcess && len(r.inProcessPhases) > 0 {
		c.InProcessMS = map[string]float64{}
		for p, d := range r.inProcessPhases {
			c.InProcessMS[p] = ms(d)
		}
	}
	c.InProcessFallback = r.cycleFallback
	r.cycleMode, r.inProcessPhases, r.cycleFallback = "", nil, ""
}
