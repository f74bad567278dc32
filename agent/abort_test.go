package agent

import (
	"context"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestAbort: Run's context cancelled with an *Abort ends the node in any
// state: its ranks are stopped, it departs the rendezvous with the reason,
// and the outcome is fatal_error with the reason (not signaled).
func TestAbort(t *testing.T) {
	const why = "the fence watchdog could not be restarted: 3 starts in a row failed"
	tests := []struct {
		name    string
		setup   func(h *harness)
		act     func(h *harness, abort func())
		stopped bool // a rank group was running and must have been stopped
	}{
		{"while running", func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			func(h *harness, abort func()) { h.ranks.wait(h.t); abort() }, true},
		{"while joining", func(h *harness) {
			h.rdzv.next = append(h.rdzv.next, func(ctx context.Context) (rendezvous.Assignment, error) {
				return rendezvous.Assignment{}, blockUntilDone(ctx)
			})
		},
			func(h *harness, abort func()) { abort() }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			h.ctx = ctx
			tc.setup(h)
			out := h.start()
			tc.act(h, func() { cancel(&Abort{Reason: why}) })
			o := h.outcome(out)
			want(t, o, verdict.FatalError, 1)
			if o.Reason != why || o.Signal != nil {
				t.Errorf("outcome reason %q signal %v, want %q and no signal", o.Reason, o.Signal, why)
			}
			if len(h.rdzv.departs) != 1 || !strings.Contains(h.rdzv.departs[0], why) || !strings.Contains(h.rdzv.departs[0], "10.0.0.1/42") {
				t.Errorf("departs %q, want one naming the node and the reason", h.rdzv.departs)
			}
			if tc.stopped {
				if g := h.ranks.groups[0]; len(g.stopped) == 0 {
					t.Error("the running ranks were not stopped")
				} else if g.stopped[0] != syscall.SIGTERM {
					t.Errorf("ranks stopped with %v", g.stopped)
				}
			}
			var found bool
			for _, e := range h.events("job_failed") {
				if e["kind"] == string(verdict.FatalError) && e["reason"] == why {
					found = true
				}
			}
			if !found {
				t.Errorf("no job_failed event of kind fatal_error with the reason: %v", h.events("job_failed"))
			}
		})
	}
}
