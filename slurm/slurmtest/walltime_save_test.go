package slurmtest

import (
	"context"
	"fmt"
	"github.com/ftlauncher/ft-launcher/internal/testworkers"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestWalltimeSIGTERMsLetRanksSave: a job reaching its time
// limit (-t 1, the shortest Slurm has; slurmctld notices it within its
// 30 s check, so about 80-90 s) gets Slurm's SIGTERMs, more than one and a
// few ms apart; ft-launcher must not take the repeat as a request to
// SIGKILL, so ranks whose SIGTERM handler needs 2 s save complete
// checkpoints within the cluster's KillWait (5 s) and nothing is left.
func TestWalltimeSIGTERMsLetRanksSave(t *testing.T) {
	skipShort(t)
	t.Parallel() // waits out a one-minute time limit: beside the other walltime tests, after the sequential ones
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
	if err := os.WriteFile(py, []byte(testworkers.SlowSaver), 0o644); err != nil {
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
		if err := testworkers.SlowSaverCheckpoint(out, r); err != nil {
			t.Errorf("at the time limit: %v", err)
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

// TestChainWalltimeLetsRanksSave is TestWalltimeSIGTERMsLetRanksSave under
// ft-resumer's generated wrapper, as users run it: at the time limit the
// batch shell, `ft-resumer step run`, srun and the launcher all get
// Slurm's SIGTERM, and the wrapper forwards it once more to the job
// script's processes. The ranks' 2 s save must still complete, and the job
// is judged walltime (not counted).
func TestChainWalltimeLetsRanksSave(t *testing.T) {
	skipShort(t)
	t.Parallel() // waits out a one-minute time limit: beside the other walltime tests, after the sequential ones
	c := need(t)
	testenv.Require(t, testenv.SystemPython)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	out := filepath.Join(work, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(work, "saver.py")
	if err := os.WriteFile(py, []byte(testworkers.SlowSaver), 0o644); err != nil {
		t.Fatal(err)
	}
	script := ch.script(fmt.Sprintf(`#SBATCH -N1 -t 1
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
srun ft-resumer node -- ft-launcher --nproc-per-node 2 --term-timeout 60 --no-python /usr/bin/python3 %s %s
`, py, out))
	code, stdout, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "0", script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s\n%s", code, stdout, errOut, ch.logs())
	}
	for r := 0; r < 2; r++ {
		if _, err := os.Stat(filepath.Join(out, fmt.Sprintf("ready%d", r))); err != nil {
			t.Fatalf("rank %d never ran: %v\n%s", r, err, ch.logs())
		}
		if err := testworkers.SlowSaverCheckpoint(out, r); err != nil {
			t.Errorf("at the time limit under the chain's wrapper: %v", err)
		}
	}
	v := ch.status(ctx)
	if got := outcomes(v); len(got) < 2 || got[0] != "walltime" || got[1] != "finished" {
		t.Errorf("outcomes %v, want walltime then finished", got)
	}
	logs := ch.logs()
	if strings.Contains(logs, "sending SIGKILL now") {
		t.Errorf("the launcher escalated a time-limit SIGTERM to SIGKILL")
	}
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "taken as a repeat delivery") || strings.Contains(l, "forwarding SIG") || strings.Contains(l, "after SIGTERM") {
			t.Logf("job output: %s", l)
		}
	}
	if t.Failed() {
		t.Logf("job output:\n%s", logs)
	}
}

// graceRank records when its first SIGTERM came and then, never exiting,
// the time every 20 ms: the last record is when Slurm's SIGKILL ended it.
const graceRank = `import os, signal, sys, time
out, r = sys.argv[1], os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))
term = []
def on_term(s, f):
    if not term:
        term.append(time.time())
signal.signal(signal.SIGTERM, on_term)
open(os.path.join(out, "ready" + r), "w").close()
while True:
    time.sleep(0.02)
    if term:
        with open(os.path.join(out, "last%s.tmp" % r), "w") as f:
            f.write("%.6f %.6f" % (term[0], time.time()))
        os.replace(os.path.join(out, "last%s.tmp" % r), os.path.join(out, "last" + r))
`

// TestMeasureWalltimeGrace measures (FT_RESUMER_BENCH=1) the time a rank
// has between Slurm's first SIGTERM at the time limit and its SIGKILL: a
// rank under ft-launcher in an ft-resumer chain, and the same rank under a
// NeMo-style plain `srun python3`, in two -t 1 jobs at once. Both should
// have the whole KillWait (5 s on this cluster). It asserts no speed.
func TestMeasureWalltimeGrace(t *testing.T) {
	skipShort(t)
	if os.Getenv("FT_RESUMER_BENCH") == "" {
		// Not an environment skip: an opt-in measurement.
		t.Skip("opt-in measurement: set FT_RESUMER_BENCH=1 to measure")
	}
	c := need(t)
	testenv.Require(t, testenv.SystemPython)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	py := filepath.Join(work, "grace.py")
	if err := os.WriteFile(py, []byte(graceRank), 0o644); err != nil {
		t.Fatal(err)
	}
	outFT, outNeMo := filepath.Join(work, "ft"), filepath.Join(work, "nemo")
	for _, d := range []string{outFT, outNeMo} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := ch.script(fmt.Sprintf(`#SBATCH -N1 -t 1
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
srun ft-resumer node -- ft-launcher --nproc-per-node 2 --no-python /usr/bin/python3 %s %s
`, py, outFT))
	j := newLaunchJob(t, c)
	j.args = []string{"-t", "1", "--ntasks-per-node", "2"}
	nemoDone := make(chan struct{})
	go func() {
		defer close(nemoDone)
		j.submit(ctx, 1, fmt.Sprintf("srun /usr/bin/python3 %s %s", py, outNeMo), "TIMEOUT")
	}()
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, script)
	<-nemoDone
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	for _, d := range []struct{ name, dir string }{{"ft-launcher in an ft-resumer chain", outFT}, {"NeMo-style srun python3", outNeMo}} {
		for r := 0; r < 2; r++ {
			b, err := os.ReadFile(filepath.Join(d.dir, fmt.Sprintf("last%d", r)))
			if err != nil {
				t.Errorf("%s rank %d: no record after SIGTERM: %v", d.name, r, err)
				continue
			}
			var term, last float64
			if _, err := fmt.Sscan(string(b), &term, &last); err != nil {
				t.Errorf("%s rank %d: %q", d.name, r, b)
				continue
			}
			t.Logf("%s, rank %d: %.2f s from the first SIGTERM to the SIGKILL (KillWait 5 s)", d.name, r, last-term)
		}
	}
}
