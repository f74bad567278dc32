// Package verdict is the record an ft-launcher leaves when it exits: why it
// stopped and what the level above it (ft-resumer on Slurm, the Kubernetes
// controller, a person) should do next. The file is JSON, written
// atomically, versioned by its schema field; docs/verdict.md describes
// every field. In a pod the same record, compacted to the kubelet's 4096
// bytes (Compact), is also the container's termination message.
package verdict

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/ledger"
)

// Schema is the value of the schema field of the files this version writes.
// Readers accept any file whose schema starts with SchemaPrefix and ignore
// fields they do not know; a change that removes or changes the meaning of
// a field gets a new major version.
const (
	SchemaPrefix = "ft-launcher.verdict/"
	Schema       = SchemaPrefix + "v1"
)

// EnvPath names the environment variable that sets the verdict path when
// --verdict-file is not given.
const EnvPath = "FT_LAUNCHER_VERDICT_FILE"

// DefaultNoRestartExitCode is nvrx's exit code for "do not restart"
// (--ft-no-restart-exit-code changes it).
const DefaultNoRestartExitCode = 93

// Kind is why the launcher stopped. The same kind is recorded on every node
// of a job that the rendezvous closed (the close record carries it).
type Kind string

// Outcome kinds.
const (
	// Succeeded: every rank of every node exited 0.
	Succeeded Kind = "succeeded"
	// RestartBudgetExhausted: a failure came with no restart left.
	RestartBudgetExhausted Kind = "restart_budget_exhausted"
	// NoRestart: a rank asked for the workload to be shut down
	// (ShutdownWorkload) or the job was closed with the no-restart code:
	// the level above must not restart it either.
	NoRestart Kind = "no_restart"
	// NodeExcluded: this node left the job (ExcludeThisNode, a failed
	// health check); the job may go on elsewhere.
	NodeExcluded Kind = "node_excluded"
	// RendezvousLost: the rendezvous (etcd) was unreachable past its loss
	// bound.
	RendezvousLost Kind = "rendezvous_lost"
	// NodeReplaced: this node was cut off, fenced itself out of its round
	// and a spare took its place: the job went on without it. The outer
	// loop must not resubmit the job for it (the job still runs, or ended
	// with its own verdict on the other nodes).
	NodeReplaced Kind = "node_replaced"
	// NotEnoughNodes: a round could not gather --nnodes MIN nodes in time.
	NotEnoughNodes Kind = "not_enough_nodes"
	// Signaled: the launcher was stopped by a signal (SIGTERM, SIGINT, ...).
	Signaled Kind = "signaled"
	// FatalError: the launcher could not do its job (ranks could not start,
	// a refused configuration, an internal error).
	FatalError Kind = "fatal_error"
	// Walltime: the scheduler's pre-walltime warning signal (USR1 by
	// default) arrived; the ranks were told so they could checkpoint, and
	// the job ended by its time limit, not by a failure.
	Walltime Kind = "walltime"
)

// Kinds lists every kind, for documentation and validation.
var Kinds = []Kind{Succeeded, RestartBudgetExhausted, NoRestart, NodeExcluded, NodeReplaced, RendezvousLost, NotEnoughNodes, Signaled, FatalError, Walltime}

// Valid reports whether k is a known kind.
func (k Kind) Valid() bool {
	for _, x := range Kinds {
		if x == k {
			return true
		}
	}
	return false
}

// Evidence is why a node is considered bad.
type Evidence string

// Evidence kinds.
const (
	EvidenceHang        Evidence = "hang"         // a rank of the node hung (monitor verdict)
	EvidenceHealthCheck Evidence = "health_check" // the node's health check failed
	EvidenceLost        Evidence = "lost"         // gossip or lease expiry declared it gone
	EvidenceExcluded    Evidence = "excluded"     // a rank asked ExcludeThisNode
	// EvidenceFillerReclaim: a spare's filler (or its GPUs) could not be
	// reclaimed within the bound when the spare was promoted.
	EvidenceFillerReclaim Evidence = "filler_reclaim"
	// EvidenceLauncherDied: the node's launcher died without writing a
	// verdict (killed, crashed) while its node stayed up; recorded by
	// `ft-resumer node`, the launcher's parent under srun.
	EvidenceLauncherDied Evidence = "launcher_died"
	// EvidenceRankFailures: the node's own ranks kept failing in ways that
	// point at the node rather than the code (RankFailure.NodeEvidence):
	// FailingNode says in which rounds, and which jobs in a Slurm chain.
	EvidenceRankFailures Evidence = "rank_failures"
	// EvidenceStraggler: the node's ranks were slower than the other
	// nodes' by more than the threshold for the window, and it was
	// swapped for a spare (--ft-straggler swap; docs/stragglers.md).
	EvidenceStraggler Evidence = "straggler"
)

// Quarantine is a node the job stopped using, with the evidence.
type Quarantine struct {
	Node     string    `json:"node"`           // rendezvous node id (addr/pid)
	Host     string    `json:"host,omitempty"` // host name or address, for schedulers
	Evidence Evidence  `json:"evidence"`
	Detail   string    `json:"detail"`
	Round    int       `json:"round"`
	At       time.Time `json:"at"`
}

// FinishedFlag is the state of FAULT_TOL_FINISHED_FLAG_FILE at exit.
type FinishedFlag struct {
	Path    string `json:"path,omitempty"` // "" when the variable is not set
	Present bool   `json:"present"`
}

// Cycle is one restart cycle (round) as this node saw it.
type Cycle struct {
	Round int `json:"round"`
	// Phases, in milliseconds: detecting the node loss that opened this
	// round (0 when it was not a node loss or the time is not known),
	// waiting for the round, starting the ranks, running until the first
	// ending event, stopping what still ran.
	DetectionMS  float64 `json:"detection_ms,omitempty"`
	RendezvousMS float64 `json:"rendezvous_ms"`
	// FillerReclaimMS is the time taken to reclaim this spare from its
	// filler before its ranks started (0 when it ran none).
	FillerReclaimMS float64   `json:"filler_reclaim_ms,omitempty"`
	SpawnMS         float64   `json:"spawn_ms"`
	RunMS           float64   `json:"run_ms"`
	StopMS          float64   `json:"stop_ms"`
	End             string    `json:"end"`              // success, rank_failure, hang, round_ended, signal, workload_request
	Reason          string    `json:"reason,omitempty"` // what ended it
	StartedAt       time.Time `json:"started_at"`
	// Mode is how the cycle's ranks started: "full" (every rank fresh) or
	// "in-process" (survivors of the previous cycle stayed;
	// docs/inprocess.md).
	Mode string `json:"mode,omitempty"`
	// InProcessMS are an in-process cycle's restart phases in
	// milliseconds, the slowest survivor's of each: notice, teardown,
	// rejoin, restore, first_step and total (failure -> first step).
	InProcessMS map[string]float64 `json:"inprocess_ms,omitempty"`
	// InProcessFallback says why an in-process cycle fell back to the
	// full restart (rejoin_timeout, failure_during, notice_failed); empty
	// when it did not.
	InProcessFallback string `json:"inprocess_fallback,omitempty"`
}

// Verdict is the file's content.
type Verdict struct {
	Schema       string       `json:"schema"`
	Kind         Kind         `json:"kind"`
	ExitCode     int          `json:"exit_code"`
	Reason       string       `json:"reason"`
	Finished     bool         `json:"finished"` // ranks succeeded and the finished flag exists
	FinishedFlag FinishedFlag `json:"finished_flag"`
	RunID        string       `json:"run_id"`
	Node         string       `json:"node"` // this launcher's node id
	Hostname     string       `json:"hostname"`
	PID          int          `json:"pid"`
	RestartsUsed int          `json:"restarts_used"`
	MaxRestarts  int          `json:"max_restarts"`
	LastRound    int          `json:"last_round"` // -1 when no round was assigned
	Signal       string       `json:"signal,omitempty"`
	Quarantined  []Quarantine `json:"quarantined"`
	// QuarantinedOmitted counts the entries left out of Quarantined to fit
	// a size limit (a Kubernetes termination message, see Compact); 0 in
	// the verdict file.
	QuarantinedOmitted int     `json:"quarantined_omitted,omitempty"`
	Cycles             []Cycle `json:"cycles"`       // the newest cycles, at most 64
	CyclesTotal        int     `json:"cycles_total"` // every cycle this node ran
	// Ledger is the node's leases (Active, Spare, Filler) and the peers'
	// leases this node ended (a lost node's NodeFailure).
	Ledger    []ledger.Record `json:"ledger"`
	StartedAt time.Time       `json:"started_at"`
	EndedAt   time.Time       `json:"ended_at"`
	// RecordsLost is what this launcher could not record because a write
	// failed (a full file system); nil (absent) when nothing was lost.
	RecordsLost *RecordsLost `json:"records_lost,omitempty"`

	// EtcdMemberFailures are the deaths of the embedded etcd member this
	// launcher hosts and what it did about each (absent when none).
	EtcdMemberFailures []EtcdMemberFailure `json:"etcd_member_failures,omitempty"`

	// Progress is the training this node's ranks reported over the whole
	// run (every cycle): the outer loop's evidence that a job advanced
	// (ft-resumer counts a job without any as no_progress). Nil when no
	// rank ever connected to its monitor (an uninstrumented script).
	Progress *Progress `json:"progress,omitempty"`
	// RankFailures are this node's rank failures, the newest
	// MaxRankFailures: with the rank, its exit and how far it had come,
	// the outer loop recognises the same crash in consecutive jobs
	// (ft-resumer's deterministic_failure).
	RankFailures []RankFailure `json:"rank_failures,omitempty"`
	// FailingNode is set when this node's own ranks failed with node
	// evidence in too many of its latest rounds (policy.FailingNode):
	// with a spare it was swapped out (and is in Quarantined too);
	// without one it kept its place, and outer loops (the Slurm chain,
	// the AppWrapper controller) keep the next placement off it.
	FailingNode *FailingNode `json:"failing_node,omitempty"`
	// StateWarnings are the failed write-outs of the launcher-held state
	// (--state-dir: a full disk, an unwritable directory); the saves stayed
	// in memory meanwhile (docs/state.md). Absent when none.
	StateWarnings []string `json:"state_warnings,omitempty"`
	// StateRestoredFromBuddy are the local ranks this launcher gave a
	// buddy node's copy of their state before a round (a spare taking a
	// lost node's place, --state-replicas; docs/state.md), the newest 64.
	// Absent when none.
	StateRestoredFromBuddy []BuddyRestore `json:"state_restored_from_buddy,omitempty"`

	// PrewarmAuto is what --prewarm auto learned for this run's command
	// line (docs/prewarm.md); absent without it.
	PrewarmAuto *PrewarmAuto `json:"prewarm_auto,omitempty"`

	// FenceWatchdog warns that the fence watchdog (a multi-node launcher's
	// backstop against a frozen launcher) died during the run: its deaths,
	// restarts and, when it could not be restarted, why. Absent when it
	// never died.
	FenceWatchdog *FenceWatchdog `json:"fence_watchdog,omitempty"`
}

// MaxFenceWatchdogDeaths bounds FenceWatchdog.Deaths: the newest are kept.
const MaxFenceWatchdogDeaths = 16

// FenceWatchdog is the fence watchdog's deaths during a launcher's run.
type FenceWatchdog struct {
	Restarts int                  `json:"restarts"`
	Deaths   []FenceWatchdogDeath `json:"deaths"`
	// GaveUp says why it was not restarted (the launcher then killed its
	// ranks itself and ended with fatal_error); absent while it was.
	GaveUp string `json:"gave_up,omitempty"`
}

// FenceWatchdogDeath is one death of the fence watchdog.
type FenceWatchdogDeath struct {
	PID  int       `json:"pid"`
	Exit string    `json:"exit"` // "killed by SIGKILL", "exit code 2"
	At   time.Time `json:"at"`   // when the launcher reaped it
	// NewPID and RestartMS are the watchdog started in its place and how
	// long after the death it was running with the state; absent when it
	// was not restarted.
	NewPID    int     `json:"new_pid,omitempty"`
	RestartMS float64 `json:"restart_ms,omitempty"`
}

// BuddyRestore is one local rank's state restored from a buddy's copy.
type BuddyRestore struct {
	Round     int    `json:"round"`
	LocalRank int    `json:"local_rank"`
	Rank      int    `json:"rank"`
	Step      int64  `json:"step"`
	Sender    string `json:"sender"` // the node that saved the copy (the lost one)
}

// PrewarmAuto is --prewarm auto's list at the end of a run.
type PrewarmAuto struct {
	Command   string   `json:"command"`           // the key of the command line (a hash)
	Modules   []string `json:"modules"`           // what the standbys import
	Default   bool     `json:"default,omitempty"` // nothing learned yet: the built-in list
	Cycles    int      `json:"cycles"`            // rank reports learned from, over jobs
	Unsafe    []string `json:"unsafe,omitempty"`  // left out: a CUDA context, a thread or a process at import
	Failed    []string `json:"failed,omitempty"`  // left out: could not be imported in a standby
	StateFile string   `json:"state_file,omitempty"`
}

// Progress counts what this node's ranks reported to their monitors over
// a launcher's run, summed over cycles and local ranks.
type Progress struct {
	// Steps are the training steps the ranks opened (a "step" section of
	// ft_launcher_client, or an nvrx section or heartbeat carrying a new
	// iteration).
	Steps int64 `json:"steps"`
	// Checkpoints are the checkpoint saves the ranks completed (a closed
	// "checkpointing" section, or a changed checkpoint_iteration_file).
	Checkpoints int64 `json:"checkpoints"`
	// Heartbeats are the heartbeats the ranks sent (nvrx clients send one
	// per iteration; weaker evidence than a step).
	Heartbeats int64 `json:"heartbeats"`
	// FirstIteration and LastIteration are the lowest and highest
	// training iteration a rank reported (absent when none did).
	FirstIteration *int64 `json:"first_iteration,omitempty"`
	LastIteration  *int64 `json:"last_iteration,omitempty"`
	// LastStepAt is when the last step was opened (zero: none).
	LastStepAt time.Time `json:"last_step_at,omitzero"`
}

// Advanced reports whether p is evidence that the training moved on: a
// step, a checkpoint, a heartbeat, or an iteration beyond the first.
func (p *Progress) Advanced() bool {
	if p == nil {
		return false
	}
	if p.Steps > 0 || p.Checkpoints > 0 || p.Heartbeats > 0 {
		return true
	}
	return p.FirstIteration != nil && p.LastIteration != nil && *p.LastIteration > *p.FirstIteration
}

// MaxRankFailures bounds Verdict.RankFailures.
const MaxRankFailures = 16

// RankFailure is one rank failure this node saw.
type RankFailure struct {
	Round     int `json:"round"`
	Rank      int `json:"rank"` // global rank; -1 when not known
	LocalRank int `json:"local_rank"`
	// ExitCode is the rank's exit status (0 when it was killed by a
	// signal or hung), Signal the signal that killed it ("SIGSEGV").
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	// Kind is "crash" (the process died) or "hang" (its monitor killed it).
	Kind string `json:"kind"`
	// Steps are the steps the rank opened in that cycle before it failed;
	// Iteration is the last training iteration it reported (absent when
	// it reported none).
	Steps     int64     `json:"steps"`
	Iteration *int64    `json:"iteration,omitempty"`
	At        time.Time `json:"at"`
	// Cause is what the rank's own output said about the failure, when it
	// said anything: an error file, its last traceback, a fatal signal's
	// stack.
	Cause *FailureCause `json:"cause,omitempty"`
	// Bystander: the rank left a collective because a rank it waited for
	// hung and was killed (the stacks named that one): a consequence,
	// never evidence against this rank's node.
	Bystander bool `json:"bystander,omitempty"`
}

// FailureCause is what a failed rank's own output says about its failure.
type FailureCause struct {
	// Exception and Message: the uncaught exception ("RuntimeError", its
	// message's first line, at most MaxCauseMessage bytes).
	Exception string `json:"exception,omitempty"`
	Message   string `json:"message,omitempty"`
	// Signal: the fatal signal that killed it ("SIGSEGV"), when its stack
	// was written (faulthandler).
	Signal string `json:"signal,omitempty"`
	// Where is the deepest frame in the user's code ("train.py:88 in
	// step"); the innermost frame when none is the user's.
	Where string `json:"where,omitempty"`
	// Source is where it was read: error_file (TORCHELASTIC_ERROR_FILE),
	// excepthook (the launcher's hook in the rank), output (the last
	// traceback in the rank's stderr log), faulthandler (a fatal signal's
	// stack).
	Source string `json:"source"`
}

// SameAs reports whether f and o are the same rank failing the same way:
// the same exception at the same place, or the same fatal signal at the
// same place (FailureCause.Same); without a cause on either, killed by
// the same signal. A hang, or an exit with no cause, is never the same.
func (f RankFailure) SameAs(o RankFailure) bool {
	if f.Rank != o.Rank || f.Rank < 0 || f.Kind != FailureCrash || o.Kind != FailureCrash {
		return false
	}
	if f.Cause != nil && o.Cause != nil {
		return f.Cause.Same(*o.Cause)
	}
	return f.Cause == nil && o.Cause == nil && f.Signal != "" && f.Signal == o.Signal
}

// MaxCauseMessage bounds FailureCause.Message.
const MaxCauseMessage = 256

// Same reports whether two failures are the same failure: the same
// exception at the same place, or the same fatal signal at the same
// place. Messages are left out: they often hold addresses, ports or
// times that differ from one run to the next.
func (c FailureCause) Same(o FailureCause) bool {
	return c.Where != "" && c.Where == o.Where && c.Exception == o.Exception && c.Signal == o.Signal &&
		(c.Exception != "" || c.Signal != "")
}

// String is one line: "RuntimeError: boom at train.py:88 in step".
func (c FailureCause) String() string {
	what := c.Exception
	if c.Message != "" {
		what += ": " + c.Message
	}
	if c.Signal != "" {
		what = c.Signal
	}
	if c.Where != "" {
		what += " at " + c.Where
	}
	return what
}

// MaxFailingNodeDetail bounds FailingNode.Detail.
const MaxFailingNodeDetail = 1024

// FailingNode is a node's record that its ranks keep failing in ways that
// point at it.
type FailingNode struct {
	// Rounds are the rounds whose failures counted, among the node's
	// latest Window rounds.
	Rounds []int `json:"rounds"`
	Window int   `json:"window"`
	// Detail names the failures ("round 4: rank 3 exited 1 with no
	// explanation; ..."), at most MaxFailingNodeDetail bytes.
	Detail string `json:"detail"`
	// SwappedOut: the node left the job and a spare took its place.
	SwappedOut bool `json:"swapped_out"`
}

// NodeEvidence reports whether f counts against the node it ran on
// (docs/spares.md, "A node that keeps failing"): a hang; a death by a
// signal that is not a request to stop (SIGSEGV, SIGBUS, SIGILL, SIGFPE,
// SIGABRT, SIGKILL from the OOM killer, SIGSYS, SIGTRAP); an exit that
// left no explanation; an exception whose text names the hardware, the
// driver or an I/O error (CUDA, NCCL, ECC, Xid, NVML, cuDNN/cuBLAS
// internal errors, "Input/output error"). Any other Python exception is
// the code's: it follows the rank to whatever node runs it, and the
// same-failure rule stops it (SameAs).
func (f RankFailure) NodeEvidence() bool {
	if f.Bystander {
		return false
	}
	if f.Kind == FailureHang {
		return true
	}
	if f.Kind != FailureCrash {
		return false
	}
	sig := f.Signal
	if f.Cause != nil && f.Cause.Signal != "" {
		sig = f.Cause.Signal
	}
	if sig != "" {
		return nodeSignal(sig)
	}
	if f.Cause == nil || f.Cause.Exception == "" {
		return f.ExitCode != 0
	}
	text := strings.ToLower(f.Cause.Exception + ": " + f.Cause.Message)
	// Lower case texts that mark an exception as the node's (hardware,
	// driver, disk) rather than the code's.
	for _, k := range [...]string{"cuda error", "cudaerror", "nccl", "uncorrectable", " ecc ", "ecc error", "xid",
		"nvml", "cudnn_status_internal_error", "cublas_status_internal_error", "cublas_status_execution_failed",
		"unspecified launch failure", "input/output error", "[errno 5]"} {
		if strings.Contains(text, k) {
			return true
		}
	}
	return false
}

// Text is the failure in a few words: "rank 3 killed by SIGBUS", "rank 1
// exited 1 with no explanation", "rank 0 hung", or the rank and its
// cause.
func (f RankFailure) Text() string {
	what := ""
	switch {
	case f.Kind == FailureHang:
		what = "hung"
	case f.Cause != nil:
		what = f.Cause.String()
	case f.Signal != "":
		what = "killed by " + f.Signal
	default:
		what = fmt.Sprintf("exited %d with no explanation", f.ExitCode)
	}
	return fmt.Sprintf("rank %d %s", f.Rank, what)
}

// nodeSignal reports whether a death by sig counts against the node: the
// faults a process raises on itself (a bad memory access, an abort).
// SIGTERM, SIGINT, SIGHUP, SIGUSR* and SIGKILL come from others (an
// operator, a scheduler, the OOM killer) and count against nothing.
func nodeSignal(sig string) bool {
	switch sig {
	// Not SIGKILL: another process sends it (the OOM killer, an operator,
	// a scheduler), and says nothing of the node; the launcher's own kill
	// of a hung rank is recorded as the hang.
	case "SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT", "SIGSYS", "SIGTRAP":
		return true
	}
	return false
}

// RankFailure kinds.
const (
	FailureCrash = "crash"
	FailureHang  = "hang"
)

// RecordsLost counts what a launcher dropped because its writes failed.
// The launcher logs the first failure of each kind once, at error level,
// and counts every one; training goes on.
type RecordsLost struct {
	// EventLogEvents and EventLogBytes are the event-log lines (and their
	// bytes) that could not be written whole.
	EventLogEvents int64 `json:"event_log_events"`
	EventLogBytes  int64 `json:"event_log_bytes"`
	// RankOutputBytes is rank output (redirected or teed to the rank's
	// stdout.log or stderr.log) that could not be written to its file.
	RankOutputBytes int64 `json:"rank_output_bytes"`
}

// Any reports whether anything was lost.
func (r RecordsLost) Any() bool {
	return r.EventLogEvents > 0 || r.EventLogBytes > 0 || r.RankOutputBytes > 0
}

// EtcdMemberFailure is one death of the embedded etcd member a launcher
// hosts (docs/verdict.md).
type EtcdMemberFailure struct {
	Member string    `json:"member"` // m<i>; "" for a single-member etcd
	PID    int       `json:"pid"`
	Exit   string    `json:"exit"` // "killed by SIGKILL", "exit code 1"
	At     time.Time `json:"at"`   // when the launcher reaped it
	// Action is what the launcher did: EtcdMemberRejoined,
	// EtcdMemberReplaced, EtcdMemberGaveUp or EtcdMemberNotRestarted.
	Action      EtcdMemberAction `json:"action"`
	Attempts    int              `json:"attempts"` // restart attempts made for this death
	RestartedAt *time.Time       `json:"restarted_at,omitempty"`
	Error       string           `json:"error,omitempty"` // why the last attempt failed
}

// EtcdMemberAction is what the launcher did about a death of its etcd
// member (EtcdMemberFailure.Action; the etcd_member_restarted record's
// "how").
type EtcdMemberAction string

// EtcdMemberFailure actions.
const (
	EtcdMemberRejoined     EtcdMemberAction = "rejoined"      // restarted on its intact data dir
	EtcdMemberReplaced     EtcdMemberAction = "replaced"      // removed and re-added as a new member on a fresh dir
	EtcdMemberGaveUp       EtcdMemberAction = "gave_up"       // the restart limit was spent, or it cannot be restarted
	EtcdMemberNotRestarted EtcdMemberAction = "not_restarted" // the launcher was shutting down, or the member was stopped cleanly from outside
)

// Write stores v at path atomically (0644), setting Schema.
func Write(path string, v Verdict) error {
	if !v.Kind.Valid() {
		return fmt.Errorf("verdict: unknown kind %q", v.Kind)
	}
	v.Schema = Schema
	if v.Quarantined == nil {
		v.Quarantined = []Quarantine{}
	}
	if v.Cycles == nil {
		v.Cycles = []Cycle{}
	}
	if v.Ledger == nil {
		v.Ledger = []ledger.Record{}
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("verdict: encode: %w", err)
	}
	if err := atomicfile.Write(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("verdict: %w", err)
	}
	return nil
}

// Remove takes away the verdict at path after a new one could not be
// written there, so that no outer loop acts on an earlier run's verdict:
// the file is removed or, where its directory refuses that (read-only), cut
// to 0 bytes, which Read and Parse refuse as not a verdict (ft-resumer and
// the Kubernetes adapter skip it). A path that does not exist, or that is a
// directory (never a verdict), is left as it is.
func Remove(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil && st.IsDir() {
		return nil
	}
	rmErr := os.Remove(path)
	if rmErr == nil || errors.Is(rmErr, fs.ErrNotExist) {
		return nil
	}
	if tErr := os.Truncate(path, 0); tErr != nil {
		return fmt.Errorf("verdict: the previous verdict %s stays: cannot remove it (%v) nor empty it (%v)", path, rmErr, tErr)
	}
	return nil
}

// ErrSchema is returned by Read for a file that is not a verdict of a known
// major version.
var ErrSchema = errors.New("verdict: unknown schema")

// Read loads a verdict file.
func Read(path string) (Verdict, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Verdict{}, fmt.Errorf("verdict: %w", err)
	}
	return Parse(b)
}

// Parse decodes a verdict (a file's content, or a Kubernetes termination
// message).
func Parse(b []byte) (Verdict, error) {
	var v Verdict
	if err := json.Unmarshal(b, &v); err != nil {
		return Verdict{}, fmt.Errorf("verdict: decode: %w", err)
	}
	if v.Schema != Schema {
		return Verdict{}, fmt.Errorf("%w %q (want %q)", ErrSchema, v.Schema, Schema)
	}
	return v, nil
}

// TruncateDetail cuts s to at most n bytes on a character boundary, with
// an ellipsis when it was cut.
func TruncateDetail(s string, n int) string { return truncate(s, n) }
