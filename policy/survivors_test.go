package policy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSurvivors: every branch of the node's in-process decision.
func TestSurvivors(t *testing.T) {
	// ok is a rank crash of this node with budget, everything in place
	// for the survivors to stay; each case changes what it names.
	ok := func(f func(*SurvivorsInput)) SurvivorsInput {
		in := SurvivorsInput{InProcess: true, Failure: RankCrash, RestartsUsed: 1, MaxRestarts: 3,
			AgentStore: true, Survivors: 3, AllCapable: true, FirstStepsTaken: true}
		if f != nil {
			f(&in)
		}
		return in
	}
	type want struct{ stay, closes, during, record bool }
	tests := []struct {
		name    string
		in      SurvivorsInput
		want    want
		whyHas  string
		mayStay bool // MaySurvive
	}{
		{"crash, all in place: stay", ok(nil), want{stay: true}, "rank_crash: replacing the failed rank; the survivors restart in process (restart 2 of 3)", true},
		{"hang, survivors heartbeating: stay", ok(func(in *SurvivorsInput) { in.Failure = RankHang }), want{stay: true}, "rank_hang: replacing", true},
		{"another node's crash: stay, the round's reason", ok(func(in *SurvivorsInput) {
			in.JobRestarts, in.RoundEndReason = true, "node b: local rank 0 exited with code 1"
		}), want{stay: true}, "the round ended (node b: local rank 0 exited with code 1); this node's ranks restart in process", true},
		{"another node lost: stay", ok(func(in *SurvivorsInput) {
			in.JobRestarts, in.Failure, in.RoundEndReason = true, NodeLost, "node c lost"
		}),
			want{stay: true}, "the round ended (node c lost)", true},
		{"the job's restart is decided: the node's budget view is not asked", ok(func(in *SurvivorsInput) {
			in.JobRestarts, in.RestartsUsed, in.MaxRestarts = true, 3, 3
		}), want{stay: true}, "the round ended", true},
		{"full mode", ok(func(in *SurvivorsInput) { in.InProcess = false }), want{}, "--restart-mode full", false},
		{"a signal or request ends the node", ok(func(in *SurvivorsInput) { in.NodeEnding = true }), want{}, "does not restart", false},
		{"no failure (success, signal, fence)", ok(func(in *SurvivorsInput) { in.Failure = "" }), want{}, "did not end by a failure", false},
		{"no-restart request closes", ok(func(in *SurvivorsInput) { in.JobRestarts, in.Failure = true, NoRestartRequest }), want{closes: true}, "not to restart", true},
		{"crash, budget spent: the job closes", ok(func(in *SurvivorsInput) { in.RestartsUsed = 3 }), want{closes: true}, "restart budget exhausted (3 of 3", true},
		{"crash, count spent but a window: the job's decision counts", ok(func(in *SurvivorsInput) { in.RestartsUsed, in.Window = 3, time.Hour }),
			want{stay: true}, "replacing", true},
		{"crash, max-restarts 0", ok(func(in *SurvivorsInput) { in.RestartsUsed, in.MaxRestarts = 0, 0 }), want{closes: true}, "budget exhausted", true},
		{"closing during a restart records no fallback", ok(func(in *SurvivorsInput) { in.RestartsUsed, in.KeptIntoRound, in.FirstStepsTaken = 3, true, false }),
			want{closes: true, during: true}, "budget exhausted", true},
		{"no agent store", ok(func(in *SurvivorsInput) { in.AgentStore = false }), want{}, "no agent store", true},
		{"no survivor", ok(func(in *SurvivorsInput) { in.Survivors = 0 }), want{}, "no rank of this node survived", true},
		{"a survivor not registered", ok(func(in *SurvivorsInput) { in.AllCapable = false }), want{}, "not every survivor registered", true},
		{"hang, a survivor silent", ok(func(in *SurvivorsInput) { in.Failure, in.SurvivorSilent = RankHang, true }), want{}, "a survivor was silent too", true},
		{"crash: silence is not asked", ok(func(in *SurvivorsInput) { in.SurvivorSilent = true }), want{stay: true}, "replacing", true},
		{"during a restart with kept survivors: escalates, recorded", ok(func(in *SurvivorsInput) { in.KeptIntoRound, in.FirstStepsTaken = true, false }),
			want{during: true, record: true}, "escalates to the full restart", true},
		{"during, the overdue rejoin recorded it", ok(func(in *SurvivorsInput) {
			in.KeptIntoRound, in.FirstStepsTaken, in.RejoinOverdue = true, false, true
		}), want{during: true}, "escalates", true},
		{"kept survivors stepped: a new incident, stay", ok(func(in *SurvivorsInput) { in.KeptIntoRound = true }), want{stay: true}, "replacing", true},
		{"fresh ranks of a restart round unstepped: escalates", ok(func(in *SurvivorsInput) { in.FirstStepsTaken = false }),
			want{during: true, record: true}, "escalates", true},
		{"fresh ranks unstepped, not capable: not during", ok(func(in *SurvivorsInput) { in.FirstStepsTaken, in.AllCapable = false, false }),
			want{}, "not every survivor registered", true},
		{"fresh ranks unstepped, no survivor: not during", ok(func(in *SurvivorsInput) { in.FirstStepsTaken, in.Survivors = false, 0 }),
			want{}, "no rank of this node survived", true},
		{"kept survivors unstepped, none capable now: still during", ok(func(in *SurvivorsInput) {
			in.KeptIntoRound, in.FirstStepsTaken, in.AllCapable = true, false, false
		}), want{during: true, record: true}, "escalates", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MaySurvive(tc.in); got != tc.mayStay {
				t.Fatalf("MaySurvive(%+v) = %v, want %v", tc.in, got, tc.mayStay)
			}
			d := Survivors(tc.in)
			got := want{d.Stay, d.JobCloses, d.During, d.RecordFallback}
			if got != tc.want {
				t.Fatalf("Survivors(%+v) = %+v; want %+v", tc.in, d, tc.want)
			}
			if !strings.Contains(d.Why, tc.whyHas) {
				t.Fatalf("why %q does not say %q", d.Why, tc.whyHas)
			}
		})
	}
}

// TestSurvivorsInvariants sweeps every combination of the facts: the
// answer is consistent with itself, and, for a failure of the node's own
// ranks, with the job's decision on the same facts (Decide): a node never
// keeps survivors that the job restarts fully, nor the reverse.
func TestSurvivorsInvariants(t *testing.T) {
	failures := append([]Failure{""}, Failures...)
	for _, f := range failures {
		for used := 0; used <= 2; used++ {
			for survivors := 0; survivors <= 1; survivors++ {
				for mask := 0; mask < 1<<9; mask++ {
					b := func(i int) bool { return mask&(1<<i) != 0 }
					in := SurvivorsInput{InProcess: b(0), NodeEnding: b(1), Failure: f, JobRestarts: b(2),
						RestartsUsed: used, MaxRestarts: 2, AgentStore: b(3), Survivors: survivors, AllCapable: b(4),
						SurvivorSilent: b(5), KeptIntoRound: b(6), FirstStepsTaken: b(7), RejoinOverdue: b(8)}
					d := Survivors(in)
					if d.Why == "" || !slices.Contains(SurvivorsReasons, d.Reason) && !slices.Contains(Reasons, d.Reason) {
						t.Fatalf("%+v: no reason, or one not listed: %+v", in, d)
					}
					if d.Stay != (d.Reason == ReasonSurvivorsStay) {
						t.Fatalf("%+v: stay %v with reason %q", in, d.Stay, d.Reason)
					}
					if !MaySurvive(in) && (d.Stay || d.JobCloses || d.During || d.RecordFallback) {
						t.Fatalf("%+v: decided although the question does not arise: %+v", in, d)
					}
					if d.Stay && (d.JobCloses || d.During || d.RecordFallback || !in.AgentStore || in.Survivors == 0 || !in.AllCapable) {
						t.Fatalf("%+v: stays against a fact: %+v", in, d)
					}
					if d.RecordFallback && (!d.During || d.JobCloses || in.RejoinOverdue) {
						t.Fatalf("%+v: a fallback recorded without cause: %+v", in, d)
					}
					if d.Stay && f == RankHang && in.SurvivorSilent {
						t.Fatalf("%+v: kept a silent survivor after a hang: %+v", in, d)
					}
					if !MaySurvive(in) || in.JobRestarts || (f != RankCrash && f != RankHang) {
						continue
					}
					job := Decide(Input{Failure: f, RestartsUsed: used, MaxRestarts: 2, NodesPresent: 1, MinNodes: 1})
					if d.JobCloses != (job.Action == CloseJob) {
						t.Fatalf("%+v: node %+v disagrees with the job's %+v", in, d, job)
					}
					if d.JobCloses && d.Reason != job.Reason {
						t.Fatalf("%+v: node's reason %q, job's %q", in, d.Reason, job.Reason)
					}
				}
			}
		}
	}
}

// TestQuarantineForHangs: the threshold, and only where spares can exist.
func TestQuarantineForHangs(t *testing.T) {
	tests := []struct {
		name          string
		hangs, lo, hi int
		want          bool
	}{
		{"below the threshold", HangQuarantineThreshold - 1, 2, 3, false},
		{"at the threshold, spares possible", HangQuarantineThreshold, 2, 3, true},
		{"above the threshold", HangQuarantineThreshold + 2, 1, 4, true},
		{"at the threshold, fixed size: restart in place instead", HangQuarantineThreshold, 2, 2, false},
		{"no hang", 0, 1, 2, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := QuarantineForHangs(tc.hangs, tc.lo, tc.hi); got != tc.want {
				t.Fatalf("QuarantineForHangs(%d, %d, %d) = %v, want %v", tc.hangs, tc.lo, tc.hi, got, tc.want)
			}
		})
	}
}
