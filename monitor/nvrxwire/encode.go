package nvrxwire

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"syscall"
)

// encoder writes a protocol 4 pickle with no FRAME and no memo: every object
// is emitted once, which CPython 3.4+ loads without complaint.
type encoder struct{ b []byte }

func newEncoder() *encoder {
	e := &encoder{b: make([]byte, 0, 256)}
	e.b = append(e.b, opProto, 4)
	return e
}

func (e *encoder) finish() []byte { return append(e.b, opStop) }

func (e *encoder) op(o byte) { e.b = append(e.b, o) }

// global uses the text GLOBAL opcode, valid in every protocol.
func (e *encoder) global(module, name string) {
	e.b = append(e.b, opGlobal)
	e.b = append(e.b, module...)
	e.b = append(e.b, '\n')
	e.b = append(e.b, name...)
	e.b = append(e.b, '\n')
}

func (e *encoder) str(s string) {
	// Python decodes pickled str as UTF-8; invalid input would fail the whole load.
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) < 256 {
		e.b = append(e.b, opShortBinUni, byte(len(s)))
	} else {
		e.b = append(e.b, opBinUnicode)
		e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(s)))
	}
	e.b = append(e.b, s...)
}

func (e *encoder) int(n int64) {
	switch {
	case n >= 0 && n < 256:
		e.b = append(e.b, opBinInt1, byte(n))
	case n >= math.MinInt32 && n <= math.MaxInt32:
		e.b = append(e.b, opBinInt)
		e.b = binary.LittleEndian.AppendUint32(e.b, uint32(int32(n)))
	default:
		e.b = append(e.b, opLong1, 8)
		e.b = binary.LittleEndian.AppendUint64(e.b, uint64(n))
	}
}

func (e *encoder) float(f float64) {
	e.b = append(e.b, opBinFloat)
	e.b = binary.BigEndian.AppendUint64(e.b, math.Float64bits(f))
}

func (e *encoder) bool(v bool) {
	if v {
		e.op(opNewTrue)
	} else {
		e.op(opNewFalse)
	}
}

func (e *encoder) optFloat(f *float64) {
	if f == nil {
		e.op(opNone)
		return
	}
	e.float(*f)
}

func (e *encoder) optString(s *string) {
	if s == nil {
		e.op(opNone)
		return
	}
	e.str(*s)
}

func (e *encoder) optInt(n *int) {
	if n == nil {
		e.op(opNone)
		return
	}
	e.int(int64(*n))
}

// newObj emits cls.__new__(cls) for a plain class.
func (e *encoder) newObj(module, name string) {
	e.global(module, name)
	e.op(opEmptyTuple)
	e.op(opNewObj)
}

// signal emits signal.Signals(n). Numbers CPython has no member for would
// make the whole load fail, so they go out as a plain int instead.
func (e *encoder) signal(s syscall.Signal) {
	if _, ok := signalNames[int64(s)]; !ok {
		e.int(int64(s))
		return
	}
	e.global("signal", "Signals")
	e.int(int64(s))
	e.op(opTuple1)
	e.op(opReduce)
}

// Config is the FaultToleranceConfig a rank monitor advertises to an nvrx
// client in its OkMsg: nvrx's fields plus ft-launcher's extras. Its fields
// are those of configs.FaultTolerance, in the same order and with the same
// types, so the monitor converts one into the other (a conversion the
// compiler checks: a field added to one and not the other breaks the
// build); this package stays below configs.
type Config struct {
	WorkloadCheckInterval        float64
	InitialRankHeartbeatTimeout  *float64
	RankHeartbeatTimeout         *float64
	RankSectionTimeouts          map[string]*float64
	RankOutOfSectionTimeout      *float64
	NodeHealthCheckInterval      float64
	SafetyFactor                 float64
	RankTerminationSignal        syscall.Signal
	LogLevel                     int
	RestartCheckInterval         float64
	EnableNicMonitor             bool
	EnableNicHealthcheck         bool
	EnableDistStorageHealthcheck bool
	StorageHealthcheckPath       *string
	PciTopoFile                  *string
	LinkDownPathTemplate         *string
	LinkStatePathTemplate        *string
	SkipSectionResponse          bool
	Segment                      *int
	NumaBindStrict               bool
	GpuMemoryReclaimTimeout      float64
	GpuMemoryToleranceMB         float64
	GpuMemoryPollInterval        float64
	CheckRemainingProcesses      bool
	MaxNoProgressCycles          int
	MinProgressIterations        int
	CheckpointIterationFile      *string
	InstallExceptionHook         bool
	NumWarmupIterations          int
	CycleInfoDir                 *string

	// ft-launcher additions (also settable in the YAML section).
	NoRestartExitCode  int     // default 93
	TimeoutsStateFile  string  // computed timeouts persisted here ("" disables)
	TerminationGrace   float64 // seconds between a non-SIGKILL hang signal and SIGKILL
	CalculateTimeouts  bool    // launcher computes timeouts from observed timing
	DefaultTimeouts    bool    // the launcher's default clocks hold ranks when no timeout is configured
	RankStacks         bool    // the launcher reads Python ranks' stacks at a hang
	SameFailureLimit   int     // the same failure this many rounds in a row stops the job (0: never)
	NodeFailureLimit   int     // failures pointing at the node in this many of its latest N+1 rounds take it out (0: never)
	Straggler          string  // report, swap or off
	StragglerThreshold float64 // a node slower than 1 - this is slow
	StragglerWindow    float64 // seconds a node stays slow to be a straggler
	StragglerInterval  float64 // seconds between two speed samples
}

// EncodeOkMsg returns the pickle of data.OkMsg. With a nil cfg it is OkMsg()
// with an empty __dict__; otherwise OkMsg(cfg=FaultToleranceConfig) carrying
// every nvrx config field (BUILD bypasses __init__, so fields without a
// class-level default must all be present) plus ft-launcher's extras, which
// nvrx clients ignore.
func EncodeOkMsg(cfg *Config) []byte {
	e := newEncoder()
	e.newObj(DataModule, "OkMsg")
	if cfg == nil {
		return e.finish()
	}
	e.op(opEmptyDict)
	e.str("cfg")
	e.config(cfg)
	e.op(opSetItem)
	e.op(opBuild)
	return e.finish()
}

func (e *encoder) config(c *Config) {
	e.newObj(ConfigModule, ConfigClass)
	e.op(opEmptyDict)
	e.op(opMark)
	kf := func(k string, f float64) { e.str(k); e.float(f) }
	ko := func(k string, f *float64) { e.str(k); e.optFloat(f) }
	kb := func(k string, b bool) { e.str(k); e.bool(b) }
	ks := func(k string, s *string) { e.str(k); e.optString(s) }
	ki := func(k string, n int) { e.str(k); e.int(int64(n)) }
	kn := func(k string) { e.str(k); e.op(opNone) }

	kf("workload_check_interval", c.WorkloadCheckInterval)
	ko("initial_rank_heartbeat_timeout", c.InitialRankHeartbeatTimeout)
	ko("rank_heartbeat_timeout", c.RankHeartbeatTimeout)
	e.str("rank_section_timeouts")
	e.sectionTimeouts(c.RankSectionTimeouts)
	ko("rank_out_of_section_timeout", c.RankOutOfSectionTimeout)
	kf("node_health_check_interval", c.NodeHealthCheckInterval)
	kf("safety_factor", c.SafetyFactor)
	e.str("rank_termination_signal")
	e.signal(c.RankTerminationSignal)
	ki("log_level", c.LogLevel)
	kf("restart_check_interval", c.RestartCheckInterval)
	kb("enable_nic_monitor", c.EnableNicMonitor)
	kb("enable_nic_healthcheck", c.EnableNicHealthcheck)
	kb("enable_dist_storage_healthcheck", c.EnableDistStorageHealthcheck)
	ks("storage_healthcheck_path", c.StorageHealthcheckPath)
	ks("pci_topo_file", c.PciTopoFile)
	ks("link_down_path_template", c.LinkDownPathTemplate)
	ks("link_state_path_template", c.LinkStatePathTemplate)
	kb("skip_section_response", c.SkipSectionResponse)
	e.str("segment")
	e.optInt(c.Segment)
	kb("numa_bind_strict", c.NumaBindStrict)
	kf("gpu_memory_reclaim_timeout", c.GpuMemoryReclaimTimeout)
	kf("gpu_memory_tolerance_mb", c.GpuMemoryToleranceMB)
	kf("gpu_memory_poll_interval", c.GpuMemoryPollInterval)
	kb("check_remaining_processes", c.CheckRemainingProcesses)
	ki("max_no_progress_cycles", c.MaxNoProgressCycles)
	ki("min_progress_iterations", c.MinProgressIterations)
	ks("checkpoint_iteration_file", c.CheckpointIterationFile)
	kb("install_exception_hook", c.InstallExceptionHook)
	ki("num_warmup_iterations", c.NumWarmupIterations)
	kn("attribution_endpoint")
	kn("attribution_stop_action")
	kn("attribution_export_url")
	ks("cycle_info_dir", c.CycleInfoDir)
	kn("scheduler_exclusion_dir")
	// ft-launcher extras.
	ki("no_restart_exit_code", c.NoRestartExitCode)
	ts := c.TimeoutsStateFile
	ks("timeouts_state_file", &ts)
	kf("termination_grace", c.TerminationGrace)
	kb("calculate_timeouts", c.CalculateTimeouts)
	kb("default_timeouts", c.DefaultTimeouts)
	kb("rank_stacks", c.RankStacks)
	ki("same_failure_limit", c.SameFailureLimit)
	ki("node_failure_limit", c.NodeFailureLimit)
	st := c.Straggler
	ks("straggler", &st)
	kf("straggler_threshold", c.StragglerThreshold)
	kf("straggler_window", c.StragglerWindow)
	kf("straggler_interval", c.StragglerInterval)

	e.op(opSetItems)
	e.op(opBuild)
}

// sectionTimeouts emits a dict[str, float|None] with sorted keys.
func (e *encoder) sectionTimeouts(m map[string]*float64) {
	e.op(opEmptyDict)
	if len(m) == 0 {
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	e.op(opMark)
	for _, k := range keys {
		e.str(k)
		e.optFloat(m[k])
	}
	e.op(opSetItems)
}

// EncodeErrorMsg returns the pickle of data.ErrorMsg(cause).
func EncodeErrorMsg(cause string) []byte {
	e := newEncoder()
	e.newObj(DataModule, "ErrorMsg")
	e.op(opEmptyDict)
	e.str("cause")
	e.str(cause)
	e.op(opSetItem)
	e.op(opBuild)
	return e.finish()
}

// EncodeBytesOK returns the pickle of b'ok', the workload-control ack.
func EncodeBytesOK() []byte {
	return []byte{opProto, 4, opShortBinBytes, 2, 'o', 'k', opStop}
}
