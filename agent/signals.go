package agent

import (
	"context"
	"os"
	"time"
)

// DefaultSignalRepeatWindow is how long after the signal that began a stop
// the same signal again is taken as a repeat delivery of that request
// rather than as a new request to SIGKILL the ranks at once.
//
// Why 2 s: at a time limit (and on scancel) Slurm delivers SIGTERM to the
// step's processes more than once, a few milliseconds apart (13 ms was
// measured on Slurm 22.05); escalating on the second copy SIGKILLed ranks
// whose SIGTERM handler was still writing its checkpoint. 2 s is over 100
// times those gaps, so a slow slurmstepd on a loaded node stays inside it,
// and short enough that a person who really wants the ranks killed now
// only has to send the signal again a moment later (srun's own "two ^C
// within one second" rule works at the same scale).
const DefaultSignalRepeatWindow = 2 * time.Second

// stopSignals applies the rule for handled signals that arrive while ranks
// are being stopped:
//
//   - the first one (when the stop began for another reason) is remembered:
//     the node then does not restart, and the grace is unchanged;
//   - the same signal again within the window after the first is a repeat
//     delivery (Slurm's double SIGTERM): ignored, the grace is unchanged;
//   - the same signal after the window, or a different handled signal at
//     any time (SIGINT or SIGQUIT after SIGTERM), is a distinct request:
//     every rank's process group is SIGKILLed at once.
//
// Pre-walltime signals (--signal=USR1@N) never reach it: they are
// forwarded, never escalated.
type stopSignals struct {
	window  time.Duration
	first   os.Signal // nil until a signal began or joined the stop
	firstAt time.Time
}

// stopVerdict is what one signal received while stopping means.
type stopVerdict int

const (
	stopFirst    stopVerdict = iota + 1 // remembered; the node does not restart
	stopRepeat                          // a repeat delivery within the window; ignored
	stopEscalate                        // a distinct request: SIGKILL now
)

// take classifies signal s received at now.
func (r *stopSignals) take(s os.Signal, now time.Time) stopVerdict {
	switch {
	case r.first == nil:
		r.first, r.firstAt = s, now
		return stopFirst
	case s == r.first && now.Sub(r.firstAt) < r.window:
		return stopRepeat
	}
	return stopEscalate
}

// call runs one rendezvous call under a context that a handled signal
// cancels (and timeout, when > 0, bounds). It returns the signal if one
// ended the call; the signal is consumed, never lost.
func (a *Agent) call(ctx context.Context, timeout time.Duration, f func(context.Context) error) (os.Signal, error) {
	var cancel context.CancelFunc
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	} else {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	got := make(chan os.Signal, 1)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case s := <-a.d.Signals:
			got <- s
			cancel()
		case <-done:
		}
	}()
	err := f(ctx)
	close(done)
	<-exited
	select {
	case s := <-got:
		if a.isWalltime(s) {
			a.run.walltime = s
		}
		return s, err
	default:
		return nil, err
	}
}
