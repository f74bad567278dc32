package resumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// Files of the training claim: the lock one job's `step run` holds (flock)
// for as long as its script runs, and the record naming that job.
const (
	TrainingLockFile  = "training.lock"
	TrainingClaimFile = "training.json"
)

// DefaultClaimWait is how long a job waits for the training claim of a
// job that Slurm no longer runs (its processes being killed: KillWait, a
// save after a warning signal) before it refuses to train.
const DefaultClaimWait = 2 * time.Minute

// Claim is the record of the chain's training claim: which run of which
// job trains now.
type Claim struct {
	Job     string    `json:"job"`
	Restart int       `json:"restart"` // SLURM_RESTART_COUNT of the run
	Node    string    `json:"node,omitempty"`
	PID     int       `json:"pid"`
	Since   time.Time `json:"since"`
}

func (c Claim) String() string {
	s := "job " + c.Job
	if c.Restart > 0 {
		s += fmt.Sprintf(" (requeued run %d)", c.Restart)
	}
	if c.Node != "" {
		s += " on " + c.Node
	}
	if !c.Since.IsZero() {
		s += " since " + c.Since.UTC().Format(time.RFC3339)
	}
	return s
}

// ClaimedError is ClaimTraining's refusal: another job of the chain trains.
type ClaimedError struct {
	Holder      Claim
	HolderState string // Slurm's state of the holder's job ("" unknown)
}

func (e *ClaimedError) Error() string {
	st := ""
	if e.HolderState != "" {
		st = " (Slurm: " + e.HolderState + ")"
	}
	return fmt.Sprintf("another job of this chain is training: %s%s; one chain trains in one job at a time, so this job does not run its script", e.Holder, st)
}

// TrainingClaim is a held claim; Release gives it up (exiting does too).
type TrainingClaim struct{ f *os.File }

// Release gives the claim up.
func (c *TrainingClaim) Release() {
	if c == nil || c.f == nil {
		return
	}
	_ = unix.Flock(int(c.f.Fd()), unix.LOCK_UN)
	_ = c.f.Close()
	c.f = nil
}

// ClaimTraining takes the chain's exclusive training claim for run restart
// of job id: an flock on <chain>/training.lock, held by the calling process
// (the job's `step run`, for as long as the job script runs) and released
// by the kernel when it exits however it exits, plus a record naming the
// run. Two jobs of one chain can be running at once (a requeued job beside
// its successor, a preempted job run again, a wrapper submitted by hand):
// only the one holding the claim trains.
//
// When another process holds it: if Slurm runs the holder's job (another
// job, RUNNING), this job refuses at once with a *ClaimedError; if Slurm
// ended or requeued the holder's job (its processes are being killed, or
// it is saving after a warning), this job waits for the claim up to wait,
// then refuses.
func (r *Resumer) ClaimTraining(ctx context.Context, id string, restart int, node string, wait time.Duration) (*TrainingClaim, error) {
	f, err := os.OpenFile(filepath.Join(r.Dir, TrainingLockFile), os.O_CREATE|os.O_RDWR|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("slurm: training claim: %w", err)
	}
	deadline := time.Now().Add(wait)
	lastAsked := time.Time{}
	holderState := ""
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			c := Claim{Job: id, Restart: restart, Node: node, PID: os.Getpid(), Since: r.now()}
			// The record only names the holder (the lock is the claim):
			// written whole by a rename, without an fsync on the path to
			// the script's start.
			b, _ := json.Marshal(c)
			p := filepath.Join(r.Dir, TrainingClaimFile)
			err := os.WriteFile(p+".tmp", append(b, '\n'), 0o644)
			if err == nil {
				err = os.Rename(p+".tmp", p)
			}
			if err != nil {
				r.logf("job %s: training claim record: %v", id, err)
			}
			return &TrainingClaim{f: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("slurm: training claim: %w", err)
		}
		holder := readClaim(r.Dir)
		if time.Since(lastAsked) >= time.Second && holder.Job != "" {
			lastAsked = time.Now()
			holderState = ""
			qctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a slow slurmctld must not stretch the wait
			if rec, err := r.Sched.Job(qctx, holder.Job); err == nil {
				holderState = rec.State
			}
			cancel()
			// Another job that Slurm runs is training: refuse now. The
			// holder being this job's own earlier run (requeued) or a job
			// Slurm ended is on its way out: wait for it.
			if holder.Job != id && holderState == "RUNNING" {
				_ = f.Close()
				return nil, &ClaimedError{Holder: holder, HolderState: holderState}
			}
		}
		if time.Now().After(deadline) {
			_ = f.Close()
			return nil, &ClaimedError{Holder: holder, HolderState: holderState}
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("slurm: training claim: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// readClaim reads the claim record (zero when there is none).
func readClaim(dir string) Claim {
	var c Claim
	b, err := os.ReadFile(filepath.Join(dir, TrainingClaimFile))
	if err == nil {
		_ = json.Unmarshal(b, &c)
	}
	return c
}

// Refuse records that run restart of job id did not train because another
// job holds the training claim (why), and cancels the successor it may
// have pending: the holder has its own.
func (r *Resumer) Refuse(ctx context.Context, id string, restart int, why string) error {
	_, err := r.withState(ctx, func(st *State) error {
		job := st.Job(id)
		if job == nil {
			job = &ChainJob{ID: id, Submitted: r.now(), SubmittedBy: "unknown", Began: r.now()}
			st.Jobs = append(st.Jobs, job)
		}
		job.NotRun = why
		if job.Outcome == "" {
			job.Outcome, job.Reason, job.Decided, job.DecidedBy, job.Decision = Refused, why, r.now(), "training claim", "none"
		}
		r.logf("job %s refused to train: %s", id, why)
		if s := st.Job(job.Successor); s != nil && s.Began.IsZero() && s.Outcome == "" {
			if rec, err := r.Sched.Job(ctx, s.ID); err == nil && rec.State == "PENDING" {
				r.logf("cancelling job %s, the successor of job %s, which did not train", s.ID, id)
				return r.Sched.Cancel(ctx, s.ID)
			}
		}
		return nil
	})
	return err
}

// SubmitSuccessor pre-schedules the successor of job id (run restart)
// with --dependency=afternotok:<id> --kill-on-invalid-dep=yes, so that
// however this job ends, a successor exists. It is idempotent per job: a
// requeued run of the job (the same id, run again by `scontrol requeue`,
// a preemption or a node failure with --requeue) whose successor is still
// pending reuses it instead of submitting a second one, which would start
// beside the first when the job fails for good.
func (r *Resumer) SubmitSuccessor(ctx context.Context, id string, restart int) (string, error) {
	next := ""
	_, err := r.withState(ctx, func(st *State) error {
		job := st.Job(id)
		if job == nil {
			job = &ChainJob{ID: id, Submitted: r.now(), SubmittedBy: "unknown", Began: r.now()}
			st.Jobs = append(st.Jobs, job)
		}
		if st.Status != Active {
			return nil
		}
		if s := st.Job(job.Successor); s != nil && s.Began.IsZero() && s.Outcome == "" {
			rec, err := r.Sched.Job(ctx, s.ID)
			if err == nil && !rec.Terminal() && rec.State != "RUNNING" {
				next = s.ID
				r.logf("job %s (run %d): its successor, job %s, is still %s: not submitting another", id, restart, s.ID, rec.State)
				return nil
			}
		}
		if max := st.Settings.MaxJobs; max > 0 && st.trainingJobs() >= max {
			r.logf("job %s is job %d of at most %d (--max-jobs): no successor", id, st.trainingJobs(), max)
			return nil
		}
		by := "begin of " + id
		if restart > 0 {
			by = fmt.Sprintf("begin of %s (run %d)", id, restart)
		}
		j, err := r.submit(ctx, st, id, by)
		if err != nil {
			return err
		}
		job.Successor, next = j.ID, j.ID
		return nil
	})
	return next, err
}
