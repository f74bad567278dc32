package policy

import "time"

// The node's decisions. Decide (policy.go) is the job's: whether the job
// restarts, swaps a spare or closes, and what that spends; the rendezvous
// applies it. The functions below are one node's: whether this node's
// surviving ranks stay in their processes for an in-process restart
// (Survivors), and whether repeated hangs take the node out of the job
// (QuarantineForHangs). The agent gathers the facts and applies the
// answers; neither asks the job's policy with facts it does not have.

// SurvivorsInput is what the node knows when one of its cycles ends with a
// failure that may restart, under --restart-mode in-process.
type SurvivorsInput struct {
	// InProcess: the job runs --restart-mode in-process and this node's
	// rank monitors can carry it (sessions, notices, reports).
	InProcess bool
	// NodeEnding: this node does not restart, whatever the job decides:
	// a signal came, a rank asked ExcludeThisNode or ShutdownWorkload,
	// or the pre-walltime warning was forwarded.
	NodeEnding bool
	// Failure is what ended the cycle; "" when it did not end by a
	// failure (success, a signal, a closed job, a fence): every rank
	// stops.
	Failure Failure
	// JobRestarts: the job has already decided to restart (another
	// node's failure ended the round with a restart), so the budget was
	// the job's to check. False: the failure is this node's own rank's
	// (RankCrash, RankHang), reported after this decision; a restart
	// that RestartsUsed and MaxRestarts do not allow closes the job, and
	// then nobody stays.
	JobRestarts  bool
	RestartsUsed int
	MaxRestarts  int
	// Window is the job's --restart-window: with one, the node does not
	// know which of the job's restarts still count, so it leaves the
	// budget to the job's decision (a close then stops the survivors).
	Window time.Duration
	// RoundEndReason is why the round ended, for the reason recorded when
	// the survivors of a JobRestarts stay.
	RoundEndReason string

	// The facts below are known once the failure has settled (the ranks
	// that died with it have exited).

	// AgentStore: the launcher serves the round's c10d store
	// (--agent-store). Without it rank 0 hosts the store, and a surviving
	// rank 0 could not bind it again: the full restart.
	AgentStore bool
	// Survivors is the number of this node's ranks still running.
	Survivors int
	// AllCapable: every survivor registered as able to restart in process
	// (ft_launcher_client's inprocess API).
	AllCapable bool
	// SurvivorSilent: at a hang, a survivor may be the hung rank or is
	// indistinguishable from it. In a job whose ranks wait on each
	// other in collectives, a hung rank's peers fall silent with it, so
	// heartbeats cannot tell the hung rank from the ranks waiting for it:
	// keeping a silent survivor could keep the hung rank, which then never
	// rejoins. Only a hang with every survivor recently heartbeating
	// keeps the survivors.
	SurvivorSilent bool
	// KeptIntoRound: survivors of an earlier failure were kept into this
	// round (an in-process restart brought this round's ranks up).
	KeptIntoRound bool
	// FirstStepsTaken: this node's part of the round's restart is over:
	// with KeptIntoRound, every survivor took its first step of the
	// round; otherwise it is the job's first round, or every rank of this
	// node took its first step. A failure before that comes during the
	// job's restart (the other nodes' survivors have not stepped either:
	// a step is collective), and escalates to the full restart.
	FirstStepsTaken bool
	// RejoinOverdue: a survivor of this round missed the rejoin bound
	// and was killed; that fallback is recorded already.
	RejoinOverdue bool
}

// SurvivorsDecision is the node's answer.
type SurvivorsDecision struct {
	// Stay: this node's survivors keep their processes and rejoin the
	// next round; only the failed ranks start afresh. False: every rank
	// of this node stops (and, if the job restarts, starts afresh).
	Stay bool
	// JobCloses: nothing restarts after this failure (the budget is
	// spent, a rank asked not to restart); the ranks stop with the job.
	JobCloses bool
	// During: the failure came during an in-process restart, which
	// escalates to the full restart.
	During bool
	// RecordFallback: During, the job restarts, and no earlier record
	// names the fallback: the node records one (failure_during).
	RecordFallback bool
	// Reason is the rule that decided; Why says how, and when Stay, it is
	// the reason the survivors' notice carries.
	Reason Reason
	Why    string
}

// The node's reasons (Survivors).
const (
	ReasonSurvivorsStay   Reason = "survivors_stay"            // the survivors keep their processes
	ReasonNotAFailure     Reason = "not_a_failure"             // the cycle did not end by a failure that restarts
	ReasonFullRestartMode Reason = "full_restart_mode"         // --restart-mode full, or monitors that cannot carry in-process
	ReasonNodeEnding      Reason = "node_ending"               // a signal, a rank's request, the walltime
	ReasonDuringInProcess Reason = "failure_during_in_process" // escalates to the full restart
	ReasonNotCapable      Reason = "survivor_not_capable"      // a survivor did not register for in-process restarts
	ReasonNoAgentStore    Reason = "no_agent_store"            // rank 0 hosts the c10d store and could not bind it again
	ReasonNoSurvivor      Reason = "no_survivor"               // no rank of this node survived
	ReasonSurvivorSilent  Reason = "survivor_silent"           // at a hang, a survivor was silent too
)

// SurvivorsReasons lists the node's reasons (tests, docs); a decision that
// closes the job carries the job's reason (ReasonNoRestartRequested,
// ReasonBudgetExhausted).
var SurvivorsReasons = []Reason{ReasonSurvivorsStay, ReasonNotAFailure, ReasonFullRestartMode, ReasonNodeEnding,
	ReasonDuringInProcess, ReasonNotCapable, ReasonNoAgentStore, ReasonNoSurvivor, ReasonSurvivorSilent}

// MaySurvive reports whether the survivors' question arises at all, from
// the facts known before the node counts its ranks: false means every
// rank stops at once, with no settle window (docs/inprocess.md, "One
// incident, one restart").
func MaySurvive(in SurvivorsInput) bool {
	return in.InProcess && !in.NodeEnding && in.Failure != ""
}

// Survivors decides whether this node's surviving ranks stay in their
// processes after a failure (--restart-mode in-process):
//
//   - nobody stays unless MaySurvive;
//   - nobody stays when the job closes: a no-restart request, or, for a
//     failure of this node's own ranks, a restart that the budget does
//     not allow (the job's decision, Decide, will close it);
//   - a failure during an in-process restart (a survivor kept into this
//     round, or this node's fresh ranks of a restart round, had not yet
//     taken the round's first step) escalates to the full restart;
//   - the survivors stay only when there is an agent store, at least one
//     survivor, and every survivor registered as in-process capable;
//   - after a hang, a silent survivor means the full restart
//     (SurvivorsInput.SurvivorSilent).
func Survivors(in SurvivorsInput) SurvivorsDecision {
	if !MaySurvive(in) {
		switch {
		case !in.InProcess:
			return SurvivorsDecision{Reason: ReasonFullRestartMode,
				Why: "no in-process restart here (--restart-mode full, or rank monitors that cannot carry one)"}
		case in.NodeEnding:
			return SurvivorsDecision{Reason: ReasonNodeEnding,
				Why: "this node does not restart (a signal, a rank's request, or the walltime)"}
		}
		return SurvivorsDecision{Reason: ReasonNotAFailure, Why: "the cycle did not end by a failure that restarts"}
	}
	capable := in.AgentStore && in.AllCapable && in.Survivors > 0
	d := SurvivorsDecision{During: in.KeptIntoRound && !in.FirstStepsTaken ||
		!in.KeptIntoRound && capable && !in.FirstStepsTaken}
	switch {
	case in.Failure == NoRestartRequest:
		d.JobCloses, d.Reason, d.Why = true, ReasonNoRestartRequested, "a rank asked not to restart the workload"
		return d
	case !in.JobRestarts && in.Window <= 0 && !budgetLeft(in.RestartsUsed, in.MaxRestarts):
		d.JobCloses, d.Reason, d.Why = true, ReasonBudgetExhausted, budgetExhausted(in.RestartsUsed, in.MaxRestarts)
		return d
	}
	d.RecordFallback = d.During && !in.RejoinOverdue
	if blocked, why := inProcessBlocked(in.Failure, d.During, capable, in.SurvivorSilent); blocked != "" {
		d.Reason, d.Why = blocked, "this node's ranks restart fully; "+why
		switch {
		case d.During:
		case !in.AgentStore:
			d.Reason = ReasonNoAgentStore
			d.Why += " (no agent store: rank 0 hosts the c10d store and could not bind it again)"
		case in.Survivors == 0:
			d.Reason = ReasonNoSurvivor
			d.Why += " (no rank of this node survived)"
		}
		return d
	}
	d.Stay, d.Reason = true, ReasonSurvivorsStay
	if in.JobRestarts {
		d.Why = "the round ended (" + in.RoundEndReason + "); this node's ranks restart in process"
	} else {
		d.Why = replacingFailed(in.Failure, in.RestartsUsed, in.MaxRestarts)
	}
	return d
}

// inProcessBlocked says why the survivors of a restart may not stay in
// their processes ("" when they may).
func inProcessBlocked(f Failure, during, capable, silent bool) (Reason, string) {
	switch {
	case during:
		return ReasonDuringInProcess, "a failure during an in-process restart escalates to the full restart"
	case !capable:
		return ReasonNotCapable, "not every survivor registered for an in-process restart: full restart"
	case f == RankHang && silent:
		return ReasonSurvivorSilent, "a survivor was silent too (waiting for the hung rank, or hung itself): full restart"
	}
	return "", ""
}

// HangQuarantineThreshold is the number of hang verdicts on one node
// within one job after which the node is declared bad and leaves,
// quarantined, so that a spare takes its place.
const HangQuarantineThreshold = 3

// QuarantineForHangs reports whether a node that has seen hangs hang
// verdicts in this job leaves it, quarantined: at the threshold, and only
// when the job can have spares (--nnodes MIN < MAX). Without spares the
// job restarts in place until its budget ends.
func QuarantineForHangs(hangs, minNodes, maxNodes int) bool {
	return hangs >= HangQuarantineThreshold && maxNodes > minNodes
}
