package resumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
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

func lastDecided(st *State) *ChainJob {
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		if st.Jobs[i].Outcome != "" {
			return st.Jobs[i]
		}
	}
	return nil
}

func lastTrained(st *State) *ChainJob {
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		if st.Jobs[i].Outcome.Ran() {
			return st.Jobs[i]
		}
	}
	return nil
}
