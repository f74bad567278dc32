package resumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// ChainSchema is the schema of chain.json.
const ChainSchema = "ft-resumer.chain/v1"

// Chain status values.
const (
	Active  = "active"  // a job runs or is pending, or will be submitted
	Done    = "done"    // training finished (the finished flag exists)
	Stopped = "stopped" // the chain stopped without finishing (StopReason says why)
)

// Files of a chain directory.
const (
	StateFile      = "chain.json"
	LockFile       = ".lock"
	JobScriptFile  = "job.sh"         // the user's batch script, as submitted
	WrapperFile    = "wrapper.sbatch" // what is submitted: decision steps around job.sh
	JobResultsFile = "_job_results"   // NeMo's per-job record
	JobsDir        = "jobs"           // jobs/<jobid>/: verdicts, env.sh
	// EndStatusFile (in jobs/<jobid>/) holds the status `step run --end`
	// decided for this run of the job; the wrapper exits with it, and runs
	// the end step on its own when it is empty (step run was killed).
	EndStatusFile = "end-status"
)

// Settings are a chain's options, fixed when it starts.
type Settings struct {
	// MaxSubsequentFailures is how many consecutive failed jobs are
	// retried: the chain stops at failure number MaxSubsequentFailures+1.
	MaxSubsequentFailures int `json:"max_subsequent_job_failures"`
	// MaxJobs caps the jobs that train (0: no cap).
	MaxJobs int `json:"max_jobs"`
	// ExclusionTTL is how long a quarantined node stays excluded.
	ExclusionTTL Duration `json:"exclusion_ttl"`
	// FinishedFlag is FAULT_TOL_FINISHED_FLAG_FILE.
	FinishedFlag string `json:"finished_flag"`
	// SbatchArgs are extra sbatch options for every job.
	SbatchArgs []string `json:"sbatch_args,omitempty"`
	// Resumer is the ft-resumer binary the jobs run (a path every node
	// sees).
	Resumer string `json:"resumer"`
	// JobResultsFormat is "nfl" (<jobid> X|S|F) or "nemo-run" (<jobid>
	// <restart count> X|S|F).
	JobResultsFormat string `json:"job_results_format"`
	// NoRestartCode is the launcher's no-restart exit code.
	NoRestartCode int `json:"no_restart_exit_code"`
	// ProgressPaths are files, directories or globs the training writes
	// as it advances (its checkpoints): a file among them modified during
	// a job is evidence that the job made progress, for scripts whose
	// ranks report no steps to their monitors.
	ProgressPaths []string `json:"progress_paths,omitempty"`
	// MaxSubmits in SubmitWindow: a chain that would submit more jobs
	// than this in any window stops (0: no limit).
	MaxSubmits   int      `json:"max_submits"`
	SubmitWindow Duration `json:"submit_window"`
	// DeterministicAfter: the same rank failure (same rank, exit, and
	// step within DeterministicSteps) this many times over consecutive
	// failed jobs, in at least two of them, stops the chain with
	// deterministic_failure (0: never).
	DeterministicAfter int `json:"deterministic_after"`
	DeterministicSteps int `json:"deterministic_steps"`
}

// Defaults of the ft-resumer flags that set these Settings (a zero field
// means no limit).
const (
	DefaultMaxJobs            = 200
	DefaultMaxSubmits         = 30
	DefaultSubmitWindow       = 10 * time.Minute
	DefaultDeterministicAfter = 3
	DefaultDeterministicSteps = 2
)

// Why a chain stopped (State.StopKind).
const (
	StopCancelled      = "cancelled"                   // ft-resumer cancel
	StopNoRestart      = "no_restart"                  // a launcher's no-restart verdict or exit code
	StopFailures       = "max_subsequent_job_failures" // too many consecutive failed (or no-progress) jobs
	StopDeterministic  = "deterministic_failure"       // the same rank failure in consecutive jobs
	StopMaxJobs        = "max_jobs"                    // --max-jobs jobs trained
	StopSubmitRate     = "submit_rate"                 // jobs submitted faster than --max-submit-rate
	StopCapacity       = "not_enough_nodes"            // exclusions leave too few nodes
	StopCompleteNoFlag = "complete_without_flag"       // the training looks complete but wrote no finished flag
)

// Duration is a time.Duration that reads and writes as "1h30m".
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// State is a chain's record, chain.json in its directory. Everything
// ft-resumer knows lives here and in Slurm: any ft-resumer process (the
// jobs' decision steps, a command run on the login node) reads it under the
// chain lock, acts, and writes it back atomically.
type State struct {
	Schema     string      `json:"schema"`
	Dir        string      `json:"dir"`
	Settings   Settings    `json:"settings"`
	Status     string      `json:"status"`
	StopReason string      `json:"stop_reason,omitempty"`
	StopKind   string      `json:"stop_kind,omitempty"`
	Created    time.Time   `json:"created"`
	Ended      time.Time   `json:"ended,omitzero"`
	Failures   int         `json:"consecutive_failures"`
	Total      int         `json:"failures_total"`
	Jobs       []*ChainJob `json:"jobs"`
	Exclusions []Exclusion `json:"exclusions"`
}

// NodeEvidence is a node of a job whose ranks failed in ways that point at
// the node (verdict.RankFailure.NodeEvidence), with the first such failure.
type NodeEvidence struct {
	Node string `json:"node"` // Slurm node name
	What string `json:"what"`
}

// ChainJob is one Slurm job of the chain.
type ChainJob struct {
	ID          string    `json:"id"`
	Submitted   time.Time `json:"submitted"`
	SubmittedBy string    `json:"submitted_by"` // start, begin of <id>, relocation of <id>, repair
	Exclude     []string  `json:"exclude,omitempty"`
	// Began is when the job's begin step ran (zero: never).
	Began time.Time `json:"began,omitzero"`
	// Restarts is SLURM_RESTART_COUNT of its latest run (a job submitted
	// with --requeue runs again under the same id).
	Restarts int `json:"restarts,omitempty"`
	// Successor is the job its training step pre-scheduled (afternotok):
	// a requeued run reuses it while it is pending.
	Successor string `json:"successor,omitempty"`
	// NotRun says why its latest run did not run the job script (another
	// job of the chain held the training claim, a requeued run of a job
	// already judged, the chain had ended, a relocation); "" when it ran.
	NotRun string   `json:"not_run,omitempty"`
	Nodes  []string `json:"nodes,omitempty"`
	// NodeEvidence are its nodes whose ranks failed in ways that point at
	// the node (the chain's failing-node rule counts them across jobs).
	NodeEvidence []NodeEvidence `json:"node_evidence,omitempty"`
	// ScriptRC is the user's job script's exit status from the end step,
	// which ran at ScriptEnded.
	ScriptRC    *int      `json:"script_rc,omitempty"`
	ScriptEnded time.Time `json:"script_ended,omitzero"`
	Slurm       *Job      `json:"slurm,omitempty"` // Slurm's final record
	Outcome     Outcome   `json:"outcome,omitempty"`
	Reason      string    `json:"reason,omitempty"`
	Decision    string    `json:"decision,omitempty"` // continue, done, stop
	Decided     time.Time `json:"decided,omitzero"`
	// DecidedBy is who judged it: end step, begin step of <id>, resumer.
	DecidedBy string           `json:"decided_by,omitempty"`
	Verdicts  []VerdictSummary `json:"verdicts,omitempty"`
	// Counted: the judgement consumed the failure budget (what the
	// chain's failure counts add up).
	Counted bool `json:"counted,omitempty"`
	// CancelledByChain: ft-resumer cancel cancelled it while it ran.
	CancelledByChain bool `json:"cancelled_by_chain,omitempty"`
	// Warning is the first warning signal the batch shell received.
	Warning string `json:"warning_signal,omitempty"`
	// Progress is the evidence of progress the judgement used.
	Progress string `json:"progress,omitempty"`
	// Failures are the rank failures its launchers recorded (for
	// deterministic_failure), the newest verdict.MaxRankFailures per node.
	Failures []RankFailureSummary `json:"rank_failures,omitempty"`
	// Quarantined are the nodes its launchers stopped using, and Swaps
	// the spares that took a lost node's place during the job.
	Quarantined []QuarantineSummary `json:"quarantined,omitempty"`
	Swaps       []SwapSummary       `json:"spare_swaps,omitempty"`
}

// RankFailureSummary is a rank failure a launcher recorded.
type RankFailureSummary struct {
	Host      string `json:"host"`
	Rank      int    `json:"rank"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"`
	Kind      string `json:"kind"`
	Steps     int64  `json:"steps"`
	Iteration *int64 `json:"iteration,omitempty"`
	// Cause is what the rank's own output said (the verdict's cause).
	Cause *verdict.FailureCause `json:"cause,omitempty"`
}

// QuarantineSummary is a node a job's launchers stopped using.
type QuarantineSummary struct {
	Host     string `json:"host"`
	Evidence string `json:"evidence"`
	Detail   string `json:"detail,omitempty"`
}

// SwapSummary is a spare that took a lost node's place.
type SwapSummary struct {
	Spare     string    `json:"spare"`
	Replaced  string    `json:"replaced,omitempty"` // the node whose place it took ("" unknown)
	GroupRank int       `json:"group_rank"`
	At        time.Time `json:"at"`
}

// VerdictSummary is what a launcher's verdict said.
type VerdictSummary struct {
	File     string `json:"file"`
	Hostname string `json:"hostname"`
	Node     string `json:"node,omitempty"` // its Slurm node name
	Kind     string `json:"kind"`
	ExitCode int    `json:"exit_code"`
	Reason   string `json:"reason"`
}

// Exclusion is a node kept out of the chain's jobs.
type Exclusion struct {
	Node     string    `json:"node"` // Slurm node name
	Host     string    `json:"host,omitempty"`
	Evidence string    `json:"evidence"`
	Detail   string    `json:"detail"`
	Job      string    `json:"job"` // whose verdict quarantined it
	At       time.Time `json:"at"`
	Expires  time.Time `json:"expires"`
}

// Job returns the chain's job with id, or nil.
func (s *State) Job(id string) *ChainJob {
	for _, j := range s.Jobs {
		if j.ID == id {
			return j
		}
	}
	return nil
}

// ActiveExclusions returns the node names excluded at now.
func (s *State) ActiveExclusions(now time.Time) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range s.Exclusions {
		if e.Node != "" && e.Expires.After(now) && !seen[e.Node] {
			seen[e.Node] = true
			out = append(out, e.Node)
		}
	}
	return out
}

// trainingJobs counts jobs that trained or may still (not relocated,
// skipped, or never ran).
func (s *State) trainingJobs() int {
	n := 0
	for _, j := range s.Jobs {
		if j.Outcome == "" || j.Outcome.Ran() {
			n++
		}
	}
	return n
}

// ErrNoChain is returned by LoadState for a directory without a chain.
var ErrNoChain = errors.New("slurm: no chain in directory")

// LoadState reads dir/chain.json.
func LoadState(dir string) (*State, error) {
	b, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w %s", ErrNoChain, dir)
	}
	if err != nil {
		return nil, fmt.Errorf("slurm: chain state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("slurm: chain state %s: %w", dir, err)
	}
	if s.Schema != ChainSchema {
		return nil, fmt.Errorf("slurm: chain state %s: schema %q, want %q", dir, s.Schema, ChainSchema)
	}
	return &s, nil
}

// Save writes dir/chain.json atomically.
func (s *State) Save() error {
	s.Schema = ChainSchema
	if s.Jobs == nil {
		s.Jobs = []*ChainJob{}
	}
	if s.Exclusions == nil {
		s.Exclusions = []Exclusion{}
	}
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("slurm: chain state: %w", err)
	}
	if err := atomicfile.Write(filepath.Join(s.Dir, StateFile), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("slurm: chain state: %w", err)
	}
	return nil
}

// lockChain takes the chain's exclusive lock (flock on dir/.lock), waiting
// until ctx is done. Every reader-modifier-writer of chain.json holds it, so
// a job's decision step and a command on the login node never interleave.
func lockChain(ctx context.Context, dir string) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, LockFile), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("slurm: chain lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN); _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("slurm: chain lock: %w", err)
		}
		select {
		case <-ctx.Done():
			_ = f.Close()
			return nil, fmt.Errorf("slurm: chain lock %s: %w", dir, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
