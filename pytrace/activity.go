package pytrace

import "strings"

// Activity says what a thread is doing at its innermost frames, for telling
// a hung rank from ranks waiting on it.
type Activity string

const (
	// ActCollective: inside torch.distributed (a collective, a barrier,
	// init_process_group's store barrier, an elastic store get/wait: files
	// under torch/distributed/ or named *c10d*), or in torch.cuda's
	// synchronize, where a rank waits for a collective's kernels.
	ActCollective Activity = "collective"
	// ActLock: waiting in threading's Lock/Condition/Event/Semaphore or
	// Thread.join, in queue.Queue get/put, in multiprocessing's locks and
	// queues, or on a concurrent.futures result. A bare lock.acquire() in
	// user code shows only the user's frame: that is ActUser.
	ActLock Activity = "lock"
	// ActIO: in the standard library's selectors, socket, ssl, subprocess,
	// socketserver, multiprocessing.connection, http, urllib or shutil.
	ActIO Activity = "io"
	// ActSleep: asleep. time.sleep is C and does not show in a dump (a
	// sleeping thread is ActUser at the line that calls it); only sleeps in
	// Python code of the standard library (asyncio.sleep) are recognized.
	ActSleep Activity = "sleep"
	// ActUser: the innermost frame is the user's code, running or blocked in
	// a C call the dump cannot show (a deadlocked lock.acquire(), os.read on
	// a FIFO, time.sleep, a CUDA call).
	ActUser Activity = "user"
	// ActLibrary: the innermost frame is in another library (or the standard
	// library outside the modules above).
	ActLibrary Activity = "library"
	// ActNone: the thread has no Python frame ("  <no Python frame>").
	ActNone Activity = "none"
)

// Classify says what thread t is doing, from its innermost frames: if any
// frame of the innermost run of library frames is torch.distributed (or
// torch.cuda's synchronize), ActCollective; else by the innermost frame.
func Classify(t Thread) Activity {
	return classifyFrames(t.Frames)
}

func classifyFrames(fs []Frame) Activity {
	if len(fs) == 0 {
		return ActNone
	}
	for i := len(fs) - 1; i >= 0 && IsLibrary(fs[i].File); i-- {
		if isCollectiveFrame(fs[i]) {
			return ActCollective
		}
	}
	inner := fs[len(fs)-1]
	if !IsLibrary(inner.File) {
		return ActUser
	}
	if a := stdlibActivity(inner); a != "" {
		return a
	}
	return ActLibrary
}

// Collective returns the torch.distributed function thread t is in
// ("all_reduce", "barrier", "broadcast", "init_process_group",
// "synchronize", ...) when Classify(t) is ActCollective, else "". It is the
// public function of distributed_c10d.py the caller entered (the outermost
// such frame of the innermost library run), else the innermost
// torch.distributed function that is not a decorator's wrapper.
func Collective(t Thread) string {
	fs := t.Frames
	if classifyFrames(fs) != ActCollective {
		return ""
	}
	lo := len(fs) - 1
	for lo > 0 && IsLibrary(fs[lo-1].File) {
		lo--
	}
	run := fs[lo:] // the innermost run of library frames, outermost first
	for _, f := range run {
		if isC10dAPIFile(f.File) && !isWrapperName(f.Func) {
			return f.Func
		}
	}
	for i := len(run) - 1; i >= 0; i-- {
		if isCollectiveFrame(run[i]) && !isWrapperName(run[i].Func) {
			return run[i].Func
		}
	}
	for i := len(run) - 1; i >= 0; i-- {
		if isCollectiveFrame(run[i]) {
			return run[i].Func
		}
	}
	return ""
}

func slashPath(file string) string {
	if strings.IndexByte(file, '\\') >= 0 {
		return strings.ReplaceAll(file, `\`, "/")
	}
	return file
}

// isC10dAPIFile: the module that defines torch.distributed's public
// collectives.
func isC10dAPIFile(file string) bool {
	b := baseName(slashPath(file))
	return b == "distributed_c10d.py"
}

// elasticInfra are parts of torch.distributed that run the launcher and its
// watchdogs rather than collectives.
var elasticInfra = []string{
	"/torch/distributed/elastic/agent/",
	"/torch/distributed/elastic/timer/",
	"/torch/distributed/elastic/multiprocessing/",
	"/torch/distributed/elastic/events/",
	"/torch/distributed/elastic/metrics/",
}

func isCollectiveFrame(f Frame) bool {
	p := slashPath(f.File)
	if strings.Contains(p, "/torch/distributed/") {
		for _, e := range elasticInfra {
			if strings.Contains(p, e) {
				return false
			}
		}
		return true
	}
	if strings.Contains(baseName(p), "c10d") && IsLibrary(f.File) {
		return true
	}
	if strings.Contains(p, "/torch/cuda/") && f.Func == "synchronize" {
		return true
	}
	// DistributedDataParallel reduces gradients from autograd hooks, in
	// C++: a rank blocked in backward() waits for its peers' gradients
	// with no torch.distributed frame on its stack. DDP's forward
	// broadcasts buffers from its own module.
	if strings.Contains(p, "/torch/nn/parallel/distributed.py") {
		return true
	}
	if (strings.HasSuffix(p, "/torch/autograd/__init__.py") || strings.HasSuffix(p, "/torch/autograd/graph.py") ||
		strings.HasSuffix(p, "/torch/_tensor.py")) &&
		(f.Func == "backward" || f.Func == "grad" || f.Func == "_engine_run_backward") {
		return true
	}
	return false
}

func isWrapperName(fn string) bool {
	switch fn {
	case "wrapper", "_wrapper", "inner", "wrapped", "_fn", "fn", "decorated", "__call__", "<lambda>":
		return true
	}
	return false
}

// stdlibModule returns the standard-library module path of file
// ("threading", "multiprocessing/connection", "concurrent/futures/_base"),
// or "" when file is not in the standard library.
func stdlibModule(file string) string {
	p := slashPath(file)
	if strings.Contains(p, "/site-packages/") || strings.Contains(p, "/dist-packages/") {
		return ""
	}
	segs := strings.Split(p, "/")
	for i := len(segs) - 2; i >= 0; i-- {
		if isStdlibDir(segs[i]) || segs[i] == "Lib" && i > 0 && strings.HasPrefix(strings.ToLower(segs[i-1]), "python") {
			return strings.TrimSuffix(strings.Join(segs[i+1:], "/"), ".py")
		}
	}
	return ""
}

func stdlibActivity(f Frame) Activity {
	m := stdlibModule(f.File)
	if m == "" {
		return ""
	}
	switch m {
	case "threading":
		switch f.Func {
		case "wait", "wait_for", "acquire", "join", "_wait_for_tstate_lock", "__enter__", "_acquire_restore":
			return ActLock
		}
		return ""
	case "queue":
		switch f.Func {
		case "get", "put", "join":
			return ActLock
		}
		return ""
	case "multiprocessing/synchronize", "multiprocessing/queues", "asyncio/locks", "asyncio/queues":
		return ActLock
	case "concurrent/futures/_base":
		switch f.Func {
		case "result", "exception", "wait", "as_completed":
			return ActLock
		}
		return ""
	case "selectors", "socket", "ssl", "subprocess", "socketserver", "multiprocessing/connection",
		"multiprocessing/popen_fork", "multiprocessing/popen_spawn_posix", "multiprocessing/popen_forkserver",
		"http/client", "urllib/request", "shutil", "_pyio", "asyncio/selector_events",
		"asyncio/base_events", "asyncio/streams":
		return ActIO
	case "asyncio/tasks":
		if f.Func == "sleep" {
			return ActSleep
		}
		return ""
	}
	return ""
}

// Phases of training a thread can be seen in, from its library frames:
// what a step may wait on for seconds without being hung.
const (
	PhaseData    = "data loading"  // torch.utils.data: waiting on the DataLoader's workers
	PhaseSave    = "a save"        // torch.save, safetensors
	PhaseLoad    = "a load"        // torch.load, safetensors
	PhaseCompile = "a compilation" // torch._dynamo, torch._inductor, triton
)

// Phase returns the phase t is in (Phase* constants), "" when none is
// recognised: the innermost run of library frames holds one of theirs.
func Phase(t Thread) string {
	fs := t.Frames
	for i := len(fs) - 1; i >= 0 && IsLibrary(fs[i].File); i-- {
		p := slashPath(fs[i].File)
		switch {
		case strings.Contains(p, "/torch/utils/data/"):
			return PhaseData
		case strings.HasSuffix(p, "/torch/serialization.py") && strings.Contains(fs[i].Func, "save"),
			strings.Contains(p, "/safetensors/") && strings.Contains(fs[i].Func, "save"):
			return PhaseSave
		case strings.HasSuffix(p, "/torch/serialization.py") && strings.Contains(fs[i].Func, "load"),
			strings.Contains(p, "/safetensors/") && strings.Contains(fs[i].Func, "load"):
			return PhaseLoad
		case strings.Contains(p, "/torch/_dynamo/"), strings.Contains(p, "/torch/_inductor/"), strings.Contains(p, "/triton/"):
			return PhaseCompile
		}
	}
	return ""
}
