package nvrxwire

// Module and class names used on the wire by nvrx.
const (
	DataModule   = "nvidia_resiliency_ext.fault_tolerance.data"
	ConfigModule = "nvidia_resiliency_ext.fault_tolerance.config"
	ConfigClass  = "FaultToleranceConfig"
)

// AuthkeyMsg is the first message of a rank connection (multiprocessing authkey).
type AuthkeyMsg struct{ Authkey []byte }

// RankInfo identifies the rank process that sent an InitMsg.
type RankInfo struct {
	GlobalRank, LocalRank int
	Host                  string
	PID                   int
}

// InitMsg starts a monitoring session. HasIteration is true when the
// iteration/num_warmup_iters keys are present, which only clients >= 0.6 send.
type InitMsg struct {
	RankInfo       RankInfo
	HasIteration   bool
	Iteration      *int64
	NumWarmupIters *int64
}

// HeartbeatMsg is a rank heartbeat. StateLen is the length of the state dict
// (state_dict_for_chkpt in v0.1-0.2); the server expects it to be 0.
type HeartbeatMsg struct {
	Rank     int
	StateLen int
}

// SectionAction mirrors data.SectionAction.
type SectionAction int

// SectionAction values.
const (
	SectionOpen     SectionAction = 1
	SectionClose    SectionAction = 2
	SectionCloseAll SectionAction = 3
)

// SectionMsg opens or closes a named section. Section is nil for CLOSE_ALL.
type SectionMsg struct {
	Rank      int
	Section   *string
	Action    SectionAction
	Iteration *int64
}

// HeartbeatTimeouts mirrors data.HeartbeatTimeouts (seconds; nil = None).
type HeartbeatTimeouts struct {
	Initial, Subsequent *float64
	WereCalculated      *bool
}

// SectionTimeouts mirrors data.SectionTimeouts (seconds; nil = None).
type SectionTimeouts struct {
	Section                  map[string]*float64
	OutOfSection             *float64
	CalculatedSections       []string // sorted
	IsOutOfSectionCalculated bool
}

// UpdateConfigMsg updates the monitor's timeouts (rank) or cycle (launcher).
// LegacyInitial/LegacySubsequent carry the v0.1-0.2 fields
// new_initial_heartbeat_timeout/new_heartbeat_timeout.
type UpdateConfigMsg struct {
	HB                              *HeartbeatTimeouts
	Sections                        *SectionTimeouts
	CurrentCycle                    *int64
	LegacyInitial, LegacySubsequent *float64
}

// WorkloadAction mirrors data.WorkloadAction.
type WorkloadAction int

// WorkloadAction values.
const (
	WorkloadContinue         WorkloadAction = 0
	WorkloadExcludeThisNode  WorkloadAction = 1
	WorkloadShutdownWorkload WorkloadAction = 2
)

// String returns the member's name in nvrx's enum ("" for a value it does
// not have).
func (a WorkloadAction) String() string {
	switch a {
	case WorkloadContinue:
		return "Continue"
	case WorkloadExcludeThisNode:
		return "ExcludeThisNode"
	case WorkloadShutdownWorkload:
		return "ShutdownWorkload"
	}
	return ""
}

// WorkloadControlRequest is decoded from the tuple (global_rank, WorkloadControlRequest)
// sent on the rank -> launcher channel.
type WorkloadControlRequest struct {
	GlobalRank  int
	Action      WorkloadAction
	Description string
}

// ControlString is a bare string command on the launcher -> monitor channel.
type ControlString string

// Control strings understood by nvrx rank monitors.
const (
	ControlCloseWorkerIPC ControlString = "close_worker_ipc_connection"
	ControlShutdown       ControlString = "shutdown"
)
