// Package filler runs opportunistic work on a spare node: a user command
// that keeps parked GPUs busy while the node waits as a standby, and that is
// reclaimed the instant the node is promoted. Filler is pre-emptible by
// contract: reclaiming it is a SIGKILL of its whole process tree with no
// grace, so it must checkpoint on its own schedule if it cares.
//
// The filler never joins the job: its environment carries
// FT_LAUNCHER_FILLER=1 and none of the job's rendezvous or rank variables
// (MASTER_ADDR, RANK, TORCHELASTIC_*, the monitor sockets).
package filler

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// EnvMarker is set to 1 in the filler's environment.
const EnvMarker = "FT_LAUNCHER_FILLER"

// Starter starts a process group (*spawn.Reaper in production).
type Starter interface {
	StartGroup(specs []spawn.Spec) (*spawn.Group, error)
}

// GPUCheck reports whether this node's GPUs are free for the job's ranks:
// no process holds a GPU context and memory in use is below a tolerance.
// busy explains what still holds them.
type GPUCheck func(ctx context.Context) (free bool, busy string, err error)

// Options configures the filler of one spare node.
type Options struct {
	Command string   // run as /bin/sh -c COMMAND
	Env     []string // the launcher's environment; job variables are removed
	Dir     string   // working directory ("" = the launcher's)
	LogPath string   // stdout and stderr of every filler start (appended)
	// Budget bounds the filler's restarts while the node stays a spare
	// (policy.RestartBudget); zero: DefaultBudget.
	Budget policy.RestartBudget
	// ReclaimTimeout bounds a reclaim: the tree's exit plus, with GPUs,
	// the wait until they are free (polled every GPUPoll).
	ReclaimTimeout time.Duration
	GPUPoll        time.Duration
	GPUCheck       GPUCheck // nil: no GPUs to wait for
	// CgroupParent is the launcher's own cgroup (spawn.Contain); with
	// cgroup v2 each filler start gets a child cgroup there. "" for none.
	CgroupParent string
	Logger       *slog.Logger
	// OnEvent, when set, is told about starts, exits and reclaims (the
	// agent writes them to the event log): eventlog's FillerStartedEvent,
	// FillerExitedEvent, FillerReclaimedEvent and FillerGaveUpEvent.
	OnEvent func(eventlog.Record)
}

// The kinds of the records passed to OnEvent.
const (
	EventStarted   = eventlog.FillerStarted
	EventExited    = eventlog.FillerExited
	EventReclaimed = eventlog.FillerReclaimed
	EventGaveUp    = eventlog.FillerGaveUp
)

func (o *Options) defaults() {
	if o.Budget == (policy.RestartBudget{}) {
		o.Budget = DefaultBudget()
	}
	if o.ReclaimTimeout <= 0 {
		o.ReclaimTimeout = 30 * time.Second
	}
	if o.GPUPoll <= 0 {
		o.GPUPoll = 200 * time.Millisecond
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OnEvent == nil {
		o.OnEvent = func(eventlog.Record) {}
	}
}

// Filler supervises the filler command of one spare node. Methods are
// called from the agent's goroutine; supervision runs in its own.
type Filler struct {
	o   Options
	st  Starter
	log *slog.Logger

	mu      sync.Mutex
	running bool          // a supervision loop is active
	stop    chan struct{} // closed to end the loop
	done    chan struct{} // closed when the loop returned
	group   *spawn.Group  // the current start, nil between starts
	cgroup  string        // the current start's cgroup ("" none)
	starts  int
}

// New returns a Filler; nothing runs until Park.
func New(st Starter, o Options) *Filler {
	o.defaults()
	return &Filler{o: o, st: st, log: o.Logger}
}

// Park starts the filler if it is not running (the node was just parked as
// a spare). It never blocks on the filler.
func (f *Filler) Park() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running {
		return
	}
	f.running = true
	f.starts = 0
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	go f.supervise(f.stop, f.done)
}

// Running reports whether the filler is being supervised.
func (f *Filler) Running() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running
}

// DefaultBudget: a filler that exits is started again at once, then after
// 1 s, 2 s, 4 s... (at most 30 s) while it keeps exiting within a minute of
// its start, 9 times at most (10 starts) while the node stays a spare.
func DefaultBudget() policy.RestartBudget {
	return policy.RestartBudget{Limit: 9, Backoff: time.Second, MaxBackoff: 30 * time.Second, Stable: time.Minute}
}

// supervise starts the command, and again after each exit (Budget) until
// stopped or the budget is spent.
func (f *Filler) supervise(stop, done chan struct{}) {
	defer close(done)
	tr := policy.RestartTracker{Budget: f.o.Budget}
	for {
		started := time.Now()
		g, err := f.startOnce()
		if err != nil {
			f.log.Error("filler did not start", "err", err)
			f.o.OnEvent(eventlog.FillerGaveUpEvent{Reason: err.Error()})
			return
		}
		var e spawn.Exit
		select {
		case <-stop:
			return
		case e = <-g.Exits():
		}
		// Its children may live on in its group: clear them before a restart.
		f.killCgroup()
		g.Stop(syscall.SIGKILL, 0)
		f.setGroup(nil)
		f.log.Warn("filler exited while the node is a spare", "exit", e.String())
		f.o.OnEvent(eventlog.FillerExitedEvent{ExitCode: e.TorchExitCode(), PID: e.PID})
		wait, ok := tr.Next(time.Now(), started)
		if !ok {
			f.log.Error("filler exited too often; not restarting it", "starts", f.startsUsed())
			f.o.OnEvent(eventlog.FillerGaveUpEvent{Reason: fmt.Sprintf("exited %d times", f.startsUsed())})
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(wait):
		}
	}
}

func (f *Filler) startOnce() (*spawn.Group, error) {
	out, err := os.OpenFile(f.o.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("filler log %s: %w", f.o.LogPath, err)
	}
	defer out.Close() // the child holds its own copy
	g, err := f.st.StartGroup([]spawn.Spec{{LocalRank: -2, Argv: []string{"/bin/sh", "-c", f.o.Command},
		Env: Env(f.o.Env), Dir: f.o.Dir, Stdout: out, Stderr: out}})
	if err != nil {
		return nil, fmt.Errorf("start filler %q: %w", f.o.Command, err)
	}
	pid := g.PIDs()[-2]
	cg, cerr := cgroupFor(f.o.CgroupParent, pid)
	if cerr != nil {
		f.log.Warn("filler runs without its own cgroup", "err", cerr)
	}
	f.mu.Lock()
	f.group, f.cgroup = g, cg
	f.starts++
	n := f.starts
	f.mu.Unlock()
	f.log.Info("filler started on this spare node", "pid", pid, "start", n, "log", f.o.LogPath, "cgroup", cg)
	f.o.OnEvent(eventlog.FillerStartedEvent{PID: pid, Start: n, Command: f.o.Command, Log: f.o.LogPath})
	return g, nil
}

func (f *Filler) setGroup(g *spawn.Group) {
	f.mu.Lock()
	f.group = g
	f.mu.Unlock()
}

func (f *Filler) startsUsed() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

// Reclaim is what happens when the spare is promoted: the filler's whole
// process tree is SIGKILLed at once (no grace), its exit awaited, and,
// with GPUs, the GPUs awaited until free; all within ReclaimTimeout. An
// error means this node cannot safely run the job's ranks.
func (f *Filler) Reclaim(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, f.o.ReclaimTimeout)
	defer cancel()
	f.mu.Lock()
	running, stop, done, g := f.running, f.stop, f.done, f.group
	f.running = false
	f.mu.Unlock()
	if !running {
		return 0, nil
	}
	close(stop)
	f.killCgroup()
	if g != nil {
		// Stop with SIGKILL: signal, sweep the group and every orphan the
		// launcher adopted, bounded by spawn.
		stopped := make(chan spawn.StopResult, 1)
		go func() { stopped <- g.Stop(syscall.SIGKILL, 0) }()
		select {
		case res := <-stopped:
			if len(res.Leftover) > 0 {
				return time.Since(start), fmt.Errorf("filler processes survive SIGKILL: %v", res.Leftover)
			}
		case <-ctx.Done():
			return time.Since(start), fmt.Errorf("filler did not exit within %v", f.o.ReclaimTimeout)
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		return time.Since(start), fmt.Errorf("filler supervisor did not end within %v", f.o.ReclaimTimeout)
	}
	if err := f.waitGPUs(ctx); err != nil {
		return time.Since(start), err
	}
	took := time.Since(start)
	f.log.Info("filler reclaimed", "took", took)
	f.o.OnEvent(eventlog.FillerReclaimedEvent{TookMS: float64(took.Microseconds()) / 1000})
	return took, nil
}

// killCgroup kills the current start's cgroup, if it has one.
func (f *Filler) killCgroup() {
	f.mu.Lock()
	dir := f.cgroup
	f.cgroup = ""
	f.mu.Unlock()
	if err := killCgroup(dir); err != nil {
		f.log.Warn("filler cgroup", "err", err)
	}
}

// waitGPUs polls GPUCheck until the GPUs are free or ctx ends.
func (f *Filler) waitGPUs(ctx context.Context) error {
	if f.o.GPUCheck == nil {
		return nil
	}
	var last string
	for {
		free, busy, err := f.o.GPUCheck(ctx)
		if err == nil && free {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = busy
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("GPUs still in use %v after the filler was killed: %s", f.o.ReclaimTimeout, last)
		case <-time.After(f.o.GPUPoll):
		}
	}
}

// Close stops the filler (the node is leaving); like Reclaim, but it does
// not wait for the GPUs.
func (f *Filler) Close() {
	o := f.o.GPUCheck
	f.o.GPUCheck = nil
	_, _ = f.Reclaim(context.Background())
	f.o.GPUCheck = o
}

// jobVars are the variables a filler must not see: they belong to the
// job's ranks and rendezvous.
var jobVars = []string{"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
	"GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE"}

// jobPrefixes are variable prefixes of the job (torchrun, ft-launcher,
// nvrx's monitor sockets, PET_ launch options).
var jobPrefixes = []string{"TORCHELASTIC_", "FT_RANK_MONITOR", "FT_LAUNCHER_", "PET_", "TORCH_ELASTIC_"}

// Env is the filler's environment: base without the job's variables, plus
// FT_LAUNCHER_FILLER=1.
func Env(base []string) []string {
	out := make([]string, 0, len(base)+1)
next:
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		for _, v := range jobVars {
			if k == v {
				continue next
			}
		}
		for _, p := range jobPrefixes {
			if strings.HasPrefix(k, p) {
				continue next
			}
		}
		out = append(out, kv)
	}
	return append(out, EnvMarker+"=1")
}

// LogPath is the filler's log file under dir.
func LogPath(dir string) string { return filepath.Join(dir, "filler.log") }
