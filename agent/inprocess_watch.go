package agent

// Following the survivors of an in-process restart from their notices to
// their first steps (rejoining → stepping → complete), within the rejoin
// bound (overdue: stuck survivors replaced once, the others killed), and
// what the cycle's verdict record says of it.

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

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

// endWatch stops following the running restart (a failure ended its
// round) and returns it; nil when none was followed.
func (p *inProcess) endWatch() *rejoinWatch {
	w := p.watch
	p.watch = nil
	if w != nil && w.timer != nil {
		w.timer.Stop()
	}
	return w
}

// rejoinTimer is the channel of the running restart's bound (nil unless
// rejoining).
func (p *inProcess) rejoinTimer() <-chan time.Time {
	if p.phase() == ipRejoining && p.watch.timer != nil {
		return p.watch.timer.C
	}
	return nil
}

// reports is the ranks' in-process reports channel. It is read in every
// restart mode: ranks that use the API report a fresh rank's first step in
// --restart-mode full too, and an unread channel would fill.
func (p *inProcess) reports() <-chan monitor.InProcessReport {
	if p.d.ipm != nil {
		return p.d.ipm.InProcessReports()
	}
	return nil
}

// report records a rank's report in round: a fresh rank's first step, a
// survivor's rejoin (rejoining → stepping once none waits) or first step
// (→ complete once every survivor stepped).
func (p *inProcess) report(ctx context.Context, round int, rep monitor.InProcessReport) {
	if rep.Phase == "first_step" && rep.Round == round && p.freshSteps != nil {
		p.freshSteps[rep.LocalRank] = true
	}
	w := p.watch
	if w == nil || rep.Round != w.round {
		return
	}
	switch rep.Phase {
	case "rejoined":
		p.rejoined(w, rep)
	case "first_step":
		p.firstStep(ctx, w, rep)
	}
}

// rejoined records a survivor's new process group up.
func (p *inProcess) rejoined(w *rejoinWatch, rep monitor.InProcessReport) {
	lr := rep.LocalRank
	if !w.waiting[lr] {
		return
	}
	delete(w.waiting, lr)
	p.d.ev.Emit(eventlog.InProcessRejoinedEvent{Round: w.round, LocalRank: lr,
		TeardownS: rep.TeardownS, RejoinS: rep.RejoinS})
	if len(w.waiting) == 0 {
		w.noReplacements()
		if w.timer != nil {
			w.timer.Stop()
		}
	}
}

// firstStep records a survivor's first step of the round with its phases;
// the last one completes the restart.
func (p *inProcess) firstStep(ctx context.Context, w *rejoinWatch, rep monitor.InProcessReport) {
	lr := rep.LocalRank
	if !w.stepping[lr] {
		return
	}
	delete(w.stepping, lr)
	delete(w.waiting, lr)
	if len(w.waiting) == 0 {
		w.noReplacements()
	}
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	since := time.Since(w.failedAt)
	for ph, d := range map[string]time.Duration{"notice": w.notices[lr].Sub(w.failedAt), "teardown": sec(rep.TeardownS),
		"rejoin": sec(rep.RejoinS), "restore": sec(rep.RestoreS), "first_step": sec(rep.FirstStepS), "total": since} {
		if ph != "notice" { // observed when the notice was sent
			p.d.met.InProcessPhase(ph, d)
		}
		w.phases[ph] = max(w.phases[ph], d)
	}
	p.d.ev.Emit(eventlog.InProcessFirstStepEvent{Round: w.round, LocalRank: lr,
		TeardownS: rep.TeardownS, RejoinS: rep.RejoinS, RestoreS: rep.RestoreS,
		FirstStepS: rep.FirstStepS, SinceFailureS: since.Seconds()})
	if len(w.stepping) > 0 {
		return
	}
	w.completed = true
	if w.timer != nil {
		w.timer.Stop()
	}
	p.phases = w.phases
	if p.d.ledger != nil {
		p.d.ledger.InProcessRestarted(ctx, w.phases)
	}
	p.d.log.Info("in-process restart complete: every survivor took its first step", "round", w.round,
		"since_failure", since.Round(time.Millisecond))
}

// survivorLeft ends the cycle as a failure when a survivor of the running
// in-process restart exits, even with code 0, before it rejoined: it never
// will (its training function had returned, say, and it was finishing when
// the peer failed), and the ranks of the round wait for it (a clean exit
// would leave them waiting until the store's timeout). The failure comes
// during the in-process restart, so the job falls back to the full
// restart. A survivor that rejoined and then exits 0 has finished.
func (p *inProcess) survivorLeft(e spawn.Exit, end *cycleEnd, asg rendezvous.Assignment) bool {
	w := p.watch
	if w == nil || !w.waiting[e.LocalRank] {
		return false
	}
	end.kind = endRankFailure
	end.reason = fmt.Sprintf("local rank %d (rank %d) %s during the in-process restart of round %d, before it rejoined",
		e.LocalRank, asg.RankBase+e.LocalRank, exitText(e), w.round)
	end.failures = append(end.failures, ranklogs.Failure{LocalRank: e.LocalRank, GlobalRank: asg.RankBase + e.LocalRank,
		PID: e.PID, ExitCode: e.TorchExitCode(), Time: e.At})
	p.d.log.Warn("a survivor left during the in-process restart", "local_rank", e.LocalRank, "how", exitText(e))
	p.d.host.recordRankFailure(e, false)
	return true
}

// overdue handles the survivors that have not rejoined the round's group
// g within the bound. Those that have not even opened their new monitor
// session (stuck: they ignored the notice, or are blocked in a collective
// of the old group) are killed and replaced by fresh ranks within the
// round, once per round, and the bound starts again for the others, which
// wait in init_process_group for the replacements: the incident still
// spends one restart (still rejoining). Survivors that opened their
// session but did not rejoin, and any survivor overdue after a
// replacement, are killed (overdue); their exits end the cycle and the job
// falls back to the full restart.
func (p *inProcess) overdue(g RankGroup) {
	w := p.watch
	if w == nil {
		return
	}
	ipm := p.monitors()
	var stuck []int
	for _, lr := range slices.Sorted(maps.Keys(w.waiting)) {
		if ipm == nil || !ipm.InProcessCapable(lr) {
			stuck = append(stuck, lr)
		}
	}
	if mg, ok := g.(*mixedGroup); ok && len(stuck) > 0 && !w.replaced && w.specs != nil {
		err := p.replaceStuck(w, mg, stuck)
		if err == nil {
			return
		}
		p.d.log.Warn("in-process: could not replace the survivors that did not rejoin", "local_ranks", stuck, "err", err)
	}
	w.overdue = true
	w.noReplacements()
	for _, lr := range slices.Sorted(maps.Keys(w.waiting)) {
		p.recordFallback(w.round, "rejoin_timeout", lr, fmt.Sprintf("local rank %d did not rejoin round %d within %s; killing it",
			lr, w.round, p.d.rejoinTimeout))
		if s, ok := g.(rankSignaler); ok {
			if err := s.Signal(lr, syscall.SIGKILL); err != nil {
				p.d.log.Warn("killing a survivor that did not rejoin", "local_rank", lr, "err", err)
			}
		}
	}
}

// replaceStuck starts fresh ranks for the survivors in stuck (no session
// at the bound), makes them the round's ranks, then kills the stuck
// processes (their exits are not the round's) and restarts the bound for
// the survivors still waiting.
func (p *inProcess) replaceStuck(w *rejoinWatch, g *mixedGroup, stuck []int) error {
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
	ng, err := p.d.ranks.StartGroup(specs)
	w.noReplacements() // the ends are the new ranks' now (or nobody's)
	w.replaced = true
	if err != nil {
		return fmt.Errorf("start replacements for local ranks %v: %w", stuck, err)
	}
	g.add(ng, stuck)
	pids := ng.PIDs()
	bound := p.d.rejoinTimeout
	for _, lr := range stuck {
		if err := signalRank(olds[lr], lr, syscall.SIGKILL); err != nil {
			p.d.log.Warn("in-process: killing a survivor that did not rejoin", "local_rank", lr, "err", err)
		}
		delete(w.waiting, lr)
		delete(w.stepping, lr)
		delete(w.notices, lr)
		if ipm := p.monitors(); ipm != nil {
			ipm.ReplaceRank(lr, pids[lr])
		}
		reason := fmt.Sprintf("local rank %d did not open its monitor session of round %d within %s of its notice (stuck); killed and replaced by pid %d",
			lr, w.round, bound, pids[lr])
		p.d.log.Warn("in-process: a survivor that did not rejoin is replaced within the round", "round", w.round,
			"local_rank", lr, "pid", pids[lr])
		p.d.ev.Emit(eventlog.InProcessReplacedEvent{Round: w.round, LocalRank: lr, Why: eventlog.Opt("rejoin_timeout"),
			PID: eventlog.Opt(pids[lr]), Reason: eventlog.Opt(reason)})
	}
	if len(w.waiting) > 0 {
		w.timer.Reset(bound) // the survivors wait for the replacements
		p.d.log.Info("in-process: the rejoin bound starts again for the survivors that opened their session",
			"local_ranks", slices.Sorted(maps.Keys(w.waiting)), "rejoin_timeout", bound)
	}
	return nil
}

// recordFallback records that the in-process restart of round falls back
// to the full restart (localRank -1: not one survivor's doing).
func (p *inProcess) recordFallback(round int, why string, localRank int, reason string) {
	if p.fallback == "" { // the first cause stands
		p.fallback = why
	}
	p.d.met.InProcessFallback(why)
	rec := eventlog.InProcessFallbackEvent{Round: round, Why: why, Reason: reason}
	if localRank >= 0 {
		rec.LocalRank = eventlog.Opt(localRank)
	}
	p.d.log.Warn("in-process restart falls back to the full restart", "why", why, "reason", reason)
	p.d.ev.Emit(rec)
}

// recordCycle writes the finished cycle's restart mode and in-process
// phases into its verdict record, and starts the next cycle's afresh.
func (p *inProcess) recordCycle(c *verdict.Cycle) {
	c.Mode = string(p.cycleMode)
	if c.Mode == "" {
		c.Mode = string(policy.ModeFull)
	}
	if p.cycleMode == policy.ModeInProcess && len(p.phases) > 0 {
		c.InProcessMS = map[string]float64{}
		for ph, d := range p.phases {
			c.InProcessMS[ph] = ms(d)
		}
	}
	c.InProcessFallback = p.fallback
	p.cycleMode, p.phases, p.fallback = "", nil, ""
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
