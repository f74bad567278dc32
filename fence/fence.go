// Package fence is the launcher's fence watchdog: a small process beside the
// launcher that SIGKILLs the ranks' process groups once the launcher can no
// longer prove that its node still belongs to the round, even when the
// launcher itself cannot act (frozen by SIGSTOP, stalled, swapped out).
//
// Why a separate process: the launcher stops its own ranks when it notices
// that its rendezvous lease lapsed, but a frozen launcher notices nothing.
// Its peers see its lease expire (or gossip declare it dead) and start the
// next round without it, while its ranks, untouched by the freeze, keep
// running the old round beside the new one (a 60 s SIGSTOP once left two
// rounds writing for 60 s). The watchdog is another process, in a process group of its
// own, so a SIGSTOP of the launcher (or of the launcher's process group)
// does not stop it.
//
// The launcher drives it over a pipe (the watchdog's stdin), one command a
// line:
//
//	guard <pgid>      a rank's process group to kill at the deadline
//	unguard <pgid>    the group was stopped by the launcher
//	extend <ns>       the deadline, in CLOCK_MONOTONIC nanoseconds
//	disarm            no deadline until the next extend
//
// CLOCK_MONOTONIC is system-wide, so one instant means the same to both
// processes, and it does not jump with the wall clock. When the clock passes
// the deadline with no newer extend, every guarded group is SIGKILLed and a
// report line (JSON) goes to the watchdog's stdout, which the launcher reads
// when it runs again; a line also goes to stderr (the launcher's), so the
// fence leaves a record even if the launcher never resumes. A group guarded
// after the deadline passed is killed at once. At EOF of the pipe (the
// launcher exited or died) the guarded groups are killed and the watchdog
// exits; a launcher that ends normally has stopped its ranks and unguarded
// them by then, so nothing is killed.
//
// A guarded group is identified by its leader's pid and start time, so a
// pid reused by an unrelated process after the group was gone is never
// signalled.
//
// The watchdog is stateless, so a dead one is replaced at once: the
// launcher's handle (Watchdog) keeps the guarded groups and the last
// deadline beside the pipe, starts a new watchdog when the reaper reports
// the old one's death, and writes it that state (guards, then the
// deadline) before anything else. Options.Budget bounds the restarts; when
// it gives up, the handle SIGKILLs the guarded groups itself and kills any
// group guarded later at once, so that no rank runs unprotected.
//
// The watchdog opens no socket: its commands come only over the pipe, its
// reports go only over its stdout pipe.
package fence

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// ModeEnv, set to "1" in a process's environment, makes ft-launcher run as
// the watchdog (Serve) instead of as a launcher. Only Start sets it, and only
// in the watchdog's environment.
const ModeEnv = "FT_LAUNCHER_FENCE_WATCHDOG"

// ModeArg is the watchdog's argv[1]: it changes nothing, but makes the
// watchdog recognisable in ps.
const ModeArg = "fence-watchdog"

// Report is what the watchdog tells the launcher after it fenced.
type Report struct {
	// Reason: "deadline" (the clock passed the deadline), "guard_after_deadline"
	// (a group guarded once the deadline had passed) or "launcher_gone" (EOF).
	Reason string `json:"reason"`
	// Killed are the process groups SIGKILLed.
	Killed []int `json:"killed"`
	// DeadlineNs and AtNs are the deadline and the instant the watchdog
	// acted, on CLOCK_MONOTONIC; LateMs is how long after the deadline.
	DeadlineNs int64   `json:"deadline_ns"`
	AtNs       int64   `json:"at_ns"`
	LateMs     float64 `json:"late_ms"`
}

// Monotonic is CLOCK_MONOTONIC now, in nanoseconds: the clock of the
// protocol's deadlines. Go's own monotonic readings use the same clock on
// Linux, so a deadline is also a time.Duration away from time.Now().
func Monotonic() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		// CLOCK_MONOTONIC exists on every Linux; nothing sensible remains.
		panic(fmt.Sprintf("fence: clock_gettime(CLOCK_MONOTONIC): %v", err))
	}
	return ts.Nano()
}

// MonotonicAt converts t, a local instant taken from time.Now (possibly
// shifted), to CLOCK_MONOTONIC nanoseconds. It uses the monotonic reading
// time.Until relies on, so a wall-clock step between does not shift it.
func MonotonicAt(t time.Time) int64 {
	return Monotonic() + int64(time.Until(t))
}

// killGroups SIGKILLs every process group of guarded (pgid -> its leader's
// start time) and returns the groups signalled, sorted, and the signals
// that failed otherwise than for a group already gone. Both sides fence
// with it: the watchdog at its deadline, the launcher when it has no
// watchdog any more.
func killGroups(guarded map[int]uint64) (killed []int, errs []error) {
	for pgid, start := range guarded {
		if st, err := procfs.Read(pgid); err == nil && st.StartTime != start {
			continue // the pid was reused by another process: not ours
		}
		// The leader is ours (alive or a zombie), or it was reaped while
		// members of its group live on: a pgid is not reused then.
		if err := unix.Kill(-pgid, unix.SIGKILL); err == nil {
			killed = append(killed, pgid)
		} else if !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("SIGKILL process group %d: %w", pgid, err))
		}
	}
	slices.Sort(killed)
	return killed, errs
}
