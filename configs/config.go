// Package configs turns a launch line (torchrun and nvrx ft_launcher flags,
// PET_* environment fallbacks, an optional fault-tolerance YAML file) into one
// validated Config. Precedence is flag > environment (PET_*) > the Slurm
// job (inside one) > the Kubernetes pod (inside one) > YAML > default.
package configs

import (
	"math"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/state"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Std is torchrun's stream mask: 0 none, 1 stdout, 2 stderr, 3 both.
type Std int

// Stream mask values.
const (
	StdNone Std = 0
	StdOut  Std = 1
	StdErr  Std = 2
	StdBoth Std = 3
)

// StdSpec is a parsed -r/--redirects or -t/--tee value: either one mask for
// every local rank, or a per-local-rank map where unlisted ranks get StdNone.
type StdSpec struct {
	All     Std
	PerRank map[int]Std // non-nil when the value was a map like "0:1,1:2"
}

// For returns the mask that applies to localRank.
func (s StdSpec) For(localRank int) Std {
	if s.PerRank != nil {
		return s.PerRank[localRank]
	}
	return s.All
}

// NNodes is --nnodes: N or MIN:MAX.
type NNodes struct{ Min, Max int }

// Config is the effective, validated configuration of one ft-launcher.
// Restart modes (--restart-mode).
const (
	RestartFull      = "full"
	RestartInProcess = "in-process"
)

type Config struct {
	// torchrun-compatible launch options.
	NNodes       NNodes
	NProcPerNode int    // resolved count
	NProcSpec    string // as given: "4", "cpu", "gpu", "auto"
	RdzvBackend  string // static | c10d | etcd | etcd-v2 (c10d maps to the embedded etcd default)
	RdzvEndpoint string
	RdzvID       string
	RdzvConf     map[string]string // as given; Rdzv holds the interpreted values
	Standalone   bool
	MaxRestarts  int
	// RestartWindow, when set, counts only the restarts within it against
	// MaxRestarts; RestartDelay is the wait before each counted restart's
	// round (the job's policy.RestartBudget).
	RestartWindow    time.Duration
	RestartDelay     time.Duration
	MonitorInterval  time.Duration // accepted and ignored: ft-launcher is event-driven
	StartMethod      string
	Role             string
	Module           bool
	NoPython         bool
	LogDir           string
	Redirects        StdSpec
	Tee              StdSpec
	LocalRanksFilter []int // nil: every local rank is shown on the console
	LogKeepAttempts  int   // keep the last N per-cycle attempt dirs of the run's log dir; 0 keeps all
	NodeRank         int   // -1 when not given; static backend rank and etcd node order
	MasterAddr       string
	MasterPort       int
	LocalAddr        string
	SignalsToHandle  []syscall.Signal

	// Stop and signal handling.
	TermTimeout        time.Duration // grace after forwarding a received signal (nvrx --term-timeout, default 1800s as nvrx)
	WorkersStopTimeout time.Duration // grace when stopping ranks for a restart (nvrx default 15s)

	// Worker command.
	Script     string
	ScriptArgs []string
	PythonExec string // interpreter used unless NoPython: $PYTHON_EXEC, else python3 on PATH

	// Etcd rendezvous connection options (multi-node).
	RdzvCACert   string
	RdzvCert     string
	RdzvKey      string
	RdzvUser     string
	RdzvPassword string

	// Rdzv is the rendezvous interpreted from the options above, validated
	// at parse time.
	Rdzv Rendezvous

	// InfraRank is this node's rank as the infrastructure knows it, which
	// orders nodes in the etcd rendezvous (-1 unknown); InfraRankFrom names
	// its source: the --node-rank flag or PET_NODE_RANK, SLURM_PROCID,
	// JOB_COMPLETION_INDEX, the pod ordinal of a pod's host name, or "none".
	InfraRank     int
	InfraRankFrom string

	// Scheduler environment, read once here for everything that needs it.
	Slurm slurm.Env
	K8s   k8s.Env

	// ft-launcher's own options.
	EventLog       string // JSON-lines event log path ("" disables)
	MetricsAddr    string // Prometheus listen address ("" disables)
	HealthCheckCmd string // pre-join node health check command ("" disables)
	VerdictFile    string // JSON verdict written on exit ("": verdict.json in the run's log directory, chosen at run time)
	TerminationLog string // the verdict, compacted, for the kubelet's termination message ("" disables)

	// Launcher-held training state (docs/state.md): "" disables it.
	StateDir     string
	StatePersist state.Every // when the background writer writes (--state-persist-every)
	// StateReplicas is K of --state-replicas: the buddy launchers each
	// node streams its saves to (0: none; always 0 without StateDir).
	StateReplicas int
	// StateShmDir is where the segments live (--state-shm-dir; "" is
	// /dev/shm): a tmpfs, so that a save is a memory copy.
	StateShmDir string
	// JobSecretFile holds the job secret (--job-secret-file; "" none):
	// the state replication's frames are authenticated with it.
	JobSecretFile string

	// Spares.
	SpareFiller               string        // command run on this node while it is a spare ("" none)
	SpareFillerReclaimTimeout time.Duration // bound on killing the filler and freeing the GPUs when promoted

	// Prewarm are the Python modules each local rank's standby interpreter
	// imports ahead of a restart (nil: ranks always start cold; docs/prewarm.md).
	Prewarm []string
	// PrewarmAuto: --prewarm auto, the modules are learned from what the
	// ranks import (prewarm.Learner; Prewarm is then nil).
	PrewarmAuto bool
	// PrewarmImporting is what a restart does with a standby still
	// importing: "auto" (also ""), "wait" or "stop" (docs/prewarm.md).
	PrewarmImporting string

	// AgentStore makes group rank 0's launcher serve the ranks' c10d
	// TCPStore (TORCHELASTIC_USE_AGENT_STORE=True); false leaves it to
	// rank 0, as before (docs/agentstore.md).
	AgentStore bool

	// RestartMode is RestartFull (every rank restarts) or RestartInProcess
	// (surviving ranks that registered for it stay and rejoin the next
	// round; docs/inprocess.md).
	RestartMode string
	// InProcessRejoinTimeout bounds how long a survivor may take to
	// rejoin after the notice before it is killed and the job falls back
	// to the full restart.
	InProcessRejoinTimeout time.Duration

	// WalltimeSignals are the scheduler's pre-walltime warnings: forwarded
	// to the ranks, never a failure (default SIGUSR1, SIGUSR2).
	WalltimeSignals []syscall.Signal
	PrintConfig     bool
	CfgPath         string // --ft-cfg-path as given

	FT FaultTolerance

	// Sources says where each launch option's value came from, keyed as
	// in --print-config's launch block: the flag or PET_* variable, the
	// Slurm job, the Kubernetes pod, the YAML file, or "default".
	Sources map[string]string

	// Warnings collected while parsing (deprecated spellings and the like),
	// logged by the caller once a logger exists.
	Warnings []string
}

// FaultTolerance mirrors nvrx's FaultToleranceConfig (field names in the yaml
// tags are nvrx's). Nullable timeouts are *float64 seconds: nil means disabled.
type FaultTolerance struct {
	WorkloadCheckInterval        float64             `yaml:"workload_check_interval"`
	InitialRankHeartbeatTimeout  *float64            `yaml:"initial_rank_heartbeat_timeout"`
	RankHeartbeatTimeout         *float64            `yaml:"rank_heartbeat_timeout"`
	RankSectionTimeouts          map[string]*float64 `yaml:"rank_section_timeouts"`
	RankOutOfSectionTimeout      *float64            `yaml:"rank_out_of_section_timeout"`
	NodeHealthCheckInterval      float64             `yaml:"node_health_check_interval"`
	SafetyFactor                 float64             `yaml:"safety_factor"`
	RankTerminationSignal        syscall.Signal      `yaml:"rank_termination_signal"`
	LogLevel                     int                 `yaml:"log_level"`
	RestartCheckInterval         float64             `yaml:"restart_check_interval"`
	EnableNicMonitor             bool                `yaml:"enable_nic_monitor"`
	EnableNicHealthcheck         bool                `yaml:"enable_nic_healthcheck"`
	EnableDistStorageHealthcheck bool                `yaml:"enable_dist_storage_healthcheck"`
	StorageHealthcheckPath       *string             `yaml:"storage_healthcheck_path"`
	PciTopoFile                  *string             `yaml:"pci_topo_file"`
	LinkDownPathTemplate         *string             `yaml:"link_down_path_template"`
	LinkStatePathTemplate        *string             `yaml:"link_state_path_template"`
	SkipSectionResponse          bool                `yaml:"skip_section_response"`
	Segment                      *int                `yaml:"segment"`
	NumaBindStrict               bool                `yaml:"numa_bind_strict"`
	GpuMemoryReclaimTimeout      float64             `yaml:"gpu_memory_reclaim_timeout"`
	GpuMemoryToleranceMB         float64             `yaml:"gpu_memory_tolerance_mb"`
	GpuMemoryPollInterval        float64             `yaml:"gpu_memory_poll_interval"`
	CheckRemainingProcesses      bool                `yaml:"check_remaining_processes"`
	MaxNoProgressCycles          int                 `yaml:"max_no_progress_cycles"`
	MinProgressIterations        int                 `yaml:"min_progress_iterations"`
	CheckpointIterationFile      *string             `yaml:"checkpoint_iteration_file"`
	InstallExceptionHook         bool                `yaml:"install_exception_hook"`
	NumWarmupIterations          int                 `yaml:"num_warmup_iterations"`
	CycleInfoDir                 *string             `yaml:"cycle_info_dir"`

	// ft-launcher additions (also settable in the YAML section).
	NoRestartExitCode int     `yaml:"no_restart_exit_code"` // default verdict.DefaultNoRestartExitCode (93)
	TimeoutsStateFile string  `yaml:"timeouts_state_file"`  // computed timeouts persisted here ("" disables)
	TerminationGrace  float64 `yaml:"termination_grace"`    // seconds between a non-SIGKILL hang signal and SIGKILL
	CalculateTimeouts bool    `yaml:"calculate_timeouts"`   // launcher computes timeouts from observed timing
	// DefaultTimeouts: with no rank timeout configured, ranks that heartbeat
	// are held to the launcher's default clocks (a start-up timeout and a
	// step timeout learned in the run; docs/timeouts.md).
	DefaultTimeouts bool `yaml:"default_timeouts"`
	// RankStacks: the launcher installs a hook in Python ranks that lets
	// it read every thread's stack when a rank hangs (before it is killed)
	// or dies by a fatal signal (package stacks; docs/timeouts.md).
	RankStacks bool `yaml:"rank_stacks"`
	// SameFailureLimit: a job whose same rank fails the same way (the same
	// exception at the same place, or the same fatal signal) in this many
	// consecutive rounds stops with the no-restart exit code instead of
	// spending the rest of its restarts; 0 never stops.
	SameFailureLimit int `yaml:"same_failure_limit"`
	// NodeFailureLimit: a node whose own ranks failed in ways that point
	// at the node (a fatal signal, a hang, an exit with no explanation, a
	// hardware or driver error) in this many of its latest N+1 rounds
	// keeps failing: a hot spare takes its place, and outer loops keep the
	// next job off it (policy.FailingNode); 0 never.
	NodeFailureLimit int `yaml:"node_failure_limit"`
	// Straggler is what the launcher does about a node whose ranks are
	// slower than the others' (package straggler; docs/stragglers.md):
	// StragglerReport, StragglerSwap or StragglerOff.
	Straggler string `yaml:"straggler"`
	// StragglerThreshold: a node is slow when its slowest rank's speed,
	// relative to the other nodes' slowest ranks, is below
	// 1 - StragglerThreshold.
	StragglerThreshold float64 `yaml:"straggler_threshold"`
	// StragglerWindow: seconds the speeds are averaged over; a node slow
	// for half of it is a straggler.
	StragglerWindow float64 `yaml:"straggler_window"`
	// StragglerInterval: seconds between two samples of the ranks' speed
	// (each node writes one record to etcd per interval).
	StragglerInterval float64 `yaml:"straggler_interval"`
}

// Straggler modes (FaultTolerance.Straggler).
const (
	StragglerReport = "report" // measured, shown, never acted on
	StragglerSwap   = "swap"   // a straggler is swapped for a standing spare at its next state save
	StragglerOff    = "off"    // not measured
)

// Straggler defaults: docs/stragglers.md, "Defaults" gives the numbers
// they were chosen from.
const (
	DefaultStragglerThreshold = 0.2
	DefaultStragglerWindow    = 30.0
	DefaultStragglerInterval  = 10.0
)

// The launcher's default clocks (FaultTolerance.DefaultTimeouts): what a
// rank that heartbeats is held to when no rank timeout is configured
// (docs/timeouts.md, "With no timeout configured").
const (
	// DefaultStartupTimeout bounds a rank's start-up: from its session's
	// start to its first heartbeat (imports, compilation, loading a
	// checkpoint, forming the process group), and every gap while the step
	// timeout is still being learned or a named phase (a section other
	// than "step") is open. 30 min is torch's default process-group
	// timeout: a start-up collective that waits longer fails in torch
	// itself.
	DefaultStartupTimeout = 30 * time.Minute
	// DefaultLearnedFloor is the least step timeout learned in the run:
	// what a save, an evaluation or a data-loader stall that the client
	// does not announce may take between two heartbeats in the first run.
	DefaultLearnedFloor = 60 * time.Second
	// DefaultLearnIntervals is how many heartbeat intervals a rank sends
	// in a cycle before its step timeout is learned from them: the first
	// steps (compilation, warm-up, the first collectives) are the slow
	// ones, and stay under the start-up timeout.
	DefaultLearnIntervals = 10
	// DefaultJudgedFloor is the least step timeout learned in the run when
	// the launcher takes the ranks' stacks (rank_stacks): an expiry is
	// then only a question, answered by the stacks and the ranks'
	// activity before anything is killed (a busy rank, or one in a data
	// loader, a save or a load, is left alone), so the clock can be short
	// and a hang costs about a second.
	DefaultJudgedFloor = time.Second
)

// DefaultSameFailureLimit is how many times in a row the same rank may
// fail the same way before the job stops: the second time already
// suggests a deterministic bug, the third, with the same exception at the
// same line three rounds running, leaves little room for chance (a flaky
// read, a transient NCCL error rarely fail at one place three times),
// and costs two restarts, not the whole budget.
const DefaultSameFailureLimit = 3

// DefaultNodeFailureLimit is how many of a node's latest N+1 rounds may
// end with a failure that points at the node before it is taken out: one
// such failure happens to any node (a cosmic-ray bit flip, an OOM kill
// once), two in three rounds is a pattern (the Slurm chain's own rule
// counts two of three jobs likewise), and with a spare waiting a swap
// costs about what a restart in place costs.
const DefaultNodeFailureLimit = 2

// DefaultClocksApply reports whether the default clocks hold the ranks:
// they are on and no rank timeout is configured.
func (ft *FaultTolerance) DefaultClocksApply() bool {
	if !ft.DefaultTimeouts {
		return false
	}
	set := func(v *float64) bool { d, ok := Seconds(v); return ok && d > 0 }
	if set(ft.InitialRankHeartbeatTimeout) || set(ft.RankHeartbeatTimeout) || set(ft.RankOutOfSectionTimeout) {
		return false
	}
	for _, v := range ft.RankSectionTimeouts {
		if set(v) {
			return false
		}
	}
	return true
}

// DefaultFaultTolerance returns nvrx's current (v0.6+) defaults plus ours.
func DefaultFaultTolerance() FaultTolerance {
	return FaultTolerance{
		WorkloadCheckInterval:   5.0,
		RankSectionTimeouts:     map[string]*float64{},
		NodeHealthCheckInterval: 5.0,
		SafetyFactor:            5.0,
		RankTerminationSignal:   syscall.SIGKILL,
		LogLevel:                20,
		RestartCheckInterval:    60.0,
		EnableNicHealthcheck:    true,
		SkipSectionResponse:     true,
		NumaBindStrict:          true,
		GpuMemoryReclaimTimeout: 50.0,
		GpuMemoryToleranceMB:    512.0,
		GpuMemoryPollInterval:   2.0,
		MaxNoProgressCycles:     3,
		MinProgressIterations:   1,
		NumWarmupIterations:     5,
		NoRestartExitCode:       verdict.DefaultNoRestartExitCode,
		TerminationGrace:        5.0,
		CalculateTimeouts:       true,
		DefaultTimeouts:         true,
		RankStacks:              true,
		SameFailureLimit:        DefaultSameFailureLimit,
		NodeFailureLimit:        DefaultNodeFailureLimit,
		Straggler:               StragglerReport,
		StragglerThreshold:      DefaultStragglerThreshold,
		StragglerWindow:         DefaultStragglerWindow,
		StragglerInterval:       DefaultStragglerInterval,
	}
}

// Seconds converts a nullable timeout to a duration; ok is false when disabled.
func Seconds(v *float64) (d time.Duration, ok bool) {
	if v == nil {
		return 0, false
	}
	return time.Duration(math.Round(*v * float64(time.Second))), true
}

// Exit codes shared by every command.
const (
	ExitSuccess = 0
	ExitFailure = 1
	ExitUsage   = 2
	// ExitVerdictLost: ft-launcher could not write its verdict (or its
	// termination message) and would otherwise have exited 0 or 1; the
	// previous verdict at that path was removed. 73 is sysexits'
	// EX_CANTCREAT ("an output file cannot be created"), clear of 0, 1,
	// 2, the no-restart code 93 and ft-resumer's 3 and 75.
	ExitVerdictLost = 73
)
