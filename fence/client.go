package fence

import (
	"bufio"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// writeBound bounds one command write: the watchdog reads at once unless it
// is itself stopped, and a launcher must never block on it.
const writeBound = time.Second

// closeBound is how long Close waits for the watchdog to exit after EOF
// before it SIGKILLs it.
const closeBound = 5 * time.Second

// DefaultBudget bounds the restarts of a watchdog process that keeps
// dying (policy.RestartBudget). A death is repaired at once (the node is
// unprotected until a new watchdog serves); a death or a failed start
// soon after the last restart waits 100 ms, doubling to at most 1 s; the
// launcher gives up, and fences its ranks itself, after 3 restarts within
// 30 s (a crash loop, or an executable that is gone or a fork that fails:
// restarting again would leave the ranks unprotected most of the time).
// A watchdog that served 10 s ends the row. The node is unprotected for
// at most about 0.3 s plus the forks before its ranks are killed.
func DefaultBudget() policy.RestartBudget {
	return policy.RestartBudget{Limit: 3, Window: 30 * time.Second, Backoff: 100 * time.Millisecond,
		MaxBackoff: time.Second, Stable: 10 * time.Second}
}

// Options configure Start.
type Options struct {
	// Argv is the watchdog's command line; nil: this executable with
	// ModeArg (ft-launcher in watchdog mode). A restart runs it again.
	Argv []string
	// OnFence is called, from a goroutine of the Watchdog, with each report
	// of a fence: when the launcher runs again after the watchdog acted.
	OnFence func(Report)
	// OnRestart is called, from a goroutine of the Watchdog, after the
	// watchdog process died and a new one was started and given the state.
	OnRestart func(Restart)
	// OnGiveUp is called, from a goroutine of the Watchdog, when a dead
	// watchdog is not restarted (Budget): the launcher has then SIGKILLed
	// the guarded groups itself, and kills every group guarded later at
	// once; the node must not run ranks any more.
	OnGiveUp func(GiveUp)
	// Budget bounds the restarts; zero: DefaultBudget.
	Budget policy.RestartBudget
	// Logger receives the launcher side's log lines (nil: discarded).
	Logger *slog.Logger
}

// Restart is one death of the watchdog process and its restart.
type Restart struct {
	OldPID, NewPID int
	// Exit is how the dead one ended ("killed by SIGKILL", "exit code 2"),
	// Code and Signal the same as numbers (Code -1 when killed by a signal).
	Exit   string
	Code   int
	Signal string
	// Served is how long the dead one ran; Downtime is from its reaping
	// (the launcher learns of a death within milliseconds: SIGCHLD) until
	// the new one was started with the state in its pipe.
	Served, Downtime time.Duration
	Attempts         int // starts tried (1 unless a start failed)
	Guarded          int // process groups given to the new one
	Armed            bool
	Restarts         int // restarts so far, this one included
}

// GiveUp is a dead watchdog that was not restarted.
type GiveUp struct {
	OldPID int
	Exit   string
	Reason string // why it was not restarted
	Killed []int  // the guarded groups the launcher SIGKILLed itself
}

// Watchdog is the launcher's handle on its fence watchdog process, which it
// restarts when it dies (Options.Budget). A nil *Watchdog is valid and does
// nothing (single-node jobs run none).
//
// The protocol's state (the guarded groups, the deadline) is kept here as
// well as sent: a restarted watchdog is stateless and is given it again
// before anything else, so protection resumes where it stood.
type Watchdog struct {
	log    *slog.Logger
	r      *spawn.Reaper
	o      Options
	argv   []string
	budget policy.RestartBudget

	mu       sync.Mutex
	cur      *incarnation   // the running watchdog; nil while dead, given up or closed
	pid      int            // the last one started
	guarded  map[int]uint64 // pgid -> its leader's start time
	armed    bool
	deadline int64 // CLOCK_MONOTONIC ns of the last extend
	closed   bool
	gaveUp   string // why the watchdog is not restarted; "" while it is
	restarts int

	readers sync.WaitGroup
	closing chan struct{} // closed by Close: no restart after it
	done    chan struct{} // the supervisor ended
}

// incarnation is one watchdog process.
type incarnation struct {
	g       *spawn.Group
	pid     int
	w       *os.File // its stdin
	started time.Time
	failed  bool          // a write failed: logged once
	dead    chan struct{} // closed once it was reaped; exit is set then
	exit    spawn.Exit
}

// Start starts the watchdog as a child of r, in a process group of its own
// (so a SIGSTOP or signal of the launcher's group does not reach it).
func Start(r *spawn.Reaper, o Options) (*Watchdog, error) {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	argv := o.Argv
	if argv == nil {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("fence watchdog: find this executable: %w", err)
		}
		argv = []string{self, ModeArg}
	}
	b := o.Budget
	if b == (policy.RestartBudget{}) {
		b = DefaultBudget()
	}
	if b.Limit < 1 || b.Window < 0 || b.Delay < 0 || b.Backoff < 0 || b.MaxBackoff < 0 || b.Stable < 0 {
		return nil, fmt.Errorf("fence watchdog: restart budget %+v: want Limit >= 1 and no negative duration", b)
	}
	w := &Watchdog{log: log, r: r, o: o, argv: argv, budget: b, guarded: map[int]uint64{},
		closing: make(chan struct{}), done: make(chan struct{})}
	inc, err := w.spawn()
	if err != nil {
		return nil, err
	}
	w.cur, w.pid = inc, inc.pid
	go w.supervise(inc)
	log.Debug("fence watchdog started", "pid", inc.pid)
	return w, nil
}

// spawn starts one watchdog process and the reader of its reports.
func (w *Watchdog) spawn() (*incarnation, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("fence watchdog: command pipe: %w", err)
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, fmt.Errorf("fence watchdog: report pipe: %w", err)
	}
	// DeathSignal SIGTERM, which the watchdog ignores: when the launcher
	// dies the watchdog must outlive it long enough to see the EOF and kill
	// the ranks' groups (a rank's grandchildren do not get the ranks'
	// parent-death signal).
	g, err := w.r.StartGroup([]spawn.Spec{{LocalRank: -1, Argv: w.argv,
		Env:   append(os.Environ(), ModeEnv+"=1"),
		Stdin: inR, Stdout: repW, DeathSignal: syscall.SIGTERM}})
	inR.Close()
	repW.Close()
	if err != nil {
		inW.Close()
		repR.Close()
		return nil, fmt.Errorf("fence watchdog: start %s: %w", w.argv[0], err)
	}
	inc := &incarnation{g: g, pid: g.PIDs()[-1], w: inW, started: time.Now(), dead: make(chan struct{})}
	w.readers.Add(2)
	go func() { // reports: read whenever this process runs
		defer w.readers.Done()
		defer repR.Close()
		sc := bufio.NewScanner(repR)
		for sc.Scan() {
			var rep Report
			if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
				w.log.Error("fence watchdog: unreadable report", "line", sc.Text(), "err", err)
				continue
			}
			if w.o.OnFence != nil {
				w.o.OnFence(rep)
			}
		}
	}()
	go func() {
		defer w.readers.Done()
		inc.exit = <-g.Exits()
		close(inc.dead)
	}()
	return inc, nil
}

// supervise restarts the watchdog each time it dies, until Close or the
// policy gives up.
func (w *Watchdog) supervise(inc *incarnation) {
	defer close(w.done)
	tr := policy.RestartTracker{Budget: w.budget}
	for {
		select {
		case <-inc.dead:
		case <-w.closing:
			return // Close ends and reaps the current one
		}
		e := inc.exit
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return
		}
		w.cur = nil
		inc.w.Close()
		w.mu.Unlock()
		// Reaped already, and it starts no process of its own: nothing of
		// it to sweep (a sweep would scan /proc before the restart).

		served := e.At.Sub(inc.started)
		wait, ok := tr.Next(e.At, inc.started)
		w.log.Error("fence watchdog died: ranks are not killed if this launcher freezes until it is restarted",
			"pid", inc.pid, "exit", e.String(), "served", served.Round(time.Millisecond), "restart", ok)
		if !ok {
			w.giveUp(inc, e, fmt.Sprintf("it died again after %s, its restart budget spent (%d restarts within %s)",
				served.Round(time.Millisecond), w.budget.Limit, w.budget.Window))
			return
		}
		var next *incarnation
		var err error
		attempts := 0
		for {
			if wait > 0 {
				select {
				case <-time.After(wait):
				case <-w.closing:
					return
				}
			}
			attempts++
			if next, err = w.spawn(); err == nil {
				break
			}
			w.log.Error("fence watchdog: restart failed", "attempt", attempts, "err", err)
			if wait, ok = tr.Next(time.Now(), time.Time{}); !ok {
				w.giveUp(inc, e, fmt.Sprintf("the last start failed (%v), its restart budget spent (%d restarts within %s)",
					err, w.budget.Limit, w.budget.Window))
				return
			}
		}
		rs, ok := w.install(next)
		if !ok {
			// Closed meanwhile, when no watchdog ran: end this one as Close
			// would have.
			next.w.Close()
			select {
			case <-next.dead:
			case <-time.After(closeBound):
			}
			next.g.Stop(syscall.SIGKILL, 0)
			return
		}
		rs.OldPID, rs.Exit, rs.Code, rs.Signal = inc.pid, exitStatus(e), e.Code, signalName(e.Signal)
		rs.Served, rs.Downtime, rs.Attempts = served, time.Since(e.At), attempts
		w.log.Warn("fence watchdog restarted: protection resumed", "old_pid", rs.OldPID, "pid", rs.NewPID,
			"exit", rs.Exit, "downtime", rs.Downtime.Round(time.Microsecond), "guarded", rs.Guarded, "armed", rs.Armed,
			"restarts", rs.Restarts)
		if w.o.OnRestart != nil {
			w.o.OnRestart(rs)
		}
		inc = next
	}
}

// install makes next the current watchdog and gives it the state, the
// guarded groups first and then the deadline (so a deadline that passed
// meanwhile fences them at once); false when the Watchdog was closed
// meanwhile.
func (w *Watchdog) install(next *incarnation) (Restart, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pid = next.pid
	if w.closed {
		return Restart{}, false
	}
	w.cur = next
	for pgid := range w.guarded {
		w.writeLocked("guard " + strconv.Itoa(pgid))
	}
	if w.armed {
		w.writeLocked("extend " + strconv.FormatInt(w.deadline, 10))
	}
	w.restarts++
	return Restart{NewPID: next.pid, Guarded: len(w.guarded), Armed: w.armed, Restarts: w.restarts}, true
}

// giveUp fences the guarded groups from the launcher, since no watchdog
// will, and reports why.
func (w *Watchdog) giveUp(inc *incarnation, e spawn.Exit, reason string) {
	w.mu.Lock()
	w.gaveUp = reason
	killed, errs := killGroups(w.guarded)
	clear(w.guarded)
	w.mu.Unlock()
	for _, err := range errs {
		w.log.Error("fence watchdog given up: killing the ranks", "err", err)
	}
	w.log.Error("fence watchdog cannot be restarted: this node's ranks are killed rather than run unprotected",
		"why", reason, "killed_pgids", killed)
	if w.o.OnGiveUp != nil {
		w.o.OnGiveUp(GiveUp{OldPID: inc.pid, Exit: exitStatus(e), Reason: reason, Killed: killed})
	}
}

// exitStatus says how a process ended: "killed by SIGKILL", "exit code 1".
func exitStatus(e spawn.Exit) string {
	if e.Signal != 0 {
		return "killed by " + signalName(e.Signal)
	}
	return fmt.Sprintf("exit code %d", e.Code)
}

func signalName(s syscall.Signal) string {
	if s == 0 {
		return ""
	}
	return unix.SignalName(s)
}

// PID is the process id of the watchdog last started.
func (w *Watchdog) PID() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pid
}

// GaveUp says why the watchdog is not restarted any more; "" while it is
// (or on a nil Watchdog).
func (w *Watchdog) GaveUp() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gaveUp
}

// Guard asks the watchdog to kill process group pgid at the deadline. Once
// the watchdog was given up, the group is SIGKILLed at once: no rank runs
// unprotected.
func (w *Watchdog) Guard(pgid int) {
	if w == nil {
		return
	}
	st, err := procfs.Read(pgid)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		return // gone already: nothing of it to fence that the launcher's own stop does not sweep
	}
	if w.gaveUp != "" {
		killed, errs := killGroups(map[int]uint64{pgid: st.StartTime})
		w.log.Error("no fence watchdog: killing a rank process group at once", "pgid", pgid, "killed", killed, "errs", errs)
		return
	}
	w.guarded[pgid] = st.StartTime
	w.writeLocked("guard " + strconv.Itoa(pgid))
}

// Unguard removes pgid from the guarded groups (its ranks were stopped).
func (w *Watchdog) Unguard(pgid int) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.guarded, pgid)
	w.writeLocked("unguard " + strconv.Itoa(pgid))
}

// Extend sets the deadline to t, an instant derived from time.Now (its
// monotonic reading is what counts).
func (w *Watchdog) Extend(t time.Time) {
	if w == nil {
		return
	}
	ns := MonotonicAt(t)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed, w.deadline = true, ns
	w.writeLocked("extend " + strconv.FormatInt(ns, 10))
}

// Disarm removes the deadline until the next Extend.
func (w *Watchdog) Disarm() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	w.writeLocked("disarm")
}

// writeLocked sends cmd to the current watchdog, if one runs; with none
// (dead, being restarted) the state kept here is what the next one gets.
func (w *Watchdog) writeLocked(cmd string) {
	inc := w.cur
	if inc == nil {
		return
	}
	_ = inc.w.SetWriteDeadline(time.Now().Add(writeBound))
	if _, err := inc.w.WriteString(cmd + "\n"); err != nil && !inc.failed {
		// A dead watchdog (EPIPE) is restarted by supervise; a stopped one
		// (the write timed out) is not dead and stays.
		inc.failed = true
		w.log.Error("fence watchdog does not take commands: ranks may not be killed if this launcher freezes", "pid", inc.pid, "cmd", cmd, "err", err)
	}
}

// Close ends the watchdog: the EOF of its commands makes it kill whatever
// is still guarded and exit; it is SIGKILLed if it has not exited within
// closeBound, and reaped either way. No restart follows.
func (w *Watchdog) Close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	close(w.closing)
	inc := w.cur
	w.cur = nil
	if inc != nil {
		inc.w.Close()
	}
	w.mu.Unlock()
	<-w.done
	if inc != nil {
		select {
		case <-inc.dead:
		case <-time.After(closeBound):
			w.log.Warn("fence watchdog did not exit at the end of its commands; killing it", "pid", inc.pid)
		}
		inc.g.Stop(syscall.SIGKILL, 0) // reaps it (a no-op once it exited) and sweeps its group
	}
	w.readers.Wait()
}
