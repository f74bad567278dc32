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
// The decision is policy.Survivors (policy/survivors.go); the unit that
// carries it out is inProcess, one per Run (runState.ip), with its own
// phases (ipPhase, below). The agent drives it from two states of its
// machine (states.go): keeping (inProcess.keep: settle, decide, keep or go
// to stopping) and rejoining (inProcess.start: a round for kept
// survivors), and from supervise (the survivors' reports, the rejoin
// bound, a survivor that leaves). The unit's files:
//
//	inprocess.go         the type, its phases and the agent's side
//	inprocess_facts.go   the facts policy.Survivors decides on
//	inprocess_settle.go  settle-and-kill: no rank dying with the failure is kept
//	inprocess_start.go   the round for kept survivors, step by step
//	inprocess_watch.go   following the survivors until their first step
//	mixedgroup.go        the ranks of such a round (survivors and fresh ranks)

import (
	"context"
	"log/slog"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
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

// inProcessDeps are the agent's parts an in-process restart uses, given
// to it when Run begins.
type inProcessDeps struct {
	on            bool // --restart-mode in-process
	nproc         int  // --nproc-per-node
	rejoinTimeout time.Duration
	stopTimeout   time.Duration     // --workers-stop-timeout (kept survivors that no round starts)
	ipm           InProcessMonitors // the monitors' in-process side, read in any mode (nil: none)
	mons          Monitors          // the rank monitors (nil: none)
	ranks         RankStarter
	agentStore    bool         // the launcher serves the ranks' store (--agent-store)
	ledger        *ledger.Book // nil: no ledger
	log           *slog.Logger
	ev            *eventlog.Log
	met           *metrics.Metrics
	host          inProcessHost
}

// inProcessHost is what an in-process restart has the node agent do: its
// records of the running cycle's exits and failures, and the end of a
// spare's swap once the round's ranks run (*Agent).
type inProcessHost interface {
	recordExit(e spawn.Exit, end *cycleEnd)
	recordRankFailure(e spawn.Exit, hang bool)
	reportFailures(failures []ranklogs.Failure, att *ranklogs.Attempt, drain time.Duration)
	swapDone()
}

// ipCycle is the agent's running cycle as the in-process restart sees it:
// passed in at each step, never kept.
type ipCycle struct {
	asg    rendezvous.Assignment
	end    *cycleEnd
	group  RankGroup
	att    *ranklogs.Attempt
	timing *cycleTiming
}

// inProcess is the in-process restart of one Run: the survivors kept
// between a failure and the next round, the restart being followed, and
// what the cycle's verdict record says of it. Its zero value is idle and
// records full restarts.
type inProcess struct {
	d inProcessDeps

	kept     *keptRanks          // ipKept: the survivors waiting for the next round
	watch    *rejoinWatch        // a round with survivors: their rejoins and first steps
	keptAtts []*ranklogs.Attempt // log attempts survivors still write to
	// freshSteps are the local ranks started afresh this round that
	// reported their first step of it (freshRoundUnstepped); nil before
	// the first round.
	freshSteps map[int]bool
	// What the running cycle's verdict record says (recordCycle): its
	// restart mode, the slowest survivor's phases, why it fell back.
	cycleMode policy.Mode
	phases    map[string]time.Duration
	fallback  string
}

// ipPhase is where the in-process restart of a Run stands. It is derived
// from the unit's state (phase), never stored beside it:
//
//	idle ──keep──► kept ──start──► rejoining ──(all rejoined)──► stepping ──(all stepped)──► complete
//	 ▲              │                 │  ▲
//	 │              │                 │  └── at the bound: stuck survivors replaced (once a round)
//	 │              │                 └── at the bound, else ──► overdue (the rest killed: the cycle fails)
//	 └── stopKept ──┘
//
// Besides: start goes from kept to stepping when no notified survivor
// waits for its rejoin, to idle when no survivor is left, and stays in
// kept when the fresh ranks cannot start. keep goes to kept from any
// other phase when the survivors of the cycle's failure stay (a failure
// in a round with survivors may keep them again) and to idle when they do
// not (once policy.Survivors was asked), as allFresh does (a round that
// starts every rank afresh).
type ipPhase int

const (
	ipIdle      ipPhase = iota // nothing kept, no restart followed
	ipKept                     // survivors kept; the next round starts them (start) or stops them (stopKept)
	ipRejoining                // survivors notified; the rejoin bound runs for those not rejoined
	ipStepping                 // every survivor rejoined (or was replaced); waiting for their first steps
	ipOverdue                  // the bound passed: the survivors left waiting were killed
	ipComplete                 // every survivor took its first step of the round
)

func (p ipPhase) String() string {
	switch p {
	case ipIdle:
		return "idle"
	case ipKept:
		return "kept"
	case ipRejoining:
		return "rejoining"
	case ipStepping:
		return "stepping"
	case ipOverdue:
		return "overdue"
	case ipComplete:
		return "complete"
	}
	return "ipPhase(?)"
}

// phase is the in-process restart's phase now.
func (p *inProcess) phase() ipPhase {
	w := p.watch
	switch {
	case p.kept != nil:
		return ipKept
	case w == nil:
		return ipIdle
	case w.completed:
		return ipComplete
	case w.overdue:
		return ipOverdue
	case len(w.waiting) > 0:
		return ipRejoining
	}
	return ipStepping
}

// newInProcess is the in-process restart of a Run (idle).
func (a *Agent) newInProcess() inProcess {
	ipm, _ := a.d.Monitors.(InProcessMonitors)
	return inProcess{d: inProcessDeps{on: a.cfg.RestartMode == configs.RestartInProcess, nproc: a.cfg.NProcPerNode,
		rejoinTimeout: a.cfg.InProcessRejoinTimeout, stopTimeout: a.cfg.WorkersStopTimeout, ipm: ipm, mons: a.d.Monitors, ranks: a.d.Ranks,
		agentStore: a.d.Store != nil, ledger: a.d.Ledger, log: a.log, ev: a.ev, met: a.met, host: a}}
}

// monitors is the monitors' in-process side under --restart-mode
// in-process; nil means every restart is full.
func (p *inProcess) monitors() InProcessMonitors {
	if !p.d.on {
		return nil
	}
	return p.d.ipm
}

// mode names how the coming restart restarts this node's ranks.
func (p *inProcess) mode() policy.Mode {
	if p.phase() == ipKept {
		return policy.ModeInProcess
	}
	return policy.ModeFull
}

// newRound starts counting the first steps of the round's fresh ranks
// (every round, before its ranks start).
func (p *inProcess) newRound() { p.freshSteps = map[int]bool{} }

// allFresh: a round starts every rank afresh, so no survivor is followed.
func (p *inProcess) allFresh() { p.watch = nil }

// keep is StateKeeping's work, for a cycle that may keep its survivors:
// it settles the cycle's failure, gathers the rest of the facts and
// applies policy.Survivors. When the survivors stay it keeps them (kept),
// does for the cycle what stopCycle does for stopped ranks (the monitors'
// end of the cycle, the failure report, its timing) and returns true; the
// agent then drops the cycle's group and logs. False: every rank stops.
func (p *inProcess) keep(in policy.SurvivorsInput, c ipCycle) bool {
	ipm := p.monitors()
	if ipm == nil || !policy.MaySurvive(in) {
		return false
	}
	ending := p.settle(c)
	end := *c.end // with the exits seen while settling
	survivors, silent := p.survivorsOf(&in, ipm, end, c.asg.Round, ending)
	p.watchFacts(&in, p.endWatch(), c.asg.Round)
	d := policy.Survivors(in)
	if d.RecordFallback {
		p.recordFallback(c.asg.Round, "failure_during", -1, "a failure during the restart into round "+
			itoa(c.asg.Round)+", before the job's first step: "+end.reason)
	}
	if !d.Stay {
		if !d.JobCloses {
			attrs := []any{"round", c.asg.Round, "why", d.Why}
			if silent != "" {
				attrs = append(attrs, "silent", silent)
			}
			p.d.log.Info("full restart of this node's ranks", attrs...)
		}
		return false
	}
	now := time.Now()
	c.timing.stopStart = now
	p.kept = &keptRanks{group: c.group, survivors: survivors, failedAt: failureTime(end, now), why: d.Why}
	p.keptAtts = append(p.keptAtts, c.att) // the survivors still write to its pipes
	if p.d.mons != nil {
		p.d.mons.EndCycleWith(false)
	}
	if end.kind == endRankFailure {
		// A short wait: the survivors wait for this restart, and a
		// failed rank's children (DataLoader workers) may hold its
		// stderr open for seconds.
		p.d.host.reportFailures(end.failures, c.att, stderrDrainInProcess)
	}
	p.d.log.Warn("keeping the surviving ranks for an in-process restart", "round", c.asg.Round,
		"survivors", survivors, "why", d.Why)
	p.d.ev.Emit(eventlog.InProcessKeptEvent{Round: c.asg.Round, Survivors: survivors,
		Failed: failedRanks(end, ending), Why: d.Why})
	c.timing.stopped = time.Now()
	return true
}

// stopKept stops survivors still kept when no round will start them: the
// job ends first (a close, a signal, a lost rendezvous), or this node is
// parked as a standby (kept → idle).
func (p *inProcess) stopKept(why string) {
	k := p.kept
	if k == nil {
		return
	}
	p.kept = nil
	res := k.group.Stop(syscall.SIGTERM, p.d.stopTimeout)
	p.d.log.Info("stopped the kept survivors", "why", why, "exits", len(res.Exits))
	p.closeKeptLogs()
}

// closeKeptLogs closes the log attempts the survivors wrote to, once they
// are stopped.
func (p *inProcess) closeKeptLogs() {
	for _, att := range p.keptAtts {
		att.Close()
	}
	p.keptAtts = nil
}

// The agent's side: its states keeping and rejoining, and what it asks of
// the unit elsewhere.

// ipCycle is the running cycle, for the in-process restart.
func (a *Agent) ipCycle() ipCycle {
	r := &a.run
	return ipCycle{asg: r.asg, end: &r.end, group: r.group, att: r.att, timing: &r.cycle}
}

// keeping is the state in which a cycle that may keep its survivors
// (policy.MaySurvive) settles the failure and asks policy.Survivors
// whether this node's surviving ranks stay: they stay (deciding reports
// the failure; the next round is rejoining), or every rank stops.
func (a *Agent) keeping() State {
	if !a.run.ip.keep(a.survivorFacts(), a.ipCycle()) {
		return StateStopping
	}
	a.run.group, a.run.att = nil, nil // the kept survivors' now
	return StateDeciding
}

// rejoining is the state of a round whose ranks are this node's kept
// survivors and fresh ranks for the missing ones: it starts them
// (startRejoin), then waits, as running does, for what ends the cycle
// while the survivors rejoin.
func (a *Agent) rejoining(ctx context.Context) State { return a.runCycle(ctx, a.startRejoin) }

// startRejoin prepares the round and starts it for the kept survivors.
func (a *Agent) startRejoin() error {
	specs, att, err := a.prepareCycle()
	if err != nil {
		return err
	}
	g, err := a.run.ip.start(a.ipCycle(), specs, att)
	if err != nil {
		return err
	}
	a.run.group, a.run.att = g, att
	return nil
}

// restartMode names how the coming restart restarts this node's ranks.
func (a *Agent) restartMode() policy.Mode { return a.run.ip.mode() }

// restarted counts a restart of the job by the mode that restarts this
// node's ranks: in the metrics and on the node's Active lease in the
// ledger (kept in memory until the lease's next write).
func (a *Agent) restarted(ctx context.Context) {
	mode := a.restartMode()
	a.met.Restarted()
	a.met.RestartedMode(string(mode))
	if a.d.Ledger != nil {
		a.d.Ledger.Restarted(ctx, string(mode))
	}
}
