package resumer

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestTrainingClaimIsExclusive: while one run holds the training claim,
// another cannot take it (here Slurm cannot be asked about the holder, so
// the second waits its bound and is refused naming the holder); once the
// holder releases it, the claim is free. flock conflicts between open file
// descriptions, so one process shows what two jobs do.
func TestTrainingClaimIsExclusive(t *testing.T) {
	dir := t.TempDir()
	r := &Resumer{Dir: dir, Sched: Scheduler{Env: []string{"PATH=" + t.TempDir()}}} // no Slurm command to ask
	ctx := context.Background()
	a, err := r.ClaimTraining(ctx, "41", 1, "n1", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if c := readClaim(dir); c.Job != "41" || c.Restart != 1 || c.Node != "n1" || c.PID != os.Getpid() {
		t.Errorf("claim record %+v, want job 41 run 1 on n1 by this process", c)
	}
	start := time.Now()
	_, err = r.ClaimTraining(ctx, "42", 0, "n2", 300*time.Millisecond)
	var ce *ClaimedError
	if !errors.As(err, &ce) || ce.Holder.Job != "41" {
		t.Fatalf("second claim: %v, want a ClaimedError naming job 41", err)
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("refused after %v, before its wait", waited)
	}
	if want := "another job of this chain is training: job 41 (requeued run 1) on n1 since "; len(ce.Error()) < len(want) || ce.Error()[:len(want)] != want {
		t.Errorf("refusal %q, want it to start %q", ce.Error(), want)
	}
	a.Release()
	b, err := r.ClaimTraining(ctx, "42", 0, "n2", time.Second)
	if err != nil {
		t.Fatalf("claim after release: %v", err)
	}
	defer b.Release()
	if c := readClaim(dir); c.Job != "42" {
		t.Errorf("claim record names job %s, want 42", c.Job)
	}
	if _, err := os.Stat(filepath.Join(dir, TrainingLockFile)); err != nil {
		t.Error(err)
	}
}
