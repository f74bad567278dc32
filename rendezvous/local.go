package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Local is the single-node rendezvous (--standalone, --nnodes=1): the round
// state lives in this process and the restart budget is counted here.
type Local struct {
	runID       string
	localWorld  int
	maxRestarts int
	window      time.Duration // --restart-window (0: every restart counts)
	delay       time.Duration // --restart-delay
	masterAddr  string
	masterPort  int // 0: pick a free port each round
	portFn      func(round int) (int, error)

	mu       sync.Mutex
	round    int
	restarts int // restarts spent (policy.Decide), counted on their own
	// recent are the times of the restarts that may still count in the
	// window (policy.RestartBudget.Recent); only with a window.
	recent []time.Time
	closed bool
	kind   verdict.Kind
	code   int
	reason string
	// ends holds the Ended channels of the current and the previous round
	// only: a job may restart tens of thousands of times.
	ends map[int]chan RoundEnd
	met  *metrics.Metrics
}

// WithMetrics makes l report rounds and restarts to m (nil-safe).
func (l *Local) WithMetrics(m *metrics.Metrics) *Local {
	l.met = m
	return l
}

// WithRestartBudget gives l the job's restart window and delay
// (--restart-window, --restart-delay; policy.Input).
func (l *Local) WithRestartBudget(window, delay time.Duration) *Local {
	l.window, l.delay = window, delay
	return l
}

// WithMasterPort makes l take the port of each round from fn (the agent
// store's, bound before the round is handed out) when no fixed port was
// given.
func (l *Local) WithMasterPort(fn func(round int) (int, error)) *Local {
	l.portFn = fn
	return l
}

// NewLocal returns a Local rendezvous. masterPort 0 picks a free port on
// masterAddr for every round, so concurrent jobs never collide on 29500.
func NewLocal(runID string, localWorld, maxRestarts int, masterAddr string, masterPort int) *Local {
	return &Local{runID: runID, localWorld: localWorld, maxRestarts: maxRestarts,
		masterAddr: masterAddr, masterPort: masterPort, round: 0, ends: map[int]chan RoundEnd{}}
}

// Next returns the assignment for the current round.
func (l *Local) Next(ctx context.Context) (Assignment, error) {
	if err := ctx.Err(); err != nil {
		return Assignment{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return Assignment{}, ErrClosed
	}
	port := l.masterPort
	if port == 0 && l.portFn != nil {
		p, err := l.portFn(l.round)
		if err != nil {
			return Assignment{}, fmt.Errorf("rendezvous: master port for round %d: %w", l.round, err)
		}
		port = p
	} else if port == 0 {
		p, err := FreePort(l.masterAddr)
		if err != nil {
			return Assignment{}, err
		}
		port = p
	}
	l.met.RoundCompleted(l.round, l.localWorld, 0)
	return Assignment{RunID: l.runID, Round: l.round, GroupRank: 0, GroupWorldSize: 1,
		RankBase: 0, WorldSize: l.localWorld, MasterAddr: l.masterAddr, MasterPort: port,
		MaxRestarts: l.maxRestarts, RestartsUsed: l.restarts}, nil
}

// Ended returns a channel for round; on one node nothing else ends a round
// except Shutdown. A round older than the previous one gets a channel that
// is not kept (nothing can end it any more).
func (l *Local) Ended(round int) <-chan RoundEnd {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.ends[round]
	if !ok {
		ch = make(chan RoundEnd, 1)
		if round >= l.round-1 {
			l.ends[round] = ch
		}
		if l.closed {
			ch <- RoundEnd{Kind: EndJobClosed, Round: round, Code: l.code, Reason: l.reason, Close: l.kind}
		}
	}
	return ch
}

// pruneLocked drops the channels of rounds before the previous one.
func (l *Local) pruneLocked() {
	for r := range l.ends {
		if r < l.round-1 {
			delete(l.ends, r)
		}
	}
}

// Fail applies the restart policy to a failure of this node's ranks.
func (l *Local) Fail(ctx context.Context, round int, f policy.Failure, reason string) (Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if round != l.round {
		return Decision{}, fmt.Errorf("rendezvous: failure reported for round %d but the current round is %d", round, l.round)
	}
	if l.closed {
		return Decision{Close: l.kind, Code: l.code, Reason: l.reason, RestartsUsed: l.restarts}, nil
	}
	now := time.Now()
	in := policy.Input{Failure: f, RestartsUsed: l.restarts, MaxRestarts: l.maxRestarts,
		NodesPresent: 1, MinNodes: 1, Window: l.window, RecentRestarts: l.recent, Now: now, Delay: l.delay}
	d := policy.Decide(in)
	if d.Action == policy.CloseJob {
		// A no-restart close: the agent closes with its configured code
		// through Shutdown; Fail only sees NoRestartRequest from callers
		// that did not, so nvrx's default.
		code := verdict.CloseExitCode(d.Close)
		l.closed, l.kind, l.code, l.reason = true, d.Close, code, d.Why+": "+reason
		return Decision{Action: d.Action, Close: d.Close, Code: code, Reason: l.reason, RestartsUsed: l.restarts}, nil
	}
	l.round++
	l.pruneLocked()
	if d.CountsRestart {
		l.restarts++
		if l.window > 0 {
			l.recent = in.Budget().Recent(append(l.recent, now), now)
		}
	}
	return Decision{Restart: true, Action: d.Action, Reason: d.Why + ": " + reason, RestartsUsed: l.restarts, Delay: d.Delay}, nil
}

// Succeed ends the job with success.
func (l *Local) Succeed(ctx context.Context, round int) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return l.code, nil
	}
	l.closed, l.kind, l.code, l.reason = true, verdict.Succeeded, 0, "all ranks succeeded"
	return 0, nil
}

// Shutdown closes the job.
func (l *Local) Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed, l.kind, l.code, l.reason = true, kind, code, reason
	if ch, ok := l.ends[l.round]; ok {
		select {
		case ch <- RoundEnd{Kind: EndJobClosed, Round: l.round, Code: code, Reason: reason, Close: kind}:
		default:
		}
	}
	return nil
}

// Leave on a single node is the same as closing the job with failure.
func (l *Local) Leave(ctx context.Context, reason string) error {
	return l.Shutdown(ctx, verdict.NodeExcluded, 1, "node left: "+reason)
}

// Depart does nothing on a single node: there is no peer to tell, and the
// stopping agent's own outcome (signaled) is not the rendezvous's to set.
func (l *Local) Depart(ctx context.Context, reason string) error { return nil }

// Close does nothing for Local.
func (l *Local) Close() error { return nil }

// FreePort asks the kernel for a free TCP port on addr.
func FreePort(addr string) (int, error) { return netutil.FreePort(addr) }
