package slurmtest

// This file is long on purpose: it is the ft-resumer chain's scenario list
// on one private Slurm cluster (auto-resume, walltime, node failures,
// exclusions, a killed resumer, scancel), each scenario a short test over
// the same job scripts and waits.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// These tests run ft-resumer against the real private cluster. Job steps are
// real ft-launcher single-node runs (--no-python) or plain shell emulating a
// training that writes a checkpoint; multi-node DDP under srun is tested
// with the launcher's own Slurm support.

// rankScript writes a rank program for ft-launcher --no-python.
func rankScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/bash\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// launch is the srun line that runs one real ft-launcher per node.
func launch(rank string) string {
	return "srun --kill-on-bad-exit=1 ft-resumer node -- ft-launcher --standalone --nproc-per-node 1 --no-python --max-restarts 0 " + rank
}

func TestAutoResumeOverTwoJobs(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	ckpt := filepath.Join(work, "ckpt")
	// Three steps per job from the checkpoint; training ends at step 6.
	// The first job's rank crashes after its steps (the launcher's budget
	// is 0), the second finishes and writes the finished flag.
	rank := rankScript(t, work, "rank.sh", fmt.Sprintf(`ck=%q
step=$(cat "$ck" 2>/dev/null || echo 0)
for i in 1 2 3; do step=$((step+1)); echo $step > "$ck.tmp"; mv "$ck.tmp" "$ck"; done
if [ "$step" -lt 6 ]; then echo "crash at step $step" >&2; exit 1; fi
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`, ckpt))
	script := ch.script("#SBATCH -N1\n" + launch(rank) + "\n")
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "1", script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure finished never_ran] (the last: the successor Slurm removed)", got)
	}
	if v.Status != resumer.Done || v.FailuresTotal != 1 {
		t.Errorf("chain %s with %d failures, want done with 1", v.Status, v.FailuresTotal)
	}
	if got := strings.TrimSpace(readFile(t, ckpt)); got != "6" {
		t.Errorf("checkpoint step %s, want 6 (the second job resumed from the first's checkpoint)", got)
	}
	// The launcher under srun wrote its verdict per node.
	if j := v.Jobs[0]; len(j.Verdicts) != 1 || j.Verdicts[0].Kind != "restart_budget_exhausted" || j.Verdicts[0].File != "verdict-"+j.Nodes[0]+".json" {
		t.Errorf("job 1 verdicts %+v, want one restart_budget_exhausted in verdict-<node>.json", j.Verdicts)
	}
	want := fmt.Sprintf("%s F\n%s S\n", v.Jobs[0].ID, v.Jobs[1].ID)
	if got := readFile(t, filepath.Join(ch.dir, resumer.JobResultsFile)); got != want {
		t.Errorf("_job_results %q, want %q", got, want)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs still pending or running after the chain ended: %v", live)
	}
}

func TestWalltimeDoesNotCount(t *testing.T) {
	skipShort(t)
	t.Parallel() // waits out a one-minute time limit: beside the other walltime tests, after the sequential ones
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	// The first job outlives its one-minute limit; the second finishes. With
	// no failure allowed, the chain only goes on if TIMEOUT is not counted.
	// The first job's shell must not go on to the flag when its sleep is
	// killed at the limit: Slurm signals the step's processes one by one,
	// and under load the shell could run touch before its own SIGTERM.
	script := ch.script(`#SBATCH -N1 -t 1
if [ "$FT_RESUMER_JOB_INDEX" = 0 ]; then sleep 600 || exit $?; fi
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`)
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "0", script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"walltime", "finished", "never_ran"}) {
		t.Fatalf("outcomes %v, want [walltime finished never_ran]", got)
	}
	if v.Jobs[0].SlurmState != "TIMEOUT" || v.Jobs[0].Counted || v.FailuresTotal != 0 {
		t.Errorf("job 1: Slurm %s, counted %v, failures %d; want TIMEOUT, not counted, 0", v.Jobs[0].SlurmState, v.Jobs[0].Counted, v.FailuresTotal)
	}
	if v.Jobs[0].DecidedBy == "end step" {
		t.Errorf("a walltime kill was decided by the job's own end step (%s); Slurm's record must decide", v.Jobs[0].Reason)
	}
}

func TestNodeFailureCountsAndTheChainGoesOn(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
if [ "$FT_RESUMER_JOB_INDEX" = 0 ]; then echo "$SLURMD_NODENAME" > %[1]s/node-0; sleep 300; fi
echo "$SLURMD_NODENAME" > %[1]s/node-1
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`, work))
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "1", script)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	var node string
	waitFor(t, time.Minute, "job 1 to run", func() bool {
		b, err := os.ReadFile(filepath.Join(work, "node-0"))
		node = strings.TrimSpace(string(b))
		return err == nil && node != ""
	})
	if t.Failed() {
		t.FailNow()
	}
	// The node fails (as slurmctld sees it): the job ends NODE_FAIL.
	if _, err := c.Run(ctx, "scontrol", "update", "NodeName="+node, "State=DOWN", "Reason=ft-resumer test"); err != nil {
		t.Fatal(err)
	}
	defer c.Run(context.Background(), "scontrol", "update", "NodeName="+node, "State=RESUME")
	if err := cmd.Wait(); err != nil {
		t.Fatalf("ft-resumer run: %v\n%s", err, out)
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Fatalf("outcomes %v, want [failure finished never_ran]", got)
	}
	if j := v.Jobs[0]; j.SlurmState != "NODE_FAIL" || !j.Counted || v.FailuresTotal != 1 {
		t.Errorf("job 1: %s counted %v (failures %d); want NODE_FAIL, counted", j.SlurmState, j.Counted, v.FailuresTotal)
	}
	if got := strings.TrimSpace(readFile(t, filepath.Join(work, "node-1"))); got == node {
		t.Errorf("job 2 ran on the DOWN node %s", got)
	}
}

func TestConsecutiveFailuresStopTheChain(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	script := ch.script("#SBATCH -N1\nexit 1\n")
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "2", script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	trained := ranOutcomes(v)
	if !slices.Equal(trained, []string{"failure", "failure", "failure"}) {
		t.Errorf("jobs that ran: %v, want three failures", trained)
	}
	if v.Status != resumer.Stopped || !strings.Contains(v.StopReason, "3 consecutive failed jobs (max_subsequent_job_failures=2)") {
		t.Errorf("chain %s: %q", v.Status, v.StopReason)
	}
	if !strings.Contains(out, "chain stopped: 3 consecutive") {
		t.Errorf("run output does not say why the chain stopped:\n%s", out)
	}
	if lines := strings.Count(readFile(t, filepath.Join(ch.dir, resumer.JobResultsFile)), " F\n"); lines != 3 {
		t.Errorf("_job_results has %d F lines, want 3", lines)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs left after the chain stopped: %v", live)
	}
}

func TestNoRestartVerdictStopsTheChain(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	// The rank asks the launcher to shut the workload down (nvrx's
	// ShutdownWorkload): the launcher exits 93 with a no_restart verdict.
	// The job script then exits 1 whatever srun reported (set -e style).
	rank := rankScript(t, work, "rank.sh", `python3 -c 'from ft_launcher_client import request_workload_action as r; r("ShutdownWorkload", "loss is NaN")'
sleep 30
`)
	script := ch.script("#SBATCH -N1\n" + launch(rank) + "\nrc=$?\necho \"srun exit status $rc\" > " + filepath.Join(work, "srun-rc") + "\n[ $rc -eq 0 ] || exit 1\n")
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "5", script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1\n%s\n%s", code, out, errOut)
	}
	t.Logf("%s (the job script exited 1)", strings.TrimSpace(readFile(t, filepath.Join(work, "srun-rc"))))
	v := ch.status(ctx)
	if v.Jobs[0].Outcome != resumer.NoRestart || v.Status != resumer.Stopped || !strings.Contains(v.StopReason, "ShutdownWorkload") {
		t.Errorf("job 1 %s, chain %s (%s); want no_restart, stopped by the verdict", v.Jobs[0].Outcome, v.Status, v.StopReason)
	}
	for _, j := range v.Jobs[1:] {
		if j.Outcome.Ran() {
			t.Errorf("job %s ran (%s) after a no_restart verdict", j.ID, j.Outcome)
		}
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("successor left after no_restart: %v", live)
	}
}

// quarantineScript makes job 0 of an -N<n> job write its launchers'
// verdicts, the first node's naming the second (by address, evidence lost),
// and fail; later jobs record their node list and finish.
func quarantineScript(nodes int, work string) string {
	return fmt.Sprintf(`#SBATCH -N%d
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then
  echo "$SLURM_JOB_NODELIST" > %[2]s/nodes-$FT_RESUMER_JOB_INDEX
  touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0
fi
set -- $(scontrol show hostnames "$SLURM_JOB_NODELIST")
addr() { scontrol show node -o "$1" | tr ' ' '\n' | sed -n 's/^NodeAddr=//p'; }
a1=$(addr $1) a2=$(addr $2)
echo "$2" > %[2]s/quarantined
now=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)
cat > "$FT_RESUMER_JOB_DIR/verdict-$1.json" <<VERDICT
{"schema":"ft-launcher.verdict/v1","kind":"restart_budget_exhausted","exit_code":1,
 "reason":"restart budget exhausted (1 of 1 restarts used): node $a2/200 lost","finished":false,
 "finished_flag":{"path":"","present":false},"run_id":"t","node":"$a1/100","hostname":"vm","pid":100,
 "restarts_used":1,"max_restarts":1,"last_round":1,
 "quarantined":[{"node":"$a2/200","host":"$a2","evidence":"lost","detail":"node $a2/200 lost (gossip)","round":0,"at":"$now"}],
 "cycles":[],"started_at":"$now","ended_at":"$now"}
VERDICT
exit 1
`, nodes, work)
}

func TestQuarantinedNodeIsExcludedFromTheNextJob(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(quarantineScript(2, work))
	start := time.Now()
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--exclusion-expiry", "1h", script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	bad := strings.TrimSpace(readFile(t, filepath.Join(work, "quarantined")))
	nodes2, err := slurm.ExpandNodeList(strings.TrimSpace(readFile(t, filepath.Join(work, "nodes-1"))))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes2) != 2 || slices.Contains(nodes2, bad) {
		t.Errorf("job 2 ran on %v; node %s was quarantined by job 1", nodes2, bad)
	}
	v := ch.status(ctx)
	if len(v.Exclusions) != 1 {
		t.Fatalf("exclusions %+v, want one", v.Exclusions)
	}
	e := v.Exclusions[0]
	if e.Node != bad || e.Evidence != "lost" || !e.Active || e.Job != v.Jobs[0].ID || !strings.Contains(e.Detail, "lost (gossip)") {
		t.Errorf("exclusion %+v, want node %s, evidence lost, active, from job %s", e, bad, v.Jobs[0].ID)
	}
	if exp := e.Expires.Sub(start); exp < 59*time.Minute || exp > 61*time.Minute+5*time.Minute {
		t.Errorf("exclusion expires %v after the start, want about 1h", exp)
	}
	if !slices.Contains(v.Jobs[1].Nodes, v.Jobs[1].Nodes[0]) || slices.Contains(v.Jobs[1].Nodes, bad) {
		t.Errorf("chain records job 2 on %v", v.Jobs[1].Nodes)
	}
}

func TestSuccessorOnAnExcludedNodeIsRelocated(t *testing.T) {
	skipShort(t)
	// Job 1 quarantines its own node and is then SIGKILLed with its batch
	// script, so no end step passes the exclusion to the pending
	// successor, which Slurm places on the same (lowest idle) node. Its
	// begin step must see that and hand over to a job that excludes the
	// node.
	got := exclusionRace(t, `# The batch script (the wrapper and its 'ft-resumer step run', the job
# script's parent) and the job script's own process group: no end step.
kill -KILL "$(ps -o ppid= -p $PPID | tr -d ' ')" "$PPID"
kill -KILL 0`, "relocated")
	if !slices.Equal(got, []string{"failure", "relocated", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure relocated finished never_ran]", got)
	}
}

// TestDeferredEndStepExcludesBeforeTheSuccessorIsPlaced: the job script dies of a signal (srun's status after a launcher was
// killed), so the end step leaves the outcome to Slurm's final state; it
// must still give the pending successor the node its launchers
// quarantined, before the job ends and the successor can be placed. The
// successor then never lands on the node: no relocation, no second trip
// through the queue.
func TestDeferredEndStepExcludesBeforeTheSuccessorIsPlaced(t *testing.T) {
	skipShort(t)
	got := exclusionRace(t, "kill -KILL 0  # the job script's process group: status 137, the end step runs", "")
	if !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure finished never_ran]: the successor was excluded from the node before it was placed", got)
	}
}

// exclusionRace runs a chain whose first job quarantines its own node (a
// node_excluded verdict, as a failed health check writes) and then runs
// kill, while other jobs hold every other node, so that a successor
// without the exclusion could only go where job 1 was. It waits for a job
// with outcome waitFor (none: "") before freeing the other nodes, checks
// that no job trained on the quarantined node, and returns the outcomes.
func exclusionRace(t *testing.T, kill, waitOutcome string) []string {
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
if [ "$FT_RESUMER_JOB_INDEX" != 0 ]; then
  echo "$SLURMD_NODENAME" > %[1]s/trained-on-$FT_RESUMER_JOB_INDEX
  touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0
fi
echo "$SLURMD_NODENAME" > %[1]s/quarantined
now=$(date -u +%%Y-%%m-%%dT%%H:%%M:%%SZ)
cat > "$FT_RESUMER_JOB_DIR/verdict-$SLURMD_NODENAME.json" <<VERDICT
{"schema":"ft-launcher.verdict/v1","kind":"node_excluded","exit_code":1,"reason":"health check failed: nvidia-smi exited 9",
 "finished":false,"finished_flag":{"path":"","present":false},"run_id":"t","node":"$SLURMD_NODENAME","hostname":"vm","pid":1,
 "restarts_used":0,"max_restarts":0,"last_round":0,"quarantined":[],"cycles":[],"started_at":"$now","ended_at":"$now"}
VERDICT
%[2]s
sleep 60
`, work, kill))
	// Other jobs hold every node but the first, so the successor can only
	// go where job 1 was.
	var blockers []string
	for _, n := range c.Nodes[1:] {
		id, err := c.Run(ctx, "sbatch", "--parsable", "--exclusive", "-w", n.Name, "-o", "/dev/null", "--wrap", "sleep 300")
		if err != nil {
			t.Fatal(err)
		}
		blockers = append(blockers, id)
	}
	defer c.Run(context.Background(), "scancel", blockers...)
	waitFor(t, time.Minute, "the blockers to run", func() bool {
		out, _ := c.Run(ctx, "squeue", "-h", "-t", "running", "-o", "%A", "-j", strings.Join(blockers, ","))
		return len(strings.Fields(out)) == len(blockers)
	})
	// submit, not run: no follower may pass the exclusion on before the
	// successor is placed; only the jobs' own steps act.
	if code, out, errOut := ch.resumer(ctx, "submit", "--chain-dir", ch.dir, script); code != 0 {
		t.Fatalf("ft-resumer submit = %d\n%s\n%s", code, out, errOut)
	}
	if waitOutcome != "" {
		waitFor(t, 2*time.Minute, "a "+waitOutcome+" job", func() bool {
			st, err := resumer.LoadState(ch.dir)
			return err == nil && slices.ContainsFunc(st.Jobs, func(j *resumer.ChainJob) bool { return string(j.Outcome) == waitOutcome })
		})
	} else {
		// Job 1 was judged or deferred by its end step, and the successor
		// is pending, excluded from the node, waiting for a free one.
		waitFor(t, 2*time.Minute, "the successor to get its exclusion", func() bool {
			st, err := resumer.LoadState(ch.dir)
			return err == nil && len(st.Jobs) >= 2 && len(st.Jobs[1].Exclude) == 1
		})
		time.Sleep(3 * time.Second) // Slurm's scheduling passes: it must stay pending
		if _, err := os.Stat(filepath.Join(work, "trained-on-1")); err == nil {
			t.Errorf("the successor ran while the only free node was the excluded one")
		}
	}
	if _, err := c.Run(ctx, "scancel", blockers...); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	if waitOutcome == "relocated" && !strings.Contains(out, "relocated -> relocate (") {
		t.Errorf("the relocated job's line lacks its decision word:\n%s", out)
	}
	bad := strings.TrimSpace(readFile(t, filepath.Join(work, "quarantined")))
	if got := strings.TrimSpace(readFile(t, filepath.Join(work, "trained-on-1"))); got == bad {
		t.Errorf("the job after job 1 trained on %s, which job 1 quarantined", got)
	}
	v := ch.status(ctx)
	if len(v.Exclusions) != 1 || v.Exclusions[0].Node != bad || v.Exclusions[0].Evidence != "excluded" || !strings.Contains(v.Exclusions[0].Detail, "health check") {
		t.Errorf("exclusions %+v, want %s with evidence excluded and the health check detail", v.Exclusions, bad)
	}
	if waitOutcome == "relocated" && len(v.Jobs) > 2 && !strings.HasPrefix(v.Jobs[2].SubmittedBy, "relocation of "+v.Jobs[1].ID) {
		t.Errorf("job 3 submitted by %q, want the relocation of job 2", v.Jobs[2].SubmittedBy)
	}
	var got []string
	for _, j := range v.Jobs {
		got = append(got, string(j.Outcome))
	}
	return got
}

func TestExclusionsNeverShrinkTheJob(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	// All three nodes are needed: excluding one must stop the chain with a
	// clear message instead of leaving a job that can never be placed.
	script := ch.script(quarantineScript(3, filepath.Dir(ch.dir)))
	code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, script)
	if code != 1 {
		t.Fatalf("ft-resumer run = %d, want 1\n%s\n%s", code, out, errOut)
	}
	v := ch.status(ctx)
	if v.Status != resumer.Stopped || !strings.Contains(v.StopReason, "leaves 2 usable node(s)") || !strings.Contains(v.StopReason, "needs 3") {
		t.Errorf("chain %s: %q; want stopped because 2 nodes are left for a 3-node job", v.Status, v.StopReason)
	}
}

func TestResumerKilledMidChainIsPickedUp(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	gate := filepath.Join(work, "go")
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
for i in $(seq 1500); do [ -f %[1]q ] && break; sleep 0.2; done
if [ "$FT_RESUMER_JOB_INDEX" = 0 ]; then exit 1; fi
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`, gate))
	args := []string{"run", "--chain-dir", ch.dir, script}
	cmd, out := ch.startResumer(args...)
	var st *resumer.State
	waitFor(t, time.Minute, "job 1 to begin", func() bool {
		s, err := resumer.LoadState(ch.dir)
		st = s
		return err == nil && len(s.Jobs) >= 2 && !s.Jobs[0].Began.IsZero()
	})
	if t.Failed() {
		cmd.Process.Kill()
		cmd.Wait()
		t.FailNow()
	}
	// ft-resumer dies while job 1 runs and its successor is pending; then
	// the successor is lost too (cancelled by hand) and job 1 fails.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	t.Logf("first ft-resumer (killed):\n%s", out)
	first, successor := st.Jobs[0].ID, st.Jobs[1].ID
	if _, err := c.Run(ctx, "scancel", successor); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "job 1 to end", func() bool {
		out, _ := c.Run(ctx, "squeue", "-h", "-j", first, "-o", "%T")
		return out == ""
	})
	code, out2, errOut := ch.resumer(ctx, args...)
	if code != 0 {
		t.Fatalf("second ft-resumer run = %d\n%s\n%s", code, out2, errOut)
	}
	if !strings.Contains(errOut, "picking up the chain") {
		t.Errorf("second run did not say it picked the chain up:\n%s", errOut)
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"failure", "never_ran", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure never_ran finished never_ran]", got)
	}
	if len(v.Jobs) == 4 && (v.Jobs[0].DecidedBy != "end step" || !strings.HasPrefix(v.Jobs[2].SubmittedBy, "repair")) {
		t.Errorf("job 1 decided by %q, job 3 submitted by %q; want the end step and a repair", v.Jobs[0].DecidedBy, v.Jobs[2].SubmittedBy)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs left: %v", live)
	}
}

func TestScancelLeavesNoProcess(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	started := filepath.Join(work, "started")
	// A rank with a child and a setsid grandchild, under a real launcher.
	rank := rankScript(t, work, "rank.sh", fmt.Sprintf(`sleep 1000 &
setsid sleep 1000 &
touch %q
wait
`, started))
	script := ch.script("#SBATCH -N1\nif [ \"$FT_RESUMER_JOB_INDEX\" != 0 ]; then touch \"$FAULT_TOL_FINISHED_FLAG_FILE\"; exit 0; fi\n" + launch(rank) + "\n")
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, script)
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	waitFor(t, time.Minute, "the rank to start", func() bool { _, err := os.Stat(started); return err == nil })
	st := ch.state()
	first := st.Jobs[0].ID
	// The job's processes (not this test's ft-resumer, which carries the
	// marker too).
	self := fmt.Sprintf("%d ", cmd.Process.Pid)
	before := slices.DeleteFunc(ProcessesWithEnv("TEST_CHAIN_MARKER="+ch.marker), func(p string) bool { return strings.HasPrefix(p, self) })
	t.Logf("processes of job %s before scancel: %v", first, before)
	if len(before) < 4 {
		t.Fatalf("expected the launcher, the rank and its two sleeps among %v", before)
	}
	if _, err := c.Run(ctx, "scancel", first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "job 1 to leave Slurm", func() bool {
		out, _ := c.Run(ctx, "squeue", "-h", "-j", first, "-o", "%T")
		return out == ""
	})
	// Nothing of job 1 may survive: its launcher, ranks, children, escapees.
	waitFor(t, 30*time.Second, "no process of job 1 left", func() bool {
		for _, p := range ProcessesWithEnv("TEST_CHAIN_MARKER=" + ch.marker) {
			if slices.Contains(before, p) {
				return false
			}
		}
		return true
	})
	if t.Failed() {
		t.Logf("processes of the job before scancel: %v; now: %v", before, ProcessesWithEnv("TEST_CHAIN_MARKER="+ch.marker))
	}
	// The chain treats the cancelled job as a failure and goes on.
	if err := cmd.Wait(); err != nil {
		t.Errorf("ft-resumer run: %v\n%s", err, out)
	}
	if got := outcomes(ch.status(ctx)); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure finished never_ran]", got)
	}
}

// TestMeasureDecisionLatency measures (FT_RESUMER_BENCH=1), on this
// cluster, the time from a job's script end to the chain's decision and to
// the successor's script start, for ft-resumer and for a hand-written
// NeMo-Framework-Launcher-style afterany loop. It asserts no speed.
func TestMeasureDecisionLatency(t *testing.T) {
	skipShort(t)
	if os.Getenv("FT_RESUMER_BENCH") == "" {
		// Not an environment skip: an opt-in measurement.
		t.Skip("opt-in measurement: set FT_RESUMER_BENCH=1 to measure")
	}
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	// Both chains run at once, so that Slurm's and the machine's noise
	// falls on both alike; FT_RESUMER_BENCH_JOBS jobs each (default 21:
	// 20 hops a side).
	jobs := 21
	if n, err := strconv.Atoi(os.Getenv("FT_RESUMER_BENCH_JOBS")); err == nil && n > 1 {
		jobs = n
	}
	// Each job's script also records when its batch script (the process
	// Slurm started: the wrapper, two levels up under ft-resumer; job.sh,
	// one level up in the loop) started, from /proc (10 ms ticks), after
	// its own stamp: what precedes the script splits into Slurm's part and
	// the job's own.
	stamp := func(dir string, up int) string {
		return fmt.Sprintf(`echo "start $SLURM_JOB_ID $(date +%%s.%%N)" >> %[1]s/stamps
p=$$; for i in $(seq %[3]d); do p=$(awk '{print $4}' /proc/$p/stat); done
echo "batch $SLURM_JOB_ID $(awk -v t="$(awk '{print $22}' /proc/$p/stat)" -v hz="$(getconf CLK_TCK)" -v bt="$(awk '/^btime/{print $2}' /proc/stat)" 'BEGIN{printf "%%.3f", bt + t/hz}')" >> %[1]s/stamps
n=$(grep -c '^start' %[1]s/stamps)
sleep 1
if [ "$n" -ge %[2]d ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; echo "end $SLURM_JOB_ID $(date +%%s.%%N)" >> %[1]s/stamps; exit 0; fi
echo "end $SLURM_JOB_ID $(date +%%s.%%N)" >> %[1]s/stamps
exit 1
`, dir, jobs, up)
	}
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)

	// NeMo-Framework-Launcher's loop, by hand: pre-schedule an afterany
	// continuation, check the flag and the failure window at start, record
	// X/S/F in _job_results, cancel the continuation when finished.
	nemo := filepath.Join(t.TempDir(), "nemo")
	if err := os.MkdirAll(nemo, 0o755); err != nil {
		t.Fatal(err)
	}
	flag := filepath.Join(nemo, "_finished_flag")
	// FT_RESUMER_BENCH_LOOP_DEP=afternotok gives the loop ft-resumer's
	// dependency type, to tell Slurm's part from ours.
	loopDep := "afterany"
	if d := os.Getenv("FT_RESUMER_BENCH_LOOP_DEP"); d != "" {
		loopDep = d
	}
	body := fmt.Sprintf(`#!/bin/bash
#SBATCH -N1 -o %[1]s/slurm-%%j.out
export FAULT_TOL_FINISHED_FLAG_FILE=%[2]s
R=%[1]s/_job_results
if [ -n "$FT_RESUMED" ]; then
  [ -f "$FAULT_TOL_FINISHED_FLAG_FILE" ] && exit 0
  [ "$(tail -n %[3]d $R | grep -c ' [XF]$')" -ge %[3]d ] && exit 1
fi
NEXT=$(FT_RESUMED=1 sbatch --parsable --dependency=%[4]s:$SLURM_JOB_ID %[1]s/job.sh)
echo "$SLURM_JOB_ID X" >> $R
bash %[1]s/train.sh
rc=$?
if [ $rc -eq 0 ]; then sed -i "s/^$SLURM_JOB_ID X$/$SLURM_JOB_ID S/" $R; else sed -i "s/^$SLURM_JOB_ID X$/$SLURM_JOB_ID F/" $R; fi
if [ -f "$FAULT_TOL_FINISHED_FLAG_FILE" ]; then scancel $NEXT; exit 0; fi
exit $rc
`, nemo, flag, jobs, loopDep)
	if err := os.WriteFile(filepath.Join(nemo, "job.sh"), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(nemo, "train.sh"), []byte(stamp(nemo, 1)), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(ctx, "sbatch", "--parsable", filepath.Join(nemo, "job.sh"))
	cmd.Env = append(cmd.Env, "TEST_CHAIN_MARKER="+ch.marker)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sbatch: %v %s", err, out)
	}

	script := ch.script("#SBATCH -N1\n" + stamp(work, 2))
	if code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", strconv.Itoa(jobs), script); code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s", code, out, errOut)
	}
	waitFor(t, 10*time.Minute, "the NeMo-style loop to finish", func() bool {
		_, err := os.Stat(flag)
		return err == nil
	})
	waitFor(t, time.Minute, "the NeMo-style loop's jobs to end", func() bool {
		out, _ := c.Run(ctx, "squeue", "-h", "-o", "%A")
		return out == ""
	})

	gaps := gapsFrom(t, filepath.Join(work, "stamps"))
	st := ch.state()
	var decide []float64
	ends := endsFrom(t, filepath.Join(work, "stamps"))
	for _, j := range st.Jobs {
		if e, ok := ends[j.ID]; ok && !j.Decided.IsZero() {
			decide = append(decide, j.Decided.Sub(e).Seconds())
		}
	}
	var begin []float64
	for _, sl := range readStamps(t, filepath.Join(work, "stamps")) {
		if j := st.Job(sl.job); sl.kind == "start" && j != nil && !j.Began.IsZero() {
			begin = append(begin, sl.at-float64(j.Began.UnixNano())/1e9)
		}
	}
	split := func(path string) (slurmPart, own []float64) {
		var lastEnd float64
		batch := map[string]float64{}
		for _, s := range readStamps(t, path) {
			if s.kind == "batch" {
				batch[s.job] = s.at
			}
		}
		for _, s := range readStamps(t, path) {
			switch {
			case s.kind == "end":
				lastEnd = s.at
			case s.kind == "start" && lastEnd > 0 && batch[s.job] > 0:
				slurmPart = append(slurmPart, batch[s.job]-lastEnd)
				own = append(own, s.at-batch[s.job])
			}
		}
		return slurmPart, own
	}
	oursSlurm, oursOwn := split(filepath.Join(work, "stamps"))
	loopSlurm, loopOwn := split(filepath.Join(nemo, "stamps"))
	load, _ := os.ReadFile("/proc/loadavg")
	t.Logf("both chains at once, %d jobs each; load at the end: %s", jobs, strings.TrimSpace(string(load)))
	t.Logf("ft-resumer: script end -> decision (s): %s", fmtList(decide))
	t.Logf("ft-resumer: begin step's record -> script start (s): %s", fmtList(begin))
	t.Logf("ft-resumer: script end -> successor script start (s): %s", fmtList(gaps))
	t.Logf("NeMo-style %s loop: script end -> successor script start (s): %s", loopDep, fmtList(gapsFrom(t, filepath.Join(nemo, "stamps"))))
	t.Logf("script end -> batch script start, Slurm's part (s): ft-resumer %s; loop %s", fmtList(oursSlurm), fmtList(loopSlurm))
	t.Logf("batch script start -> script's first line, the job's own (s): ft-resumer %s; loop %s", fmtList(oursOwn), fmtList(loopOwn))
	_, table, _ := ch.resumer(ctx, "status", "--chain-dir", ch.dir)
	t.Logf("ft-resumer status:\n%s", table)
}

type stampLine struct {
	kind, job string
	at        float64
}

func readStamps(t *testing.T, path string) []stampLine {
	t.Helper()
	var out []stampLine
	for _, l := range strings.Split(strings.TrimSpace(readFile(t, path)), "\n") {
		f := strings.Fields(l)
		if len(f) != 3 {
			continue
		}
		at, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, stampLine{f[0], f[1], at})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

func gapsFrom(t *testing.T, path string) []float64 {
	var gaps []float64
	var lastEnd float64
	for _, s := range readStamps(t, path) {
		if s.kind == "end" {
			lastEnd = s.at
		} else if s.kind == "start" && lastEnd > 0 {
			gaps = append(gaps, s.at-lastEnd)
		}
	}
	return gaps
}

func endsFrom(t *testing.T, path string) map[string]time.Time {
	ends := map[string]time.Time{}
	for _, s := range readStamps(t, path) {
		if s.kind == "end" {
			sec := int64(s.at)
			ends[s.job] = time.Unix(sec, int64((s.at-float64(sec))*1e9))
		}
	}
	return ends
}

func fmtList(xs []float64) string {
	if len(xs) == 0 {
		return "none"
	}
	s := append([]float64{}, xs...)
	sort.Float64s(s)
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return fmt.Sprintf("%s (median %.3f, worst %.3f)", strings.Join(parts, " "), s[len(s)/2], s[len(s)-1])
}

// TestKilledStepRunLeavesTheEndStepToTheWrapper: `step run --end` is the
// end step of the generated wrapper; when it is killed before it decided
// (here by the job script itself, its child), the wrapper finds no status in
// jobs/<id>/end-status and runs the end step on its own, so the job is
// still judged and the chain goes on.
func TestKilledStepRunLeavesTheEndStepToTheWrapper(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(fmt.Sprintf(`#SBATCH -N1
n=$(ls %[1]s/ran-* 2>/dev/null | wc -l)
touch %[1]s/ran-$SLURM_JOB_ID
if [ "$n" -ge 1 ]; then touch "$FAULT_TOL_FINISHED_FLAG_FILE"; exit 0; fi
# Once the successor is submitted (step run does it beside this script),
# kill step run, this script's parent.
for i in $(seq 600); do squeue -h -o %%E | grep -q "afternotok:$SLURM_JOB_ID" && break; sleep 0.1; done
kill -KILL $PPID
exit 0
`, work))
	if code, out, errOut := ch.resumer(ctx, "run", "--chain-dir", ch.dir, script); code != 0 {
		t.Fatalf("ft-resumer run = %d, want 0\n%s\n%s\n%s", code, out, errOut, ch.logs())
	}
	var ran []*resumer.ChainJob // the chain's last successor never runs
	for _, j := range ch.state().Jobs {
		if !j.Began.IsZero() {
			ran = append(ran, j)
		}
	}
	if len(ran) != 2 {
		t.Fatalf("%d jobs of the chain began, want 2:\n%s", len(ran), ch.logs())
	}
	first, second := ran[0], ran[1]
	// Only the end step records the script's status; a status of 137
	// leaves the outcome to Slurm's final state (decided by a follower).
	switch {
	case first.ScriptRC == nil:
		t.Errorf("job %s: no script status: the wrapper's end step did not run\n%s", first.ID, ch.logs())
	case *first.ScriptRC != 137 || first.Outcome != resumer.Failure:
		t.Errorf("job %s: script status %d, outcome %q; want 137 (step run killed) and a failure", first.ID, *first.ScriptRC, first.Outcome)
	}
	if got := readFile(t, filepath.Join(ch.dir, resumer.JobsDir, first.ID, resumer.EndStatusFile)); got != "" {
		t.Errorf("job %s: end-status %q, want it empty (step run was killed before it decided)", first.ID, got)
	}
	if second.Outcome != resumer.Finished || second.DecidedBy != "end step" {
		t.Errorf("job %s: outcome %q decided by %q, want finished by the end step", second.ID, second.Outcome, second.DecidedBy)
	}
	if got := readFile(t, filepath.Join(ch.dir, resumer.JobsDir, second.ID, resumer.EndStatusFile)); got != "0\n" {
		t.Errorf("job %s: end-status %q, want \"0\\n\" (step run --end decided)", second.ID, got)
	}
}
