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

	"github.com/ftlauncher/ft-launcher/spawn"
)

// writeBound bounds one command write: the watchdog reads at once unless it
// is itself stopped, and a launcher must never block on it.
const writeBound = time.Second

// closeBound is how long Close waits for the watchdog to exit after EOF
// before it SIGKILLs it.
const closeBound = 5 * time.Second

// Options configure Start.
type Options struct {
	// Argv is the watchdog's command line; nil: this executable with
	// ModeArg (ft-launcher in watchdog mode).
	Argv []string
	// OnFence is called, from a goroutine of the Watchdog, with each report
	// of a fence: when the launcher runs again after the watchdog acted.
	OnFence func(Report)
	// Logger receives the launcher side's log lines (nil: discarded).
	Logger *slog.Logger
}

// Watchdog is the launcher's handle on its fence watchdog process. A nil
// *Watchdog is valid and does nothing (single-node jobs run none).
type Watchdog struct {
	log     *slog.Logger
	g       *spawn.Group
	pid     int
	mu      sync.Mutex
	w       *os.File // the watchdog's stdin; nil once closed
	failed  bool     // a write failed: logged once
	readers sync.WaitGroup
	closing chan struct{}   // closed by Close before the watchdog may exit
	exited  chan spawn.Exit // the watchdog's exit, once reaped
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
	g, err := r.StartGroup([]spawn.Spec{{LocalRank: -1, Argv: argv,
		Env:   append(os.Environ(), ModeEnv+"=1"),
		Stdin: inR, Stdout: repW, DeathSignal: syscall.SIGTERM}})
	inR.Close()
	repW.Close()
	if err != nil {
		inW.Close()
		repR.Close()
		return nil, fmt.Errorf("fence watchdog: start %s: %w", argv[0], err)
	}
	w := &Watchdog{log: log, g: g, pid: g.PIDs()[-1], w: inW,
		closing: make(chan struct{}), exited: make(chan spawn.Exit, 1)}
	w.readers.Add(2)
	go func() { // reports: read whenever this process runs
		defer w.readers.Done()
		defer repR.Close()
		sc := bufio.NewScanner(repR)
		for sc.Scan() {
			var rep Report
			if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
				log.Error("fence watchdog: unreadable report", "line", sc.Text(), "err", err)
				continue
			}
			if o.OnFence != nil {
				o.OnFence(rep)
			}
		}
	}()
	go func() { // an exit before Close leaves the ranks unfenced: say so
		defer w.readers.Done()
		e := <-g.Exits()
		select {
		case <-w.closing:
		default:
			log.Error("fence watchdog exited: ranks are no longer killed if this launcher freezes", "exit", e.String())
		}
		w.exited <- e
	}()
	log.Debug("fence watchdog started", "pid", w.pid)
	return w, nil
}

// PID is the watchdog's process id.
func (w *Watchdog) PID() int {
	if w == nil {
		return 0
	}
	return w.pid
}

// Guard asks the watchdog to kill process group pgid at the deadline.
func (w *Watchdog) Guard(pgid int) { w.send("guard " + strconv.Itoa(pgid)) }

// Unguard removes pgid from the guarded groups (its ranks were stopped).
func (w *Watchdog) Unguard(pgid int) { w.send("unguard " + strconv.Itoa(pgid)) }

// Extend sets the deadline to t, an instant derived from time.Now (its
// monotonic reading is what counts).
func (w *Watchdog) Extend(t time.Time) { w.send("extend " + strconv.FormatInt(MonotonicAt(t), 10)) }

// Disarm removes the deadline until the next Extend.
func (w *Watchdog) Disarm() { w.send("disarm") }

func (w *Watchdog) send(cmd string) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.w == nil {
		return
	}
	_ = w.w.SetWriteDeadline(time.Now().Add(writeBound))
	if _, err := w.w.WriteString(cmd + "\n"); err != nil && !w.failed {
		w.failed = true
		w.log.Error("fence watchdog does not take commands: ranks may not be killed if this launcher freezes", "cmd", cmd, "err", err)
	}
}

// Close ends the watchdog: the EOF of its commands makes it kill whatever
// is still guarded and exit; it is SIGKILLed if it has not exited within
// closeBound, and reaped either way.
func (w *Watchdog) Close() {
	if w == nil {
		return
	}
	w.mu.Lock()
	if w.w == nil {
		w.mu.Unlock()
		return
	}
	close(w.closing)
	w.w.Close()
	w.w = nil
	w.mu.Unlock()
	select {
	case <-w.exited:
	case <-time.After(closeBound):
		w.log.Warn("fence watchdog did not exit at the end of its commands; killing it", "pid", w.pid)
	}
	w.g.Stop(syscall.SIGKILL, 0) // reaps it (a no-op once it exited) and sweeps its group
	w.readers.Wait()
}
