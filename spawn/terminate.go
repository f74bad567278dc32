package spawn

import (
	"context"
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// pollAlive is how often Terminate looks at /proc during the grace when it
// has no reap notification to wait on.
const pollAlive = 20 * time.Millisecond

// TerminateOptions tunes Terminate.
type TerminateOptions struct {
	// Grace is how long the rank may take to act on a signal other than
	// SIGKILL before it is SIGKILLed.
	Grace time.Duration
	// Reaped, when not nil, is closed once the rank's leader is reaped: the
	// rank then counts as ended when it is closed (no polling). Without it
	// the rank counts as ended once /proc shows no live process in the
	// signalled group (or, for a lone process, the process is gone).
	Reaped <-chan struct{}
	// Signalled, when not nil, is called right after the termination
	// signal was sent, before the grace: a hang report stamps its time and
	// logs it without waiting for the outcome.
	Signalled func(Termination)
}

// Termination reports what Terminate did.
type Termination struct {
	// Target is what was signalled: -pgid for the rank's process group, or
	// the pid when it does not lead a group of its own.
	Target      int
	Signal      syscall.Signal // the termination signal (SIGKILL for 0)
	SignalledAt time.Time      // when it was sent
	Err         error          // sending it failed (ESRCH: already gone)
	Escalated   bool           // it survived the grace and was SIGKILLed
}

// Terminate ends the rank whose leader is pid: SIGCONT and then sig to its
// process group (a SIGSTOPped rank could not act on sig otherwise), then,
// unless sig is SIGKILL, up to opts.Grace for it to end, then SIGKILL. It
// returns after the SIGKILL without waiting for the rank to die (a process in
// D state may never), or at once when ctx is cancelled during the grace, in
// which case a surviving rank is SIGKILLed first. A pid that does not lead
// its own process group, or leads the launcher's, is signalled alone, so the
// launcher never signals itself.
func Terminate(ctx context.Context, pid int, sig syscall.Signal, opts TerminateOptions) Termination {
	if sig == 0 {
		sig = syscall.SIGKILL
	}
	t := Termination{Target: pid, Signal: sig}
	if pid <= 1 {
		// kill(0 or -1) would reach the launcher's group or every process.
		t.Err = errors.New("spawn: refusing to signal pid <= 1")
		t.SignalledAt = time.Now()
		return t
	}
	if pgid, err := unix.Getpgid(pid); err == nil && pgid == pid && pgid != unix.Getpgrp() {
		t.Target = -pid
	}
	_ = unix.Kill(t.Target, unix.SIGCONT)
	t.Err = unix.Kill(t.Target, sig)
	t.SignalledAt = time.Now()
	if opts.Signalled != nil {
		opts.Signalled(t)
	}
	if sig == syscall.SIGKILL || t.Err != nil {
		return t
	}
	if !waitEnded(ctx, t.Target, opts) {
		_ = unix.Kill(t.Target, unix.SIGKILL)
		t.Escalated = true
	}
	return t
}

// waitEnded waits up to opts.Grace (or until ctx ends) for the target to
// end and reports whether it did.
func waitEnded(ctx context.Context, target int, opts TerminateOptions) bool {
	timer := time.NewTimer(opts.Grace)
	defer timer.Stop()
	if opts.Reaped != nil {
		select {
		case <-opts.Reaped:
			return true
		case <-timer.C:
		case <-ctx.Done():
		}
		select {
		case <-opts.Reaped:
			return true
		default:
			return false
		}
	}
	tick := time.NewTicker(pollAlive)
	defer tick.Stop()
	for alive(target) {
		select {
		case <-tick.C:
		case <-timer.C:
			return !alive(target)
		case <-ctx.Done():
			return !alive(target)
		}
	}
	return true
}

// alive reports whether target (-pgid or pid) still has a live process.
func alive(target int) bool {
	if target < 0 {
		return procfs.GroupAlive(-target)
	}
	st, err := procfs.Read(target)
	return err == nil && !st.Dead()
}
