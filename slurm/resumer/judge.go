package resumer

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// judgeFromSlurm judges job from Slurm's record if Slurm is done with it.
func (r *Resumer) judgeFromSlurm(ctx context.Context, st *State, job *ChainJob, by string) {
	rec, err := r.Sched.Job(ctx, job.ID)
	// A predecessor that Slurm is still cleaning up (COMPLETING: its
	// processes being killed) ends within KillWait; wait for its final
	// state, bounded, rather than start this job without judging it.
	for deadline := time.Now().Add(30 * time.Second); err == nil && rec.State == "COMPLETING" && time.Now().Before(deadline); {
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		rec, err = r.Sched.Job(ctx, job.ID)
	}
	if err != nil || !rec.Terminal() {
		return
	}
	job.Slurm = &rec
	r.judge(ctx, st, job, rec, by)
}

func (r *Resumer) judge(ctx context.Context, st *State, job *ChainJob, rec Job, by string) {
	f, sums := r.facts(ctx, st, job, rec)
	job.Verdicts = sums
	j := Judge(f)
	if j.Defer { // cannot happen with a terminal record; be safe
		j = Judgement{Outcome: Failure, Reason: j.Reason}
	}
	r.apply(ctx, st, job, j, f.Verdicts, by)
}

// facts gathers what is known about job: its launchers' verdicts
// (jobs/<id>/verdict*.json), the finished flag (only if no later job
// began: a later job may have made it), the script status and rec.
func (r *Resumer) facts(ctx context.Context, st *State, job *ChainJob, rec Job) (Facts, []VerdictSummary) {
	f := Facts{ScriptRC: job.ScriptRC, Slurm: rec, NoRestartCode: st.Settings.NoRestartCode, Began: !job.Began.IsZero(),
		CancelledByChain: job.CancelledByChain}
	dir := filepath.Join(st.Dir, JobsDir, job.ID)
	f.Warning = readWarning(dir)
	job.Warning = f.Warning
	var sums []VerdictSummary
	nvs := readVerdicts(dir)
	name := r.slurmNames(ctx, job, nvs)
	for _, nv := range nvs {
		// Reasons, summaries and status name nodes as Slurm does (fake
		// or containerised nodes share one host name; launchers see
		// addresses): the judgement reads v with its hosts renamed.
		v := nv.v
		node := name(v.Hostname, v.Node)
		sums = append(sums, VerdictSummary{File: filepath.Base(nv.file), Hostname: v.Hostname, Node: node, Kind: string(v.Kind), ExitCode: v.ExitCode, Reason: v.Reason})
		v.Hostname = node
		v.Quarantined = slices.Clone(v.Quarantined)
		for i := range v.Quarantined {
			v.Quarantined[i].Host = name(v.Quarantined[i].Host, v.Quarantined[i].Node)
		}
		v.Ledger = slices.Clone(v.Ledger)
		for i := range v.Ledger {
			v.Ledger[i].Host = name(v.Ledger[i].Host, v.Ledger[i].Node)
		}
		f.Verdicts = append(f.Verdicts, v)
	}
	later := false
	seen := false
	for _, j := range st.Jobs {
		if j == job {
			seen = true
		} else if seen && !j.Began.IsZero() && j.Outcome != Skipped && j.Outcome != Relocated && j.Outcome != Refused {
			later = true
		}
	}
	if _, err := os.Stat(st.Settings.FinishedFlag); err == nil && !later {
		f.FlagPresent = true
	}
	f.Progress = progressEvidence(st, job, f.Verdicts)
	f.FinishedFlag = st.Settings.FinishedFlag
	for _, p := range st.Jobs {
		if p == job {
			break
		}
		if p.Outcome.Ran() {
			f.PrevSuccess = ""
			if p.Outcome == Success {
				f.PrevSuccess = "job " + p.ID + ": " + p.Reason
			}
		}
	}
	summarize(job, f.Verdicts)
	return f, sums
}

// apply records a judgement and acts on it: counts, exclusions, the chain's
// status, and the pending successor (its exclusions, or its cancellation).
func (r *Resumer) apply(ctx context.Context, st *State, job *ChainJob, j Judgement, vs []verdict.Verdict, by string) {
	job.Outcome, job.Reason, job.Decided, job.DecidedBy = j.Outcome, j.Reason, r.now(), by
	job.Progress = progressSummary(j)
	wasActive := st.Status == Active
	switch {
	case !wasActive:
		// A job ending after the chain ended (cancelled by ft-resumer
		// cancel, or skipped) changes nothing.
	case j.Outcome == Finished:
		st.Status, st.Ended = Done, r.now()
	case j.Outcome == NoRestart:
		r.stop(ctx, st, StopNoRestart, fmt.Sprintf("job %s: %s", job.ID, j.Reason))
	case j.Outcome.Counts():
		st.Failures++
		st.Total++
		job.Counted = true
		if j.Complete {
			r.stop(ctx, st, StopCompleteNoFlag, fmt.Sprintf("job %s: %s", job.ID, j.Reason))
		} else if why, ok := deterministic(st, job); ok && j.Outcome == Failure {
			r.stop(ctx, st, StopDeterministic, "deterministic failure: "+why)
		} else if st.Failures > st.Settings.MaxSubsequentFailures {
			r.stop(ctx, st, StopFailures, fmt.Sprintf("%d consecutive failed jobs (max_subsequent_job_failures=%d); last: job %s: %s",
				st.Failures, st.Settings.MaxSubsequentFailures, job.ID, j.Reason))
		}
	case j.Outcome.Resets() && j.Progressed:
		st.Failures = 0
	}
	if st.Status == Active && job.Outcome.Ran() {
		r.addExclusions(ctx, st, job, vs)
		_ = r.checkCapacity(ctx, st, job)
	}
	if max := st.Settings.MaxJobs; st.Status == Active && max > 0 && st.trainingJobs() >= max && !undecidedBesides(st, job) {
		// The last job --max-jobs allows ended unfinished, and its begin
		// step submitted no successor: say so now, not at the next
		// ft-resumer command.
		r.stop(ctx, st, StopMaxJobs, fmt.Sprintf("%d jobs trained, the most --max-jobs allows (%d); last: job %s: %s", st.trainingJobs(), max, job.ID, j.Reason))
	}
	switch st.Status {
	case Done:
		job.Decision = "done"
	case Stopped:
		job.Decision = "stop"
	default:
		job.Decision = "continue"
	}
	r.logf("job %s: %s (%s) -> %s [decided by %s; consecutive failures %d/%d]", job.ID, job.Outcome, job.Reason, job.Decision, by, st.Failures, st.Settings.MaxSubsequentFailures)
	if st.Status != Active {
		_ = r.cancelLive(ctx, st, job, false)
		return
	}
	r.pushExclusions(ctx, st, job)
}

func (r *Resumer) stop(ctx context.Context, st *State, kind, reason string) {
	if st.Status != Active {
		return
	}
	st.Status, st.StopKind, st.StopReason, st.Ended = Stopped, kind, reason, r.now()
	r.logf("chain stopped: %s", reason)
}

// undecidedBesides reports whether a job of the chain other than job has
// no outcome yet (it is pending or running).
func undecidedBesides(st *State, job *ChainJob) bool {
	for _, p := range st.Jobs {
		if p != job && p.Outcome == "" {
			return true
		}
	}
	return false
}

func progressSummary(j Judgement) string {
	switch {
	case j.Outcome == NoProgress:
		return "none"
	case j.Outcome.Resets() && j.Progressed:
		return "yes"
	case j.Outcome.Resets():
		return "none"
	}
	return ""
}

// cancelLive cancels the chain's jobs that have not begun (and, with
// running, those that have), except keep.
func (r *Resumer) cancelLive(ctx context.Context, st *State, keep *ChainJob, running bool) error {
	var ids []string
	for _, p := range st.Jobs {
		if p == keep || p.Outcome != "" || (p.Slurm != nil && p.Slurm.Terminal()) {
			continue
		}
		if !p.Began.IsZero() && !running {
			continue
		}
		ids = append(ids, p.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	r.logf("cancelling job(s) %s", strings.Join(ids, ","))
	return r.Sched.Cancel(ctx, ids...)
}
