package slurmtest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// One chain, one training: whatever Slurm does to a chain's jobs (requeue
// by hand, a real preemption with --requeue, which a node failure's requeue
// follows too, hold, release, cancel, a wrapper submitted by hand), no two
// jobs of the chain train at once and no job has two successors.

// trainingScript is a job script that logs "start|end <job> <run> <unix
// time>" to work/train.log, writes its pid to work/inflight (a second
// training started while that process lives logs OVERLAP), waits for
// work/go and then writes the finished flag. The start and the end are
// logged with shell builtins only: scancel signals every process of the
// job, so a date(1) the EXIT trap started could die with the script and
// leave an end line without its time. (The end line was once missing: a
// second SIGTERM ran the TERM trap again inside the EXIT trap, and the
// test read the cancelled run as never ended.)
func trainingScript(work string) string {
	return fmt.Sprintf(`#SBATCH -N1
log=%[1]q/train.log
run="$SLURM_JOB_ID ${SLURM_RESTART_COUNT:-0}"
# The traps first: a requeue or scancel may come as soon as the script starts.
# A second SIGTERM (Slurm signals the job's processes, ft-resumer forwards
# its own) must not cut the EXIT trap short before it logs the end: the
# first one makes the script ignore the rest.
trap 'trap "" TERM; echo "end $run $EPOCHREALTIME" >> "$log"' EXIT
trap 'trap "" TERM; exit 143' TERM
if [ -s %[1]q/inflight ] && kill -0 "$(< %[1]q/inflight)" 2>/dev/null; then echo "OVERLAP $run $EPOCHREALTIME" >> "$log"; fi
echo $$ > %[1]q/inflight
echo "start $run $EPOCHREALTIME" >> "$log"
for i in $(seq 3000); do [ -f %[1]q/go ] && break; sleep 0.2; done
touch "$FAULT_TOL_FINISHED_FLAG_FILE"
`, work)
}

// trainings reads train.log: the runs that started ("<job> <run>"), and a
// failure message for an overlap (two trainings at once).
func trainings(t *testing.T, work string) (started []string, overlap string) {
	t.Helper()
	b, _ := os.ReadFile(filepath.Join(work, "train.log"))
	type span struct {
		run        string
		start, end float64
	}
	spans := map[string]*span{}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) != 4 {
			continue
		}
		run := f[1] + " " + f[2]
		at, _ := strconv.ParseFloat(f[3], 64)
		switch f[0] {
		case "OVERLAP":
			overlap = "a training started while another was running: " + l
		case "start":
			started = append(started, run)
			spans[run] = &span{run: run, start: at}
		case "end":
			if s := spans[run]; s != nil {
				s.end = at
			}
		}
	}
	var all []*span
	for _, s := range spans {
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].start < all[j].start })
	for i := 1; i < len(all); i++ {
		if p := all[i-1]; p.end == 0 || p.end > all[i].start {
			overlap += fmt.Sprintf("; run %q (%.3f-%.3f) overlaps run %q starting %.3f", p.run, p.start, p.end, all[i].run, all[i].start)
		}
	}
	return started, overlap
}

// waitFirstTraining waits until the chain's first job trains and its
// successor is submitted, and returns both ids.
func waitFirstTraining(t *testing.T, ch *chain, work string) (first, successor string) {
	t.Helper()
	waitFor(t, time.Minute, "job 1 to train and its successor to be submitted", func() bool {
		st, err := resumer.LoadState(ch.dir)
		if err != nil || len(st.Jobs) < 2 || st.Jobs[0].Successor == "" {
			return false
		}
		first, successor = st.Jobs[0].ID, st.Jobs[0].Successor
		return logHas(work, "start "+first+" 0 ")
	})
	if t.Failed() {
		t.FailNow()
	}
	return first, successor
}

func logHas(work, line string) bool {
	b, _ := os.ReadFile(filepath.Join(work, "train.log"))
	return strings.Contains(string(b), line)
}

func jobState(ctx context.Context, c *Cluster, id string) string {
	out, _ := c.Run(ctx, "squeue", "-h", "-j", id, "-o", "%T")
	return strings.TrimSpace(out)
}

// requeueChain is a chain whose jobs are submitted with --requeue, its
// first job training and its successor submitted.
type requeueChain struct {
	ch               *chain
	work             string
	cmd              *exec.Cmd
	out              *bytes.Buffer
	first, successor string
}

// startRequeueChain starts `ft-resumer run` on a chain of trainingScript
// with -- --requeue and waits until its first job trains; the run is
// killed at the end of t if it is still going.
func startRequeueChain(t *testing.T, c *Cluster) *requeueChain {
	t.Helper()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, ch.script(trainingScript(work)), "--", "--requeue")
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	rc := &requeueChain{ch: ch, work: work, cmd: cmd, out: out}
	rc.first, rc.successor = waitFirstTraining(t, ch, work)
	return rc
}

// rerunReusedSuccessor checks that the first job's rerun (after a requeue)
// found its successor pending and submitted no other.
func (rc *requeueChain) rerunReusedSuccessor(t *testing.T) {
	t.Helper()
	waitFor(t, 30*time.Second, "the rerun to find its successor pending", func() bool {
		o, _ := os.ReadFile(filepath.Join(rc.work, "slurm-"+rc.first+".out"))
		return strings.Contains(string(o), "its successor, job "+rc.successor+", is still PENDING: not submitting another")
	})
	if t.Failed() {
		t.FailNow()
	}
	if st := rc.ch.state(); len(st.Jobs) != 2 || st.Jobs[0].Restarts != 1 {
		t.Fatalf("after the requeue: %d jobs, job 1 run %d; want 2 jobs (no second successor), run 1", len(st.Jobs), st.Jobs[0].Restarts)
	}
}

// end waits for the run to end and checks the one-training record: the
// trainings in order with no overlap, the jobs' outcomes (why says what
// they mean), and one successor of the first job.
func (rc *requeueChain) end(ctx context.Context, t *testing.T, trainingsWant, outcomesWant []string, why string) {
	t.Helper()
	rc.ch.waitRun(ctx, rc.cmd, rc.out)
	started, overlap := trainings(t, rc.work)
	if overlap != "" {
		t.Errorf("%s\ntrain.log:\n%s", overlap, readFile(t, filepath.Join(rc.work, "train.log")))
	}
	if !slices.Equal(started, trainingsWant) {
		t.Errorf("trainings %v, want %v", started, trainingsWant)
	}
	v := rc.ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, outcomesWant) {
		t.Errorf("outcomes %v, want %v: %s", got, outcomesWant, why)
	}
	by := 0
	for _, j := range v.Jobs {
		if strings.HasPrefix(j.SubmittedBy, "begin of "+rc.first) {
			by++
		}
	}
	if by != 1 {
		t.Errorf("job %s had %d successors submitted, want 1\n%s", rc.first, by, rc.out)
	}
}

// TestRequeueHoldReleaseCancelOneTraining: a chain job submitted with
// --requeue is requeued while it trains (`scontrol requeue`: the path of a
// preemption with PreemptMode=REQUEUE and of a node failure with
// --requeue). Its rerun must not submit a second successor: it reuses the
// pending one. That successor is then held, the job cancelled, the
// successor released: it alone trains, and the finished flag is its.
func TestRequeueHoldReleaseCancelOneTraining(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rc := startRequeueChain(t, c)
	work, a, b := rc.work, rc.first, rc.successor
	if _, err := c.Run(ctx, "scontrol", "requeue", a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 90*time.Second, "the requeued job to train again", func() bool { return logHas(work, "start "+a+" 1 ") })
	rc.rerunReusedSuccessor(t)
	if _, err := c.Run(ctx, "scontrol", "hold", b); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx, "scancel", a); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the cancelled job to end", func() bool { return logHas(work, "end "+a+" 1 ") && jobState(ctx, c, a) == "" })
	time.Sleep(3 * time.Second) // a held job must not start; give Slurm's 1 s scheduler a few passes
	if s := jobState(ctx, c, b); s != "PENDING" {
		t.Errorf("held successor %s is %q, want PENDING", b, s)
	}
	if _, err := c.Run(ctx, "scontrol", "release", b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the released successor to train", func() bool { return logHas(work, "start "+b+" 0 ") })
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rc.end(ctx, t, []string{a + " 0", a + " 1", b + " 0"}, []string{"failure", "finished", "never_ran"},
		"the cancelled job, its one successor (which wrote the flag), the successor's successor Slurm removed")
}

// TestPreemptionRequeueOneTraining: a real preemption of a chain job
// submitted with --requeue: a job of the higher-tier partition needs every
// CPU of the node the chain trains on, and Slurm (PreemptMode=REQUEUE)
// requeues the chain's job. Its rerun, once the urgent job is done, reuses
// the pending successor instead of submitting a second one, never trains
// beside another job of the chain, and ends the chain with the finished
// flag; the successor never runs.
func TestPreemptionRequeueOneTraining(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rc := startRequeueChain(t, c)
	work, a := rc.work, rc.first
	nodeOut, err := c.Run(ctx, "squeue", "-h", "-j", a, "-o", "%N")
	node := strings.TrimSpace(nodeOut)
	if err != nil || node == "" {
		t.Fatalf("the node of job %s: %q %v", a, nodeOut, err)
	}
	urgentOut, err := c.Run(ctx, "sbatch", "--parsable", "-p", UrgentPartition, "-w", node, "--exclusive",
		"-o", filepath.Join(work, "urgent.out"), "--wrap", "sleep 3")
	if err != nil {
		t.Fatalf("sbatch the urgent job: %v: %s", err, urgentOut)
	}
	urgent := strings.TrimSpace(urgentOut)
	t.Cleanup(func() { _, _ = c.Run(context.Background(), "scancel", urgent) })
	waitFor(t, time.Minute, "the chain's job to be preempted", func() bool { return logHas(work, "end "+a+" 0 ") })
	waitFor(t, 2*time.Minute, "the preempted job to train again after the urgent one", func() bool { return logHas(work, "start "+a+" 1 ") })
	rc.rerunReusedSuccessor(t)
	if st := jobState(ctx, c, urgent); st != "" {
		t.Errorf("the urgent job %s is %q while the preempted job trains again, want it done", urgent, st)
	}
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rc.end(ctx, t, []string{a + " 0", a + " 1"}, []string{"finished", "never_ran"},
		"the preempted job's rerun wrote the flag; its one successor never ran")
	// Slurm's own record says preempted, not requeued by hand.
	if log := readFile(t, filepath.Join(c.Dir, "log", "slurmctld.log")); !strings.Contains(log, "preempted") {
		t.Errorf("slurmctld.log does not mention a preemption")
	}
}

// TestSecondJobOfAChainRefusesToTrain: a job of the chain that starts
// while another of its jobs trains (here the chain's wrapper submitted by
// hand) refuses at once with a verdict naming the training job, submits
// no successor and exits 0; the chain goes on.
func TestSecondJobOfAChainRefusesToTrain(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(trainingScript(work))
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, script)
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	a, _ := waitFirstTraining(t, ch, work)
	sb := ch.c.Command(ctx, "sbatch", "--parsable", filepath.Join(ch.dir, resumer.WrapperFile))
	sb.Env = ch.env()
	o, err := sb.Output()
	if err != nil {
		t.Fatalf("sbatch the wrapper: %v", err)
	}
	x := strings.TrimSpace(string(o))
	waitFor(t, time.Minute, "the second job to end", func() bool {
		st, err := resumer.LoadState(ch.dir)
		return err == nil && st.Job(x) != nil && st.Job(x).Outcome != "" && jobState(ctx, c, x) == ""
	})
	if t.Failed() {
		t.FailNow()
	}
	st := ch.state()
	xj := st.Job(x)
	if xj.Outcome != resumer.Refused || !strings.Contains(xj.Reason, "another job of this chain is training: job "+a) {
		t.Errorf("job %s: %s (%s), want refused naming job %s", x, xj.Outcome, xj.Reason, a)
	}
	if xj.Successor != "" || len(st.Jobs) != 3 {
		t.Errorf("job %s submitted successor %q; the chain has %d jobs, want 3 (job 1, its successor, the refused one)", x, xj.Successor, len(st.Jobs))
	}
	rec, err := resumer.Scheduler{Env: c.Env()}.Job(ctx, x)
	if err != nil || rec.State != "COMPLETED" || rec.ExitCode != 0 {
		t.Errorf("refused job in Slurm: %+v %v, want COMPLETED 0", rec, err)
	}
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ch.waitRun(ctx, cmd, out)
	started, overlap := trainings(t, work)
	if overlap != "" {
		t.Error(overlap)
	}
	if !slices.Equal(started, []string{a + " 0"}) {
		t.Errorf("trainings %v, want only job %s's", started, a)
	}
	if v := ch.status(ctx); v.Status != resumer.Done || v.Jobs[0].Outcome != resumer.Finished {
		t.Errorf("chain %s, job 1 %s; want done, finished by job 1", v.Status, v.Jobs[0].Outcome)
	}
}

// TestTwoResumerRunsOneChain: two `ft-resumer run` started at once on one
// chain directory: one starts the chain, the other picks it up (the chain
// lock); one job trains, one successor is pending, and both follow the
// chain to its end.
func TestTwoResumerRunsOneChain(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(trainingScript(work))
	cmd1, out1 := ch.startResumer("run", "--chain-dir", ch.dir, script)
	cmd2, out2 := ch.startResumer("run", "--chain-dir", ch.dir, script)
	defer func() {
		for _, cmd := range []*exec.Cmd{cmd1, cmd2} {
			if cmd.ProcessState == nil {
				cmd.Process.Kill()
				cmd.Wait()
			}
		}
	}()
	a, _ := waitFirstTraining(t, ch, work)
	time.Sleep(2 * time.Second) // both followers reconcile a few times meanwhile
	if st := ch.state(); len(st.Jobs) != 2 {
		t.Errorf("%d jobs while job 1 trains, want 2 (it and its successor)", len(st.Jobs))
	}
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ch.waitRun(ctx, cmd1, out1)
	ch.waitRun(ctx, cmd2, out2)
	if !strings.Contains(out1.String()+out2.String(), "picking up the chain") {
		t.Errorf("neither run says it picked the chain up:\n%s\n%s", out1, out2)
	}
	started, overlap := trainings(t, work)
	if overlap != "" || !slices.Equal(started, []string{a + " 0"}) {
		t.Errorf("trainings %v %s, want only job %s's", started, overlap, a)
	}
	if got := outcomes(ch.status(ctx)); !slices.Equal(got, []string{"finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [finished never_ran]", got)
	}
}

// TestRequeuedFailedJobDoesNotTrainBesideItsSuccessor: a --requeue job that
// failed, whose successor now trains, is requeued by hand (`scontrol
// requeue` of a finished job). The chain judged it already and went on:
// its rerun does not run the script, says why, submits nothing, and exits
// 75 so that a successor still pending would run.
func TestRequeuedFailedJobDoesNotTrainBesideItsSuccessor(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	script := ch.script(strings.Replace(trainingScript(work), "for i in", `[ "$FT_RESUMER_JOB_INDEX" = 0 ] && exit 1
for i in`, 1))
	cmd, out := ch.startResumer("run", "--chain-dir", ch.dir, script, "--", "--requeue")
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	var a, b string
	waitFor(t, time.Minute, "job 1 to fail and its successor to train", func() bool {
		st, err := resumer.LoadState(ch.dir)
		if err != nil || len(st.Jobs) < 2 || st.Jobs[0].Outcome != resumer.Failure {
			return false
		}
		a, b = st.Jobs[0].ID, st.Jobs[1].ID
		return logHas(work, "start "+b+" 0 ")
	})
	if t.Failed() {
		t.FailNow()
	}
	if _, err := c.Run(ctx, "scontrol", "requeue", a); err != nil {
		t.Fatal(err)
	}
	var aj *resumer.ChainJob
	waitFor(t, 90*time.Second, "the requeued job to run again and end", func() bool {
		st, err := resumer.LoadState(ch.dir)
		if err != nil {
			return false
		}
		aj = st.Job(a)
		return aj.Restarts == 1 && aj.NotRun != "" && jobState(ctx, c, a) == ""
	})
	if t.Failed() {
		t.FailNow()
	}
	if !strings.Contains(aj.NotRun, "requeued run 1 of a job already judged failure") || aj.Outcome != resumer.Failure {
		t.Errorf("job %s: %s, not run: %q; want the failure kept and the rerun refused", a, aj.Outcome, aj.NotRun)
	}
	rec, err := resumer.Scheduler{Env: c.Env()}.Job(ctx, a)
	if err != nil || rec.ExitCode != resumer.ExitContinue {
		t.Errorf("requeued run in Slurm: %+v %v, want exit %d (a pending successor would run)", rec, err, resumer.ExitContinue)
	}
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ch.waitRun(ctx, cmd, out)
	started, overlap := trainings(t, work)
	if overlap != "" || !slices.Equal(started, []string{a + " 0", b + " 0"}) {
		t.Errorf("trainings %v %s, want [%s 0, %s 0]: the rerun must not train", started, overlap, a, b)
	}
	if got := outcomes(ch.status(ctx)); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure finished never_ran] (no job added by the rerun)", got)
	}
}
