package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

func TestDecide(t *testing.T) {
	tests := []struct {
		name   string
		in     Input
		action Action
		counts bool
		close  verdict.Kind
	}{
		{"crash with budget", Input{Failure: RankCrash, RestartsUsed: 0, MaxRestarts: 3, NodesPresent: 2, MinNodes: 2}, RestartInPlace, true, ""},
		{"crash last restart", Input{Failure: RankCrash, RestartsUsed: 2, MaxRestarts: 3, NodesPresent: 2, MinNodes: 2}, RestartInPlace, true, ""},
		{"crash budget exhausted", Input{Failure: RankCrash, RestartsUsed: 3, MaxRestarts: 3, NodesPresent: 2, MinNodes: 2}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"crash max-restarts 0", Input{Failure: RankCrash, MaxRestarts: 0, NodesPresent: 1, MinNodes: 1}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"crash never takes a spare", Input{Failure: RankCrash, RestartsUsed: 0, MaxRestarts: 1, SparesAvailable: 2, NodesPresent: 4, MinNodes: 2}, RestartInPlace, true, ""},
		{"crash with spares, no budget", Input{Failure: RankCrash, RestartsUsed: 1, MaxRestarts: 1, SparesAvailable: 2, NodesPresent: 4, MinNodes: 2}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"hang with budget", Input{Failure: RankHang, RestartsUsed: 1, MaxRestarts: 5, NodesPresent: 1, MinNodes: 1}, RestartInPlace, true, ""},
		{"hang budget exhausted", Input{Failure: RankHang, RestartsUsed: 5, MaxRestarts: 5, NodesPresent: 1, MinNodes: 1}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"node lost with spare", Input{Failure: NodeLost, RestartsUsed: 0, MaxRestarts: 3, SparesAvailable: 1, NodesPresent: 2, MinNodes: 2}, SwapSpare, false, ""},
		{"node lost with spare, max-restarts 0", Input{Failure: NodeLost, MaxRestarts: 0, SparesAvailable: 1, NodesPresent: 2, MinNodes: 2}, SwapSpare, false, ""},
		{"node lost with spare, budget spent", Input{Failure: NodeLost, RestartsUsed: 2, MaxRestarts: 2, SparesAvailable: 1, NodesPresent: 2, MinNodes: 2}, SwapSpare, false, ""},
		{"node lost no spare", Input{Failure: NodeLost, RestartsUsed: 0, MaxRestarts: 3, NodesPresent: 1, MinNodes: 2}, RestartInPlace, true, ""},
		{"node lost no spare, enough nodes", Input{Failure: NodeLost, RestartsUsed: 0, MaxRestarts: 3, NodesPresent: 2, MinNodes: 2}, RestartInPlace, true, ""},
		{"node lost no spare, no budget", Input{Failure: NodeLost, RestartsUsed: 3, MaxRestarts: 3, NodesPresent: 1, MinNodes: 2}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"node excluded with spare", Input{Failure: NodeExcluded, MaxRestarts: 0, SparesAvailable: 2, NodesPresent: 3, MinNodes: 2}, SwapSpare, false, ""},
		{"node excluded no spare", Input{Failure: NodeExcluded, MaxRestarts: 1, NodesPresent: 1, MinNodes: 2}, RestartInPlace, true, ""},
		{"node excluded no spare, no budget", Input{Failure: NodeExcluded, RestartsUsed: 1, MaxRestarts: 1, NodesPresent: 1, MinNodes: 2}, CloseJob, false, verdict.RestartBudgetExhausted},
		{"node stopped with spare", Input{Failure: NodeStopped, MaxRestarts: 0, SparesAvailable: 1, NodesPresent: 2, MinNodes: 2}, SwapSpare, false, ""},
		{"node stopped no spare", Input{Failure: NodeStopped, MaxRestarts: 2, NodesPresent: 1, MinNodes: 2}, RestartInPlace, true, ""},
		{"no-restart request with budget", Input{Failure: NoRestartRequest, MaxRestarts: 10, NodesPresent: 2, MinNodes: 2}, CloseJob, false, verdict.NoRestart},
		{"no-restart request with spares", Input{Failure: NoRestartRequest, MaxRestarts: 10, SparesAvailable: 3, NodesPresent: 5, MinNodes: 2}, CloseJob, false, verdict.NoRestart},
		{"unknown failure counts as process failure", Input{Failure: "mystery", MaxRestarts: 1, NodesPresent: 1, MinNodes: 1}, RestartInPlace, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.action || d.CountsRestart != tc.counts || d.Close != tc.close {
				t.Fatalf("Decide(%+v) = %+v; want action %s counts %v close %q", tc.in, d, tc.action, tc.counts, tc.close)
			}
			if d.Why == "" {
				t.Fatal("decision without a reason")
			}
		})
	}
}

// Every failure kind with every budget state gives a decision that is
// consistent: a close has a kind, a counted restart only with budget left.
func TestDecideInvariants(t *testing.T) {
	for _, f := range Failures {
		for used := 0; used <= 3; used++ {
			for max := 0; max <= 3; max++ {
				for spares := 0; spares <= 2; spares++ {
					in := Input{Failure: f, RestartsUsed: used, MaxRestarts: max, SparesAvailable: spares, NodesPresent: 2, MinNodes: 2}
					d := Decide(in)
					switch d.Action {
					case CloseJob:
						if !d.Close.Valid() || d.CountsRestart {
							t.Fatalf("%+v: close without kind or counted: %+v", in, d)
						}
					case RestartInPlace:
						if !d.CountsRestart || used >= max {
							t.Fatalf("%+v: restart in place must count and needs budget: %+v", in, d)
						}
					case SwapSpare:
						if d.CountsRestart || spares == 0 || (f != NodeLost && f != NodeExcluded && f != NodeStopped) {
							t.Fatalf("%+v: bad swap: %+v", in, d)
						}
					default:
						t.Fatalf("%+v: unknown action %q", in, d.Action)
					}
				}
			}
		}
	}
}

// TestDecideReasons: every decision names its rule as a constant, and the
// rule matches the action (consumers switch on it, never on Why).
func TestDecideReasons(t *testing.T) {
	tests := []struct {
		in   Input
		want Reason
	}{
		{Input{Failure: NoRestartRequest, MaxRestarts: 3}, ReasonNoRestartRequested},
		{Input{Failure: NodeLost, SparesAvailable: 1}, ReasonSpareSwap},
		{Input{Failure: NodeStopped, MaxRestarts: 1, NodesPresent: 1, MinNodes: 2}, ReasonWaitForNodes},
		{Input{Failure: NodeExcluded, MaxRestarts: 1, NodesPresent: 2, MinNodes: 2}, ReasonRestartOnPresent},
		{Input{Failure: RankHang, MaxRestarts: 1, NodesPresent: 2, MinNodes: 2}, ReasonProcessFailure},
		{Input{Failure: RankCrash, RestartsUsed: 1, MaxRestarts: 1}, ReasonBudgetExhausted},
	}
	seen := map[Reason]bool{}
	for _, tc := range tests {
		d := Decide(tc.in)
		if d.Reason != tc.want {
			t.Errorf("Decide(%+v).Reason = %q, want %q (why %q)", tc.in, d.Reason, tc.want, d.Why)
		}
		seen[d.Reason] = true
	}
	for _, r := range Reasons {
		if !seen[r] {
			t.Errorf("reason %q has no case", r)
		}
	}
}

// TestDecideWindowAndDelay: with --restart-window only the restarts within
// it count; --restart-delay is the wait of every counted restart.
func TestDecideWindowAndDelay(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ago := func(d ...time.Duration) []time.Time {
		var ts []time.Time
		for _, x := range d {
			ts = append(ts, now.Add(-x))
		}
		return ts
	}
	tests := []struct {
		name   string
		in     Input
		action Action
		why    string
	}{
		{"two old restarts fall out of the window",
			Input{Failure: RankCrash, RestartsUsed: 2, MaxRestarts: 2, Window: time.Hour, RecentRestarts: ago(2*time.Hour, 90*time.Minute), Now: now, Delay: 5 * time.Second},
			RestartInPlace, "(restart 1 of 2 within 1h0m0s)"},
		{"one within, one out",
			Input{Failure: RankCrash, RestartsUsed: 5, MaxRestarts: 2, Window: time.Hour, RecentRestarts: ago(2*time.Hour, 10*time.Minute), Now: now, Delay: 5 * time.Second},
			RestartInPlace, "(restart 2 of 2 within 1h0m0s)"},
		{"both within: exhausted",
			Input{Failure: RankCrash, RestartsUsed: 2, MaxRestarts: 2, Window: time.Hour, RecentRestarts: ago(30*time.Minute, 10*time.Minute), Now: now},
			CloseJob, "restart budget exhausted (2 of 2 restarts used within 1h0m0s)"},
		{"no window: the total counts",
			Input{Failure: RankCrash, RestartsUsed: 2, MaxRestarts: 2, RecentRestarts: ago(2*time.Hour, 90*time.Minute), Now: now},
			CloseJob, "restart budget exhausted (2 of 2 restarts used)"},
		{"a spare swap waits for nothing",
			Input{Failure: NodeLost, SparesAvailable: 1, Delay: 5 * time.Second},
			SwapSpare, "a spare takes its place"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.action || !strings.Contains(d.Why, tc.why) {
				t.Fatalf("Decide = %+v; want %s with %q", d, tc.action, tc.why)
			}
			wantDelay := time.Duration(0)
			if d.CountsRestart {
				wantDelay = tc.in.Delay
			}
			if d.Delay != wantDelay {
				t.Fatalf("delay %v, want %v", d.Delay, wantDelay)
			}
		})
	}
}
