package report

import (
	"testing"
)

// TestRoundEndedReadsTheCause: a round ended by another node is labelled
// from the record's cause, whatever its prose says: a node loss whose
// reason does not say "lost", and a crash whose reason does.
func TestRoundEndedReadsTheCause(t *testing.T) {
	tests := []struct {
		name, cause, reason, want string
	}{
		{"node loss", `"cause":"node_lost",`, "node n2: lease expired", "node_loss"},
		{"a crash whose prose says lost", `"cause":"rank_crash",`, "node n2: rank 1 lost its connection and exited with code 1", "round_ended"},
		{"no cause (an older launcher)", ``, "node n2 lost", "round_ended"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			lines := []string{
				`{"event":"launcher_started","nproc_per_node":1,"node":"n1","run_id":"r1","ts":"2026-01-01T00:00:00Z"}`,
				`{"event":"cycle_started","group_rank":0,"node":"n1","pids":[10],"round":0,"run_id":"r1","ts":"2026-01-01T00:00:01Z","world_size":2}`,
				`{` + tc.cause + `"event":"round_ended","job_closed":false,"node":"n1","reason":"` + tc.reason + `","round":0,"run_id":"r1","ts":"2026-01-01T00:00:05Z"}`,
				`{"event":"rank_exited","exit_code":-15,"signal":"SIGTERM","local_rank":0,"node":"n1","rank":0,"round":0,"run_id":"r1","ts":"2026-01-01T00:00:06Z"}`,
				`{"event":"job_failed","node":"n1","reason":"out of restarts","round":0,"run_id":"r1","ts":"2026-01-01T00:00:07Z"}`,
			}
			r := buildFromLines(t, lines)
			if len(r.Rounds) == 0 || r.Rounds[0].End != tc.want {
				t.Fatalf("rounds %+v: want round 0 ended %q", r.Rounds, tc.want)
			}
		})
	}
}
