package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestVerdictProgressAndRankFailures runs the real launcher with ranks
// using the Python client (client/python): step sections carrying the
// iteration, a checkpoint section, and rank 1 exiting with code 3 inside
// the step of iteration 7 in each of the two cycles. The verdict's progress
// sums both cycles and both ranks; its rank_failures name the crash twice,
// with the rank's steps and iteration, as the outer loop needs them to
// recognise the same crash.
func TestVerdictProgressAndRankFailures(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	worker, _ := filepath.Abs("testdata/progress_worker.py")
	markers := filepath.Join(j.dir, "markers")
	if err := os.Mkdir(markers, 0o755); err != nil {
		t.Fatal(err)
	}
	vpath := filepath.Join(j.dir, "verdict.json")
	code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--max-restarts", "1", "--verdict-file", vpath, "--ft-rank-heartbeat-timeout", "60",
		worker, "1", "7", markers)
	if code != 1 {
		t.Fatalf("exit %d, want 1 (restart budget exhausted)\n%s", code, j.stderr.String())
	}
	v, err := verdict.Read(vpath)
	if err != nil {
		t.Fatal(err)
	}
	if v.Kind != verdict.RestartBudgetExhausted {
		t.Fatalf("verdict kind %q, want %q: %s", v.Kind, verdict.RestartBudgetExhausted, v.Reason)
	}
	p := v.Progress
	if p == nil {
		t.Fatal("verdict without progress, although the ranks reported steps")
	}
	// Per cycle: rank 0 opens 10 steps and checkpoints once, rank 1 opens
	// 8 (iterations 0..7) and checkpoints once.
	if p.Steps != 36 || p.Checkpoints != 4 {
		t.Errorf("progress %+v: want 36 steps and 4 checkpoints over 2 cycles", *p)
	}
	if p.Heartbeats < 36 {
		t.Errorf("progress %+v: want at least 36 heartbeats (one per step)", *p)
	}
	if p.FirstIteration == nil || *p.FirstIteration != 0 || p.LastIteration == nil || *p.LastIteration != 9 {
		t.Errorf("progress iterations %v..%v, want 0..9", p.FirstIteration, p.LastIteration)
	}
	if p.LastStepAt.Before(v.StartedAt) || p.LastStepAt.After(v.EndedAt) {
		t.Errorf("last step at %v, outside the run %v..%v", p.LastStepAt, v.StartedAt, v.EndedAt)
	}
	if len(v.RankFailures) != 2 {
		t.Fatalf("rank failures %+v, want 2 (rank 1 in each cycle)", v.RankFailures)
	}
	for i, f := range v.RankFailures {
		if f.Round != i || f.Rank != 1 || f.LocalRank != 1 || f.ExitCode != 3 || f.Signal != "" ||
			f.Kind != verdict.FailureCrash || f.Steps != 8 || f.Iteration == nil || *f.Iteration != 7 {
			it := "nil"
			if f.Iteration != nil {
				it = fmt.Sprint(*f.Iteration)
			}
			t.Errorf("rank failure %d = %+v (iteration %s), want round %d, rank 1, exit 3, 8 steps, iteration 7", i, f, it, i)
		}
	}
}
