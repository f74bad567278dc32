package agent

import (
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestStopSignalsRule: the rule alone, signal by signal.
func TestStopSignalsRule(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	type rx struct {
		sig  os.Signal
		at   time.Duration // after t0
		want stopVerdict
	}
	tests := []struct {
		name  string
		first os.Signal // the signal that began the stop (nil: a stop for a restart)
		rxs   []rx
	}{
		{"Slurm's double SIGTERM 13 ms apart", syscall.SIGTERM, []rx{{syscall.SIGTERM, 13 * time.Millisecond, stopRepeat}}},
		{"three copies within the window", syscall.SIGTERM, []rx{
			{syscall.SIGTERM, 5 * time.Millisecond, stopRepeat}, {syscall.SIGTERM, 1900 * time.Millisecond, stopRepeat}}},
		{"same signal at the window's end escalates", syscall.SIGTERM, []rx{{syscall.SIGTERM, 2 * time.Second, stopEscalate}}},
		{"a second ^C after the window escalates", syscall.SIGINT, []rx{{syscall.SIGINT, 3 * time.Second, stopEscalate}}},
		{"a different signal within the window escalates", syscall.SIGTERM, []rx{{syscall.SIGINT, 10 * time.Millisecond, stopEscalate}}},
		{"SIGQUIT after SIGINT escalates", syscall.SIGINT, []rx{{syscall.SIGQUIT, time.Millisecond, stopEscalate}}},
		{"stop for a restart: first remembered, its repeat ignored", nil, []rx{
			{syscall.SIGTERM, 0, stopFirst}, {syscall.SIGTERM, 10 * time.Millisecond, stopRepeat}}},
		{"stop for a restart: repeat after the window escalates", nil, []rx{
			{syscall.SIGTERM, 0, stopFirst}, {syscall.SIGTERM, 2500 * time.Millisecond, stopEscalate}}},
		{"the window counts from the first signal, not the last", syscall.SIGTERM, []rx{
			{syscall.SIGTERM, 1500 * time.Millisecond, stopRepeat}, {syscall.SIGTERM, 2100 * time.Millisecond, stopEscalate}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := stopSignals{window: DefaultSignalRepeatWindow}
			if tc.first != nil {
				r.first, r.firstAt = tc.first, t0
			}
			for i, x := range tc.rxs {
				if got := r.take(x.sig, t0.Add(x.at)); got != x.want {
					t.Errorf("signal %d (%v at +%v): got %d, want %d", i, x.sig, x.at, got, x.want)
				}
			}
		})
	}
}

// repeatSignalCases: the window rule through the whole agent (TestRun):
// a repeat delivery leaves the ranks their grace, a distinct request
// SIGKILLs them.
func repeatSignalCases() []runCase {
	// stopping waits for the fake group's Stop to begin.
	stopping := func(h *harness, g *fakeGroup) {
		waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.stopped) == 1 })
	}
	killed := func(t *testing.T, h *harness, want bool) {
		t.Helper()
		g := h.ranks.groups[0]
		g.mu.Lock()
		defer g.mu.Unlock()
		got := len(g.signalled) == 1 && g.signalled[0] == syscall.SIGKILL
		if got != want || len(g.signalled) > 1 {
			t.Errorf("SIGKILL sent: %v (signalled %v), want %v", got, g.signalled, want)
		}
	}
	var mu sync.Mutex
	var sentAt time.Time
	const grace = 1500 * time.Millisecond
	return []runCase{
		{
			name: "stopping: SIGTERM twice 10 ms apart (Slurm at a time limit): no SIGKILL, the ranks get the whole grace",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.ranks.stopBlocks = true
				h.cfg.TermTimeout = grace
				h.repeatWindow = time.Minute // "within" however loaded the machine
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				mu.Lock()
				sentAt = time.Now()
				mu.Unlock()
				h.sigs <- syscall.SIGTERM
				stopping(h, g)
				time.Sleep(10 * time.Millisecond)
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				killed(t, h, false)
				mu.Lock()
				defer mu.Unlock()
				if d := time.Since(sentAt); d < grace {
					t.Errorf("the stop ended %v after the first SIGTERM, before the %v grace", d, grace)
				}
				if g := h.ranks.groups[0]; len(g.stopped) != 1 || g.stopped[0] != syscall.SIGTERM {
					t.Errorf("stopped with %v", g.stopped)
				}
			},
		},
		{
			name: "stopping: the same signal again after the window SIGKILLs",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.ranks.stopBlocks = true
				h.cfg.TermTimeout = time.Minute
				h.repeatWindow = 100 * time.Millisecond
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGINT
				stopping(h, g)
				time.Sleep(300 * time.Millisecond)
				h.sigs <- syscall.SIGINT
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				killed(t, h, true)
			},
		},
		{
			name: "stopping: a different signal within the window SIGKILLs",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.ranks.stopBlocks = true
				h.cfg.TermTimeout = time.Minute
				h.repeatWindow = time.Minute
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGTERM
				stopping(h, g)
				h.sigs <- syscall.SIGINT
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				killed(t, h, true)
			},
		},
		{
			name: "stopping for a restart: SIGTERM twice within the window ends the node without SIGKILL",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1))
				h.ranks.stopBlocks = true
				h.cfg.WorkersStopTimeout = grace
				h.repeatWindow = time.Minute
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(1, 1, 0)
				stopping(h, g)
				h.sigs <- syscall.SIGTERM
				time.Sleep(10 * time.Millisecond)
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				killed(t, h, false)
				if len(h.rdzv.fails) != 0 || len(h.ranks.groups) != 1 {
					t.Errorf("restarted after a signal: fails %v groups %d", h.rdzv.fails, len(h.ranks.groups))
				}
			},
		},
	}
}
