package rendezvous

import (
	"context"
	"fmt"
	"sync"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
	"github.com/ftlauncher/ft-launcher/metrics"
)

// Local is the single-node rendezvous (--standalone, --nnodes=1): the round
// state lives in this process and the restart budget is counted here.
type Local struct {
	runID       string
	localWorld  int
	maxRestarts int
	masterAddr  string
	masterPort  int // 0: pick a free port each round

	mu     sync.Mutex
	round  int
	joined bool
	closed bool
	code   int
	reason string
	ends   map[int]chan RoundEnd
	met    *metrics.Metrics
}

// WithMetrics makes l report rounds and restarts to m (nil-safe).
func (l *Local) WithMetrics(m *metrics.Metrics) *Local {
	l.met = m
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
	if port == 0 {
		p, err := FreePort(l.masterAddr)
		if err != nil {
			return Assignment{}, err
		}
		port = p
	}
	l.met.RoundCompleted(l.round, l.localWorld, 0)
	return Assignment{RunID: l.runID, Round: l.round, GroupRank: 0, GroupWorldSize: 1,
		RankBase: 0, WorldSize: l.localWorld, MasterAddr: l.masterAddr, MasterPort: port,
		MaxRestarts: l.maxRestarts}, nil
}

// Ended returns a channel for round; on one node nothing else ends a round
// except Shutdown.
func (l *Local) Ended(round int) <-chan RoundEnd {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.ends[round]
	if !ok {
		ch = make(chan RoundEnd, 1)
		l.ends[round] = ch
		if l.closed {
			ch <- RoundEnd{Kind: EndJobClosed, Round: round, Code: l.code, Reason: l.reason}
		}
	}
	return ch
}

// Fail counts a failure against the budget.
func (l *Local) Fail(ctx context.Context, round int, reason string) (Decision, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if round != l.round {
		return Decision{}, fmt.Errorf("rendezvous: failure reported for round %d but the current round is %d", round, l.round)
	}
	if l.round >= l.maxRestarts {
		l.closed, l.code, l.reason = true, 1, fmt.Sprintf("restart budget exhausted (%d of %d restarts used): %s", l.round, l.maxRestarts, reason)
		return Decision{Restart: false, Code: 1, Reason: l.reason}, nil
	}
	l.round++
	l.met.Restarted()
	return Decision{Restart: true, Reason: reason}, nil
}

// Succeed ends the job with success.
func (l *Local) Succeed(ctx context.Context, round int) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed, l.code, l.reason = true, 0, "all ranks succeeded"
	return 0, nil
}

// Shutdown closes the job.
func (l *Local) Shutdown(ctx context.Context, code int, reason string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed, l.code, l.reason = true, code, reason
	if ch, ok := l.ends[l.round]; ok {
		select {
		case ch <- RoundEnd{Kind: EndJobClosed, Round: l.round, Code: code, Reason: reason}:
		default:
		}
	}
	return nil
}

// Leave on a single node is the same as closing the job with failure.
func (l *Local) Leave(ctx context.Context, reason string) error {
	return l.Shutdown(ctx, 1, "node left: "+reason)
}

// Close does nothing for Local.
func (l *Local) Close() error { return nil }

// FreePort asks the kernel for a free TCP port on addr.
func FreePort(addr string) (int, error) { return netutil.FreePort(addr) }
