package slurmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// slowSaver is a rank whose SIGTERM handler needs 2 s before it writes its
// checkpoint (1 MiB and an END line, to a temporary file, fsynced and
// renamed: complete or absent) and exits 0. It ignores further SIGTERMs, as
// a careful training script does: at a time limit slurmstepd signals every
// process of the step, the ranks included, and more than once.
const slowSaver = `import os, signal, sys, time
out, rank = sys.argv[1], os.environ["RANK"]
def save(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    t0 = time.monotonic()
    time.sleep(2)
    path = os.path.join(out, "ckpt%s.bin" % rank)
    with open(path + ".tmp", "wb") as f:
        f.write(b"x" * (1 << 20) + b"END\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    print("rank %s saved %.2f s after SIGTERM" % (rank, time.monotonic() - t0), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
open(os.path.join(out, "ready%s" % rank), "w").close()
while True:
    time.sleep(0.05)
`

// TestWalltimeSIGTERMsLetRanksSave (issue 27): a job reaching its time
// limit (-t 1, the shortest Slurm has; slurmctld notices it within its
// 30 s check, so about 80-90 s) gets Slurm's SIGTERMs, more than one and a
// few ms apart; ft-launcher must not take the repeat as a request to
// SIGKILL, so ranks whose SIGTERM handler needs 2 s save complete
// checkpoints within the cluster's KillWait (5 s) and nothing is left.
func TestWalltimeSIGTERMsLetRanksSave(t *testing.T) {
	c := need(t)
	testenv.Require(t, testenv.SystemPython)
	ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	out := filepath.Join(j.work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(j.work, "saver.py")
	if err := os.WriteFile(py, []byte(slowSaver), 0o644); err != nil {
		t.Fatal(err)
	}
	j.args = []string{"-t", "1"}
	start := time.Now()
	id, job := j.submit(ctx, 1, fmt.Sprintf("srun ft-launcher --nproc-per-node 2 --term-timeout 60 --no-python /usr/bin/python3 %s %s", py, out), "TIMEOUT")
	t.Logf("job %s ended %s (%d:%d) %s after submission", id, job.State, job.ExitCode, job.Signal, time.Since(start).Round(time.Second))
	for r := 0; r < 2; r++ {
		if _, err := os.Stat(filepath.Join(out, fmt.Sprintf("ready%d", r))); err != nil {
			t.Fatalf("rank %d never ran: %v\n%s", r, err, j.logs())
		}
		b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("ckpt%d.bin", r)))
		if err != nil {
			t.Errorf("rank %d did not save at the time limit: %v", r, err)
			continue
		}
		if len(b) != 1<<20+4 || string(b[len(b)-4:]) != "END\n" {
			t.Errorf("rank %d's checkpoint is incomplete: %d bytes", r, len(b))
		}
	}
	logs := j.output()
	if strings.Contains(logs, "sending SIGKILL now") {
		t.Errorf("the launcher escalated a time-limit SIGTERM to SIGKILL:\n%s", j.logs())
	}
	// How many SIGTERMs the launcher saw (the repeat is Slurm's doing and
	// not guaranteed on every version): for the record.
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "taken as a repeat delivery") || strings.Contains(l, "saved") && strings.Contains(l, "after SIGTERM") {
			t.Logf("job output: %s", l)
		}
	}
	if t.Failed() {
		t.Logf("job output:\n%s", j.logs())
	}
}
