package slurmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// These tests try the chain on the real cluster: what a Slurm user
// does (a script that never trains, --signal=B:USR1@N, the same crash in
// every job, ft-resumer cancel, a spare absorbing a node loss) and what
// the chain must make of it.

// TestExitZeroWithoutTrainingStopsTheChain: a batch script that never
// trains (`srun ... || true` around a launcher that cannot start its rank)
// exits 0 every time. Each such job is no_progress, which counts: the
// chain stops after max_subsequent_job_failures+1 of them instead of
// looping.
func TestExitZeroWithoutTrainingStopsTheChain(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	script := ch.script("#SBATCH -N1\n" + launch("/nonexistent/train.sh") + " || true\n")
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "1", script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1 (stopped)\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	var ran []string
	for _, j := range v.Jobs {
		if j.Outcome.Ran() {
			ran = append(ran, string(j.Outcome))
			if !j.Counted || !strings.Contains(j.Reason, "without evidence of progress") {
				t.Errorf("job %s: counted %v, reason %q; want counted, and the reason to say no evidence of progress", j.ID, j.Counted, j.Reason)
			}
		}
	}
	if !slices.Equal(ran, []string{"no_progress", "no_progress"}) {
		t.Errorf("jobs that ran: %v, want two no_progress", ran)
	}
	if v.Status != resumer.Stopped || v.StopKind != resumer.StopFailures || v.FailuresTotal != 2 {
		t.Errorf("chain %s [%s] with %d failures (%s); want stopped [%s] with 2", v.Status, v.StopKind, v.FailuresTotal, v.StopReason, resumer.StopFailures)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs left after the chain stopped: %v", live)
	}
}

// TestProgressPathIsEvidence: an uninstrumented job that stops by itself
// after writing a checkpoint under --progress-path made progress: success,
// which resets the count, and the chain goes on to finish.
func TestProgressPathIsEvidence(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	ckpt := filepath.Join(filepath.Dir(ch.dir), "ckpt")
	if err := os.Mkdir(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
if [ "$FT_RESUMER_JOB_INDEX" = 0 ]; then sleep 1; echo 10 > %[1]s/step-10; exit 0; fi
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`, ckpt))
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "0", "--progress-path", ckpt, script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"success", "finished", "never_ran"}) {
		t.Fatalf("outcomes %v, want [success finished never_ran]", got)
	}
	if j := v.Jobs[0]; j.Progress != "yes" || !strings.Contains(j.Reason, "step-10") {
		t.Errorf("job 1: progress %q, reason %q; want yes, naming the checkpoint", j.Progress, j.Reason)
	}
	if !strings.Contains(out, "chain done: training finished (2 jobs trained)") {
		t.Errorf("run's last line does not count the jobs that trained:\n%s", out)
	}
}

// TestCompleteWithoutFlagStopsAtOnce: a training that completes but never
// writes the finished flag: the first job trains (a checkpoint under
// --progress-path) and exits 0, the second finds nothing left to do and
// exits 0 at once. That second job is told apart from "no progress": the
// reason says the training seems complete without the flag and what to do,
// and the chain stops there instead of running
// max_subsequent_job_failures more jobs that would do the same.
func TestCompleteWithoutFlagStopsAtOnce(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	ckpt := filepath.Join(filepath.Dir(ch.dir), "ckpt")
	if err := os.Mkdir(ckpt, 0o755); err != nil {
		t.Fatal(err)
	}
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
if [ -f %[1]s/step-960 ]; then echo "nothing left to train"; exit 0; fi
sleep 1; echo 960 > %[1]s/step-960
`, ckpt))
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "3", "--progress-path", ckpt, script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1 (stopped)\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	if got := ranOutcomes(v); !slices.Equal(got, []string{"success", "no_progress"}) {
		t.Fatalf("jobs that trained: %v, want [success no_progress] (then stop, not 3 more)", got)
	}
	if v.StopKind != resumer.StopCompleteNoFlag || !strings.Contains(v.StopReason, "seems complete but wrote no finished flag") ||
		!strings.Contains(v.StopReason, "FAULT_TOL_FINISHED_FLAG_FILE") || strings.Contains(v.StopReason, "instrument the ranks") {
		t.Errorf("chain %s [%s]: %s; want stopped [%s] saying the training seems complete and naming the flag", v.Status, v.StopKind, v.StopReason, resumer.StopCompleteNoFlag)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs left after the chain stopped: %v", live)
	}
}

// TestWarningSignal: Slurm's warning before the time limit, both ways
// docs/slurm.md shows. --signal=USR1@N signals the job steps: the
// launcher gets it directly. --signal=B:USR1@N signals only the batch
// shell: the generated wrapper must survive it, pass it to the job script
// (whose own trap runs, the NeMo habit) and through srun to the launcher.
// Either way the launcher tells the rank, the rank saves and exits, the job
// ends before its limit and is judged walltime-like: not a failure.
//
// The limit is 3 minutes, the warning 100 s before it: Slurm may send a
// warning up to 60 s early (sbatch(1), --signal; slurmctld checks every
// 30 s), so it comes 20-80 s after the job starts, never before srun has
// started the job step. With 2 minutes it could come as the job started:
// beside the walltime tests (five jobs starting at once, load average 15)
// "to the job steps" once ran into its limit with the warning never seen,
// most likely sent before the step existed. The cases wait for it with
// their ranks asleep, so they and the test are parallel: they run beside
// the walltime tests, after the sequential tests, each its own chain,
// directory and Slurm job.
func TestWarningSignal(t *testing.T) {
	skipShort(t)
	t.Parallel()
	c := need(t)
	for _, tt := range []struct{ name, signal, recorded string }{
		{"to the batch shell", "B:USR1@100", "USR1"},
		{"to the job steps", "USR1@100", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := runclock.WithTimeout(context.Background(), 6*time.Minute)
			defer cancel()
			ch := newChain(t, c)
			work := filepath.Dir(ch.dir)
			rank := rankScript(t, work, "rank.sh", fmt.Sprintf(`trap 'echo saved > %[1]s/saved; exit 0' USR1
touch %[1]s/rank-started
while :; do sleep 0.1; done
`, work))
			script := ch.script(fmt.Sprintf(`#SBATCH -N1 -t 3 --signal=%[3]s
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
trap 'echo trapped > %[1]s/script-trapped' USR1
%[2]s
`, work, launch(rank), tt.signal))
			code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "0", script)
			if code != 0 {
				t.Fatalf("ft-resumer run = %d\n%s\n%s\n%s", code, out, errOut, ch.logs())
			}
			v := ch.status(ctx)
			if got := outcomes(v); !slices.Equal(got, []string{"walltime", "finished", "never_ran"}) {
				t.Fatalf("outcomes %v, want [walltime finished never_ran]", got)
			}
			j := v.Jobs[0]
			if j.Counted || j.WarningSignal != tt.recorded || !strings.Contains(j.Reason, "warning signal") || v.FailuresTotal != 0 {
				t.Errorf("job 1: counted %v, warning %q, reason %q, failures %d; want not counted, warning %q, the reason naming it", j.Counted, j.WarningSignal, j.Reason, v.FailuresTotal, tt.recorded)
			}
			if j.SlurmState == "TIMEOUT" {
				t.Errorf("job 1 ran into its time limit: the warning did not reach the rank")
			}
			if got := strings.TrimSpace(readFile(t, filepath.Join(work, "saved"))); got != "saved" {
				t.Errorf("the rank did not save on the warning: %q", got)
			}
			// Only the batch shell's warning reaches the script itself.
			_, err := os.Stat(filepath.Join(work, "script-trapped"))
			if trapped := err == nil; trapped != (tt.recorded != "") {
				t.Errorf("the job script's own USR1 trap ran: %v, want %v", trapped, tt.recorded != "")
			}
			if len(j.Verdicts) != 1 || j.Verdicts[0].Kind != "walltime" {
				t.Errorf("job 1 verdicts %+v, want the launcher's walltime verdict", j.Verdicts)
			}
		})
	}
}

// TestSameCrashStopsTheChainEarly: rank 1 crashes with exit code 3 at its
// fifth step in every job. The chain recognises the same failure and stops
// with deterministic_failure after three occurrences in three jobs,
// although max_subsequent_job_failures would allow six jobs.
func TestSameCrashStopsTheChainEarly(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	train := filepath.Join(work, "train.py")
	if err := os.WriteFile(train, []byte(`import os, sys, time
from ft_launcher_client import RankMonitorClient
c = RankMonitorClient()
c.init_workload_monitoring(iteration=0)
rank = int(os.environ["RANK"])
for step in range(1, 30):
    c.start_section("step", iteration=step)
    time.sleep(0.05)
    if rank == 1 and step == 5:
        print("rank 1: bad batch at step 5", flush=True)
        os._exit(3)
    c.end_section("step")
c.shutdown_workload_monitoring()
`), 0o644); err != nil {
		t.Fatal(err)
	}
	script := ch.script("#SBATCH -N1\nsrun --kill-on-bad-exit=0 ft-resumer node -- ft-launcher --standalone --nproc-per-node 2 --max-restarts 0 " + train + "\n")
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "5", script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1 (stopped)\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	ran := ranOutcomes(v)
	if !slices.Equal(ran, []string{"failure", "failure", "failure"}) {
		t.Errorf("jobs that ran: %v, want three failures, then the stop", ran)
	}
	if v.StopKind != resumer.StopDeterministic || !strings.Contains(v.StopReason, "rank 1 exited with code 3") || !strings.Contains(v.StopReason, "3 consecutive jobs") {
		t.Errorf("chain %s [%s]: %q; want deterministic_failure naming rank 1, exit code 3 and 3 jobs", v.Status, v.StopKind, v.StopReason)
	}
	if j := v.Jobs[0]; len(j.RankFailures) == 0 || j.RankFailures[0].Rank != 1 || j.RankFailures[0].ExitCode != 3 {
		t.Errorf("job 1 rank failures %+v, want rank 1 exit 3", j.RankFailures)
	}
	if !strings.Contains(out, "chain stopped: deterministic failure") {
		t.Errorf("run output does not say why the chain stopped:\n%s", out)
	}
}

// TestCancelIsNotAFailure: ft-resumer cancel stops the chain on purpose;
// the job it cancels is recorded as cancelled, not as a failure, and the
// header's counts agree with the table's.
func TestCancelIsNotAFailure(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(fmt.Sprintf("#SBATCH -N1\ntouch %s/running\nsleep 300\n", work))
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, script)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	waitFor(t, time.Minute, "the job to run", func() bool { _, err := os.Stat(filepath.Join(work, "running")); return err == nil })
	if t.Failed() {
		t.FailNow()
	}
	if code, _, errOut := ch.resumer(ctx, "cancel", "--chain-dir", ch.dir); code != 0 {
		t.Fatalf("cancel = %d: %s", code, errOut)
	}
	if err := cmd.Wait(); err == nil {
		t.Errorf("ft-resumer run exited 0 after a cancel, want 1 (stopped)\n%s", out)
	}
	var v resumer.StatusView
	waitFor(t, time.Minute, "the cancelled job to be judged", func() bool {
		v = ch.status(ctx)
		return len(v.Jobs) > 0 && v.Jobs[0].Outcome != ""
	})
	if got := outcomes(v); len(got) == 0 || got[0] != "cancelled" {
		t.Errorf("outcomes %v, want cancelled first", got)
	}
	counted := 0
	for _, j := range v.Jobs {
		if j.Counted {
			counted++
		}
	}
	if counted != 0 || v.FailuresTotal != 0 || v.ConsecutiveFailures != 0 || v.StopKind != resumer.StopCancelled {
		t.Errorf("after a cancel: %d jobs counted, failures %d/%d, stop kind %q; want none counted and kind cancelled", counted, v.ConsecutiveFailures, v.FailuresTotal, v.StopKind)
	}
	_, table, _ := ch.resumer(ctx, "status", "--chain-dir", ch.dir)
	if !strings.Contains(table, "failures: 0 consecutive (max 3), 0 in all") || strings.Contains(table, " yes ") {
		t.Errorf("status table:\n%s", table)
	}
}

// TestSpareSwapShowsInStatus: a three-node job with --nnodes 2:3 loses an
// active node's launcher; the spare takes its place inside the job, which
// finishes. ft-resumer status shows the swap and the quarantined node.
func TestSpareSwapShowsInStatus(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	// Round 0 runs until the test kills a launcher; round 1 (after the
	// swap) finishes the training.
	rank := rankScript(t, work, "rank.sh", fmt.Sprintf(`echo "$SLURMD_NODENAME" > %[1]s/group-$GROUP_RANK-round-$TORCHELASTIC_RESTART_COUNT
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then while :; do sleep 0.1; done; fi
sleep 1
if [ "$RANK" = 0 ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; fi
`, work))
	script := ch.script("#SBATCH -N3\nsrun --kill-on-bad-exit=0 ft-resumer node -- ft-launcher --nnodes 2:3 --nproc-per-node 1 --no-python --max-restarts 0 " + rank + "\n")
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, script)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	victimFile := filepath.Join(work, "group-1-round-0")
	waitFor(t, 2*time.Minute, "group rank 1 to run", func() bool { b, err := os.ReadFile(victimFile); return err == nil && len(b) > 1 })
	if t.Failed() {
		t.FailNow()
	}
	victim := strings.TrimSpace(readFile(t, victimFile))
	pid := launcherOn(ch.marker, victim)
	if pid == 0 {
		t.Fatalf("no ft-launcher of the job on %s", victim)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	ch.waitRun(ctx, cmd, out)
	v := ch.status(ctx)
	j := v.Jobs[0]
	if j.Outcome != resumer.Finished {
		t.Fatalf("job 1: %s (%s), want finished", j.Outcome, j.Reason)
	}
	if len(j.SpareSwaps) != 1 || j.SpareSwaps[0].Replaced == "" || j.SpareSwaps[0].GroupRank != 1 {
		t.Errorf("job 1 spare swaps %+v, want one, replacing group rank 1", j.SpareSwaps)
	}
	found := false
	for _, q := range j.Quarantined {
		found = found || q.Evidence == "lost"
	}
	if !found {
		t.Errorf("job 1 quarantined %+v, want the lost node", j.Quarantined)
	}
	_, table, _ := ch.resumer(ctx, "status", "--chain-dir", ch.dir)
	if !strings.Contains(table, "took") || !strings.Contains(table, "quarantined (lost") {
		t.Errorf("status table does not show the swap and the quarantine:\n%s", table)
	}
}

// launcherOn finds the pid of the ft-launcher (not its ft-resumer node
// parent) of a chain's job on node.
func launcherOn(marker, node string) int {
	for _, pid := range hangdump.Matching(func(env []byte) bool {
		e := string(env)
		return strings.Contains(e, "TEST_CHAIN_MARKER="+marker+"\x00") && strings.Contains(e, "SLURMD_NODENAME="+node+"\x00") &&
			!strings.Contains(e, "FT_LAUNCHER_FENCE_WATCHDOG=1\x00")
	}) {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		if strings.TrimSpace(string(comm)) == "ft-launcher" {
			return pid
		}
	}
	return 0
}
