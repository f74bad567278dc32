package resumer

import (
	"fmt"
	"strings"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// Outcome is what one job of a chain amounted to.
type Outcome string

// Outcomes. Finished and NoRestart end the chain; Success, Walltime and
// Preempted continue it and reset the consecutive-failure count when the
// job made progress; Failure and NoProgress continue it and count.
// Cancelled (by ft-resumer cancel) neither counts nor resets. Relocated,
// Skipped, NeverRan and Refused are jobs that did not train (they neither count nor
// reset).
const (
	Finished   Outcome = "finished"    // the finished flag exists
	NoRestart  Outcome = "no_restart"  // a launcher's verdict (or exit 93) said do not restart
	Success    Outcome = "success"     // the job script exited 0 without the flag, with evidence of progress (training stopped by itself)
	NoProgress Outcome = "no_progress" // the job script exited 0 without the flag and without any evidence of progress
	Walltime   Outcome = "walltime"    // Slurm ended it at its time limit (TIMEOUT, DEADLINE), or it ended after Slurm's warning signal
	Preempted  Outcome = "preempted"   // Slurm preempted it
	Failure    Outcome = "failure"     // FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, CANCELLED, or a non-zero script exit
	Cancelled  Outcome = "cancelled"   // cancelled by ft-resumer cancel (the chain was stopped on purpose)
	Relocated  Outcome = "relocated"   // landed on an excluded node; replaced by a job that excludes it
	Skipped    Outcome = "skipped"     // started after the chain had ended: did nothing
	NeverRan   Outcome = "never_ran"   // ended without running (cancelled while pending)
	Refused    Outcome = "refused"     // did not train: another job of the chain held the training claim
)

// Unknown is the state recorded for a job no Slurm source knows any more
// (purged after MinJobAge with no accounting).
const Unknown = "UNKNOWN"

// Facts are what is known about a job when it is judged.
type Facts struct {
	// ScriptRC is the exit status of the user's job script, as the job's
	// end step saw it (nil when that step did not run: the job was killed).
	ScriptRC *int
	// Slurm is Slurm's final record (State "" while the job still runs:
	// the end step judges before Slurm has a final state).
	Slurm Job
	// Verdicts are the launchers' verdict files of the job.
	Verdicts []verdict.Verdict
	// FlagPresent: the finished flag exists now.
	FlagPresent bool
	// NoRestartCode is the launcher's no-restart exit code (93).
	NoRestartCode int
	// Began: the job's begin step ran (the user's script may have run).
	Began bool
	// Warning is the first of Slurm's warning signals (--signal=B:SIG@N)
	// the job's batch shell received ("USR1", "USR2", "TERM"; "" none), as
	// the generated wrapper recorded it.
	Warning string
	// Progress is the evidence that the job's training advanced.
	Progress Evidence
	// CancelledByChain: ft-resumer cancel cancelled this job.
	CancelledByChain bool
	// PrevSuccess describes the previous job that trained when it exited
	// 0 with evidence of progress (the training stopped by itself); ""
	// otherwise.
	PrevSuccess string
	// FinishedFlag is the flag's path, for the messages.
	FinishedFlag string
}

// Evidence is what is known about a job's progress: from its launchers'
// verdicts (steps, checkpoints, heartbeats the rank monitors counted) and
// from the chain's --progress-path files (a checkpoint written during the
// job).
type Evidence struct {
	// Known: some source could have shown progress (a verdict with a
	// progress record, or a --progress-path setting). When nothing could,
	// a job's progress is unknown, not absent.
	Known bool
	// Reported: a launcher's verdict carried a progress record: the ranks
	// talk to their monitors (they are instrumented). LastIteration is the
	// highest iteration they reported (nil: none).
	Reported      bool
	LastIteration *int64
	// Advanced: a source showed progress; Detail says which.
	Advanced bool
	Detail   string
}

// Judgement is the decision about one job.
type Judgement struct {
	Outcome Outcome
	Reason  string
	// Defer: not enough is known yet (the end step of a job stopped by a
	// signal: Slurm's final state tells walltime from preemption from
	// cancellation); judge again from Slurm's record.
	Defer bool
	// Progressed: the outcome may reset the consecutive-failure count
	// (Success, and Walltime or Preempted unless the evidence shows that
	// the job did not advance).
	Progressed bool // Complete: the job exited 0 without progress where the training
	// looks complete (the previous job stopped by itself after training,
	// or the ranks resumed at an iteration and made no step) but the
	// finished flag is missing: the chain stops rather than run more jobs
	// that would do the same.
	Complete bool
}

// Judge classifies a job from facts, never from an exit code alone. The
// order matters: the finished flag wins over everything (training is done
// even if teardown failed), then a no-restart verdict (srun may have turned
// 93 into 143), then Slurm's record of why the job ended, then the script's
// exit status.
func Judge(f Facts) Judgement {
	code := f.NoRestartCode
	if code == 0 {
		code = verdict.DefaultNoRestartExitCode
	}
	if !f.Began && (f.Slurm.State == "CANCELLED" || f.Slurm.State == Unknown) {
		// Cancelled before its begin step: a successor Slurm removed
		// (kill-on-invalid-dep) or one cancelled by hand while pending.
		return Judgement{Outcome: NeverRan, Reason: "Slurm: CANCELLED before it began (reason " + f.Slurm.Reason + ")"}
	}
	if f.FlagPresent {
		return Judgement{Outcome: Finished, Reason: "finished flag present"}
	}
	for _, v := range f.Verdicts {
		if v.Kind == verdict.NoRestart {
			return Judgement{Outcome: NoRestart, Reason: fmt.Sprintf("verdict no_restart on %s: %s", v.Hostname, v.Reason)}
		}
	}
	if f.ScriptRC != nil && *f.ScriptRC == code {
		return Judgement{Outcome: NoRestart, Reason: fmt.Sprintf("job script exited %d (no restart)", code)}
	}
	warn := warningNote(f)
	if f.Slurm.State == "" || !f.Slurm.Terminal() {
		// Judged by the job's own end step.
		switch {
		case warn != "" && f.Warning != "TERM":
			// USR1/USR2 come only from --signal (or a deliberate scancel
			// -s): the job ended because its time was running out.
			return walltime(f, warn)
		case f.ScriptRC == nil:
			return Judgement{Defer: true, Reason: "job script status unknown"}
		case *f.ScriptRC > 128 || anySignaled(f.Verdicts) || f.Warning == "TERM":
			// A TERM may be --signal=B:TERM@N, Slurm's time limit, a
			// preemption or scancel: only Slurm's final state tells.
			return Judgement{Defer: true, Reason: fmt.Sprintf("job script stopped by a signal (status %d): Slurm's final state decides", *f.ScriptRC)}
		case *f.ScriptRC == 0:
			return exitZero(f, "job script exited 0 without the finished flag")
		default:
			return Judgement{Outcome: Failure, Reason: fmt.Sprintf("job script exited %d%s", *f.ScriptRC, verdictNote(f.Verdicts))}
		}
	}
	s := f.Slurm
	if s.ExitCode == code && s.Signal == 0 {
		return Judgement{Outcome: NoRestart, Reason: fmt.Sprintf("Slurm: %s exit %d (no restart)", s.State, code)}
	}
	switch s.State {
	case "TIMEOUT", "DEADLINE":
		j := walltime(f, "")
		j.Reason = "Slurm: " + s.State + " (time limit)" + progressNote(f.Progress)
		return j
	case "PREEMPTED":
		return Judgement{Outcome: Preempted, Reason: "Slurm: PREEMPTED" + progressNote(f.Progress), Progressed: !(f.Progress.Known && !f.Progress.Advanced)}
	case "CANCELLED":
		if f.CancelledByChain {
			return Judgement{Outcome: Cancelled, Reason: "cancelled by ft-resumer cancel"}
		}
	}
	if warn != "" && (s.State == "FAILED" || s.State == "COMPLETED") {
		// Ended by itself before its time limit, after the warning: the
		// ranks saved and stopped (the wrapper's status). A warning does
		// not excuse what Slurm did to the job (CANCELLED, NODE_FAIL,
		// OUT_OF_MEMORY): those are judged as without it.
		return walltime(f, warn)
	}
	if f.ScriptRC != nil && *f.ScriptRC == 0 {
		return exitZero(f, "job script exited 0 without the finished flag")
	}
	if s.State == "COMPLETED" {
		return exitZero(f, "Slurm: COMPLETED without the finished flag")
	}
	return Judgement{Outcome: Failure, Reason: fmt.Sprintf("Slurm: %s %d:%d%s", s.State, s.ExitCode, s.Signal, verdictNote(f.Verdicts))}
}

// exitZero judges a job that ended well without the finished flag: it made
// progress only on evidence (a verdict's steps or checkpoints, a new file
// under --progress-path), else it is no_progress, which counts: a script
// that never trains (a typo'd config, `srun ... || true`) must not loop
// the chain. A job without progress where the training looks complete (the
// previous job stopped by itself after training, or the ranks resumed at
// an iteration and made no step) is told apart: the flag is what is
// missing, and more jobs would only do the same (Complete).
func exitZero(f Facts, why string) Judgement {
	if f.Progress.Advanced {
		return Judgement{Outcome: Success, Reason: why + "; progress: " + f.Progress.Detail, Progressed: true}
	}
	flag := "FAULT_TOL_FINISHED_FLAG_FILE"
	if f.FinishedFlag != "" {
		flag += " (" + f.FinishedFlag + ")"
	}
	var seems []string
	if f.PrevSuccess != "" {
		seems = append(seems, "the previous job stopped by itself after training ("+f.PrevSuccess+")")
	}
	if f.Progress.Reported && f.Progress.LastIteration != nil {
		seems = append(seems, fmt.Sprintf("the ranks resumed at iteration %d and made no step", *f.Progress.LastIteration))
	}
	if len(seems) > 0 {
		return Judgement{Outcome: NoProgress, Complete: true, Reason: why + ": the training seems complete but wrote no finished flag (" +
			strings.Join(seems, "; ") + "; this job: " + f.Progress.Detail + "); make the training create " + flag +
			" when it is done (or, if it is not done, find why it exits 0 without training); the chain stops rather than run more jobs that would do the same"}
	}
	how := "no launcher verdict reported a training step, checkpoint or heartbeat"
	if f.Progress.Detail != "" {
		how = f.Progress.Detail
	}
	hint := "; instrument the ranks or pass --progress-path, docs/slurm.md \"Progress\""
	if f.Progress.Reported {
		hint = ": the ranks report to their monitors but made no step"
	}
	return Judgement{Outcome: NoProgress, Reason: why + " and without evidence of progress (" + how + hint + ")"}
}

// walltime judges a job that ended by its time limit or after the warning
// signal: never a failure; it resets the count unless the evidence shows
// that the job did not advance.
func walltime(f Facts, warn string) Judgement {
	reason := "ended after " + warn + " (walltime-like: not a failure)"
	if warn == "" {
		reason = "time limit"
	}
	return Judgement{Outcome: Walltime, Reason: reason + progressNote(f.Progress), Progressed: !(f.Progress.Known && !f.Progress.Advanced)}
}

// warningNote names the warning the job got: the batch shell's (the
// wrapper's record) or the launchers' (a walltime verdict).
func warningNote(f Facts) string {
	if f.Warning != "" {
		return "Slurm's warning signal SIG" + f.Warning + " to the batch shell (--signal=B:" + f.Warning + "@N)"
	}
	for _, v := range f.Verdicts {
		if v.Kind == verdict.Walltime {
			return "Slurm's warning signal to the launcher on " + v.Hostname + " (--signal=SIG@N; its verdict: " + v.Reason + ")"
		}
	}
	return ""
}

func progressNote(e Evidence) string {
	if e.Known && !e.Advanced {
		return "; no evidence of progress (" + e.Detail + "): the failure count is not reset"
	}
	return ""
}

func anySignaled(vs []verdict.Verdict) bool {
	for _, v := range vs {
		if v.Kind == verdict.Signaled {
			return true
		}
	}
	return false
}

func verdictNote(vs []verdict.Verdict) string {
	for _, v := range vs {
		if v.Kind != verdict.Succeeded {
			return fmt.Sprintf("; verdict %s: %s", v.Kind, v.Reason)
		}
	}
	return ""
}

// Counts reports whether the outcome consumes the failure budget, and
// Resets whether it may reset the consecutive-failure count.
func (o Outcome) Counts() bool { return o == Failure || o == NoProgress }

// Resets reports whether the job may have made progress: it trained until it
// stopped by itself or until the scheduler stopped it (walltime,
// preemption); Judgement.Progressed says whether it did.
func (o Outcome) Resets() bool { return o == Success || o == Walltime || o == Preempted }

// Ran reports whether the job trained at all (jobs that did not are left out
// of the failure count and of _job_results).
func (o Outcome) Ran() bool {
	return o != Relocated && o != Skipped && o != NeverRan && o != Refused && o != ""
}
