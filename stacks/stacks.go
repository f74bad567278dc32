// Package stacks reads where the Python processes of a node's ranks are:
// the stack of every thread, taken from outside the rank while it hangs,
// before the launcher kills it.
//
// The launcher puts a small hook first on each Python rank's PYTHONPATH
// (hook/sitecustomize.py, which chains to the sitecustomize it shadows, as
// --prewarm auto's hook does). The hook registers faulthandler on a
// real-time signal, writing to <dir>/<pid>.txt, and points faulthandler's
// fatal-error handler there too. Collect sends that signal to each rank
// process that has a handler installed for it (SigCgt in
// /proc/<pid>/status: the signal's default action would kill a process
// without one, so a rank that is not Python, or whose hook did not load,
// is never sent it) and reads what the handler appended. faulthandler
// writes from its C signal handler, so a rank deadlocked on a lock, blocked
// in a read or waiting in a collective still answers at once; a stopped
// one (SIGSTOP) cannot, and its state says so.
//
// Where torch's NCCL flight recorder is on (its buffer size set in the
// ranks' environment, or set by the launcher on a GPU node), the hook also
// keeps a thread that dumps it on request (flightrec.go): Collect asks each
// dumped rank for it after its stacks, within the same bound.
//
// Nothing a rank writes is executed: the dumps are text, parsed by
// package pytrace; a flight recorder is a pickle read only by the
// restricted decoder of package nvrxwire.
package stacks

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/lockdir"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

//go:embed hook/sitecustomize.py hook/_ftl_stacks.py
var hookFiles embed.FS

// Signal is the signal the hook dumps the stacks on: a real-time signal
// no library uses (glibc and musl keep 32-34 for themselves).
const Signal = syscall.Signal(37)

// The variables the hook reads.
const (
	DirEnv    = "FT_LAUNCHER_STACKS_DIR"
	SignalEnv = "FT_LAUNCHER_STACKS_SIGNAL"
	FREnv     = "FT_LAUNCHER_STACKS_FR" // "1": keep the flight-recorder thread
)

// DefaultBound is how long Collect waits for the dumps, all ranks
// together.
const DefaultBound = time.Second

// settle is how long a dump file must stay the same size before its dump
// is taken as complete: faulthandler writes a dump in one burst of
// write(2) calls, microseconds apart.
const settle = 8 * time.Millisecond

// poll is how often Collect looks at the dump files.
const poll = 2 * time.Millisecond

// maxDump bounds what Collect reads of one dump.
const maxDump = 1 << 20

// Collector owns the hook and the dump directory of one launcher.
type Collector struct {
	dir     string   // temporary: hook/ and dumps/
	lock    *os.File // holds dir's owner lock (lockdir) while the launcher runs
	hookDir string
	dumpDir string
	// frDefault: the flight recorder's buffer size Env sets where the
	// ranks' environment sets none (0: leave it off).
	frDefault int
	fr        bool // Env turned the flight-recorder thread on
}

// dirPrefix names the collectors' directories under $TMPDIR.
const dirPrefix = "ft-launcher-stacks-"

// New writes the hook into a new private directory under $TMPDIR, locked
// while this process runs. The directories of launchers that died without
// removing theirs (SIGKILL) are removed first.
func New() (*Collector, error) {
	lockdir.RemoveStale(os.TempDir(), dirPrefix, nil)
	dir, lock, err := lockdir.Make(os.TempDir(), dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("stacks: %w", err)
	}
	c := &Collector{dir: dir, lock: lock, hookDir: filepath.Join(dir, "hook"), dumpDir: filepath.Join(dir, "dumps")}
	for _, d := range []string{c.hookDir, c.dumpDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			c.Close()
			return nil, fmt.Errorf("stacks: %w", err)
		}
	}
	for _, name := range []string{"sitecustomize.py", "_ftl_stacks.py"} {
		b, err := hookFiles.ReadFile("hook/" + name)
		if err == nil {
			err = os.WriteFile(filepath.Join(c.hookDir, name), b, 0o600)
		}
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("stacks: write the hook: %w", err)
		}
	}
	return c, nil
}

// HookDir is the directory the hook puts first on PYTHONPATH.
func (c *Collector) HookDir() string { return c.hookDir }

// Close removes the hook and the dumps.
func (c *Collector) Close() error {
	err := os.RemoveAll(c.dir)
	if c.lock != nil {
		c.lock.Close()
	}
	return err
}

// Env returns env with the hook first on PYTHONPATH and its variables
// set (env itself is not modified). It also decides whether Collect asks
// for the flight recorder: where env sets torch's buffer size
// (TORCH_NCCL_TRACE_BUFFER_SIZE, or TORCH_FR_BUFFER_SIZE of newer torch)
// above 0, or sets neither and SetFlightRecorderDefault gave a size, which
// Env then sets.
func (c *Collector) Env(env []string) []string {
	pp := c.hookDir
	out := make([]string, 0, len(env)+5)
	frSet := false
	c.fr = false
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && slices.Contains(frBufferVars, k) {
			frSet = true
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
				c.fr = true
			}
		}
		switch {
		case strings.HasPrefix(kv, "PYTHONPATH="):
			if old := strings.TrimPrefix(kv, "PYTHONPATH="); old != "" {
				pp = c.hookDir + string(os.PathListSeparator) + old
			} else {
				pp = c.hookDir
			}
		case strings.HasPrefix(kv, DirEnv+"="), strings.HasPrefix(kv, SignalEnv+"="), strings.HasPrefix(kv, FREnv+"="):
		default:
			out = append(out, kv)
		}
	}
	if !frSet && c.frDefault > 0 {
		out = append(out, frBufferVars[0]+"="+strconv.Itoa(c.frDefault))
		c.fr = true
	}
	if c.fr {
		out = append(out, FREnv+"=1")
	}
	return append(out, "PYTHONPATH="+pp, DirEnv+"="+c.dumpDir, SignalEnv+"="+strconv.Itoa(int(Signal)))
}

// frBufferVars are torch's variables for the flight recorder's buffer
// size (entries kept); 0, torch's default, turns it off.
var frBufferVars = []string{"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"}

// SetFlightRecorderDefault makes Env turn torch's flight recorder on with
// n entries where the ranks' environment does not set its size (call it
// before Env; the launcher does on a node with NVIDIA GPUs).
func (c *Collector) SetFlightRecorderDefault(n int) { c.frDefault = n }

// FlightRecorderOn says whether Collect asks the ranks for their flight
// recorders (decided by Env).
func (c *Collector) FlightRecorderOn() bool { return c.fr }

// State is what a rank process was doing, as far as the kernel says.
type State string

// States of a rank.
const (
	StateDumped   State = "dumped"    // its stacks are in Dump
	StateStopped  State = "stopped"   // stopped by a signal (SIGSTOP): it cannot answer
	StateNoHook   State = "no_hook"   // no process of the rank catches Signal (not Python, or the hook did not load)
	StateGone     State = "gone"      // it exited before it answered
	StateNoAnswer State = "no_answer" // it catches Signal but wrote nothing within the bound
)

// Rank is what Collect found for one rank.
type Rank struct {
	LocalRank int
	PID       int    // the rank's process
	DumpedPID int    // the process that dumped: PID, or a descendant (a rank started through a shell)
	State     State  // see the constants
	Proc      byte   // the rank process's state letter (R, S, D, T, ...)
	WChan     string // where the kernel has the rank's main thread waiting ("" when running)
	Dump      []byte // what the handler wrote: faulthandler's text, parsed by pytrace
	// FR: torch's flight recorder of the dumped process (a pickle, as
	// torch's own tools read it), asked for after its stacks when it is on.
	FR      []byte
	FRState FRState
	Took    time.Duration
}

// Collect takes the stacks of the ranks in pids (local rank → pid), all at
// once, waiting at most bound in all (DefaultBound when 0).
func (c *Collector) Collect(ctx context.Context, pids map[int]int, bound time.Duration) []Rank {
	if bound <= 0 {
		bound = DefaultBound
	}
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out := make([]Rank, 0, len(pids))
	var mu sync.Mutex
	var wg sync.WaitGroup
	for lr, pid := range pids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.collect(ctx, lr, pid)
			mu.Lock()
			out = append(out, r)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b Rank) int { return a.LocalRank - b.LocalRank })
	return out
}

func (c *Collector) collect(ctx context.Context, lr, pid int) (r Rank) {
	start := time.Now()
	r = Rank{LocalRank: lr, PID: pid}
	defer func() { r.Took = time.Since(start) }()
	st, err := procfs.Read(pid)
	if err != nil || st.Dead() {
		r.State = StateGone
		return r
	}
	r.Proc = st.State
	r.WChan = wchan(pid)
	if st.Stopped() {
		r.State = StateStopped
		return r
	}
	target := hooked(pid)
	if target == 0 {
		r.State = StateNoHook
		return r
	}
	r.DumpedPID = target
	path := filepath.Join(c.dumpDir, strconv.Itoa(target)+".txt")
	before := size(path)
	if err := syscall.Kill(target, Signal); err != nil {
		r.State = StateGone
		return r
	}
	last, stable := before, time.Time{}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		n := size(path)
		switch {
		case n != last:
			last, stable = n, time.Now()
		case n > before && time.Since(stable) >= settle:
			r.State, r.Dump = StateDumped, read(path, before, n)
			if c.fr {
				r.FR, r.FRState = c.flightRecorder(ctx, target)
			}
			return r
		}
		select {
		case <-ctx.Done():
			if last > before { // a dump cut short by the bound is still evidence
				r.State, r.Dump = StateDumped, read(path, before, last)
			} else if s, err := procfs.Read(target); err != nil || s.Dead() {
				r.State = StateGone
			} else {
				r.State = StateNoAnswer
			}
			return r
		case <-t.C:
		}
	}
}

// hooked returns pid, or else its first descendant, that catches Signal
// (0: none). Only the topmost one is asked: a forked DataLoader worker
// inherits the handler but is not where the rank is.
func hooked(pid int) int {
	if procfs.Catches(pid, Signal) {
		return pid
	}
	for _, d := range procfs.Descendants(pid) {
		if procfs.Catches(d, Signal) {
			return d
		}
	}
	return 0
}

func size(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

func read(path string, from, to int64) []byte {
	if to-from > maxDump {
		from = to - maxDump
	}
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	b := make([]byte, to-from)
	n, _ := io.ReadFull(io.NewSectionReader(f, from, to-from), b)
	return b[:n]
}

func wchan(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/wchan")
	if err != nil {
		return ""
	}
	w := string(bytes.TrimSpace(b))
	if w == "0" {
		return ""
	}
	return w
}

// Fatal returns what the fatal-error handler of process pid wrote (a
// SIGSEGV's or SIGABRT's stack) after offset from, and the file's size
// (to pass as from next time). nil when nothing was written.
func (c *Collector) Fatal(pid int, from int64) ([]byte, int64) {
	path := filepath.Join(c.dumpDir, strconv.Itoa(pid)+".txt")
	n := size(path)
	if n <= from {
		return nil, n
	}
	return read(path, from, n), n
}

// Exception returns the traceback of the uncaught exception process pid
// died of, as the hook wrote it (its last 64 KiB); nil when none.
func (c *Collector) Exception(pid int) []byte {
	path := filepath.Join(c.dumpDir, strconv.Itoa(pid)+".exc")
	n := size(path)
	if n == 0 {
		return nil
	}
	return read(path, max(n-maxException, 0), n)
}

// maxException bounds what Exception reads.
const maxException = 64 << 10

// Forget removes the files of an exited process.
func (c *Collector) Forget(pid int) {
	for _, ext := range []string{".txt", ".exc", ".frq", ".fr", ".fr.tmp"} {
		os.Remove(filepath.Join(c.dumpDir, strconv.Itoa(pid)+ext))
	}
}
