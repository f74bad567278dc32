package resumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// ExitContinue is the wrapper's exit status for a job whose script exited 0
// without finishing the training: non-zero, so that the pre-scheduled
// afternotok successor runs (75 is EX_TEMPFAIL).
const ExitContinue = 75

// Resumer runs a chain's steps: Start on the login node, Begin and End in
// each job around the user's script, Reconcile from any ft-resumer command.
// It holds no state between calls: every call locks the chain, reads
// chain.json, acts on Slurm, and writes chain.json back.
type Resumer struct {
	Dir   string
	Sched Scheduler
	Log   io.Writer              // decisions, one line each (nil: discarded)
	Now   func() time.Time       // nil: time.Now
	Exec  func() (string, error) // this binary, for the wrapper (nil: os.Executable)
}

func (r *Resumer) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *Resumer) logf(format string, a ...any) {
	if r.Log != nil {
		fmt.Fprintf(r.Log, "ft-resumer: "+format+"\n", a...)
	}
}

// withState runs f on the locked, loaded chain and saves it afterwards
// (also when f fails: what was done on Slurm must be recorded).
func (r *Resumer) withState(ctx context.Context, f func(*State) error) (*State, error) {
	if _, err := os.Stat(filepath.Join(r.Dir, StateFile)); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %s", ErrNoChain, r.Dir)
	}
	unlock, err := lockChain(ctx, r.Dir)
	if err != nil {
		return nil, err
	}
	defer unlock()
	st, err := LoadState(r.Dir)
	if err != nil {
		return nil, err
	}
	st.Dir = r.Dir
	ferr := f(st)
	if err := st.Save(); err != nil {
		return st, errors.Join(ferr, err)
	}
	if err := writeJobResults(st); err != nil {
		return st, errors.Join(ferr, err)
	}
	return st, ferr
}

// ErrFinishedAlready is returned by Start when the finished flag exists
// before the chain starts.
var ErrFinishedAlready = errors.New("slurm: the finished flag already exists")

// Start begins a chain in r.Dir with the user's batch script, or, when the
// directory already holds a chain, picks it up (created is false) without
// submitting anything: Reconcile then repairs what needs it.
func (r *Resumer) Start(ctx context.Context, script string, set Settings) (st *State, created bool, err error) {
	if err := os.MkdirAll(r.Dir, 0o755); err != nil {
		return nil, false, fmt.Errorf("slurm: chain dir: %w", err)
	}
	unlock, err := lockChain(ctx, r.Dir)
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if st, err := LoadState(r.Dir); err == nil {
		return st, false, nil
	} else if !errors.Is(err, ErrNoChain) {
		return nil, false, err
	}
	if set.FinishedFlag == "" {
		set.FinishedFlag = filepath.Join(r.Dir, "finished.flag")
	}
	if _, err := os.Stat(set.FinishedFlag); err == nil {
		return nil, false, fmt.Errorf("%w (%s): training is done; remove it to train again", ErrFinishedAlready, set.FinishedFlag)
	}
	if set.Resumer == "" {
		exe := r.Exec
		if exe == nil {
			exe = os.Executable
		}
		if set.Resumer, err = exe(); err != nil {
			return nil, false, fmt.Errorf("slurm: own path: %w", err)
		}
	}
	if set.JobResultsFormat == "" {
		set.JobResultsFormat = "nfl"
	}
	if set.NoRestartCode == 0 {
		set.NoRestartCode = verdict.DefaultNoRestartExitCode
	}
	body, err := os.ReadFile(script)
	if err != nil {
		return nil, false, fmt.Errorf("slurm: job script: %w", err)
	}
	if err := CheckScript(script, body); err != nil {
		return nil, false, err
	}
	st = &State{Dir: r.Dir, Settings: set, Status: Active, Created: r.now()}
	if err := os.WriteFile(filepath.Join(r.Dir, JobScriptFile), body, 0o755); err != nil {
		return nil, false, fmt.Errorf("slurm: job script copy: %w", err)
	}
	if err := os.WriteFile(filepath.Join(r.Dir, WrapperFile), []byte(Wrapper(string(body), r.Dir, set)), 0o755); err != nil {
		return nil, false, fmt.Errorf("slurm: wrapper: %w", err)
	}
	_, serr := r.submit(ctx, st, "", "start")
	if err := st.Save(); err != nil {
		return nil, false, errors.Join(serr, err)
	}
	if serr != nil {
		return st, true, serr
	}
	return st, true, writeJobResults(st)
}

// ErrBadScript is returned by Start for a batch script sbatch would refuse.
var ErrBadScript = errors.New("slurm: batch script refused")

// CheckScript refuses, before anything is submitted, a batch script that
// sbatch would refuse in every job of the chain: its first line must be an
// interpreter line ("#!/bin/bash"); the chain runs it as is, by its shebang.
func CheckScript(path string, body []byte) error {
	if !strings.HasPrefix(string(body), "#!") {
		first, _, _ := strings.Cut(string(body), "\n")
		if len(first) > 60 {
			first = first[:60] + "..."
		}
		return fmt.Errorf("%w: %s: the first line must be an interpreter line such as #!/bin/bash (sbatch refuses a script without one), not %q", ErrBadScript, path, first)
	}
	return nil
}

// submit submits the next job of the chain (after: afternotok dependency,
// "" for none) with the active exclusions, and records it.
func (r *Resumer) submit(ctx context.Context, st *State, after, by string) (*ChainJob, error) {
	if err := r.checkRate(ctx, st); err != nil {
		return nil, err
	}
	excl := st.ActiveExclusions(r.now())
	id, err := r.Sched.Submit(ctx, Submission{
		Script:     filepath.Join(st.Dir, WrapperFile),
		Args:       st.Settings.SbatchArgs,
		AfterNotOK: after,
		Exclude:    excl,
	})
	if err != nil {
		return nil, fmt.Errorf("slurm: submit (%s): %w", by, err)
	}
	j := &ChainJob{ID: id, Submitted: r.now(), SubmittedBy: by, Exclude: excl}
	st.Jobs = append(st.Jobs, j)
	r.logf("submitted job %s (%s)%s", id, by, excludeNote(excl))
	return j, nil
}

func excludeNote(excl []string) string {
	if len(excl) == 0 {
		return ""
	}
	return " excluding " + strings.Join(excl, ",")
}

// BeginResult says whether the job's own script should run.
type BeginResult struct {
	Run    bool
	Reason string
	Env    map[string]string // exported to the job's script (FT_RESUMED, ...)
	// Continue: the job does not run, but the chain goes on through its
	// pending successor (exit non-zero so that afternotok holds).
	Continue bool
}

// Begin is the decision step at the start of run restart
// (SLURM_RESTART_COUNT) of job id, on the nodes nodeList: it judges any
// predecessor whose own end step did not run (a job killed at its
// walltime, by a node failure, by scancel) and checks that this job did
// not land on an excluded node (else it submits a replacement that
// excludes it and does not run). The successor is submitted by the job's
// training step once it holds the chain's training claim (ClaimTraining,
// SubmitSuccessor), not here: a job that will not train must not add one.
//
// A requeued run of a job the chain has already judged does not train:
// the chain went on without it.
func (r *Resumer) Begin(ctx context.Context, id, nodeList string, restart int) (BeginResult, error) {
	var res BeginResult
	_, err := r.withState(ctx, func(st *State) error {
		job := st.Job(id)
		if job == nil { // submitted by hand with the wrapper, or its record was lost
			job = &ChainJob{ID: id, Submitted: r.now(), SubmittedBy: "unknown"}
			st.Jobs = append(st.Jobs, job)
		}
		by := "begin step of " + id
		if rerun := !job.Began.IsZero() && restart != job.Restarts; rerun {
			archiveRun(filepath.Join(st.Dir, JobsDir, id), job.Restarts)
			job.ScriptRC, job.ScriptEnded, job.Warning = nil, time.Time{}, ""
			r.logf("job %s runs again (requeued, run %d)", id, restart)
			if job.Outcome != "" {
				job.Restarts, job.Began = restart, r.now()
				job.NotRun = fmt.Sprintf("requeued run %d of a job already judged %s (%s): the chain went on without it, so this run does not train", restart, job.Outcome, job.Reason)
				res.Reason, res.Continue = job.NotRun, st.Status == Active && job.Outcome.Ran()
				return nil
			}
		}
		job.Restarts, job.Began, job.NotRun = restart, r.now(), ""
		job.Nodes, _ = slurm.ExpandNodeList(nodeList)
		for _, p := range st.Jobs {
			if p != job && p.Outcome == "" {
				r.judgeFromSlurm(ctx, st, p, by)
			}
		}
		if st.Status != Active {
			if job.Outcome == "" {
				job.Outcome, job.Reason, job.Decided, job.DecidedBy = Skipped, "chain is "+st.Status+": "+st.StopReason, r.now(), by
			}
			res.Reason = "chain is " + st.Status + ": " + st.StopReason
			job.NotRun = res.Reason
			return nil
		}
		excl := st.ActiveExclusions(r.now())
		if bad := intersect(job.Nodes, excl); len(bad) > 0 {
			next, err := r.submit(ctx, st, "", "relocation of "+id)
			job.Outcome, job.Decided, job.DecidedBy, job.Decision = Relocated, r.now(), by, "relocate"
			job.Reason = fmt.Sprintf("landed on excluded node(s) %s", strings.Join(bad, ","))
			if err != nil {
				return err
			}
			job.Reason += "; replaced by job " + next.ID
			res.Reason, job.NotRun = job.Reason, job.Reason
			r.logf("job %s %s", id, job.Reason)
			return nil
		}
		res.Run = true
		index := 0
		for _, j := range st.Jobs {
			if j == job {
				break
			}
			if j.Outcome.Ran() {
				index++
			}
		}
		res.Env = map[string]string{"FT_RESUMER_JOB_INDEX": fmt.Sprint(index)}
		if index > 0 {
			res.Env["FT_RESUMED"] = "1" // NeMo-Framework-Launcher's continuation marker
		}
		return nil
	})
	return res, err
}

// archiveRun moves what an earlier run of a requeued job left in its
// directory (verdicts, warning record) to run-<n>/, so that the new run is
// judged on its own.
func archiveRun(dir string, run int) {
	files, _ := filepath.Glob(filepath.Join(dir, "verdict*.json"))
	files = append(files, filepath.Join(dir, WarningFile))
	to := filepath.Join(dir, fmt.Sprintf("run-%d", run))
	for _, f := range files {
		if _, err := os.Stat(f); err != nil {
			continue
		}
		if err := os.MkdirAll(to, 0o755); err != nil {
			return
		}
		_ = os.Rename(f, filepath.Join(to, filepath.Base(f)))
	}
}

// End is the decision step after the user's script of job id exited with
// rc at scriptEnded (zero: now). It returns the status the job should exit
// with: 0 when the chain is done (Slurm then cancels the afternotok
// successor by itself), else non-zero (rc, or ExitContinue when rc is 0 but
// training is not finished) so that the successor runs unless the chain
// stopped and cancelled it.
func (r *Resumer) End(ctx context.Context, id string, rc int, scriptEnded time.Time) (int, error) {
	if scriptEnded.IsZero() {
		scriptEnded = r.now()
	}
	exit := rc
	if rc == 0 {
		exit = ExitContinue
	}
	_, err := r.withState(ctx, func(st *State) error {
		job := st.Job(id)
		if job == nil {
			job = &ChainJob{ID: id, Submitted: r.now(), SubmittedBy: "unknown", Began: r.now()}
			st.Jobs = append(st.Jobs, job)
		}
		if job.NotRun != "" {
			// This run did not run the script. A requeued run of a job
			// judged earlier lets a pending successor run (non-zero);
			// otherwise the job did nothing the chain continues from.
			exit = 0
			if st.Status == Active && job.Outcome.Ran() {
				exit = ExitContinue
			}
			return nil
		}
		job.ScriptRC, job.ScriptEnded = &rc, scriptEnded
		if job.Outcome != "" { // judged already (skipped, relocated)
			if st.Status == Done {
				exit = 0
			}
			return nil
		}
		f, sums := r.facts(ctx, st, job, Job{})
		job.Verdicts = sums
		j := Judge(f)
		if j.Defer {
			r.logf("job %s: %s", id, j.Reason)
			// The nodes its launchers quarantined are known now: exclude
			// them from the pending successor before this job ends and
			// the successor can start (the outcome waits for Slurm).
			if st.Status == Active {
				r.addExclusions(ctx, st, job, f.Verdicts)
				r.pushExclusions(ctx, st, job)
			}
			return nil
		}
		r.apply(ctx, st, job, j, f.Verdicts, "end step")
		switch {
		case st.Status == Done:
			exit = 0
		case st.Status == Stopped && rc == 0:
			exit = 0
		}
		return nil
	})
	return exit, err
}

// Reconcile brings the chain up to date with Slurm: it judges every job
// Slurm has finished that nobody judged yet, records Slurm's final state of
// every job, and, when the chain is active but no job of it is pending or
// running (a successor cancelled by hand, a job that died before its begin
// step), submits one. Any ft-resumer command runs it first, so running
// ft-resumer again after it died picks the chain up where it was.
func (r *Resumer) Reconcile(ctx context.Context) (*State, error) {
	return r.withState(ctx, func(st *State) error {
		live := false
		for _, j := range st.Jobs {
			if j.Slurm != nil && j.Slurm.Terminal() {
				continue
			}
			rec, err := r.Sched.Job(ctx, j.ID)
			if errors.Is(err, ErrUnknownJob) {
				rec, err = Job{ID: j.ID, State: Unknown}, nil
			}
			if err != nil {
				return err
			}
			if !rec.Terminal() {
				live = true
				continue
			}
			j.Slurm = &rec
			if j.Outcome == "" {
				r.judge(ctx, st, j, rec, "resumer")
			}
		}
		if st.Status != Active || live {
			return nil
		}
		if max := st.Settings.MaxJobs; max > 0 && st.trainingJobs() >= max {
			r.stop(ctx, st, StopMaxJobs, fmt.Sprintf("%d jobs trained, the most --max-jobs allows (%d)", st.trainingJobs(), max))
			return nil
		}
		if err := r.checkCapacity(ctx, st, lastTrained(st)); err != nil {
			return nil // checkCapacity stopped the chain
		}
		_, err := r.submit(ctx, st, "", "repair: no job pending or running")
		return err
	})
}

// Cancel stops the chain on purpose: it is marked stopped and every job of
// it that is pending or running is cancelled.
func (r *Resumer) Cancel(ctx context.Context, reason string) (*State, error) {
	return r.withState(ctx, func(st *State) error {
		if st.Status == Active {
			r.stop(ctx, st, StopCancelled, reason)
		}
		for _, p := range st.Jobs {
			if p.Outcome == "" && !p.Began.IsZero() && (p.Slurm == nil || !p.Slurm.Terminal()) {
				p.CancelledByChain = true
			}
		}
		return r.cancelLive(ctx, st, nil, true)
	})
}

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

// pushExclusions gives the pending successor(s) the exclusions known now:
// slurmctld applies ExcNodeList when it places the job, which is after job
// ends (afternotok), so it is in time whenever this runs in job's end step.
// Judged later (the end step did not run), the successor may have started
// already: its begin step then checks its nodes (and relocates it).
func (r *Resumer) pushExclusions(ctx context.Context, st *State, job *ChainJob) {
	excl := st.ActiveExclusions(r.now())
	for _, p := range st.Jobs {
		if p == job || p.Outcome != "" || !p.Began.IsZero() || slices.Equal(p.Exclude, excl) {
			continue
		}
		if err := r.Sched.SetExclude(ctx, p.ID, excl); err != nil {
			if rec, jerr := r.Sched.Job(ctx, p.ID); jerr == nil && rec.State != "PENDING" {
				r.logf("job %s already left the queue (%s) before %s could be excluded from it; its begin step checks its nodes and moves it if it landed on one", p.ID, rec.State, strings.Join(excl, ","))
			} else {
				r.logf("job %s: could not set ExcNodeList=%s: %v (its begin step checks its nodes and moves it if it landed on one)", p.ID, strings.Join(excl, ","), err)
			}
			continue
		}
		p.Exclude = excl
		r.logf("job %s: excluding %s", p.ID, strings.Join(excl, ","))
	}
}

func (r *Resumer) stop(ctx context.Context, st *State, kind, reason string) {
	if st.Status != Active {
		return
	}
	st.Status, st.StopKind, st.StopReason, st.Ended = Stopped, kind, reason, r.now()
	r.logf("chain stopped: %s", reason)
}

// checkRate stops the chain instead of submitting when it already
// submitted MaxSubmits jobs within SubmitWindow: jobs that end that fast
// are not training, whatever they are judged (a relocation loop, jobs
// dying before their begin step), and a queue must never be flooded.
func (r *Resumer) checkRate(ctx context.Context, st *State) error {
	max, win := st.Settings.MaxSubmits, time.Duration(st.Settings.SubmitWindow)
	if max <= 0 || win <= 0 {
		return nil
	}
	since := r.now().Add(-win)
	n := 0
	for _, j := range st.Jobs {
		if j.Submitted.After(since) {
			n++
		}
	}
	if n < max {
		return nil
	}
	last := ""
	if lt := lastDecided(st); lt != nil {
		last = fmt.Sprintf("; last: job %s: %s (%s)", lt.ID, lt.Outcome, lt.Reason)
	}
	r.stop(ctx, st, StopSubmitRate, fmt.Sprintf("%d jobs submitted in the last %v, the most --max-submit-rate allows (%d/%v): jobs that end this fast are not training%s",
		n, win, max, win, last))
	return errors.New("slurm: submit rate limit reached")
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

func lastDecided(st *State) *ChainJob {
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		if st.Jobs[i].Outcome != "" {
			return st.Jobs[i]
		}
	}
	return nil
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

// addExclusions records the nodes quarantined in job's verdicts (and the
// node of a verdict of kind node_excluded) as exclusions with an expiry.
func (r *Resumer) addExclusions(ctx context.Context, st *State, job *ChainJob, _ []verdict.Verdict) {
	nvs := readVerdicts(filepath.Join(st.Dir, JobsDir, job.ID))
	type cand struct {
		keys                   []string
		host, evidence, detail string
		at                     time.Time
	}
	var cands []cand
	for _, nv := range nvs {
		if nv.v.Kind == verdict.NodeExcluded {
			cands = append(cands, cand{keys: []string{nv.node, nv.v.Hostname, addrOf(nv.v.Node)}, host: nv.v.Hostname,
				evidence: string(verdict.EvidenceExcluded), detail: nv.v.Reason, at: nv.v.EndedAt})
		}
		for _, q := range nv.v.Quarantined {
			cands = append(cands, cand{keys: []string{q.Host, addrOf(q.Node)}, host: q.Host,
				evidence: string(q.Evidence), detail: q.Detail, at: q.At})
		}
	}
	if len(cands) == 0 {
		return
	}
	nodes, err := r.Sched.Nodes(ctx)
	if err != nil {
		r.logf("job %s: cannot map quarantined nodes to Slurm nodes: %v", job.ID, err)
	}
	resolve := nodeResolver(nodes, nvs)
	now := r.now()
	for _, c := range cands {
		name := ""
		for _, k := range c.keys {
			if name = resolve(k); name != "" {
				break
			}
		}
		if name == "" {
			r.logf("job %s: quarantined node %v (%s) matches no Slurm node; not excluded", job.ID, c.keys, c.evidence)
			continue
		}
		exp := now.Add(time.Duration(st.Settings.ExclusionTTL))
		found := false
		for i := range st.Exclusions {
			if e := &st.Exclusions[i]; e.Node == name && e.Expires.After(now) {
				found = true
				if exp.After(e.Expires) {
					e.Expires = exp
				}
			}
		}
		if found {
			continue
		}
		at := c.at
		if at.IsZero() {
			at = now
		}
		st.Exclusions = append(st.Exclusions, Exclusion{Node: name, Host: c.host, Evidence: c.evidence, Detail: c.detail, Job: job.ID, At: at, Expires: exp})
		r.logf("job %s: node %s quarantined (%s: %s), excluded until %s", job.ID, name, c.evidence, c.detail, exp.Format(time.RFC3339))
	}
}

// checkCapacity stops the chain when the exclusions leave fewer usable
// nodes than the job needs: a chain that cannot be placed must say so, not
// wait in the queue forever.
func (r *Resumer) checkCapacity(ctx context.Context, st *State, job *ChainJob) error {
	excl := st.ActiveExclusions(r.now())
	if len(excl) == 0 || job == nil {
		return nil
	}
	need := len(job.Nodes)
	if job.Slurm != nil && job.Slurm.NumNodes > need {
		need = job.Slurm.NumNodes
	}
	if need == 0 {
		return nil
	}
	nodes, err := r.Sched.Nodes(ctx)
	if err != nil {
		return nil // cannot tell; Slurm will say if it cannot place the job
	}
	parts := map[string]bool{}
	for _, n := range nodes {
		if slices.Contains(job.Nodes, n.Name) {
			for _, p := range n.Partitions {
				parts[p] = true
			}
		}
	}
	var usable []string
	for _, n := range nodes {
		inPart := len(parts) == 0
		for _, p := range n.Partitions {
			inPart = inPart || parts[p]
		}
		if inPart && !slices.Contains(excl, n.Name) {
			usable = append(usable, n.Name)
		}
	}
	if len(usable) >= need {
		return nil
	}
	r.stop(ctx, st, StopCapacity, fmt.Sprintf("excluding %s leaves %d usable node(s) (%s) but the job needs %d",
		strings.Join(excl, ","), len(usable), strings.Join(usable, ","), need))
	return errors.New("not enough nodes")
}

func lastTrained(st *State) *ChainJob {
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		if st.Jobs[i].Outcome.Ran() {
			return st.Jobs[i]
		}
	}
	return nil
}

type nodeVerdict struct {
	file string
	node string // Slurm node name from the file name (verdict-<node>.json), if any
	v    verdict.Verdict
}

func readVerdicts(dir string) []nodeVerdict {
	files, _ := filepath.Glob(filepath.Join(dir, "verdict*.json"))
	sort.Strings(files)
	var out []nodeVerdict
	for _, f := range files {
		v, err := verdict.Read(f)
		if err != nil {
			continue
		}
		node := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "verdict-"), ".json")
		if node == "verdict.json" || node == filepath.Base(f) {
			node = ""
		}
		out = append(out, nodeVerdict{file: f, node: node, v: v})
	}
	return out
}

// slurmNames returns a function that names a host (a host name or
// address, with its rendezvous node id "addr/pid" when known) by its Slurm
// node name: the verdict files' own names (verdict-<node>.json, written on
// that node by `ft-resumer node`; a single-node job's verdict.json is its
// one node's), then, only for what those do not name, Slurm's
// NodeAddr/NodeHostName (scontrol, asked once). What maps to nothing keeps
// its own name.
func (r *Resumer) slurmNames(ctx context.Context, job *ChainJob, nvs []nodeVerdict) func(host, node string) string {
	byAddr := map[string]string{}
	byHost := map[string]map[string]bool{}
	for _, nv := range nvs {
		n := nv.node
		if n == "" && len(job.Nodes) == 1 {
			n = job.Nodes[0]
		}
		if n == "" {
			continue
		}
		if a := addrOf(nv.v.Node); a != "" {
			byAddr[a] = n
		}
		if h := nv.v.Hostname; h != "" {
			if byHost[h] == nil {
				byHost[h] = map[string]bool{}
			}
			byHost[h][n] = true
		}
	}
	var slurmResolve func(string) string
	return func(host, node string) string {
		if n, ok := byAddr[addrOf(node)]; ok && node != "" {
			return n
		}
		if n, ok := byAddr[host]; ok {
			return n
		}
		if ns := byHost[host]; len(ns) == 1 {
			for n := range ns {
				return n
			}
		}
		if slurmResolve == nil {
			nodes, _ := r.Sched.Nodes(ctx)
			slurmResolve = nodeResolver(nodes, nil)
		}
		for _, k := range []string{addrOf(node), host} {
			if n := slurmResolve(k); n != "" {
				return n
			}
		}
		if host == "" {
			return addrOf(node)
		}
		return host
	}
}

// addrOf returns the address part of a rendezvous node id ("addr/pid").
func addrOf(node string) string {
	a, _, _ := strings.Cut(node, "/")
	return a
}

// nodeResolver maps a host name, address or node name to a Slurm node
// name: Slurm's own NodeName/NodeAddr/NodeHostName (a host name only when
// one node has it: fake nodes share one), then the verdict files' names.
func nodeResolver(nodes []slurm.NodeInfo, nvs []nodeVerdict) func(string) string {
	byKey := map[string]string{}
	hostCount := map[string]int{}
	for _, n := range nodes {
		hostCount[n.Hostname]++
	}
	for _, n := range nodes {
		byKey[n.Name] = n.Name
		if n.Addr != "" {
			byKey[n.Addr] = n.Name
		}
		if n.Hostname != "" && hostCount[n.Hostname] == 1 {
			byKey[n.Hostname] = n.Name
		}
	}
	for _, nv := range nvs {
		if nv.node == "" {
			continue
		}
		if a := addrOf(nv.v.Node); a != "" {
			if _, ok := byKey[a]; !ok {
				byKey[a] = nv.node
			}
		}
	}
	return func(k string) string {
		if k == "" {
			return ""
		}
		return byKey[k]
	}
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
