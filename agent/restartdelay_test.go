package agent

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestRestartDelay: a restart that spent the budget waits the job's
// --restart-delay (the decision's Delay) before the node joins the next
// round, whether this node's failure or another's ended the round; a
// signal during the wait ends the node at once. The wait is asserted from
// below only (at least the delay), never from above.
func TestRestartDelay(t *testing.T) {
	const delay = 300 * time.Millisecond
	// clock records when the round ended and when the next round was asked for.
	type clock struct {
		mu          sync.Mutex
		ended, next time.Time
	}
	nextAt := func(c *clock, round, restarts int) func(context.Context) (rendezvous.Assignment, error) {
		return func(ctx context.Context) (rendezvous.Assignment, error) {
			c.mu.Lock()
			c.next = time.Now()
			c.mu.Unlock()
			return active(round, restarts)(ctx)
		}
	}
	waited := func(t *testing.T, c *clock) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.ended.IsZero() || c.next.IsZero() {
			t.Fatalf("round ended at %v, next round asked at %v", c.ended, c.next)
		}
		if got := c.next.Sub(c.ended); got < delay {
			t.Errorf("the next round was asked %v after the restart decision, want at least the delay %v", got, delay)
		}
	}
	cases := []runCase{}
	{
		c := &clock{}
		cases = append(cases, runCase{
			name: "this node's rank crash: the decision's delay",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0), nextAt(c, 1, 1))
				h.rdzv.fail = func(context.Context, failCall) (rendezvous.Decision, error) {
					c.mu.Lock()
					c.ended = time.Now()
					c.mu.Unlock()
					return rendezvous.Decision{Restart: true, Action: policy.RestartInPlace, RestartsUsed: 1, Delay: delay,
						Reason: "rank_crash: restarting every rank in place (restart 1 of 3)"}, nil
				}
			},
			act: func(h *harness) {
				h.ranks.wait(h.t).exit(1, 3, 0)
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				waited(t, c)
			},
		})
	}
	{
		c := &clock{}
		cases = append(cases, runCase{
			name:  "another node's failure: the round end's delay",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0), nextAt(c, 1, 1)) },
			act: func(h *harness) {
				h.ranks.wait(h.t)
				c.mu.Lock()
				c.ended = time.Now()
				c.mu.Unlock()
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Node: "10.0.0.2/7",
					Reason: "node 10.0.0.2/7: rank 3 exited with code 1", Cause: policy.RankCrash, Action: policy.RestartInPlace, Delay: delay})
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				waited(t, c)
			},
		})
	}
	cases = append(cases, runCase{
		name: "a signal during the delay ends the node without joining",
		setup: func(h *harness) {
			h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1))
			h.rdzv.fail = func(context.Context, failCall) (rendezvous.Decision, error) {
				return rendezvous.Decision{Restart: true, Action: policy.RestartInPlace, RestartsUsed: 1, Delay: time.Hour,
					Reason: "rank_crash: restarting every rank in place (restart 1 of 3)"}, nil
			}
		},
		act: func(h *harness) {
			h.ranks.wait(h.t).exit(1, 3, 0)
			waitFor(h.t, func() bool { h.rdzv.mu.Lock(); defer h.rdzv.mu.Unlock(); return len(h.rdzv.fails) == 1 })
			h.sigs <- syscall.SIGTERM
		},
		check: func(t *testing.T, h *harness, o Outcome) {
			want(t, o, verdict.Signaled, 1)
			if h.rdzv.nexts != 1 || len(h.ranks.groups) != 1 {
				t.Errorf("joined during the delay: Next called %d times, %d groups started", h.rdzv.nexts, len(h.ranks.groups))
			}
		},
	})
	runAll(t, cases)
}
