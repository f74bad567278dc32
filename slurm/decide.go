package slurm

import (
	"fmt"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// Outcome is what one job of a chain amounted to.
type Outcome string

// Outcomes. Finished and NoRestart end the chain; Success, Walltime and
// Preempted continue it and reset the consecutive-failure count; Failure
// continues it and counts. Relocated, Skipped and NeverRan are jobs that did
// not train (they neither count nor reset).
const (
	Finished  Outcome = "finished"   // the finished flag exists
	NoRestart Outcome = "no_restart" // a launcher's verdict (or exit 93) said do not restart
	Success   Outcome = "success"    // the job script exited 0 without the flag (training stopped by itself)
	Walltime  Outcome = "walltime"   // Slurm ended it at its time limit (TIMEOUT, DEADLINE)
	Preempted Outcome = "preempted"  // Slurm preempted it
	Failure   Outcome = "failure"    // FAILED, NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, CANCELLED, or a non-zero script exit
	Relocated Outcome = "relocated"  // landed on an excluded node; replaced by a job that excludes it
	Skipped   Outcome = "skipped"    // started after the chain had ended: did nothing
	NeverRan  Outcome = "never_ran"  // ended without running (cancelled while pending)
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
}

// Judgement is the decision about one job.
type Judgement struct {
	Outcome Outcome
	Reason  string
	// Defer: not enough is known yet (the end step of a job stopped by a
	// signal: Slurm's final state tells walltime from preemption from
	// cancellation); judge again from Slurm's record.
	Defer bool
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
	if f.Slurm.State == "" || !f.Slurm.Terminal() {
		// Judged by the job's own end step.
		switch {
		case f.ScriptRC == nil:
			return Judgement{Defer: true, Reason: "job script status unknown"}
		case *f.ScriptRC > 128 || anySignaled(f.Verdicts):
			return Judgement{Defer: true, Reason: fmt.Sprintf("job script stopped by a signal (status %d): Slurm's final state decides", *f.ScriptRC)}
		case *f.ScriptRC == 0:
			return Judgement{Outcome: Success, Reason: "job script exited 0 without the finished flag"}
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
		return Judgement{Outcome: Walltime, Reason: "Slurm: " + s.State + " (time limit)"}
	case "PREEMPTED":
		return Judgement{Outcome: Preempted, Reason: "Slurm: PREEMPTED"}
	}
	if f.ScriptRC != nil && *f.ScriptRC == 0 {
		return Judgement{Outcome: Success, Reason: "job script exited 0 without the finished flag"}
	}
	if s.State == "COMPLETED" {
		return Judgement{Outcome: Success, Reason: "Slurm: COMPLETED without the finished flag"}
	}
	return Judgement{Outcome: Failure, Reason: fmt.Sprintf("Slurm: %s %d:%d%s", s.State, s.ExitCode, s.Signal, verdictNote(f.Verdicts))}
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
// Resets whether it resets the consecutive-failure count.
func (o Outcome) Counts() bool { return o == Failure }

// Resets reports whether the job made progress: it trained until it stopped
// by itself or until the scheduler stopped it (walltime, preemption).
func (o Outcome) Resets() bool { return o == Success || o == Walltime || o == Preempted }

// Ran reports whether the job trained at all (jobs that did not are left out
// of the failure count and of _job_results).
func (o Outcome) Ran() bool { return o != Relocated && o != Skipped && o != NeverRan && o != "" }
