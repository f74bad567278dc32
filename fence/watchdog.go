package fence

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// ignoredSignals are the signals the watchdog ignores: the terminating ones
// a scheduler or a terminal sends to everything of a job (Slurm's SIGTERM to
// the step, a walltime SIGUSR1), which the launcher handles for the ranks.
// The watchdog ends only by the EOF of its pipe, after killing what it
// guards, or by SIGKILL. SIGPIPE is ignored so that a report to a launcher
// that is gone fails instead of killing the watchdog.
func ignoredSignals() []os.Signal {
	return []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1,
		syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGPIPE, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM,
		syscall.SIGIO, syscall.SIGPWR, syscall.SIGSTKFLT}
}

// Serve is the watchdog process's main: it reads commands from in, writes
// reports (JSON lines) to report and its log lines to log, and returns the
// exit code once in ends.
func Serve(in io.Reader, report, log io.Writer) int {
	signal.Ignore(ignoredSignals()...)
	w := &watchdog{report: report, log: log, guarded: map[int]uint64{}}
	cmds := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		readErr <- sc.Err()
		close(cmds)
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case line, ok := <-cmds:
			if !ok {
				if err := <-readErr; err != nil {
					w.logf("reading the launcher's commands: %v", err)
				}
				w.fence("launcher_gone")
				return 0
			}
			if err := w.command(line); err != nil {
				w.logf("%v", err)
			}
		case <-timer.C:
		}
		// Re-arm from the clock itself: the timer may fire early or late,
		// and a late firing (this process was descheduled) still fences.
		timer.Stop()
		if w.armed && !w.fired {
			if left := w.deadline - Monotonic(); left <= 0 {
				w.fence("deadline")
			} else {
				timer.Reset(time.Duration(left))
			}
		}
	}
}

// watchdog is the watchdog's state; one goroutine owns it.
type watchdog struct {
	report, log io.Writer
	guarded     map[int]uint64 // pgid -> its leader's start time (clock ticks since boot)
	armed       bool           // a deadline is set
	fired       bool           // the deadline passed and the groups were killed
	deadline    int64          // CLOCK_MONOTONIC ns
}

func (w *watchdog) command(line string) error {
	verb, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	switch verb {
	case "guard", "unguard":
		pgid, err := strconv.Atoi(arg)
		if err != nil || pgid <= 1 {
			return fmt.Errorf("%s: want a process group id > 1, got %q", verb, arg)
		}
		if verb == "unguard" {
			delete(w.guarded, pgid)
			return nil
		}
		st, err := procfs.Read(pgid)
		if err != nil {
			// Gone already (reaped): nothing of it to fence that the
			// launcher's own stop does not sweep.
			return nil
		}
		w.guarded[pgid] = st.StartTime
		if w.armed && w.fired {
			w.fence("guard_after_deadline")
		}
	case "extend":
		ns, err := strconv.ParseInt(arg, 10, 64)
		if err != nil {
			return fmt.Errorf("extend: want CLOCK_MONOTONIC nanoseconds, got %q", arg)
		}
		w.armed, w.fired, w.deadline = true, false, ns
	case "disarm":
		w.armed, w.fired = false, false
	default:
		return fmt.Errorf("unknown command %q (want guard, unguard, extend or disarm)", line)
	}
	return nil
}

// fence SIGKILLs every guarded group and reports it; no report when nothing
// was guarded.
func (w *watchdog) fence(reason string) {
	if reason == "deadline" {
		w.fired = true
	}
	if len(w.guarded) == 0 {
		return
	}
	now := Monotonic()
	killed, errs := killGroups(w.guarded)
	for _, err := range errs {
		w.logf("%v", err)
	}
	clear(w.guarded)
	if len(killed) == 0 {
		return
	}
	r := Report{Reason: reason, Killed: killed}
	if w.armed && reason != "launcher_gone" {
		r.DeadlineNs, r.LateMs = w.deadline, float64(now-w.deadline)/1e6
	}
	r.AtNs = now
	w.logf("fenced: SIGKILLed the ranks' process groups %v (%s; %.0f ms after the deadline)", killed, reason, r.LateMs)
	b, _ := json.Marshal(r)
	if _, err := w.report.Write(append(b, '\n')); err != nil {
		w.logf("report to the launcher: %v", err)
	}
}

func (w *watchdog) logf(format string, args ...any) {
	fmt.Fprintf(w.log, "ft-launcher fence watchdog (pid %d): %s\n", os.Getpid(), fmt.Sprintf(format, args...))
}
