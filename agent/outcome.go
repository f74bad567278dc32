package agent

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Outcome is why the node agent stopped: the typed result of Run.
type Outcome struct {
	Kind   verdict.Kind
	Reason string
	// Code is the exit code recorded by the rendezvous when the job was
	// closed with one (a ShutdownWorkload's no-restart code, a job failed
	// elsewhere); ExitCode uses it for those kinds.
	Code         int
	RestartsUsed int
	MaxRestarts  int
	LastRound    int // -1 when no round was assigned
	// Signal is the signal that stopped the launcher (Kind Signaled).
	Signal os.Signal
	// RanksClean is true when every rank stopped by a signal exited 0.
	RanksClean   bool
	Quarantined  []verdict.Quarantine
	FinishedFlag verdict.FinishedFlag
	Cycles       []verdict.Cycle // the newest (at most 64)
	CyclesTotal  int             // every cycle this node ran
	// Ledger is this node's leases and the peers' leases it ended.
	Ledger []ledger.Record
	// Progress is what the ranks reported over the run (nil: no rank
	// connected to its monitor); RankFailures the newest rank failures.
	Progress     *verdict.Progress
	RankFailures []verdict.RankFailure
	// FailingNode: this node's ranks kept failing in ways that point at
	// it (failingnode.go).
	FailingNode *verdict.FailingNode
	StartedAt   time.Time
	EndedAt     time.Time
}

// Finished reports whether training is over: the ranks succeeded and the
// finished flag (FAULT_TOL_FINISHED_FLAG_FILE) exists.
func (o Outcome) Finished() bool {
	return o.Kind == verdict.Succeeded && o.FinishedFlag.Present
}

// ExitCode is the one mapping from an outcome to the launcher's exit code;
// the codes are torchrun's and nvrx's: 0 success, 1 failure, the
// no-restart code (93 by default) when the workload must not be restarted.
func (o Outcome) ExitCode() int {
	switch o.Kind {
	case verdict.Succeeded:
		return configs.ExitSuccess
	case verdict.NoRestart:
		if o.Code > 0 {
			return o.Code
		}
		return verdict.DefaultNoRestartExitCode
	case verdict.NodeReplaced:
		// The job went on without this node: its own part ended, with the
		// job's code when it waited for the job's end (0 when it did not).
		return o.Code
	case verdict.Signaled, verdict.Walltime:
		if o.RanksClean {
			return configs.ExitSuccess
		}
		return configs.ExitFailure
	}
	return configs.ExitFailure
}

// Verdict is the record written for this outcome.
func (o Outcome) Verdict(runID, node, host string) verdict.Verdict {
	v := verdict.Verdict{Kind: o.Kind, ExitCode: o.ExitCode(), Reason: o.Reason, Finished: o.Finished(),
		FinishedFlag: o.FinishedFlag, RunID: runID, Node: node, Hostname: host, PID: os.Getpid(),
		RestartsUsed: o.RestartsUsed, MaxRestarts: o.MaxRestarts, LastRound: o.LastRound,
		Quarantined: o.Quarantined, Cycles: o.Cycles, CyclesTotal: o.CyclesTotal, Ledger: o.Ledger, StartedAt: o.StartedAt, EndedAt: o.EndedAt,
		Progress: o.Progress, RankFailures: o.RankFailures, FailingNode: o.FailingNode}
	if o.Signal != nil {
		v.Signal = sigName(o.Signal)
	}
	return v
}

// runState is what the state handlers share during one Run.
type runState struct {
	hinted       map[eventlog.HintCause]bool // failure hints given (hintFailures), by cause
	started      time.Time
	asg          rendezvous.Assignment
	lastRound    int
	restartsUsed int
	maxRestarts  int
	group        RankGroup
	att          *ranklogs.Attempt
	end          cycleEnd
	cycle        cycleTiming
	cycles       []verdict.Cycle
	cyclesTotal  int
	pendingReq   *monitor.WorkloadRequest
	hangs        int          // hang verdicts on this node in this job
	stacksSaved  map[int]bool // rounds whose hang stacks were written (recordStacks)
	isSpare      bool         // parked as a spare (a Spare lease is open)
	fillerOn     bool         // the spare's filler was started
	swap         *swapTiming  // a promotion being timed until the ranks run
	// pendingSignal is a signal taken while stopping ranks for a restart.
	pendingSignal os.Signal
	// walltime is the pre-walltime warning signal, once received, and
	// walltimeAt when it last was forwarded.
	walltime    os.Signal
	walltimeAt  time.Time
	quarantined []verdict.Quarantine
	// rankFailures are this node's rank failures, the newest
	// verdict.MaxRankFailures (recordRankFailure).
	rankFailures []verdict.RankFailure
	// failingNode is set once this node's ranks keep failing in ways that
	// point at it (failingnode.go).
	failingNode *verdict.FailingNode
	outcome     *Outcome
	// restartAt is when the next round may start after a restart that
	// spent the budget (--restart-delay); zero: at once.
	restartAt time.Time

	// ip is the in-process restart (inprocess.go): its survivors, the
	// restart it follows, what the cycle's verdict record says of it.
	ip inProcess
}

// maxCycles is how many of the newest cycles the outcome keeps (the verdict
// says how many there were in all).
const maxCycles = 64

// cycleTiming are the instants of one cycle's phases.
type cycleTiming struct {
	round                              int
	start, joined, spawnStart, spawned time.Time
	stopStart, stopped                 time.Time
	reclaim                            time.Duration // taking the node back from its filler
	detection                          time.Duration // the previous round's node loss, as its detector timed it
}

func newRunState(now time.Time, maxRestarts int) runState {
	return runState{started: now, lastRound: -1, maxRestarts: maxRestarts}
}

func (r *runState) setOutcome(kind verdict.Kind, reason string) {
	if r.outcome != nil {
		return // the first decided outcome stands
	}
	r.outcome = &Outcome{Kind: kind, Reason: reason}
}

// closedBy records a job closed by the rendezvous; a record without a kind
// (written by an older launcher) is read from its code.
func (r *runState) closedBy(kind verdict.Kind, code int, reason string) {
	if kind == "" || !kind.Valid() {
		kind = verdict.CloseKindOf(code)
	}
	r.setOutcome(kind, reason)
	if r.outcome.Kind == verdict.NoRestart || r.outcome.Kind == verdict.NodeReplaced {
		r.outcome.Code = code
	}
}

func (r *runState) signaled(sig os.Signal, ranksClean bool) {
	reason := "stopped by a signal"
	if sig != nil {
		reason = "stopped by " + sigName(sig)
	}
	kind := verdict.Signaled
	if r.walltime != nil {
		// The scheduler warned of its time limit, then stopped us.
		kind = verdict.Walltime
		reason += " after the pre-walltime signal " + sigName(r.walltime)
	}
	r.setOutcome(kind, reason)
	r.outcome.Signal, r.outcome.RanksClean = sig, ranksClean
}

// walltimeEnded records a job ended by its time limit.
func (r *runState) walltimeEnded(reason string, ranksClean bool) {
	r.setOutcome(verdict.Walltime, reason)
	r.outcome.Signal, r.outcome.RanksClean = r.walltime, ranksClean
}

// quarantine records a node the job stopped using, once per node.
func (r *runState) quarantine(node, host string, ev verdict.Evidence, detail string, round int) {
	if node == "" {
		return
	}
	for _, q := range r.quarantined {
		if q.Node == node {
			return
		}
	}
	r.quarantined = append(r.quarantined, verdict.Quarantine{Node: node, Host: host, Evidence: ev,
		Detail: detail, Round: round, At: time.Now().UTC()})
}

// finishCycle records the timing of the cycle that just ended.
func (r *runState) finishCycle(end cycleEnd) {
	c := r.cycle
	ms := func(from, to time.Time) float64 {
		if from.IsZero() || to.IsZero() {
			return 0
		}
		return float64(to.Sub(from).Microseconds()) / 1000
	}
	r.cyclesTotal++
	if len(r.cycles) == maxCycles {
		// Keep the newest: a long job restarts thousands of times, and the
		// verdict (and this process) must not grow with it.
		copy(r.cycles, r.cycles[1:])
		r.cycles = r.cycles[:maxCycles-1]
	}
	r.cycles = append(r.cycles, verdict.Cycle{Round: c.round, DetectionMS: float64(c.detection.Microseconds()) / 1000,
		RendezvousMS:    ms(c.start, c.joined),
		FillerReclaimMS: float64(c.reclaim.Microseconds()) / 1000,
		SpawnMS:         ms(c.spawnStart, c.spawned), RunMS: ms(c.spawned, c.stopStart), StopMS: ms(c.stopStart, c.stopped),
		End: cycleEndName(end), Reason: end.reason, StartedAt: c.start.UTC()})
	r.ip.recordCycle(&r.cycles[len(r.cycles)-1])
}

func cycleEndName(end cycleEnd) string {
	if end.kind == endRankFailure && end.hang {
		return "hang"
	}
	return end.kind.String()
}

// finish completes the outcome with what every outcome carries and
// records it in the event log.
func (a *Agent) finish() Outcome {
	r := &a.run
	if r.outcome == nil {
		r.setOutcome(verdict.FatalError, "internal error: the agent ended without an outcome")
	}
	o := *r.outcome
	o.RestartsUsed, o.MaxRestarts, o.LastRound = r.restartsUsed, r.maxRestarts, r.lastRound
	o.Quarantined, o.Cycles, o.CyclesTotal = r.quarantined, r.cycles, r.cyclesTotal
	o.RankFailures, o.FailingNode = r.rankFailures, r.failingNode
	if p, ok := a.d.Monitors.(progressReporter); ok {
		o.Progress = p.Progress()
	}
	o.StartedAt, o.EndedAt = r.started.UTC(), time.Now().UTC()
	o.FinishedFlag = finishedFlag(a.envValue("FAULT_TOL_FINISHED_FLAG_FILE"))
	if o.Kind == verdict.Walltime && o.RanksClean && o.FinishedFlag.Present {
		// The training reached its end as the time limit came.
		o.Kind = verdict.Succeeded
	}
	a.closeLedger(&o)
	if o.Finished() {
		a.log.Info("training finished: finished flag present", "flag", o.FinishedFlag.Path)
		a.ev.Emit(eventlog.TrainingFinishedEvent{Round: o.LastRound, Flag: o.FinishedFlag.Path})
	}
	a.ev.Emit(eventlog.VerdictEvent{VerdictKind: o.Kind, ExitCode: o.ExitCode(), Reason: o.Reason,
		RestartsUsed: o.RestartsUsed, LastRound: o.LastRound, Finished: o.Finished(), Quarantined: len(o.Quarantined)})
	return o
}

// progressReporter is the part of *monitor.Manager that reports what the
// ranks did, for the verdict's progress and rank failures.
type progressReporter interface {
	Progress() *verdict.Progress
	RankCycle(localRank int) (steps int64, iteration *int64)
}

// recordRankFailure records local rank e's failure for the verdict, with
// how far the rank had come in this cycle (its monitor's count).
func (a *Agent) recordRankFailure(e spawn.Exit, hang bool) {
	asg := a.run.asg
	f := verdict.RankFailure{Round: asg.Round, Rank: asg.RankBase + e.LocalRank, LocalRank: e.LocalRank,
		Kind: verdict.FailureCrash, At: e.At.UTC()}
	if e.Signal != 0 {
		f.Signal = sigName(e.Signal)
	} else {
		f.ExitCode = e.Code
	}
	if hang {
		f.Kind, f.ExitCode = verdict.FailureHang, 0
	}
	if p, ok := a.d.Monitors.(progressReporter); ok {
		f.Steps, f.Iteration = p.RankCycle(e.LocalRank)
	}
	r := &a.run
	if len(r.rankFailures) == verdict.MaxRankFailures {
		copy(r.rankFailures, r.rankFailures[1:])
		r.rankFailures = r.rankFailures[:verdict.MaxRankFailures-1]
	}
	r.rankFailures = append(r.rankFailures, f)
}

// finishedFlag reads the state of the finished flag file.
func finishedFlag(path string) verdict.FinishedFlag {
	if path == "" {
		return verdict.FinishedFlag{}
	}
	_, err := os.Stat(path)
	return verdict.FinishedFlag{Path: path, Present: err == nil}
}

// delayNextRound makes the next round wait d after a restart that spent
// the budget (--restart-delay; 0: at once).
func (r *runState) delayNextRound(d time.Duration) {
	r.restartAt = time.Time{}
	if d > 0 {
		r.restartAt = time.Now().Add(d)
	}
}

// waitRestartDelay waits, before joining the next round, for the restart
// delay a decision set (delayNextRound); ctx ends the wait (a signal).
func (r *runState) waitRestartDelay(ctx context.Context, log *slog.Logger) error {
	wait := time.Until(r.restartAt)
	r.restartAt = time.Time{}
	if wait <= 0 {
		return nil
	}
	log.Info("waiting before the next round (--restart-delay)", "wait", wait.Round(time.Millisecond))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
