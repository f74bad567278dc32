package report

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestMistypedFieldIsAWarning: a line whose fields do not fit its kind's
// typed record (eventlog.Decode's RecordError) leaves the report without
// what it would have shown, and says so; the rest of the run is accounted
// as before.
func TestMistypedFieldIsAWarning(t *testing.T) {
	good, err := os.ReadFile("testdata/crash.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "events.jsonl")
	bad := `{"event":"rank_checkpoint","node":"n1","rank":"zero","round":0,"run_id":"r1","ts":"2026-01-01T00:00:20Z"}` + "\n"
	if err := os.WriteFile(path, append(good, bad...), 0o644); err != nil {
		t.Fatal(err)
	}
	want, err := Build(Inputs{EventLogs: []string{"testdata/crash.jsonl"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Build(Inputs{EventLogs: []string{path}})
	if err != nil {
		t.Fatal(err)
	}
	n := strings.Count(string(good), "\n") + 1
	if len(got.Warnings) != 1 || !strings.Contains(got.Warnings[0], path) || !strings.Contains(got.Warnings[0], fmt.Sprintf("line %d: rank_checkpoint record", n)) {
		t.Errorf("warnings %q, want one naming %s line %d and the kind", got.Warnings, path, n)
	}
	for p, s := range want.PhasesS {
		if got.PhasesS[p] != s {
			t.Errorf("phase %s = %v with the mistyped line, %v without", p, got.PhasesS[p], s)
		}
	}
}
