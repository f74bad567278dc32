package resumer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestVerdictLostIsNoVerdict: a launcher that could not write its verdict
// removed the old one or, where it could not, emptied it; ft-resumer reads
// an empty file as no verdict, and judges the job from the script's exit
// status (73, ExitVerdictLost): a failure, not the earlier run's outcome.
func TestVerdictLostIsNoVerdict(t *testing.T) {
	dir := t.TempDir()
	if err := verdict.Write(filepath.Join(dir, "verdict-n1.json"), verdict.Verdict{Kind: verdict.RestartBudgetExhausted, ExitCode: 1}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "verdict-n2.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	nvs := readVerdicts(dir)
	if len(nvs) != 1 || nvs[0].node != "n1" {
		t.Fatalf("read %+v, want n1's verdict only", nvs)
	}

	code := 73 // configs.ExitVerdictLost (configs imports this package)
	j := Judge(Facts{Began: true, ScriptRC: &code})
	if j.Outcome != Failure || j.Defer {
		t.Errorf("judged %+v, want a failure", j)
	}
}
