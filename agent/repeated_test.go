package agent

import (
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

func TestRepeatedFailure(t *testing.T) {
	boom := &verdict.FailureCause{Exception: "ValueError", Message: "x", Where: "t.py:3 in f"}
	other := &verdict.FailureCause{Exception: "ValueError", Message: "x", Where: "t.py:9 in g"}
	crash := func(round, rank int, c *verdict.FailureCause) verdict.RankFailure {
		return verdict.RankFailure{Round: round, Rank: rank, Kind: verdict.FailureCrash, ExitCode: 1, Cause: c}
	}
	sig := func(round, rank int, s string) verdict.RankFailure {
		return verdict.RankFailure{Round: round, Rank: rank, Kind: verdict.FailureCrash, Signal: s}
	}
	for _, tc := range []struct {
		name  string
		fs    []verdict.RankFailure
		round int
		limit int
		stop  bool
	}{
		{"three in a row", []verdict.RankFailure{crash(0, 1, boom), crash(1, 1, boom), crash(2, 1, boom)}, 2, 3, true},
		{"two only", []verdict.RankFailure{crash(1, 1, boom), crash(2, 1, boom)}, 2, 3, false},
		{"a round between ended elsewhere", []verdict.RankFailure{crash(0, 1, boom), crash(2, 1, boom), crash(3, 1, boom)}, 3, 3, false},
		{"another place", []verdict.RankFailure{crash(0, 1, boom), crash(1, 1, other), crash(2, 1, boom)}, 2, 3, false},
		{"another rank", []verdict.RankFailure{crash(0, 0, boom), crash(1, 1, boom), crash(2, 1, boom)}, 2, 3, false},
		{"two failures in one round, one the same", []verdict.RankFailure{crash(0, 1, boom), crash(1, 0, other), crash(1, 1, boom), crash(2, 1, boom)}, 2, 3, true},
		{"the same signal, no cause", []verdict.RankFailure{sig(0, 1, "SIGKILL"), sig(1, 1, "SIGKILL")}, 1, 2, true},
		{"exit codes alone are not the same failure", []verdict.RankFailure{crash(0, 1, nil), crash(1, 1, nil)}, 1, 2, false},
		{"hangs are not counted", []verdict.RankFailure{{Round: 0, Rank: 1, Kind: verdict.FailureHang}, {Round: 1, Rank: 1, Kind: verdict.FailureHang}}, 1, 2, false},
		{"the last failure is from an older round", []verdict.RankFailure{crash(0, 1, boom), crash(1, 1, boom), crash(2, 1, boom)}, 3, 3, false},
		{"off", []verdict.RankFailure{crash(0, 1, boom), crash(1, 1, boom), crash(2, 1, boom)}, 2, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runState{rankFailures: tc.fs, asg: rendezvous.Assignment{Round: tc.round}}
			why, stop := r.repeatedFailure(tc.limit)
			if stop != tc.stop {
				t.Fatalf("stop %v (%q), want %v", stop, why, tc.stop)
			}
			if stop && !strings.Contains(why, "rank 1") {
				t.Errorf("reason %q does not name the rank", why)
			}
		})
	}
}
