package report

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestStateRestoreFromBuddy: a restore whose state a buddy's copy put into
// the segment (state_restore with source "buddy", as the launcher's store
// records a spare's first load after a node loss) reads as "buddy" in the
// state account, the round's restore sources, the rank's mark and the
// page, beside the other rank's restore from memory.
func TestStateRestoreFromBuddy(t *testing.T) {
	r, err := Build(Inputs{EventLogs: []string{"testdata/state_buddy.jsonl"}})
	if err != nil {
		t.Fatal(err)
	}
	if r.State == nil || fmt.Sprint(r.State.Restores) != fmt.Sprint(map[string]int{"buddy": 1, "memory": 1}) {
		t.Fatalf("state account %+v, want one restore from a buddy and one from memory", r.State)
	}
	i := slices.IndexFunc(r.Rounds, func(rd Round) bool { return rd.Round == 1 })
	if i < 0 || r.Rounds[i].RestoreSources() != "buddy ×1, memory ×1" {
		t.Fatalf("rounds %+v, want round 1 restored from buddy ×1, memory ×1", r.Rounds)
	}
	for _, x := range r.Rounds[i].Restores {
		if want := map[int]string{0: "memory", 1: "buddy"}[x.Rank]; x.Source != want {
			t.Errorf("rank %d restored from %s, want %s", x.Rank, x.Source, want)
		}
	}
	lane := slices.IndexFunc(r.Ranks, func(l Lane) bool { return l.Name == "rank 1" })
	if lane < 0 || !slices.ContainsFunc(r.Ranks[lane].Marks, func(m Mark) bool {
		return m.Kind == "restore" && strings.Contains(m.Label, "restored step 8 from buddy")
	}) {
		t.Errorf("rank 1 has no mark of its restore from a buddy: %+v", r.Ranks)
	}
	var h bytes.Buffer
	if err := r.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<td>buddy ×1, memory ×1</td>", "buddy ×1 memory ×1"} {
		if !strings.Contains(h.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}
