package eventlog

import (
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The event records: one struct per event kind, the contract between what
// the launcher writes (Log.Emit) and what tools read (Decode, and through
// it ft-resumer report). The JSON names are the on-disk format that
// existing logs and users' tools rely on: never rename one. A field written
// only sometimes is a pointer with omitempty (Opt makes one), so that it is
// absent exactly when it was absent before records were typed; a field
// always written has no omitempty, zero values included.
//
// Why one file of over 600 lines: it is one list and no logic, the schema
// of the core's events (agent, rank monitors, in-process restart,
// launcher-held state): the kind constants, a struct per kind and the Kind
// methods. Adding or reviewing a record means reading it beside its
// neighbours' JSON names and Kind lines, and docs/architecture.md and
// docs/report.md point here as the one place to look; splitting it would
// scatter that list without separating any behaviour. The records of the
// components with their own callbacks are in components.go.

// Kinds of the rank monitors' records (package monitor) and of the
// filler's reclaim; the other components' kinds are in components.go.
const (
	RankFirstHeartbeat = "rank_first_heartbeat"
	RankFirstStep      = "rank_first_step"
	RankCheckpoint     = "rank_checkpoint"
	RankSteps          = "rank_steps"
	LauncherStall      = "launcher_stall"
	FillerReclaimed    = "filler_reclaimed"
)

// Kinds of the in-process restart (agent/inprocess.go).
const (
	InProcessKept      = "inprocess_kept"
	InProcessNotice    = "inprocess_notice"
	InProcessRejoined  = "inprocess_rejoined"
	InProcessFirstStep = "inprocess_first_step"
	InProcessFallback  = "inprocess_fallback"
	InProcessReplaced  = "inprocess_replaced"
)

// Kinds of the launcher-held state (package state, docs/state.md).
const (
	StateSave          = "state_save"
	StatePersisted     = "state_persisted"
	StatePersistFailed = "state_persist_failed"
	StateRestore       = "state_restore"
	StateStaleRemoved  = "state_stale_removed"
	// A save that failed its integrity check (docs/state.md, "Integrity").
	StateCorrupt = "state_corrupt"
	// Replication to buddy nodes (--state-replicas).
	StateReplicaSent       = "state_replica_sent"
	StateReplicaFailed     = "state_replica_failed"
	StateReplicaRefused    = "state_replica_refused"
	StateReplicaReceived   = "state_replica_received"
	StateReplicaDiscarded  = "state_replica_discarded"
	StateRestoredFromBuddy = "state_restored_from_buddy"
)

// Opt returns a pointer to v: the value of an optional field that is
// written.
func Opt[T any](v T) *T { return &v }

// LauncherStartedEvent: the launcher began (agent).
type LauncherStartedEvent struct {
	PID          int    `json:"pid"`
	NProcPerNode int    `json:"nproc_per_node"`
	MaxRestarts  int    `json:"max_restarts"`
	NNodes       string `json:"nnodes"` // "MIN:MAX"
	Script       string `json:"script"`
}

// CycleStartedEvent: this node's ranks of a round were started.
type CycleStartedEvent struct {
	Round        int    `json:"round"`
	GroupRank    int    `json:"group_rank"`
	WorldSize    int    `json:"world_size"`
	PIDs         []int  `json:"pids"` // by local rank
	MasterAddr   string `json:"master_addr"`
	MasterPort   int    `json:"master_port"`
	RestartsUsed int    `json:"restarts_used"`
	// Mode and Survivors: an in-process restart kept these local ranks.
	Mode      policy.Mode `json:"mode,omitempty"`
	Survivors []int       `json:"survivors,omitempty"`
}

// SignalReceivedEvent: a signal reached the launcher.
type SignalReceivedEvent struct {
	Round  *int       `json:"round,omitempty"` // absent before any round
	Signal string     `json:"signal"`
	State  AgentState `json:"state,omitempty"`
	// While stopping: a repeated signal (Repeat) within WindowS of the
	// first, and whether it escalated to SIGKILL.
	Repeat    bool     `json:"repeat,omitempty"`
	Escalated *bool    `json:"escalated,omitempty"`
	WindowS   *float64 `json:"window_s,omitempty"`
}

// StopEscalatedEvent: SIGTERM's grace ran out for a rank; SIGKILL sent.
type StopEscalatedEvent struct {
	Round     int     `json:"round"`
	LocalRank int     `json:"local_rank"`
	GraceS    float64 `json:"grace_s"`
}

// WalltimeWarningEvent: the scheduler's pre-walltime signal, forwarded.
type WalltimeWarningEvent struct {
	Round  int    `json:"round"`
	Signal string `json:"signal"`
}

// WorkloadRequestEvent: a rank asked for an action (nvrx workload control).
type WorkloadRequestEvent struct {
	Round       int            `json:"round"`
	Rank        int            `json:"rank"`
	Action      WorkloadAction `json:"action"`
	Description string         `json:"description"`
}

// RankHangEvent: a rank's monitor found it hung and killed it.
type RankHangEvent struct {
	Round           int      `json:"round"`
	LocalRank       int      `json:"local_rank"`
	Rank            int      `json:"rank"`
	TimeoutKind     HangKind `json:"timeout_kind"`
	Section         string   `json:"section"`
	TimeoutS        float64  `json:"timeout_s"`
	ElapsedS        float64  `json:"elapsed_s"`
	Signal          string   `json:"signal"`
	DetectLatencyMS float64  `json:"detect_latency_ms"`
	// SignalledAt: when it was killed; the stall began ElapsedS before it.
	SignalledAt        time.Time `json:"signalled_at"`
	EscalatedToSIGKILL bool      `json:"escalated_to_sigkill"`
	// DefaultTimeout: the clock was the launcher's default (no rank
	// timeout configured), not a configured, computed or client-sent one.
	DefaultTimeout bool `json:"default_timeout,omitempty"`
	// Judged: killed because the stacks named it the rank that hung,
	// before its own clock ran out; Finding: what the stacks said
	// (rank_stacks' text), when they were taken.
	Judged  bool   `json:"judged,omitempty"`
	Finding string `json:"finding,omitempty"`
}

// RankFailureCauseEvent: what a failed rank's own output says about its
// failure (ranklogs.Explain).
type RankFailureCauseEvent struct {
	Round     int                  `json:"round"`
	LocalRank int                  `json:"local_rank"`
	Rank      int                  `json:"rank"`
	Cause     verdict.FailureCause `json:"cause"`
}

// NodeFailingEvent: this node's own ranks failed in ways that point at
// the node in Rounds, too many of its latest Window rounds
// (policy.FailingNode). SwappedOut: it left the job and a spare takes its
// place; otherwise it keeps its place (no spare stood by, or another
// node's report ended the round) and the verdict names it for the outer
// loops.
type NodeFailingEvent struct {
	Round      int    `json:"round"`
	Rounds     []int  `json:"rounds"`
	Window     int    `json:"window"`
	Detail     string `json:"detail"`
	SwappedOut bool   `json:"swapped_out"`
	Why        string `json:"why,omitempty"` // why it was not swapped out
}

// RankSpeedEvent: this node's ranks' measured speed over the latest
// interval (package straggler): each rank's busy share and its speed
// relative to the other nodes' ranks (-1: not judged), and the node's.
type RankSpeedEvent struct {
	Round     int              `json:"round"`
	WindowS   float64          `json:"window_s"`
	NodeSpeed float64          `json:"node_speed"`
	SlowForS  float64          `json:"slow_for_s,omitempty"`
	Ranks     []RankSpeedEntry `json:"ranks"`
	Why       string           `json:"why,omitempty"` // why nothing was judged
}

// RankSpeedEntry is one rank of a RankSpeedEvent.
type RankSpeedEntry struct {
	Rank      int     `json:"rank"`
	LocalRank int     `json:"local_rank"`
	Busy      float64 `json:"busy"`
	Speed     float64 `json:"speed"`
	Source    string  `json:"source,omitempty"` // cpu, or compute (its "compute" sections)
}

// StragglerEvent: this node was found a straggler (slower than the other
// nodes by more than the threshold for the window) and Action says what
// was done: "reported" (--ft-straggler report), "kept" (swap, but no
// spare stood by: reported, never killed), "swapping" (swap: waiting for
// the next state save), "swapped" (it left; a spare takes its place).
type StragglerEvent struct {
	Round    int     `json:"round"`
	Speed    float64 `json:"speed"`
	SlowForS float64 `json:"slow_for_s"`
	Mode     string  `json:"mode"`
	Action   string  `json:"action"`
	Why      string  `json:"why,omitempty"`
}

// HangDismissedEvent: a rank's default clock expired, and the stacks and
// the ranks' activity showed no hang (the rank they name is busy, or in a
// slow phase): nothing was killed, the clocks wait WaitS longer
// (docs/timeouts.md).
type HangDismissedEvent struct {
	Round     int     `json:"round"`
	LocalRank int     `json:"local_rank"` // whose clock expired
	Why       string  `json:"why"`
	SilentS   float64 `json:"silent_s"`
	WaitS     float64 `json:"wait_s"`
	TookMS    float64 `json:"took_ms"`
}

// RankStacksEvent: a rank's clock expired and the stacks of every local
// rank were taken before any was killed (docs/timeouts.md, "Which rank
// hung").
type RankStacksEvent struct {
	Round int `json:"round"`
	// Known: the evidence singles the culprits out; else Culprits holds
	// the first rank to fall silent.
	Known    bool             `json:"known"`
	Culprits []int            `json:"culprits"`
	Why      string           `json:"why"`
	Text     string           `json:"text"`
	TookMS   float64          `json:"took_ms"` // the first expiry to the finding
	Ranks    []RankStacksRank `json:"ranks"`
}

// RankStacksRank is one rank in a RankStacksEvent.
type RankStacksRank struct {
	LocalRank  int    `json:"local_rank"`
	Rank       int    `json:"rank"`
	PID        int    `json:"pid"`
	State      string `json:"state"` // dumped, stopped, no_hook, gone, no_answer
	Activity   string `json:"activity,omitempty"`
	Place      string `json:"place,omitempty"`
	Collective string `json:"collective,omitempty"`
	File       string `json:"file,omitempty"` // its stacks, beside its logs
	// The NCCL flight recorder, where it is on: taken, none, no_answer;
	// its file beside the logs and its one-line reading.
	FlightRecorder     string `json:"flight_recorder,omitempty"`
	FlightRecorderFile string `json:"flight_recorder_file,omitempty"`
	FlightRecorderText string `json:"flight_recorder_text,omitempty"`
}

// RankExitedEvent: a rank process ended.
type RankExitedEvent struct {
	Round     int    `json:"round"`
	LocalRank int    `json:"local_rank"`
	Rank      int    `json:"rank"`
	PID       int    `json:"pid"`
	ExitCode  int    `json:"exit_code"`
	Signal    string `json:"signal,omitempty"` // the signal that killed it
}

// SpareSwapEvent: this spare was promoted; the phases of the swap.
type SpareSwapEvent struct {
	Round           int      `json:"round"`
	GroupRank       int      `json:"group_rank"`
	FillerPreempted bool     `json:"filler_preempted"`
	DetectionMS     float64  `json:"detection_ms"`
	FillerReclaimMS float64  `json:"filler_reclaim_ms"`
	SpawnMS         float64  `json:"spawn_ms"`
	RendezvousMS    *float64 `json:"rendezvous_ms,omitempty"`
	TotalMS         *float64 `json:"total_ms,omitempty"`
}

// RoundEndedEvent: a round ended. Node, where written, names the node
// that ended it (it replaces the writer's node in the line).
type RoundEndedEvent struct {
	Round     *int            `json:"round,omitempty"`
	JobClosed bool            `json:"job_closed"`
	CloseKind *verdict.Kind   `json:"kind,omitempty"` // when the job was closed before a round
	Reason    string          `json:"reason"`
	ExitCode  *int            `json:"exit_code,omitempty"`
	Node      *string         `json:"node,omitempty"`
	Cause     *policy.Failure `json:"cause,omitempty"`
	Fenced    bool            `json:"fenced,omitempty"`
}

// JobFailedEvent: the job ended in failure, as this node saw it.
type JobFailedEvent struct {
	Round      *int          `json:"round,omitempty"`
	CloseKind  *verdict.Kind `json:"kind,omitempty"`
	Reason     string        `json:"reason"`
	ExitCode   *int          `json:"exit_code,omitempty"`
	RanksClean *bool         `json:"ranks_clean,omitempty"`
}

// JobSucceededEvent: the job succeeded.
type JobSucceededEvent struct {
	Round int `json:"round"`
}

// StandbyEvent: this node was parked beyond --nnodes MIN for a round.
type StandbyEvent struct {
	Round int `json:"round"`
}

// RestartEvent: the job restarts after a round.
type RestartEvent struct {
	AfterRound   int            `json:"after_round"`
	Action       *policy.Action `json:"action,omitempty"`
	Reason       string         `json:"reason"`
	RestartsUsed *int           `json:"restarts_used,omitempty"`
	Mode         *policy.Mode   `json:"mode,omitempty"`
}

// FencedEvent: this node's lease could not be renewed; its ranks were
// killed before peers could replace it.
type FencedEvent struct {
	Round          int    `json:"round"`
	Reason         string `json:"reason"`
	RanksStoppedAt string `json:"ranks_stopped_at"` // RFC 3339
}

// FencedByWatchdogEvent: the fence watchdog killed this node's ranks.
type FencedByWatchdogEvent struct {
	Reason     string  `json:"reason"`
	PGIDs      []int   `json:"pgids"`
	LateMS     float64 `json:"late_ms"`
	ReadAfterS float64 `json:"read_after_s"`
}

// FenceWatchdogRestartedEvent: the fence watchdog died (Exit: "killed by
// SIGKILL", "exit code 2") after running ServedS and a new one (NewPID)
// was started with the state, RestartMS after the death was reaped.
type FenceWatchdogRestartedEvent struct {
	OldPID    int     `json:"old_pid"`
	NewPID    int     `json:"new_pid"`
	Exit      string  `json:"exit"`
	ExitCode  int     `json:"exit_code"`
	Signal    string  `json:"signal,omitempty"`
	ServedS   float64 `json:"served_s"`
	RestartMS float64 `json:"restart_ms"`
	Attempts  int     `json:"attempts"`
	Guarded   int     `json:"guarded"`
	Armed     bool    `json:"armed"`
	Restarts  int     `json:"restarts"`
}

// FenceWatchdogGaveUpEvent: the fence watchdog was not restarted (Reason);
// the launcher SIGKILLed the guarded process groups (PGIDs) itself.
type FenceWatchdogGaveUpEvent struct {
	OldPID int    `json:"old_pid"`
	Exit   string `json:"exit"`
	Reason string `json:"reason"`
	PGIDs  []int  `json:"pgids"`
}

// TrainingFinishedEvent: the training's finished flag was found.
type TrainingFinishedEvent struct {
	Round int    `json:"round"`
	Flag  string `json:"flag"`
}

// VerdictEvent: the outcome, as written to the verdict file.
type VerdictEvent struct {
	VerdictKind  verdict.Kind `json:"kind"`
	ExitCode     int          `json:"exit_code"`
	Reason       string       `json:"reason"`
	RestartsUsed int          `json:"restarts_used"`
	LastRound    int          `json:"last_round"`
	Finished     bool         `json:"finished"`
	Quarantined  int          `json:"quarantined"`
}

// VerdictLostEvent: the verdict file could not be written.
type VerdictLostEvent struct {
	Path     string `json:"path"`
	Err      string `json:"err"`
	ExitCode int    `json:"exit_code"`
}

// LedgerEvent: a lease of a node began, ended or counted a restart.
type LedgerEvent struct {
	Record ledger.Record `json:"record"`
}

// InProcessKeptEvent: the survivors of a failure stay in their processes.
type InProcessKeptEvent struct {
	Round     int    `json:"round"`
	Survivors []int  `json:"survivors"`
	Failed    []int  `json:"failed"`
	Why       string `json:"why"`
}

// InProcessNoticeEvent: a survivor was sent the next round's notice.
type InProcessNoticeEvent struct {
	Round       int     `json:"round"`
	LocalRank   int     `json:"local_rank"`
	Rank        int     `json:"rank"`
	WorldSize   int     `json:"world_size"`
	StorePrefix string  `json:"store_prefix"`
	NoticeMS    float64 `json:"notice_ms"`
}

// InProcessRejoinedEvent: a survivor's new process group is up.
type InProcessRejoinedEvent struct {
	Round     int     `json:"round"`
	LocalRank int     `json:"local_rank"`
	TeardownS float64 `json:"teardown_s"`
	RejoinS   float64 `json:"rejoin_s"`
}

// InProcessFirstStepEvent: a survivor finished its first step of the round.
type InProcessFirstStepEvent struct {
	Round         int     `json:"round"`
	LocalRank     int     `json:"local_rank"`
	TeardownS     float64 `json:"teardown_s"`
	RejoinS       float64 `json:"rejoin_s"`
	RestoreS      float64 `json:"restore_s"`
	FirstStepS    float64 `json:"first_step_s"`
	SinceFailureS float64 `json:"since_failure_s"`
}

// InProcessFallbackEvent: an in-process restart fell back to the full one.
type InProcessFallbackEvent struct {
	Round     int    `json:"round"`
	Why       string `json:"why"`
	Reason    string `json:"reason"`
	LocalRank *int   `json:"local_rank,omitempty"` // the survivor that caused it
}

// InProcessReplacedEvent: a kept survivor was started afresh.
type InProcessReplacedEvent struct {
	Round     int     `json:"round"`
	LocalRank int     `json:"local_rank"`
	Exit      *string `json:"exit,omitempty"` // it ended before its round
	// Why "rejoin_timeout": it did not rejoin and was killed; PID is its
	// replacement.
	Why    *string `json:"why,omitempty"`
	PID    *int    `json:"pid,omitempty"`
	Reason *string `json:"reason,omitempty"`
}

// RankFirstHeartbeatEvent: a rank's first heartbeat of a cycle (monitor).
type RankFirstHeartbeatEvent struct {
	Round       int       `json:"round"`
	LocalRank   int       `json:"local_rank"`
	Rank        int       `json:"rank"`
	At          time.Time `json:"at"`
	SinceInitMS float64   `json:"since_init_ms"`
}

// RankFirstStepEvent: a rank's first "step" section of a cycle (monitor).
type RankFirstStepEvent struct {
	Round     int       `json:"round"`
	LocalRank int       `json:"local_rank"`
	Rank      int       `json:"rank"`
	At        time.Time `json:"at"`
	Iteration *int64    `json:"iteration,omitempty"`
}

// RankCheckpointEvent: a rank closed a "checkpointing" section (monitor).
type RankCheckpointEvent struct {
	Round      int       `json:"round"`
	LocalRank  int       `json:"local_rank"`
	Rank       int       `json:"rank"`
	OpenedAt   time.Time `json:"opened_at"`
	At         time.Time `json:"at"`
	DurationMS float64   `json:"duration_ms"`
	Steps      int64     `json:"steps"`
}

// RankStepsEvent: a rank's steps of a cycle, at its end (monitor).
type RankStepsEvent struct {
	Round                int       `json:"round"`
	LocalRank            int       `json:"local_rank"`
	Rank                 int       `json:"rank"`
	Steps                int64     `json:"steps"`
	StepsSinceCheckpoint int64     `json:"steps_since_checkpoint"`
	Checkpoints          int64     `json:"checkpoints"`
	LastStepAt           time.Time `json:"last_step_at"`
}

// LauncherStallEvent: the launcher itself did not run (monitor).
type LauncherStallEvent struct {
	From       time.Time `json:"from"`
	To         time.Time `json:"to"`
	DurationMS float64   `json:"duration_ms"`
}

// FillerReclaimedEvent: the spare's filler work was stopped (filler).
type FillerReclaimedEvent struct {
	TookMS float64 `json:"took_ms"`
}

// StateSaveEvent: the launcher's store saw a rank's new save in its
// segment (state). SaveMS is the rank's stall for it; Saves the saves
// committed since the store's previous look (1 unless it missed some).
type StateSaveEvent struct {
	LocalRank int     `json:"local_rank"`
	Rank      int     `json:"rank"`
	Step      int64   `json:"step"`
	Seq       int64   `json:"seq"`
	Bytes     int64   `json:"bytes"`
	SaveMS    float64 `json:"save_ms"`
	Saves     int64   `json:"saves"`
}

// StatePersistedEvent: a save was written out to the state directory.
type StatePersistedEvent struct {
	LocalRank int           `json:"local_rank"`
	Rank      int           `json:"rank"`
	Step      int64         `json:"step"`
	Seq       int64         `json:"seq"`
	Bytes     int64         `json:"bytes"`
	File      string        `json:"file"`
	Reason    PersistReason `json:"reason"`
	WriteMS   float64       `json:"write_ms"`
}

// StatePersistFailedEvent: a write-out failed; the save stays in memory.
type StatePersistFailedEvent struct {
	LocalRank int           `json:"local_rank"`
	Reason    PersistReason `json:"reason"`
	Error     string        `json:"error"`
}

// StateRestoreEvent: a rank's load() restored its state (or found none:
// Source and Step absent), as the rank noted it for its launcher's store.
// Source: memory, buddy (memory that a buddy's copy filled before the
// round: a spare or a renumbered rank after a node loss), file; after a
// peer heal, peer (a replacement that received a survivor's state) or
// live (a survivor that kept its own).
type StateRestoreEvent struct {
	LocalRank int          `json:"local_rank"`
	Rank      int          `json:"rank"`
	Round     int          `json:"round"`
	Step      *int64       `json:"step,omitempty"`
	Source    *StateSource `json:"source,omitempty"`
	LoadMS    float64      `json:"load_ms"`
	At        time.Time    `json:"at"`
	// A peer heal after an in-process rejoin (docs/state.md, "Peer
	// heal"): peer, kept, load or fallback; why; the survivor a
	// replacement's state came from; bytes sent; when a survivor
	// completed the healed step (the end of the failed round's kept work).
	Heal     HealOutcome `json:"heal,omitempty"`
	Why      string      `json:"why,omitempty"`
	FromRank *int        `json:"from_rank,omitempty"`
	Bytes    int64       `json:"bytes,omitempty"`
	StepAt   *time.Time  `json:"step_at,omitempty"`
}

// StateCorruptEvent: a save failed its integrity check and was not used.
// By "load": a rank's load() passed over it (its CRC, or its descriptor
// or payload inconsistent) and restored UsedSource's UsedStep instead
// (absent: no source was intact and load() raised). By "write-out": the
// launcher's writer found the save's payload no longer matching its
// saver's CRC and wrote nothing (the previous file stays). Source:
// memory or file; Slot: the segment's slot (memory); Seq and Step: the
// damaged save's, when its descriptor could be read.
type StateCorruptEvent struct {
	LocalRank  int          `json:"local_rank"`
	Rank       int          `json:"rank"`
	By         CorruptBy    `json:"by"`
	Source     StateSource  `json:"source"` // memory, file
	Slot       *int         `json:"slot,omitempty"`
	Seq        *int64       `json:"seq,omitempty"`
	Step       *int64       `json:"step,omitempty"`
	Error      string       `json:"error"`
	UsedSource *StateSource `json:"used_source,omitempty"`
	UsedStep   *int64       `json:"used_step,omitempty"`
}

// CorruptBy is who found a save corrupt (StateCorruptEvent.By).
type CorruptBy string

// StateCorruptEvent.By values.
const (
	CorruptByLoad     CorruptBy = "load"      // a rank's load() passed over it
	CorruptByWriteOut CorruptBy = "write-out" // the launcher's writer did not write it out
)

// StateStaleRemovedEvent: a launcher at its start removed the segments'
// directory of a launcher that died without removing it (SIGKILL): no
// process held the directory's owner lock any more. PID is the dead
// launcher's (from the directory's name; 0 when it has none), Bytes what
// the segments held.
type StateStaleRemovedEvent struct {
	Dir   string `json:"dir"`
	PID   int    `json:"pid"`
	Bytes int64  `json:"bytes"`
	Files int    `json:"files"`
}

// StateReplicaSentEvent: a rank's newest save reached a buddy, verified
// there (the sender). Skipped: the saves since the previous copy that
// this one coalesced away.
type StateReplicaSentEvent struct {
	Buddy     string  `json:"buddy"`
	LocalRank int     `json:"local_rank"`
	Rank      int     `json:"rank"`
	Step      int64   `json:"step"`
	Seq       int64   `json:"seq"`
	Bytes     int64   `json:"bytes"`
	SendMS    float64 `json:"send_ms"`
	Skipped   int64   `json:"skipped"`
}

// StateReplicaFailedEvent: a copy to a buddy failed (the sender); the next
// try, after RetryInMS, sends the newest save. ElapsedMS: of the sync
// that failed.
type StateReplicaFailedEvent struct {
	Buddy     string `json:"buddy"`
	LocalRank int    `json:"local_rank"`
	Error     string `json:"error"`
	ElapsedMS int64  `json:"elapsed_ms"`
	RetryInMS int64  `json:"retry_in_ms"`
}

// StateReplicaRefusedEvent: copies refused. On the sender: Buddy refused
// the copies of a rank (it relies on the files from then on). On the
// receiver: a peer refused (Reason: not a member of the round, a copy in
// another node's name, a bad HMAC tag, an oversized copy, a silent
// connection, too many connections, another job or protocol version;
// Peer, and Sender, Rank, Bytes when its frame was read), or a copy over
// the memory budget (Bytes).
type StateReplicaRefusedEvent struct {
	Buddy     string  `json:"buddy,omitempty"`
	Sender    *string `json:"sender,omitempty"`
	Peer      string  `json:"peer,omitempty"`
	LocalRank *int    `json:"local_rank,omitempty"`
	Rank      *int    `json:"rank,omitempty"`
	Bytes     *int64  `json:"bytes,omitempty"`
	// Reason classifies a receiver's refusal (ReplicaRefused*); empty for
	// the older ones (job, version, memory budget).
	Reason ReplicaRefusal `json:"reason,omitempty"`
	// Suppressed counts the refusals of the same address left out of the
	// log since its previous record (a flood is recorded once every few
	// seconds per address).
	Suppressed *int   `json:"suppressed,omitempty"`
	Error      string `json:"error"`
}

// ReplicaRefusal classifies a receiver's refusal of a peer
// (StateReplicaRefusedEvent.Reason).
type ReplicaRefusal string

// StateReplicaRefusedEvent.Reason values.
const (
	ReplicaRefusedNotMember ReplicaRefusal = "not_member" // the address is not one of the round's nodes (or this host)
	ReplicaRefusedNotSender ReplicaRefusal = "not_sender" // a copy claims a node that does not replicate here, or comes from another address than that node's
	ReplicaRefusedAuth      ReplicaRefusal = "auth"       // a frame's HMAC tag is missing, unexpected or wrong (--job-secret-file)
	ReplicaRefusedOversized ReplicaRefusal = "oversized"  // a copy over the per-copy limit or the bytes the round's copies need
	ReplicaRefusedHandshake ReplicaRefusal = "handshake"  // no first frame within the handshake timeout
	ReplicaRefusedConnLimit ReplicaRefusal = "conn_limit" // too many connections (in all, or from one address)
	ReplicaRefusedProtocol  ReplicaRefusal = "protocol"   // another job, protocol version, or a malformed frame
)

// The replication records name the peer node that sent a copy "sender",
// never "node": that is the header's, the launcher that wrote the line.

// StateReplicaReceivedEvent: a buddy verified a copy of a peer's rank.
type StateReplicaReceivedEvent struct {
	Sender string `json:"sender"`
	Rank   int    `json:"rank"`
	Step   int64  `json:"step"`
	Seq    int64  `json:"seq"`
	Bytes  int64  `json:"bytes"`
}

// StateReplicaDiscardedEvent: a buddy dropped a copy in flight (the sender
// died or aborted it, a checksum mismatch); its previous complete copy is
// kept.
type StateReplicaDiscardedEvent struct {
	Sender string `json:"sender"`
	Rank   int    `json:"rank"`
	Seq    int64  `json:"seq"`
	Step   int64  `json:"step"`
	Error  string `json:"error"`
}

// StateRestoredFromBuddyEvent: before a round, a local rank's segment got
// a buddy's copy of its global rank (Sender: the node that saved it, the
// lost one).
type StateRestoredFromBuddyEvent struct {
	LocalRank int     `json:"local_rank"`
	Rank      int     `json:"rank"`
	Step      int64   `json:"step"`
	Sender    string  `json:"sender"`
	Bytes     int64   `json:"bytes"`
	FetchMS   float64 `json:"fetch_ms"`
}

// RankFailureHintEvent: a failed rank's output holds a known cause that
// its own message does not name (ranklogs.FailureHint); Hint says what to
// do.
type RankFailureHintEvent struct {
	LocalRank int       `json:"local_rank"`
	Rank      int       `json:"rank"`
	Cause     HintCause `json:"cause"`
	Hint      string    `json:"hint"`
}

func (LauncherStartedEvent) Kind() string        { return LauncherStarted }
func (CycleStartedEvent) Kind() string           { return CycleStarted }
func (SignalReceivedEvent) Kind() string         { return SignalReceived }
func (StopEscalatedEvent) Kind() string          { return StopEscalated }
func (WalltimeWarningEvent) Kind() string        { return WalltimeWarning }
func (WorkloadRequestEvent) Kind() string        { return WorkloadRequest }
func (RankHangEvent) Kind() string               { return RankHang }
func (RankStacksEvent) Kind() string             { return RankStacks }
func (HangDismissedEvent) Kind() string          { return HangDismissed }
func (RankFailureCauseEvent) Kind() string       { return RankFailureCause }
func (NodeFailingEvent) Kind() string            { return NodeFailing }
func (RankSpeedEvent) Kind() string              { return RankSpeed }
func (StragglerEvent) Kind() string              { return Straggler }
func (RankExitedEvent) Kind() string             { return RankExited }
func (SpareSwapEvent) Kind() string              { return SpareSwap }
func (RoundEndedEvent) Kind() string             { return RoundEnded }
func (JobFailedEvent) Kind() string              { return JobFailed }
func (JobSucceededEvent) Kind() string           { return JobSucceeded }
func (StandbyEvent) Kind() string                { return Standby }
func (RestartEvent) Kind() string                { return Restart }
func (FencedEvent) Kind() string                 { return Fenced }
func (FencedByWatchdogEvent) Kind() string       { return FencedByWatchdog }
func (FenceWatchdogRestartedEvent) Kind() string { return FenceWatchdogRestarted }
func (FenceWatchdogGaveUpEvent) Kind() string    { return FenceWatchdogGaveUp }
func (TrainingFinishedEvent) Kind() string       { return TrainingFinished }
func (VerdictEvent) Kind() string                { return Verdict }
func (VerdictLostEvent) Kind() string            { return VerdictLost }
func (LedgerEvent) Kind() string                 { return Ledger }
func (InProcessKeptEvent) Kind() string          { return InProcessKept }
func (InProcessNoticeEvent) Kind() string        { return InProcessNotice }
func (InProcessRejoinedEvent) Kind() string      { return InProcessRejoined }
func (InProcessFirstStepEvent) Kind() string     { return InProcessFirstStep }
func (InProcessFallbackEvent) Kind() string      { return InProcessFallback }
func (InProcessReplacedEvent) Kind() string      { return InProcessReplaced }
func (RankFirstHeartbeatEvent) Kind() string     { return RankFirstHeartbeat }
func (RankFirstStepEvent) Kind() string          { return RankFirstStep }
func (RankCheckpointEvent) Kind() string         { return RankCheckpoint }
func (RankStepsEvent) Kind() string              { return RankSteps }
func (LauncherStallEvent) Kind() string          { return LauncherStall }
func (FillerReclaimedEvent) Kind() string        { return FillerReclaimed }
func (StateSaveEvent) Kind() string              { return StateSave }
func (StatePersistedEvent) Kind() string         { return StatePersisted }
func (StatePersistFailedEvent) Kind() string     { return StatePersistFailed }
func (StateRestoreEvent) Kind() string           { return StateRestore }
func (StateStaleRemovedEvent) Kind() string      { return StateStaleRemoved }
func (StateCorruptEvent) Kind() string           { return StateCorrupt }
func (StateReplicaSentEvent) Kind() string       { return StateReplicaSent }
func (StateReplicaFailedEvent) Kind() string     { return StateReplicaFailed }
func (StateReplicaRefusedEvent) Kind() string    { return StateReplicaRefused }
func (StateReplicaReceivedEvent) Kind() string   { return StateReplicaReceived }
func (StateReplicaDiscardedEvent) Kind() string  { return StateReplicaDiscarded }
func (StateRestoredFromBuddyEvent) Kind() string { return StateRestoredFromBuddy }
func (RankFailureHintEvent) Kind() string        { return RankFailureHint }

// Typed lists a zero value of every typed record: what Decode knows.
func Typed() []Record {
	return append([]Record{
		LauncherStartedEvent{}, ListeningEvent{}, CycleStartedEvent{}, SignalReceivedEvent{}, StopEscalatedEvent{},
		WalltimeWarningEvent{}, WorkloadRequestEvent{}, RankHangEvent{}, RankStacksEvent{}, RankFailureCauseEvent{}, NodeFailingEvent{}, RankSpeedEvent{}, StragglerEvent{}, HangDismissedEvent{}, RankExitedEvent{}, SpareSwapEvent{},
		RoundEndedEvent{}, JobFailedEvent{}, JobSucceededEvent{}, StandbyEvent{}, RestartEvent{}, FencedEvent{},
		FencedByWatchdogEvent{}, TrainingFinishedEvent{}, VerdictEvent{}, VerdictLostEvent{}, LedgerEvent{},
		InProcessKeptEvent{}, InProcessNoticeEvent{}, InProcessRejoinedEvent{}, InProcessFirstStepEvent{},
		InProcessFallbackEvent{}, InProcessReplacedEvent{},
		RankFirstHeartbeatEvent{}, RankFirstStepEvent{}, RankCheckpointEvent{}, RankStepsEvent{},
		LauncherStallEvent{}, FillerReclaimedEvent{},
		StateSaveEvent{}, StatePersistedEvent{}, StatePersistFailedEvent{}, StateRestoreEvent{},
		StateStaleRemovedEvent{}, StateCorruptEvent{}, StateReplicaSentEvent{}, StateReplicaFailedEvent{}, StateReplicaRefusedEvent{},
		StateReplicaReceivedEvent{}, StateReplicaDiscardedEvent{}, StateRestoredFromBuddyEvent{},
		RankFailureHintEvent{},
		FenceWatchdogRestartedEvent{}, FenceWatchdogGaveUpEvent{},
	}, componentRecords()...)
}
