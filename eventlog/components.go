package eventlog

import "github.com/ftlauncher/ft-launcher/verdict"

// The records of the launcher's components that write through a callback
// or an event log of their own: the spare's filler (package filler), the
// standby interpreters (prewarm), the agent store (agentstore) and the
// embedded etcd member's keeper (cmd/ft-launcher). Their JSON names are the
// ones these components wrote as maps before they were typed; the
// components name their kinds after the constants here.

// Kinds of the spare's filler work (filler_reclaimed: records.go).
const (
	FillerStarted = "filler_started"
	FillerExited  = "filler_exited"
	FillerGaveUp  = "filler_gave_up"
)

// Kinds of the standby interpreters (docs/prewarm.md).
const (
	PrewarmFallback   = "prewarm_fallback"
	PrewarmStarted    = "prewarm_started"
	PrewarmDisabled   = "prewarm_disabled"
	PrewarmReady      = "prewarm_ready"
	PrewarmWaiting    = "prewarm_waiting"
	PrewarmPaused     = "prewarm_paused"
	PrewarmResumed    = "prewarm_resumed"
	PrewarmLearned    = "prewarm_learned"
	PrewarmUnsafe     = "prewarm_unsafe"
	PrewarmSpareReady = "prewarm_spare_ready"
	PrewarmSpareDied  = "prewarm_spare_died"
)

// Kinds of the agent store (docs/agentstore.md).
const (
	AgentStoreServed = "agent_store_served"
	AgentStoreClosed = "agent_store_closed"
)

// Kinds of the embedded etcd member a launcher hosts, and of its peers.
const (
	EtcdMemberExited    = "etcd_member_exited"
	EtcdMemberRestarted = "etcd_member_restarted"
	EtcdMemberGaveUp    = "etcd_member_gave_up"
	EtcdPeerMemberDown  = "etcd_peer_member_down" // another member stopped answering
	EtcdPeerMemberUp    = "etcd_peer_member_up"   // and answers again
)

// FillerStartedEvent: the filler command was started (Start counts the
// starts of this park).
type FillerStartedEvent struct {
	PID     int    `json:"pid"`
	Start   int    `json:"start"`
	Command string `json:"command"`
	Log     string `json:"log"`
}

// FillerExitedEvent: the filler command ended while the node was a spare.
type FillerExitedEvent struct {
	ExitCode int `json:"exit_code"` // torchrun's convention: a signal is its negative
	PID      int `json:"pid"`
}

// FillerGaveUpEvent: the filler is not started again.
type FillerGaveUpEvent struct {
	Reason string `json:"reason"`
}

// PrewarmPath is the way a rank started at a cycle's start (the
// prewarm_fallback record's "path"; docs/prewarm.md).
type PrewarmPath string

// Prewarm paths (package prewarm names them Path*).
const (
	PrewarmPathWarm    PrewarmPath = "warm"    // handed to its ready standby at once
	PrewarmPathWaited  PrewarmPath = "waited"  // its standby was still importing: waited for it, then handed over
	PrewarmPathStopped PrewarmPath = "stopped" // its standby was still importing: stopped, the rank started cold
	PrewarmPathCold    PrewarmPath = "cold"    // no usable standby (or a wait or handover failed): started cold
)

// PrewarmFallbackEvent: a rank did not start warm at once. Round is the
// cycle's TORCHELASTIC_RESTART_COUNT as the ranks got it. The standby's
// times are there when it had one that was waited for or stopped, the
// wait's when it was waited for.
type PrewarmFallbackEvent struct {
	Round             string      `json:"round"`
	LocalRank         int         `json:"local_rank"`
	Path              PrewarmPath `json:"path"`
	Reason            string      `json:"reason"`
	StandbyElapsedMS  *float64    `json:"standby_elapsed_ms,omitempty"`
	StandbyCPUMS      *float64    `json:"standby_cpu_ms,omitempty"`
	WaitMS            *float64    `json:"wait_ms,omitempty"`
	MaxWaitMS         *float64    `json:"max_wait_ms,omitempty"`
	ExpectedWaitCPUMS *float64    `json:"expected_wait_cpu_ms,omitempty"`
}

// PrewarmStartedEvent: ranks were handed to their standbys; Spare and
// ParkedMS when they were a promoted spare's, kept while it was parked;
// Launched when the standbys were started at the launcher's start, for
// the first cycle (--prewarm auto, a known command line).
type PrewarmStartedEvent struct {
	Round      string   `json:"round"`
	LocalRanks []int    `json:"local_ranks"`
	HandoverMS float64  `json:"handover_ms"`
	Spare      bool     `json:"spare,omitempty"`
	ParkedMS   *float64 `json:"parked_ms,omitempty"`
	Launched   bool     `json:"launched,omitempty"`
}

// PrewarmDisabledEvent: the modules cannot be imported; ranks start cold.
type PrewarmDisabledEvent struct {
	LocalRank int    `json:"local_rank"`
	Reason    string `json:"reason"`
}

// PrewarmReadyEvent: a standby has imported the modules.
type PrewarmReadyEvent struct {
	LocalRank   int     `json:"local_rank"`
	PID         int     `json:"pid"`
	ImportMS    float64 `json:"import_ms"`
	ImportCPUMS float64 `json:"import_cpu_ms"`
}

// PrewarmWaitingEvent: a restart waits, at most MaxWaitMS, for a
// standby's import.
type PrewarmWaitingEvent struct {
	Round     string  `json:"round"`
	LocalRank int     `json:"local_rank"`
	PID       int     `json:"pid"`
	MaxWaitMS float64 `json:"max_wait_ms"`
	Reason    string  `json:"reason"`
}

// PrewarmPausedEvent: standbys still importing, not needed by the cycle,
// paused while it starts.
type PrewarmPausedEvent struct {
	Round      string `json:"round"`
	LocalRanks []int  `json:"local_ranks"`
}

// PrewarmResumedEvent: the paused standbys go on importing.
type PrewarmResumedEvent struct {
	LocalRanks []int   `json:"local_ranks"`
	PausedMS   float64 `json:"paused_ms"`
}

// PrewarmLearnedEvent: --prewarm auto learned the modules a command's
// ranks import.
type PrewarmLearnedEvent struct {
	Command   string   `json:"command"`
	Modules   []string `json:"modules"`
	Ranks     int      `json:"ranks"`
	Cycles    int      `json:"cycles"`
	StateFile string   `json:"state_file"`
}

// PrewarmUnsafeEvent: --prewarm auto dropped a module a standby must not
// import.
type PrewarmUnsafeEvent struct {
	Command   string `json:"command"`
	Module    string `json:"module"`
	Reason    string `json:"reason"`
	LocalRank int    `json:"local_rank"`
}

// PrewarmSpareReadyEvent: every standby of a parked spare is ready.
type PrewarmSpareReadyEvent struct {
	LocalRanks []int    `json:"local_ranks"`
	PIDs       []int    `json:"pids"`
	Modules    []string `json:"modules"`
	ReadyMS    float64  `json:"ready_ms"`
}

// PrewarmSpareDiedEvent: a parked spare's standby ended; it is started
// again in RestartInMS, or, past the restarts allowed, given up (GaveUp).
type PrewarmSpareDiedEvent struct {
	LocalRank   int      `json:"local_rank"`
	PID         int      `json:"pid"`
	Reason      string   `json:"reason"`
	Deaths      int      `json:"deaths"`
	GaveUp      bool     `json:"gave_up,omitempty"`
	RestartInMS *float64 `json:"restart_in_ms,omitempty"`
}

// AgentStoreServedEvent: group rank 0 serves the round's store.
// AllowedAddrs is how many addresses may connect, -1 any.
type AgentStoreServedEvent struct {
	Round        int    `json:"round"`
	Addr         string `json:"addr"`
	KeysDropped  int    `json:"keys_dropped"`
	AllowedAddrs int    `json:"allowed_addrs"`
}

// AgentStoreClosedEvent: the store's server closed (Why), with what it
// held and refused (tcpstore.Stats).
type AgentStoreClosedEvent struct {
	Round       int    `json:"round"`
	Addr        string `json:"addr"`
	Why         string `json:"why"`
	Keys        int    `json:"keys"`
	Refused     uint64 `json:"refused"`
	NotMember   uint64 `json:"not_member"`
	NoHandshake uint64 `json:"no_handshake"`
	PerAddrCap  uint64 `json:"per_addr_cap"`
	IdleAtReset uint64 `json:"idle_at_reset"`
}

// EtcdMemberExitedEvent: the embedded etcd member this launcher hosts
// ended (Exit: "killed by SIGKILL", "exit code 1") after serving ServedS;
// Restart: it is started again.
type EtcdMemberExitedEvent struct {
	Member   string  `json:"member"`
	PID      int     `json:"pid"`
	Exit     string  `json:"exit"`
	ExitCode int     `json:"exit_code"`
	Signal   string  `json:"signal"`
	ServedS  float64 `json:"served_s"`
	Restart  bool    `json:"restart"`
}

// EtcdMemberRestartedEvent: the member serves again (How:
// verdict.EtcdMemberRejoined or EtcdMemberReplaced), TookS after DeadPID
// was reaped.
type EtcdMemberRestartedEvent struct {
	Member   string                   `json:"member"`
	PID      int                      `json:"pid"`
	How      verdict.EtcdMemberAction `json:"how"`
	Attempts int                      `json:"attempts"`
	TookS    float64                  `json:"took_s"`
	DeadPID  int                      `json:"dead_pid"`
}

// EtcdMemberGaveUpEvent: the member is not restarted; the cluster runs
// without it.
type EtcdMemberGaveUpEvent struct {
	Member   string `json:"member"`
	Why      string `json:"why"`
	Attempts int    `json:"attempts"`
}

// EtcdPeerMemberDownEvent: another member of the embedded cluster stopped
// answering at Endpoint.
type EtcdPeerMemberDownEvent struct {
	Peer     string `json:"peer"`
	Endpoint string `json:"endpoint"`
	Err      string `json:"err"`
}

// EtcdPeerMemberUpEvent: a peer member that was down answers again.
type EtcdPeerMemberUpEvent struct {
	Peer     string `json:"peer"`
	Endpoint string `json:"endpoint"`
}

func (FillerStartedEvent) Kind() string       { return FillerStarted }
func (FillerExitedEvent) Kind() string        { return FillerExited }
func (FillerGaveUpEvent) Kind() string        { return FillerGaveUp }
func (PrewarmFallbackEvent) Kind() string     { return PrewarmFallback }
func (PrewarmStartedEvent) Kind() string      { return PrewarmStarted }
func (PrewarmDisabledEvent) Kind() string     { return PrewarmDisabled }
func (PrewarmReadyEvent) Kind() string        { return PrewarmReady }
func (PrewarmWaitingEvent) Kind() string      { return PrewarmWaiting }
func (PrewarmPausedEvent) Kind() string       { return PrewarmPaused }
func (PrewarmResumedEvent) Kind() string      { return PrewarmResumed }
func (PrewarmLearnedEvent) Kind() string      { return PrewarmLearned }
func (PrewarmUnsafeEvent) Kind() string       { return PrewarmUnsafe }
func (PrewarmSpareReadyEvent) Kind() string   { return PrewarmSpareReady }
func (PrewarmSpareDiedEvent) Kind() string    { return PrewarmSpareDied }
func (AgentStoreServedEvent) Kind() string    { return AgentStoreServed }
func (AgentStoreClosedEvent) Kind() string    { return AgentStoreClosed }
func (EtcdMemberExitedEvent) Kind() string    { return EtcdMemberExited }
func (EtcdMemberRestartedEvent) Kind() string { return EtcdMemberRestarted }
func (EtcdMemberGaveUpEvent) Kind() string    { return EtcdMemberGaveUp }
func (EtcdPeerMemberDownEvent) Kind() string  { return EtcdPeerMemberDown }
func (EtcdPeerMemberUpEvent) Kind() string    { return EtcdPeerMemberUp }

// componentRecords lists a zero value of each record above (Typed).
func componentRecords() []Record {
	return []Record{
		FillerStartedEvent{}, FillerExitedEvent{}, FillerGaveUpEvent{},
		PrewarmFallbackEvent{}, PrewarmStartedEvent{}, PrewarmDisabledEvent{}, PrewarmReadyEvent{}, PrewarmWaitingEvent{},
		PrewarmPausedEvent{}, PrewarmResumedEvent{}, PrewarmLearnedEvent{}, PrewarmUnsafeEvent{},
		PrewarmSpareReadyEvent{}, PrewarmSpareDiedEvent{},
		AgentStoreServedEvent{}, AgentStoreClosedEvent{},
		EtcdMemberExitedEvent{}, EtcdMemberRestartedEvent{}, EtcdMemberGaveUpEvent{},
		EtcdPeerMemberDownEvent{}, EtcdPeerMemberUpEvent{},
	}
}
