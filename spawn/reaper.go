// Package spawn starts, supervises, stops and reaps the rank processes of one
// node.
//
// A Reaper owns every child process of the launcher. It marks the launcher as
// a child subreaper and reaps with wait4(-1) whenever SIGCHLD arrives, so
// descendants that get orphaned are reparented to the launcher and never
// linger as zombies (also when the launcher is PID 1 in a container). Because
// it waits on -1, every child of the process must be started through the
// Reaper (StartGroup or Run); os/exec's Cmd.Wait would race with it. At most
// one Reaper may be open in a process at a time.
//
// All forks happen on one goroutine locked to its OS thread for the whole life
// of the Reaper: Linux delivers the parent-death signal (Pdeathsig) when the
// forking thread exits, not the process, so forking from arbitrary runtime
// threads would kill ranks whenever the Go scheduler retires a thread.
package spawn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// killWaitBound bounds every wait after a SIGKILL: a process in
// uninterruptible sleep (D state) may never die, and nothing may block forever.
const killWaitBound = 2 * time.Second

// exitFunc receives the wait status of a reaped child.
type exitFunc func(pid int, ws unix.WaitStatus, at time.Time)

// Reaper owns every child of the launcher; see the package documentation.
type Reaper struct {
	log  *slog.Logger
	self int

	// mu is held across fork+register and across wait4+lookup, so a child
	// can never be reaped before its exit callback is registered.
	mu       sync.Mutex
	children map[int]exitFunc
	// kept are children registered by Keep: they live as long as this
	// process (the cgroup guardian), so Close does not wait for them.
	kept map[int]bool

	forkReq  chan forkRequest
	sigCh    chan os.Signal
	stopFork chan struct{}
	stopReap chan struct{}
	forkDone chan struct{}
	reapDone chan struct{}
	closed   sync.Once
}

type forkRequest struct {
	path   string
	argv   []string
	attr   *syscall.ProcAttr
	onExit exitFunc
	reply  chan forkReply
}

type forkReply struct {
	pid int
	err error
}

// NewReaper makes the calling process a child subreaper and starts the
// reaping and forking goroutines. log may be nil.
func NewReaper(log *slog.Logger) (*Reaper, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return nil, fmt.Errorf("spawn: prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	r := &Reaper{
		log:      log,
		self:     os.Getpid(),
		children: make(map[int]exitFunc),
		kept:     make(map[int]bool),
		forkReq:  make(chan forkRequest),
		sigCh:    make(chan os.Signal, 1),
		stopFork: make(chan struct{}),
		stopReap: make(chan struct{}),
		forkDone: make(chan struct{}),
		reapDone: make(chan struct{}),
	}
	signal.Notify(r.sigCh, syscall.SIGCHLD)
	go r.reapLoop()
	go r.forkLoop()
	return r, nil
}

// Close stops forking and reaping. Call it after every group has been
// stopped: children that are still running die then by their parent-death
// signal, because the forking thread exits with its goroutine. Close waits a
// bounded time for them to be reaped.
func (r *Reaper) Close() error {
	r.closed.Do(func() {
		close(r.stopFork)
		<-r.forkDone
		deadline := time.Now().Add(killWaitBound)
		for r.liveCount() > 0 && time.Now().Before(deadline) {
			r.reapAll()
			time.Sleep(10 * time.Millisecond)
		}
		r.reapAll() // kept children that have already exited
		if n := r.liveCount(); n > 0 {
			r.log.Warn("spawn: children still unreaped at close", "count", n)
		}
		signal.Stop(r.sigCh)
		close(r.stopReap)
		<-r.reapDone
	})
	return nil
}

// liveCount is the children Close waits for: all but the kept ones.
func (r *Reaper) liveCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for pid := range r.children {
		if !r.kept[pid] {
			n++
		}
	}
	return n
}

// Keep registers pid, a child this process started outside the Reaper
// (the cgroup guardian of Contain), so that the orphan sweep of a stop
// leaves it alone; its exit is reaped like any other, and Close does not
// wait for it (it outlives the Reaper by design).
func (r *Reaper) Keep(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.children[pid]; !ok {
		r.children[pid] = func(int, unix.WaitStatus, time.Time) {}
		r.kept[pid] = true
	}
}

// isTracked reports whether pid is a live child started through the Reaper.
func (r *Reaper) isTracked(pid int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.children[pid]
	return ok
}

func (r *Reaper) reapLoop() {
	defer close(r.reapDone)
	r.reapAll() // children that exited before Notify took effect
	for {
		select {
		case <-r.sigCh:
			r.reapAll()
		case <-r.stopReap:
			return
		}
	}
}

type reaped struct {
	pid int
	ws  unix.WaitStatus
	fn  exitFunc
}

// reapAll collects every exited child without blocking, then runs the exit
// callbacks outside the lock.
func (r *Reaper) reapAll() {
	var done []reaped
	r.mu.Lock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			break // ECHILD: no children at all; 0: none exited yet
		}
		fn := r.children[pid]
		delete(r.children, pid)
		delete(r.kept, pid)
		done = append(done, reaped{pid: pid, ws: ws, fn: fn})
	}
	r.mu.Unlock()
	at := time.Now()
	for _, d := range done {
		if d.fn == nil {
			r.log.Debug("spawn: reaped orphaned descendant", "pid", d.pid, "status", describeStatus(d.ws))
			continue
		}
		d.fn(d.pid, d.ws, at)
	}
}

// forkLoop is the only place that forks. Its goroutine stays locked to one
// OS thread and never unlocks, so the thread lives exactly as long as the
// Reaper accepts work (see the package documentation on Pdeathsig).
func (r *Reaper) forkLoop() {
	runtime.LockOSThread()
	defer close(r.forkDone)
	for {
		select {
		case req := <-r.forkReq:
			r.mu.Lock()
			pid, err := syscall.ForkExec(req.path, req.argv, req.attr)
			if err == nil {
				r.children[pid] = req.onExit
			}
			r.mu.Unlock()
			req.reply <- forkReply{pid: pid, err: err}
		case <-r.stopFork:
			return
		}
	}
}

// start forks one child in its own process group with the parent-death
// signal deathSig (0: SIGKILL). files are the child's fds 0, 1 and 2.
func (r *Reaper) start(argv, env []string, dir string, deathSig syscall.Signal, files [3]*os.File, onExit exitFunc) (int, error) {
	if deathSig == 0 {
		deathSig = syscall.SIGKILL
	}
	if len(argv) == 0 {
		return 0, errors.New("empty argv")
	}
	if env == nil {
		env = os.Environ()
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return 0, err
	}
	// Fd puts each file in blocking mode, which is what the child expects of
	// its standard streams (a non-blocking pipe would make writes fail with
	// EAGAIN in the rank).
	var fds []uintptr
	for _, f := range files {
		fds = append(fds, f.Fd())
	}
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: fds,
		Sys:   &syscall.SysProcAttr{Setpgid: true, Pdeathsig: deathSig},
	}
	req := forkRequest{path: path, argv: argv, attr: attr, onExit: onExit, reply: make(chan forkReply, 1)}
	select {
	case r.forkReq <- req:
	case <-r.stopFork:
		return 0, errors.New("reaper is closed")
	}
	rep := <-req.reply
	runtime.KeepAlive(files)
	if rep.err != nil {
		return 0, fmt.Errorf("start %q: %w", argv[0], rep.err)
	}
	return rep.pid, nil
}

// Run runs a helper command (health-check hook, nvidia-smi) to completion
// through the Reaper and returns its combined stdout and stderr. A non-zero
// exit is reported in exit, not as an error. When ctx ends first, the
// helper's process group is SIGKILLed and ctx's error is returned. env nil
// means the launcher's environment. stdin is /dev/null.
func (r *Reaper) Run(ctx context.Context, argv []string, env []string) (out []byte, exit Exit, err error) {
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, Exit{}, fmt.Errorf("spawn: run: %w", err)
	}
	defer devNull.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, Exit{}, fmt.Errorf("spawn: run: %w", err)
	}
	defer pr.Close()
	exitCh := make(chan Exit, 1)
	pid, err := r.start(argv, env, "", 0, [3]*os.File{devNull, pw, pw}, func(pid int, ws unix.WaitStatus, at time.Time) {
		exitCh <- newExit(-1, pid, ws, at)
	})
	pw.Close()
	if err != nil {
		return nil, Exit{}, fmt.Errorf("spawn: run: %w", err)
	}

	var buf []byte
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		buf, _ = io.ReadAll(pr)
	}()

	select {
	case exit = <-exitCh:
	case <-ctx.Done():
		err = fmt.Errorf("spawn: run %q: %w", argv[0], ctx.Err())
		_ = unix.Kill(-pid, unix.SIGKILL)
		select {
		case exit = <-exitCh:
		case <-time.After(killWaitBound):
			r.log.Warn("spawn: helper did not die after SIGKILL", "pid", pid, "argv0", argv[0])
		}
	}
	// Background processes the helper left in its group would hold the pipe
	// open; they have no business outliving it.
	_ = unix.Kill(-pid, unix.SIGKILL)
	select {
	case <-readDone:
	case <-time.After(killWaitBound):
		pr.Close() // unblocks the reader
		<-readDone
	}
	return buf, exit, err
}

// lookPath resolves argv0 like execvp, using PATH from env when present.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		if err := checkExecutable(file); err != nil {
			return "", fmt.Errorf("executable %q: %w", file, err)
		}
		return file, nil
	}
	pathVar, found := "", false
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], "PATH="); ok {
			pathVar, found = v, true
			break
		}
	}
	if !found {
		pathVar = os.Getenv("PATH")
	}
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %q not found in PATH", file)
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() {
		return errors.New("is a directory")
	}
	if st.Mode().Perm()&0o111 == 0 {
		return errors.New("permission denied (not executable)")
	}
	return nil
}
