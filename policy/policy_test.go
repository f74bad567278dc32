package policy

import (
	"testing"

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
					case RestartInPlace, RestartInProcess:
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

// TestDecideInProcess: the in-process action and its inputs (mode, every
// survivor registered, failure kind, budget, a failure during an
// in-process restart).
func TestDecideInProcess(t *testing.T) {
	ip := func(in Input) Input { in.Mode = ModeInProcess; in.NodesPresent, in.MinNodes = 2, 2; return in }
	tests := []struct {
		name      string
		in        Input
		action    Action
		inProcess bool
		counts    bool
		close     verdict.Kind
	}{
		{"crash, all registered", ip(Input{Failure: RankCrash, MaxRestarts: 3, AllInProcessCapable: true}), RestartInProcess, true, true, ""},
		{"hang, all registered", ip(Input{Failure: RankHang, RestartsUsed: 1, MaxRestarts: 3, AllInProcessCapable: true}), RestartInProcess, true, true, ""},
		{"hang, a survivor silent too", ip(Input{Failure: RankHang, MaxRestarts: 3, AllInProcessCapable: true, SurvivorSilent: true}), RestartInPlace, false, true, ""},
		{"crash: silence is not asked", ip(Input{Failure: RankCrash, MaxRestarts: 3, AllInProcessCapable: true, SurvivorSilent: true}), RestartInProcess, true, true, ""},
		{"node lost: silence is not asked", ip(Input{Failure: NodeLost, SparesAvailable: 1, AllInProcessCapable: true, SurvivorSilent: true}), SwapSpare, true, false, ""},
		{"crash, a survivor not registered", ip(Input{Failure: RankCrash, MaxRestarts: 3}), RestartInPlace, false, true, ""},
		{"crash during an in-process restart escalates", ip(Input{Failure: RankCrash, MaxRestarts: 3, AllInProcessCapable: true, DuringInProcess: true}), RestartInPlace, false, true, ""},
		{"crash, budget spent", ip(Input{Failure: RankCrash, RestartsUsed: 3, MaxRestarts: 3, AllInProcessCapable: true}), CloseJob, false, false, verdict.RestartBudgetExhausted},
		{"crash, max-restarts 0", ip(Input{Failure: RankCrash, AllInProcessCapable: true}), CloseJob, false, false, verdict.RestartBudgetExhausted},
		{"full mode ignores registration", Input{Failure: RankCrash, MaxRestarts: 3, AllInProcessCapable: true, Mode: ModeFull, NodesPresent: 1, MinNodes: 1}, RestartInPlace, false, true, ""},
		{"empty mode is full", Input{Failure: RankCrash, MaxRestarts: 3, AllInProcessCapable: true, NodesPresent: 1, MinNodes: 1}, RestartInPlace, false, true, ""},
		{"node lost with spare: swap, others stay", ip(Input{Failure: NodeLost, SparesAvailable: 1, AllInProcessCapable: true}), SwapSpare, true, false, ""},
		{"node lost with spare, not registered", ip(Input{Failure: NodeLost, SparesAvailable: 1}), SwapSpare, false, false, ""},
		{"node lost no spare: others stay", ip(Input{Failure: NodeLost, MaxRestarts: 2, AllInProcessCapable: true}), RestartInPlace, true, true, ""},
		{"node stopped no spare, no budget", ip(Input{Failure: NodeStopped, MaxRestarts: 0, AllInProcessCapable: true}), CloseJob, false, false, verdict.RestartBudgetExhausted},
		{"no-restart request closes", ip(Input{Failure: NoRestartRequest, MaxRestarts: 3, AllInProcessCapable: true}), CloseJob, false, false, verdict.NoRestart},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide(tc.in)
			if d.Action != tc.action || d.InProcess != tc.inProcess || d.CountsRestart != tc.counts || d.Close != tc.close {
				t.Fatalf("Decide(%+v) = %+v; want action %s in-process %v counts %v close %q", tc.in, d, tc.action, tc.inProcess, tc.counts, tc.close)
			}
			wantMode := map[bool]string{true: ModeInProcess, false: ModeFull}[tc.inProcess]
			if tc.action == CloseJob {
				wantMode = ""
			}
			if d.Mode() != wantMode || d.Why == "" {
				t.Fatalf("mode %q (want %q), why %q", d.Mode(), wantMode, d.Why)
			}
		})
	}
	// The in-process mode never changes whether the job restarts or what
	// it spends: only how the survivors restart.
	for _, f := range Failures {
		for used := 0; used <= 2; used++ {
			for spares := 0; spares <= 1; spares++ {
				for _, during := range []bool{false, true} {
					for _, silent := range []bool{false, true} {
						in := Input{Failure: f, RestartsUsed: used, MaxRestarts: 2, SparesAvailable: spares, NodesPresent: 2, MinNodes: 2}
						full := Decide(in)
						in.Mode, in.AllInProcessCapable, in.DuringInProcess, in.SurvivorSilent = ModeInProcess, true, during, silent
						d := Decide(in)
						if d.CountsRestart != full.CountsRestart || d.Close != full.Close || (d.Action == CloseJob) != (full.Action == CloseJob) {
							t.Fatalf("%+v: in-process %+v differs from full %+v in budget or close", in, d, full)
						}
						want := !during && !(silent && f == RankHang)
						if d.Action != CloseJob && d.InProcess != want {
							t.Fatalf("%+v: in-process %v, want %v", in, d.InProcess, want)
						}
					}
				}
			}
		}
	}
}
