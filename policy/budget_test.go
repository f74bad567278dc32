package policy

import (
	"testing"
	"time"
)

// TestRestartTracker: the budget's decisions over a sequence of deaths,
// with no clock: each step says when the thing died and since when it ran.
func TestRestartTracker(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		now, up time.Duration // up < 0: it never ran
		wait    time.Duration
		ok      bool
	}
	member := RestartBudget{Limit: 3, Window: 10 * time.Minute, Backoff: time.Second, MaxBackoff: 4 * time.Second, Stable: time.Minute}
	tests := []struct {
		name  string
		b     RestartBudget
		steps []step
	}{
		{"crash loop: immediate, then doubling, then the window's limit", member, []step{
			{0, 0, 0, true},
			{time.Second, 0, time.Second, true},
			{3 * time.Second, 2 * time.Second, 2 * time.Second, true},
			{6 * time.Second, 5 * time.Second, 0, false},
		}},
		{"a stable run resets the backoff, the window lets old attempts go", member, []step{
			{0, 0, 0, true},
			{time.Second, 0, time.Second, true},
			{5 * time.Minute, time.Second, 0, true},      // ran 5 min: the row starts over
			{11 * time.Minute, 5 * time.Minute, 0, true}, // the first two are out of the window
			{11*time.Minute + time.Second, 11 * time.Minute, time.Second, true},
			{11*time.Minute + 3*time.Second, 11*time.Minute + 2*time.Second, 0, false},
		}},
		{"backoff capped", RestartBudget{Limit: 10, Backoff: time.Second, MaxBackoff: 3 * time.Second}, []step{
			{0, -1, 0, true}, {0, -1, time.Second, true}, {0, -1, 2 * time.Second, true}, {0, -1, 3 * time.Second, true}, {0, -1, 3 * time.Second, true},
		}},
		{"a fixed delay, no window: the total counts", RestartBudget{Limit: 2, Delay: 5 * time.Second}, []step{
			{0, 0, 5 * time.Second, true}, {time.Hour, 0, 5 * time.Second, true}, {100 * time.Hour, 99 * time.Hour, 0, false},
		}},
		{"the zero budget allows nothing", RestartBudget{}, []step{{0, 0, 0, false}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := RestartTracker{Budget: tc.b}
			granted := 0
			for i, s := range tc.steps {
				up := time.Time{}
				if s.up >= 0 {
					up = at(s.up)
				}
				wait, ok := tr.Next(at(s.now), up)
				if wait != s.wait || ok != s.ok {
					t.Fatalf("step %d: Next = %v, %v; want %v, %v", i, wait, ok, s.wait, s.ok)
				}
				if ok {
					granted++
				}
			}
			if tr.Restarts() != granted {
				t.Fatalf("Restarts() = %d, want %d", tr.Restarts(), granted)
			}
		})
	}
}

// TestRestartBudgetRecent keeps what can still count, the newest Limit.
func TestRestartBudgetRecent(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	b := RestartBudget{Limit: 2, Window: time.Hour}
	got := b.Recent([]time.Time{t0.Add(-2 * time.Hour), t0.Add(-30 * time.Minute), t0.Add(-20 * time.Minute), t0.Add(-time.Minute)}, t0)
	if len(got) != 2 || !got[0].Equal(t0.Add(-20*time.Minute)) || !got[1].Equal(t0.Add(-time.Minute)) {
		t.Fatalf("Recent = %v", got)
	}
	if n := b.Used(got, 99, t0); n != 2 {
		t.Fatalf("Used = %d, want 2", n)
	}
	if n := (RestartBudget{Limit: 2}).Used(got, 7, t0); n != 7 {
		t.Fatalf("Used without a window = %d, want the total 7", n)
	}
}

// TestRestartBudgetMember: the budget of a dead etcd member (the keeper
// in cmd/ft-launcher) as a state machine. Each step is a death (or failed restart) at a time, with how
// long the member had served; the budget answers how long to wait before
// the next attempt, or that it gives up.
func TestRestartBudgetMember(t *testing.T) {
	p := RestartBudget{Limit: 3, Window: time.Minute, Backoff: time.Second, MaxBackoff: 4 * time.Second, Stable: 10 * time.Second}
	type step struct {
		at     time.Duration // since the start of the test clock
		served time.Duration // how long the member served before this death; 0: it never served
		wait   time.Duration
		ok     bool
	}
	tests := []struct {
		name   string
		budget RestartBudget
		steps  []step
	}{
		{"one death is repaired at once", p, []step{{at: 0, served: time.Hour, wait: 0, ok: true}}},
		{"a crash loop backs off, then gives up at the limit", p, []step{
			{at: 0, served: time.Hour, wait: 0, ok: true},
			{at: time.Second, served: 0, wait: time.Second, ok: true},
			{at: 3 * time.Second, served: 0, wait: 2 * time.Second, ok: true},
			{at: 6 * time.Second, served: 0, ok: false},
		}},
		{"the backoff stops at its maximum", RestartBudget{Limit: 10, Window: time.Minute, Backoff: time.Second, MaxBackoff: 3 * time.Second, Stable: time.Hour}, []step{
			{at: 0, wait: 0, ok: true},
			{at: 1 * time.Second, wait: time.Second, ok: true},
			{at: 2 * time.Second, wait: 2 * time.Second, ok: true},
			{at: 3 * time.Second, wait: 3 * time.Second, ok: true},
			{at: 4 * time.Second, wait: 3 * time.Second, ok: true},
		}},
		{"a member that served Stable resets the backoff", p, []step{
			{at: 0, served: time.Hour, wait: 0, ok: true},
			{at: 2 * time.Second, served: time.Second, wait: time.Second, ok: true},
			{at: 30 * time.Second, served: 20 * time.Second, wait: 0, ok: true},
		}},
		{"attempts older than the window no longer count", p, []step{
			{at: 0, served: time.Hour, wait: 0, ok: true},
			{at: time.Second, wait: time.Second, ok: true},
			{at: 3 * time.Second, wait: 2 * time.Second, ok: true},
			// Limit spent at 6 s; 2 min later the window is empty again,
			// and the member served long enough to reset the backoff.
			{at: 6 * time.Second, ok: false},
			{at: 2 * time.Minute, served: time.Minute, wait: 0, ok: true},
		}},
		{"an attempt counts from when it runs, after its wait", RestartBudget{Limit: 1, Window: 10 * time.Second, Backoff: 20 * time.Second, MaxBackoff: 20 * time.Second, Stable: time.Hour}, []step{
			{at: 0, wait: 0, ok: true},
			{at: 11 * time.Second, wait: 20 * time.Second, ok: true}, // the first attempt left the window; this one runs at 31 s
			{at: 12 * time.Second, ok: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			b := RestartTracker{Budget: tt.budget}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var up time.Time
				if s.served > 0 {
					up = now.Add(-s.served)
				}
				wait, ok := b.Next(now, up)
				if ok != s.ok || (ok && wait != s.wait) {
					t.Fatalf("step %d (at %v, served %v): next = %v, %v; want %v, %v", i, s.at, s.served, wait, ok, s.wait, s.ok)
				}
			}
		})
	}
}
