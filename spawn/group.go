package spawn

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// Spec describes one rank process.
type Spec struct {
	LocalRank int
	Argv      []string
	Env       []string // nil: the launcher's environment
	Dir       string   // "": the launcher's working directory
	// Stdin, Stdout and Stderr nil inherit the launcher's (Stdin is set
	// only for a helper the launcher talks to, the fence watchdog).
	Stdin, Stdout, Stderr *os.File
	// DeathSignal is sent to the child when the launcher dies (0: SIGKILL,
	// right for ranks). A helper that must clean up after itself, such as
	// the embedded etcd server removing its data directory, asks for SIGTERM.
	DeathSignal syscall.Signal
}

// Exit is how one child ended.
type Exit struct {
	LocalRank int // -1 for helpers started by Run
	PID       int
	Code      int // exit status, or -1 when killed by a signal
	Signal    syscall.Signal
	At        time.Time // when it was reaped
}

func newExit(localRank, pid int, ws unix.WaitStatus, at time.Time) Exit {
	e := Exit{LocalRank: localRank, PID: pid, Code: -1, At: at}
	switch {
	case ws.Exited():
		e.Code = ws.ExitStatus()
	case ws.Signaled():
		e.Signal = syscall.Signal(ws.Signal())
	}
	return e
}

// Failed reports a non-zero exit or a death by signal.
func (e Exit) Failed() bool { return e.Code != 0 || e.Signal != 0 }

// TorchExitCode follows torch's convention: -signo when killed by a signal,
// else the exit status.
func (e Exit) TorchExitCode() int {
	if e.Signal != 0 {
		return -int(e.Signal)
	}
	return e.Code
}

func (e Exit) String() string {
	who := fmt.Sprintf("local rank %d (pid %d)", e.LocalRank, e.PID)
	if e.LocalRank < 0 {
		who = fmt.Sprintf("pid %d", e.PID)
	}
	if e.Signal != 0 {
		return fmt.Sprintf("%s killed by signal %d (%s)", who, int(e.Signal), unix.SignalName(e.Signal))
	}
	return fmt.Sprintf("%s exited with code %d", who, e.Code)
}

func describeStatus(ws unix.WaitStatus) string {
	return newExit(-1, 0, ws, time.Time{}).String()
}

// Group is the set of rank processes started by one StartGroup call.
type Group struct {
	r     *Reaper
	ranks []*rankProc // in spec order
	exits chan Exit
}

type rankProc struct {
	localRank int
	pid       int // == its process group id
	done      chan struct{}
	mu        sync.Mutex
	exit      Exit
}

func (p *rankProc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// StopResult reports what Stop did.
type StopResult struct {
	Exits     []Exit // every rank's exit, by local rank; missing for ranks that never died
	Escalated []int  // local ranks SIGKILLed after the grace
	Leftover  []int  // pids still present after the bound (e.g. stuck in D state)
}

// StartGroup starts every spec, each rank as the leader of its own process
// group with Pdeathsig=SIGKILL. If any start fails, the ranks already started
// are killed and reaped before the error is returned.
func (r *Reaper) StartGroup(specs []Spec) (*Group, error) {
	seen := make(map[int]bool, len(specs))
	for _, s := range specs {
		if seen[s.LocalRank] {
			return nil, fmt.Errorf("spawn: duplicate local rank %d", s.LocalRank)
		}
		seen[s.LocalRank] = true
		if len(s.Argv) == 0 {
			return nil, fmt.Errorf("spawn: local rank %d: empty argv", s.LocalRank)
		}
	}
	g := &Group{r: r, exits: make(chan Exit, len(specs))}
	for _, s := range specs {
		p := &rankProc{localRank: s.LocalRank, done: make(chan struct{})}
		files := [3]*os.File{orDefault(s.Stdin, os.Stdin), orDefault(s.Stdout, os.Stdout), orDefault(s.Stderr, os.Stderr)}
		pid, err := r.start(s.Argv, s.Env, s.Dir, s.DeathSignal, files, func(pid int, ws unix.WaitStatus, at time.Time) {
			e := newExit(p.localRank, pid, ws, at)
			p.mu.Lock()
			p.exit = e
			p.mu.Unlock()
			close(p.done)
			g.exits <- e // buffered for every rank: never blocks the reaper
		})
		if err != nil {
			if len(g.ranks) > 0 {
				g.Stop(syscall.SIGKILL, 0)
			}
			return nil, fmt.Errorf("spawn: local rank %d: %w", s.LocalRank, err)
		}
		p.pid = pid
		g.ranks = append(g.ranks, p)
		r.log.Debug("spawn: started rank", "local_rank", s.LocalRank, "pid", pid, "argv0", s.Argv[0])
	}
	return g, nil
}

func orDefault(f, def *os.File) *os.File {
	if f == nil {
		return def
	}
	return f
}

// PIDs maps local rank to pid (which is also the rank's process group id).
func (g *Group) PIDs() map[int]int {
	m := make(map[int]int, len(g.ranks))
	for _, p := range g.ranks {
		m[p.localRank] = p.pid
	}
	return m
}

// Exits delivers one Exit per rank as soon as the rank is reaped.
func (g *Group) Exits() <-chan Exit { return g.exits }

func (g *Group) rank(localRank int) *rankProc {
	for _, p := range g.ranks {
		if p.localRank == localRank {
			return p
		}
	}
	return nil
}

// Signal sends sig to the process group of localRank. A rank that has
// already been reaped is not signalled and is not an error.
func (g *Group) Signal(localRank int, sig syscall.Signal) error {
	p := g.rank(localRank)
	if p == nil {
		return fmt.Errorf("spawn: no local rank %d in group", localRank)
	}
	if !p.alive() {
		return nil
	}
	if err := unix.Kill(-p.pid, sig); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("spawn: signal %v to local rank %d (pgid %d): %w", sig, localRank, p.pid, err)
	}
	return nil
}

// Ending reports whether localRank's process has ended or is ending
// although its exit may not be delivered yet: reaped, a zombie, in its
// exit, or with SIGKILL pending (procfs.Ending). A rank killed together
// with another is ending by the time the first one's exit is seen.
func (g *Group) Ending(localRank int) bool {
	p := g.rank(localRank)
	if p == nil || !p.alive() {
		return true
	}
	return procfs.Ending(p.pid)
}

// SignalAll sends sig to the process group of every live rank.
func (g *Group) SignalAll(sig syscall.Signal) {
	for _, p := range g.ranks {
		if err := g.Signal(p.localRank, sig); err != nil {
			g.r.log.Warn("spawn: signal failed", "err", err)
		}
	}
}

// Stop terminates every live rank at once with Terminate (SIGCONT, sig to
// its process group, grace, SIGKILL); ranks SIGKILLed after the grace are
// reported in Escalated. Finally it sweeps: every rank's process group is
// SIGKILLed again (grandchildren that ignored sig outlive their rank)
// together with every orphaned descendant the kernel reparented to the
// launcher, until none is left or killWaitBound has passed since the
// SIGKILLs. Stop never blocks longer than grace plus about 2*killWaitBound.
func (g *Group) Stop(sig syscall.Signal, grace time.Duration) StopResult {
	var res StopResult
	terms := make([]Termination, len(g.ranks))
	var wg sync.WaitGroup
	for i, p := range g.ranks {
		if p.alive() {
			wg.Go(func() {
				terms[i] = Terminate(context.Background(), p.pid, sig, TerminateOptions{Grace: grace, Reaped: p.done})
			})
		}
	}
	wg.Wait()
	for i, p := range g.ranks {
		t := terms[i]
		if t.Err != nil && !errors.Is(t.Err, unix.ESRCH) {
			g.r.log.Warn("spawn: stop signal failed", "local_rank", p.localRank, "pgid", p.pid, "err", t.Err)
		}
		if t.Escalated {
			res.Escalated = append(res.Escalated, p.localRank)
			g.r.log.Warn("spawn: rank ignored stop signal within grace, SIGKILLed", "local_rank", p.localRank, "pid", p.pid, "signal", unix.SignalName(sig), "grace", grace)
		}
	}
	if len(res.Escalated) > 0 || sig == syscall.SIGKILL {
		waitAll(g.ranks, time.Now().Add(killWaitBound))
	}

	res.Leftover = g.sweep(time.Now().Add(killWaitBound))

	for _, p := range g.ranks {
		if p.alive() {
			res.Leftover = append(res.Leftover, p.pid)
			g.r.log.Error("spawn: rank did not die after SIGKILL (D state?), giving up", "local_rank", p.localRank, "pid", p.pid)
			continue
		}
		p.mu.Lock()
		res.Exits = append(res.Exits, p.exit)
		p.mu.Unlock()
	}
	sort.Slice(res.Exits, func(i, j int) bool { return res.Exits[i].LocalRank < res.Exits[j].LocalRank })
	slices.Sort(res.Leftover)
	res.Leftover = slices.Compact(res.Leftover)
	return res
}

// waitAll waits until every rank is reaped or deadline passes.
func waitAll(ranks []*rankProc, deadline time.Time) {
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for _, p := range ranks {
		select {
		case <-p.done:
		case <-timer.C:
			return
		}
	}
}

// sweep SIGKILLs the rank process groups and untracked orphans of the
// launcher until nothing of them is left, or returns the pids still present
// at deadline. Polling is confined to this bounded shutdown path.
func (g *Group) sweep(deadline time.Time) []int {
	pgids := make(map[int]bool, len(g.ranks))
	for _, p := range g.ranks {
		pgids[p.pid] = true
	}
	for {
		found := false
		for pgid := range pgids {
			// ESRCH means the group is empty (zombies still count as members).
			if unix.Kill(-pgid, unix.SIGKILL) == nil {
				found = true
			}
		}
		procs, err := procfs.List()
		if err != nil {
			g.r.log.Warn("spawn: cannot scan /proc for orphans", "err", err)
		}
		var left []int
		for _, ps := range procs {
			orphan := ps.PPID == g.r.self && !g.r.isTracked(ps.PID)
			if orphan {
				if ps.State != 'Z' {
					g.r.log.Info("spawn: killing orphaned descendant", "pid", ps.PID, "comm", ps.Comm)
				}
				_ = unix.Kill(ps.PID, unix.SIGKILL)
			}
			if orphan || (pgids[ps.PGID] && !g.r.isTracked(ps.PID)) {
				found = true
				left = append(left, ps.PID)
			}
		}
		if !found {
			return nil
		}
		if time.Now().After(deadline) {
			g.r.log.Error("spawn: processes survive SIGKILL (D state?), giving up", "pids", left)
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}
