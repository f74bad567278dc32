package slurmtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestClusterRunsJobsOnEveryNode(t *testing.T) {
	skipShort(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, "", Options{})
	if errors.Is(err, ErrUnavailable) {
		testenv.Missing(t, testenv.Slurm, err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	out, err := c.Run(ctx, "srun", "-N3", "--ntasks-per-node=1", "-l", "sh", "-c", `echo "$SLURMD_NODENAME $SLURM_PROCID"`)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"n1 0", "n2 1", "n3 2"} {
		if !strings.Contains(out, want) {
			t.Errorf("srun -N3 output %q lacks %q", out, want)
		}
	}
}
