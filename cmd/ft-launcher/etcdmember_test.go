package main

import (
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestRestartBudget: the restart policy of a dead etcd member as a state
// machine. Each step is a death (or failed restart) at a time, with how
// long the member had served; the budget answers how long to wait before
// the next attempt, or that it gives up.
func TestRestartBudget(t *testing.T) {
	p := restartPolicy{Limit: 3, Window: time.Minute, Backoff: time.Second, MaxBackoff: 4 * time.Second, Stable: 10 * time.Second}
	type step struct {
		at     time.Duration // since the start of the test clock
		served time.Duration // how long the member served before this death; 0: it never served
		wait   time.Duration
		ok     bool
	}
	tests := []struct {
		name   string
		policy restartPolicy
		steps  []step
	}{
		{"one death is repaired at once", p, []step{{at: 0, served: time.Hour, wait: 0, ok: true}}},
		{"a crash loop backs off, then gives up at the limit", p, []step{
			{at: 0, served: time.Hour, wait: 0, ok: true},
			{at: time.Second, served: 0, wait: time.Second, ok: true},
			{at: 3 * time.Second, served: 0, wait: 2 * time.Second, ok: true},
			{at: 6 * time.Second, served: 0, ok: false},
		}},
		{"the backoff stops at its maximum", restartPolicy{Limit: 10, Window: time.Minute, Backoff: time.Second, MaxBackoff: 3 * time.Second, Stable: time.Hour}, []step{
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
		{"an attempt counts from when it runs, after its wait", restartPolicy{Limit: 1, Window: 10 * time.Second, Backoff: 20 * time.Second, MaxBackoff: 20 * time.Second, Stable: time.Hour}, []step{
			{at: 0, wait: 0, ok: true},
			{at: 11 * time.Second, wait: 20 * time.Second, ok: true}, // the first attempt left the window; this one runs at 31 s
			{at: 12 * time.Second, ok: false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			b := restartBudget{p: tt.policy}
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var up time.Time
				if s.served > 0 {
					up = now.Add(-s.served)
				}
				wait, ok := b.next(now, up)
				if ok != s.ok || (ok && wait != s.wait) {
					t.Fatalf("step %d (at %v, served %v): next = %v, %v; want %v, %v", i, s.at, s.served, wait, ok, s.wait, s.ok)
				}
			}
		})
	}
}

// TestMemberFailuresBounded: the verdict keeps the newest failures, at most
// maxMemberFailures; a nil list (no hosted member) records nothing.
func TestMemberFailuresBounded(t *testing.T) {
	var none *memberFailures
	none.add(verdict.EtcdMemberFailure{PID: 1})
	if got := none.snapshot(); got != nil {
		t.Fatalf("nil list: %v", got)
	}
	f := &memberFailures{}
	for i := range maxMemberFailures + 5 {
		f.add(verdict.EtcdMemberFailure{PID: i})
	}
	got := f.snapshot()
	if len(got) != maxMemberFailures || got[0].PID != 5 || got[len(got)-1].PID != maxMemberFailures+4 {
		t.Fatalf("kept %d entries, PIDs %d..%d; want %d, 5..%d", len(got), got[0].PID, got[len(got)-1].PID, maxMemberFailures, maxMemberFailures+4)
	}
}
