package eventlog

// The enumerations inside records: named types, so that a producer
// cannot write a value the readers do not know, with the same strings on
// the wire as before. Where a producing package has its own name for one
// (monitor.HangKind, monitor.WorkloadAction, the state package's sources),
// it is an alias of the type here: eventlog is below every producer.

// HangKind is which clock of a rank expired (rank_hang's timeout_kind).
type HangKind string

// Hang kinds.
const (
	HangInitialHeartbeat HangKind = "initial_heartbeat"
	HangHeartbeat        HangKind = "heartbeat"
	HangSection          HangKind = "section"
	HangOutOfSection     HangKind = "out_of_section"
)

// String returns the kind's name on the wire and in logs.
func (k HangKind) String() string { return string(k) }

// WorkloadAction is what a rank asked of the launcher: the member names
// of nvrx's data.WorkloadAction.
type WorkloadAction string

// Workload actions.
const (
	WorkloadContinue         WorkloadAction = "Continue"
	WorkloadExcludeThisNode  WorkloadAction = "ExcludeThisNode"
	WorkloadShutdownWorkload WorkloadAction = "ShutdownWorkload"
)

// String returns the action's nvrx name.
func (a WorkloadAction) String() string { return string(a) }

// StateSource is where a rank's state was restored from, or where a
// damaged save was found.
type StateSource string

// State sources.
const (
	SourceMemory StateSource = "memory" // the rank's segment
	SourceBuddy  StateSource = "buddy"  // memory that a buddy's copy filled before the round
	SourceFile   StateSource = "file"   // the state directory
	SourcePeer   StateSource = "peer"   // a peer heal: a survivor's live state
	SourceLive   StateSource = "live"   // a peer heal: a survivor kept its own
)

// PersistReason is why the launcher wrote a rank's state to disk.
type PersistReason string

// Persist reasons.
const (
	PersistPeriodic     PersistReason = "periodic"      // --state-persist-every
	PersistRanksStopped PersistReason = "ranks stopped" // the ranks stopped (a failure, a signal)
	PersistEnd          PersistReason = "end"           // the launcher ends
	PersistOverdue      PersistReason = "overdue"       // a periodic write-out one period late, at the launcher's priority
)

// HintCause is a known cause found in a failed rank's output
// (ranklogs.FailureHint).
type HintCause string

// Hint causes.
const (
	// HintNoLibuv: the rank's torch has no libuv TCPStore backend.
	HintNoLibuv HintCause = "torch_without_libuv"
)

// AgentState names the node agent's state when a record was written (its
// State's String(), or "setup" before the agent runs).
type AgentState string

// StateSetup: the launcher had not started its agent yet.
const StateSetup AgentState = "setup"

// HealOutcome is what a peer heal did for a rank (docs/state.md).
type HealOutcome string

// Heal outcomes.
const (
	HealPeer     HealOutcome = "peer"     // the replacements received a survivor's state
	HealKept     HealOutcome = "kept"     // every rank held the state: nothing was sent
	HealLoad     HealOutcome = "load"     // no rank held a live state (first round, full restart): load()
	HealFallback HealOutcome = "fallback" // live states that cannot be used: load(), and why
)
