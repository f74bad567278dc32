package slurmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
)

// benchRank is the rank of the fault measurements: it stamps
// "train <job> <procid> <time>" when it starts; in the job that gets the
// fault (before WORK/faulted exists) it records "<launcher pid> <node>" in
// WORK/launcher-<procid> and sleeps; afterwards it finishes the training.
func benchRank(t *testing.T, work string) string {
	return rankScript(t, work, "rank.sh", fmt.Sprintf(`echo "train $SLURM_JOB_ID $SLURM_PROCID $(date +%%s.%%N)" >> %[1]s/stamps
if [ -e %[1]s/faulted ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
echo "$PPID $SLURMD_NODENAME" > %[1]s/launcher-$SLURM_PROCID.tmp
mv %[1]s/launcher-$SLURM_PROCID.tmp %[1]s/launcher-$SLURM_PROCID
exec sleep 300
`, work))
}

// benchLaunch is the launch line, with a rendezvous port per job (a fresh
// one each job; not 29400, which another test binary's cluster may use).
func benchLaunch(srun, rank string, base int) string {
	return fmt.Sprintf(`head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
port=$((%d + SLURM_JOB_ID %% 500))
%s ft-launcher --nproc-per-node 1 --no-python --max-restarts 3 --rdzv-endpoint "$head:$port" %s`, base, srun, rank)
}

// injectFault waits for job 0's ranks and injects the fault on the node of
// procid 1 (which does not host the rendezvous): "launcher" SIGKILLs its
// launcher (the node stays up), "node" marks the node DOWN (Slurm ends the
// job NODE_FAIL and kills its processes, as when a node dies). It returns
// when the fault happened and a function that undoes it.
func injectFault(ctx context.Context, t *testing.T, c *Cluster, work, fault string) (time.Time, func()) {
	t.Helper()
	var pid int
	var node string
	waitFor(t, 2*time.Minute, "job 0's ranks", func() bool {
		_, err0 := os.Stat(filepath.Join(work, "launcher-0"))
		b, err1 := os.ReadFile(filepath.Join(work, "launcher-1"))
		f := strings.Fields(string(b))
		if err0 != nil || err1 != nil || len(f) != 2 {
			return false
		}
		pid, _ = strconv.Atoi(f[0])
		node = f[1]
		return true
	})
	if t.Failed() {
		t.FailNow()
	}
	if err := os.WriteFile(filepath.Join(work, "faulted"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	switch fault {
	case "launcher":
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		return time.Now(), func() {}
	case "node":
		at := time.Now()
		if _, err := c.Run(ctx, "scontrol", "update", "NodeName="+node, "State=DOWN", "Reason=ft-resumer fault bench"); err != nil {
			t.Fatal(err)
		}
		return at, func() {
			_, _ = c.Run(context.Background(), "scontrol", "update", "NodeName="+node, "State=RESUME")
			waitFor(t, time.Minute, "node "+node+" back", func() bool {
				out, _ := c.Run(context.Background(), "sinfo", "-h", "-n", node, "-o", "%t")
				return strings.HasPrefix(out, "idle")
			})
		}
	}
	t.Fatalf("unknown fault %q", fault)
	return time.Time{}, nil
}

// trainingAgain is when every rank of the first job that started after at
// was running (from WORK/stamps).
func trainingAgain(t *testing.T, work string, at time.Time) (float64, bool) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(work, "stamps"))
	if err != nil {
		return 0, false
	}
	byJob := map[string][]float64{}
	var order []string
	t0 := float64(at.UnixNano()) / 1e9
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		ts, err := strconv.ParseFloat(f[3], 64)
		if err != nil || ts < t0 {
			continue
		}
		if _, ok := byJob[f[1]]; !ok {
			order = append(order, f[1])
		}
		byJob[f[1]] = append(byJob[f[1]], ts)
	}
	if len(order) == 0 || len(byJob[order[0]]) < 2 {
		return 0, false
	}
	s := byJob[order[0]]
	sort.Float64s(s)
	return s[len(s)-1] - t0, true
}

// TestMeasureFaultToTraining measures (FT_RESUMER_BENCH=1), on this
// cluster, the time from a fault in a 2-node job with no spare to the
// successor job's ranks running, for ft-resumer (the documented line:
// srun --kill-on-bad-exit=0 ft-resumer node -- ft-launcher) and for a
// hand-written NeMo-Framework-Launcher-style afterany loop (srun
// --kill-on-bad-exit=1 ft-launcher), each fault a few times: a node death
// (the node marked DOWN: Slurm ends the job NODE_FAIL) and a launcher-only
// death (SIGKILL, the node stays up). It asserts no speed.
func TestMeasureFaultToTraining(t *testing.T) {
	skipShort(t)
	if os.Getenv("FT_RESUMER_BENCH") == "" {
		// Not an environment skip: an opt-in measurement.
		t.Skip("opt-in measurement: set FT_RESUMER_BENCH=1 to measure")
	}
	c := need(t)
	runs := 3
	if n, err := strconv.Atoi(os.Getenv("FT_RESUMER_BENCH_RUNS")); err == nil && n > 0 {
		runs = n
	}
	ports, err := freePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	base := 20000 + ports[0]%20000
	results := map[string][]float64{}
	var keys []string
	for _, fault := range []string{"node", "launcher"} {
		for _, loop := range []string{"ft-resumer", "hand-afterany"} {
			key := fault + " death, " + loop
			keys = append(keys, key)
			for i := 0; i < runs; i++ {
				t.Run(fmt.Sprintf("%s/%s/%d", fault, loop, i), func(t *testing.T) {
					ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
					defer cancel()
					var took float64
					if loop == "ft-resumer" {
						took = benchChain(ctx, t, c, fault, base)
					} else {
						took = benchHandLoop(ctx, t, c, fault, base)
					}
					results[key] = append(results[key], took)
					t.Logf("%s: fault -> successor's ranks running %.2f s", key, took)
				})
			}
		}
	}
	for _, k := range keys {
		xs := append([]float64{}, results[k]...)
		sort.Float64s(xs)
		if len(xs) == 0 {
			continue
		}
		t.Logf("%-32s runs %d  median %.2f s  worst %.2f s  all %s", k, len(xs), xs[len(xs)/2], xs[len(xs)-1], fmtList(results[k]))
	}
}

func benchChain(ctx context.Context, t *testing.T, c *Cluster, fault string, base int) float64 {
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	rank := benchRank(t, work)
	script := ch.script("#SBATCH -N2\n" + benchLaunch("srun --kill-on-bad-exit=0 ft-resumer node --", rank, base) + "\n")
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, "--exclusion-expiry", "1h", script)
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	at, undo := injectFault(ctx, t, c, work, fault)
	defer undo()
	ch.waitRun(ctx, cmd, out)
	took, ok := trainingAgain(t, work, at)
	if !ok {
		t.Fatalf("no successor trained\n%s", ch.logs())
	}
	t.Logf("chain outcomes %v", outcomes(ch.status(ctx)))
	return took
}

func benchHandLoop(ctx context.Context, t *testing.T, c *Cluster, fault string, base int) float64 {
	work := t.TempDir()
	name := fmt.Sprintf("hand-%d", time.Now().UnixNano())
	rank := benchRank(t, work)
	flag := filepath.Join(work, "_finished_flag")
	// NeMo-Framework-Launcher's loop, by hand (as in
	// TestMeasureDecisionLatency), on 2 nodes with the launcher under srun.
	body := fmt.Sprintf(`#!/bin/bash
#SBATCH -N2 -o %[1]s/slurm-%%j.out -J %[2]s
export FAULT_TOL_FINISHED_FLAG_FILE=%[3]s
R=%[1]s/_job_results
if [ -n "$FT_RESUMED" ]; then
  [ -f "$FAULT_TOL_FINISHED_FLAG_FILE" ] && exit 0
  [ "$(tail -n 10 $R | grep -c ' [XF]$')" -ge 10 ] && exit 1
fi
NEXT=$(FT_RESUMED=1 sbatch --parsable --dependency=afterany:$SLURM_JOB_ID %[1]s/job.sh)
echo "$SLURM_JOB_ID X" >> $R
%[4]s
rc=$?
if [ $rc -eq 0 ]; then sed -i "s/^$SLURM_JOB_ID X$/$SLURM_JOB_ID S/" $R; else sed -i "s/^$SLURM_JOB_ID X$/$SLURM_JOB_ID F/" $R; fi
if [ -f "$FAULT_TOL_FINISHED_FLAG_FILE" ]; then scancel $NEXT; exit 0; fi
exit $rc
`, work, name, flag, benchLaunch("srun --kill-on-bad-exit=1", rank, base))
	if err := os.WriteFile(filepath.Join(work, "job.sh"), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	marker := "TEST_CHAIN_MARKER=" + name
	t.Cleanup(func() {
		_, _ = c.Run(context.Background(), "scancel", "-n", name)
		waitFor(t, 90*time.Second, "the hand loop's jobs to leave Slurm", func() bool {
			out, _ := c.Run(context.Background(), "squeue", "-h", "-n", name, "-o", "%A")
			return out == ""
		})
		waitFor(t, 30*time.Second, "no process of the hand loop's jobs", func() bool { return len(ProcessesWithEnv(marker)) == 0 })
	})
	cmd := c.Command(ctx, "sbatch", "--parsable", filepath.Join(work, "job.sh"))
	cmd.Env = append(cmd.Env, marker, "PATH="+binDir+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sbatch: %v %s", err, out)
	}
	at, undo := injectFault(ctx, t, c, work, fault)
	defer undo()
	// The first rank to finish writes the flag; its peer may not have
	// stamped its start yet.
	var took float64
	waitFor(t, 3*time.Minute, "the hand loop's successor to train", func() bool {
		var ok bool
		took, ok = trainingAgain(t, work, at)
		return ok
	})
	if t.Failed() {
		t.FailNow()
	}
	waitFor(t, time.Minute, "the hand loop to finish", func() bool {
		_, err := os.Stat(flag)
		return err == nil
	})
	return took
}
