package report

import (
	"strings"
	"testing"
	"time"
)

// TestPeerHealAccount: an in-process restart whose round healed from a
// survivor (testdata/inprocess_peerheal.jsonl, recorded from
// integration's TestTorchPeerHealInProcess: rank 1 SIGKILLed mid-step 25,
// rank 0 kept step 24 and sent it to the replacement) loses the failed
// step only: round 0 ends in a crash at the kill, its kept work runs until
// the survivor completed step 24, 1 step lost, and round 1's restores are
// live and peer. The same run with the heal fallen back to the newest
// save (the survivors disagreed) keeps the usual account and says why.
func TestPeerHealAccount(t *testing.T) {
	for _, tt := range []struct {
		file      string
		sources   string
		stepsLost any
		note      string
	}{
		{"testdata/inprocess_peerheal.jsonl", "live ×1, peer ×1", 1, ""},
		{"testdata/inprocess_peerheal_fallback.jsonl", "memory ×2", nil,
			"round 1: the peer heal fell back to the newest committed save: the survivors disagree on the last completed step"},
	} {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Build(Inputs{EventLogs: []string{tt.file}})
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Rounds) != 2 {
				t.Fatalf("rounds %+v, want 2", r.Rounds)
			}
			r0 := r.Rounds[0]
			if r0.End != "crash" || r0.Reason != "rank 1 was killed by SIGKILL" {
				t.Errorf("round 0 ended %q (%q), want a crash: rank 1 was killed by SIGKILL", r0.End, r0.Reason)
			}
			var lost any
			if r0.StepsLost != nil {
				lost = *r0.StepsLost
			}
			if lost != tt.stepsLost {
				t.Errorf("round 0 lost %v steps, want %v", lost, tt.stepsLost)
			}
			if got := r.Rounds[1].RestoreSources(); got != tt.sources {
				t.Errorf("round 1 restored from %q, want %q", got, tt.sources)
			}
			notes := strings.Join(r.Notes, "\n")
			if (tt.note == "") != !strings.Contains(notes, "peer heal fell back") || !strings.Contains(notes, tt.note) {
				t.Errorf("notes %q, want %q", r.Notes, tt.note)
			}
			if tt.stepsLost == 1 {
				var labels []string
				for _, l := range r.Ranks {
					for _, m := range l.Marks {
						if m.Kind == "restore" {
							labels = append(labels, l.Name+": "+m.Label)
						}
					}
				}
				marks := []string{"rank 0: round 1: kept its live step 24 (peer heal", "rank 1: round 1: received step 24 from rank 0 (peer heal)"}
				for _, w := range marks {
					if !strings.Contains(strings.Join(labels, "\n"), w) {
						t.Errorf("restore marks %q, want one like %q", labels, w)
					}
				}
				// Kept work ends at the survivor's step 24 (18.887596 s),
				// the kill at 19.231955436 s: 0.344 s recomputed.
				want := (344359436 * time.Nanosecond).Seconds()
				if got := r0.PhasesS[Recompute]; got < want-1e-6 || got > want+1e-6 {
					t.Errorf("round 0 recompute %.6f s, want %.6f (from the healed step's end to the kill)", got, want)
				}
			}
		})
	}
}
