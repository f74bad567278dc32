package slurmtest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/report"
	"github.com/ftlauncher/ft-launcher/report/reporttest"
)

// weights is the final summary examples/ddp_train.py writes.
type weights struct {
	SHA256          string `json:"sha256"`
	Steps           int    `json:"steps"`
	WorldSize       int    `json:"world_size"`
	ResumedFromStep int    `json:"resumed_from_step"`
}

func readWeights(t *testing.T, path string) weights {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("final weights: %v", err)
	}
	var w weights
	if err := json.Unmarshal(b, &w); err != nil {
		t.Fatalf("final weights %s: %v", b, err)
	}
	return w
}

// TestAutoResumeDDPSameWeights: the example DDP training on two nodes
// (2 x 2 ranks) under the minimal srun line, driven by ft-resumer. The
// first job's rank crashes at step 12 with no restart budget, so the job
// fails without the finished flag; the chain submits the next job, which
// resumes from the step-10 checkpoint, finishes and writes the flag. The
// final weights equal those of an uninterrupted 4-rank run.
func TestAutoResumeDDPSameWeights(t *testing.T) {
	skipShort(t)
	c := need(t)
	testenv.Require(t, testenv.Torch)
	ctx, cancel := runclock.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	train := filepath.Join(repoRoot, "examples", "ddp_train.py")

	ref := t.TempDir()
	refCmd := exec.CommandContext(ctx, filepath.Join(binDir, "ft-launcher"), "--standalone", "--nproc-per-node", "4",
		"--log-dir", filepath.Join(ref, "logs"), train, "--steps", "20", "--ckpt-every", "5",
		"--ckpt-dir", filepath.Join(ref, "ckpt"), "--out", filepath.Join(ref, "w.json"))
	refCmd.Env = append(os.Environ(), "PYTHON_EXEC=/usr/bin/python3")
	if out, err := refCmd.CombinedOutput(); err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, tail(out, 4000))
	}
	want := readWeights(t, filepath.Join(ref, "w.json"))

	ch := newChain(t, c)
	work := filepath.Dir(ch.dir)
	ckpt, out := filepath.Join(work, "ckpt"), filepath.Join(work, "w.json")
	events := filepath.Join(work, "events.jsonl") // every launcher of every job appends to it
	script := ch.script(fmt.Sprintf(`#SBATCH -N2
export PYTHON_EXEC=/usr/bin/python3 PET_EVENT_LOG=%s
srun --kill-on-bad-exit=1 ft-resumer node -- ft-launcher --nproc-per-node 2 --max-restarts 0 %s \
  --steps 20 --ckpt-every 5 --ckpt-dir %s --out %s --crash-at-step 12 --crash-rank 1
`, events, train, ckpt, out))
	code, stdout, stderr := ch.resumer(ctx, "run", "--chain-dir", ch.dir, "--max-subsequent-job-failures", "1", script)
	if code != 0 {
		t.Fatalf("ft-resumer run = %d\n%s\n%s\n%s", code, stdout, stderr, ch.logs())
	}
	v := ch.status(ctx)
	if got := outcomes(v); !slices.Equal(got, []string{"failure", "finished", "never_ran"}) {
		t.Errorf("outcomes %v, want [failure finished never_ran]\n%s", got, ch.logs())
	}
	if j := v.Jobs[0]; len(j.Verdicts) != 2 || j.Verdicts[0].Kind != "restart_budget_exhausted" {
		t.Errorf("job 1 verdicts %+v, want restart_budget_exhausted from both nodes", j.Verdicts)
	}
	got := readWeights(t, out)
	if got.WorldSize != 4 || got.Steps != 20 || got.ResumedFromStep != 10 {
		t.Fatalf("final run: %+v, want 20 steps, world size 4, resumed from step 10", got)
	}
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights after the auto-resume %s differ from the uninterrupted run %s", got.SHA256, want.SHA256)
	}
	if live := ch.live(ctx); len(live) > 0 {
		t.Errorf("jobs still pending or running after the chain ended: %v", live)
	}
	checkChainReport(ctx, t, ch, events)
}

// checkChainReport: ft-resumer report across the chain's jobs (chain.json,
// the jobs' verdicts, the shared event log) accounts for the time of both
// jobs and the queue between them, and shows the 4 ranks.
func checkChainReport(ctx context.Context, t *testing.T, ch *chain, events string) {
	t.Helper()
	html := filepath.Join(filepath.Dir(ch.dir), "report.html")
	code, stdout, stderr := ch.resumer(ctx, "report", "--chain-dir", ch.dir, "--event-log", events, "--json", "-o", html)
	if code != 0 {
		t.Fatalf("ft-resumer report = %d\n%s", code, stderr)
	}
	var r report.Report
	if err := json.Unmarshal([]byte(stdout), &r); err != nil {
		t.Fatalf("report JSON: %v\n%s", err, stdout)
	}
	// Each job has one round (--max-restarts 0): the chain restarts by
	// submitting the next job.
	reporttest.CheckAccount(t, r, 0)
	if len(r.Jobs) != 2 || len(r.RunIDs) != 2 || len(r.Rounds) != 2 || r.Rounds[0].End != "crash" || r.Rounds[1].End != "success" {
		t.Errorf("jobs %+v, rounds %+v: want two jobs of two runs, a crash then a success", r.Jobs, r.Rounds)
	}
	if l := r.Rounds[0].StepsLost; l == nil || *l < 2 || *l > 3 {
		t.Errorf("steps lost in job 1: %v, want 2 or 3 (crash before step 12, checkpoint after step 10)", l)
	}
	if r.PhasesS[report.Queue] <= 0 || r.PhasesS[report.Recompute] <= 0 {
		t.Errorf("queue %.3fs, recompute %.3fs: want both > 0", r.PhasesS[report.Queue], r.PhasesS[report.Recompute])
	}
	reporttest.CheckHTMLInChromium(t, html, 4)
}

// TestScancelMultiNodeLeavesNothing: scancel of a running two-node job
// under the minimal srun line (one launcher hosting the embedded etcd)
// leaves no process and no etcd data dir behind (launchJob.cleanup checks).
func TestScancelMultiNodeLeavesNothing(t *testing.T) {
	skipShort(t)
	c := need(t)
	ctx, cancel := runclock.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := newLaunchJob(t, c)
	started := filepath.Join(j.work, "started")
	rank := filepath.Join(j.work, "rank.sh")
	if err := os.WriteFile(rank, []byte(fmt.Sprintf("#!/bin/bash\nsleep 1000 &\nsetsid sleep 1000 &\necho x >> %q\nwait\n", started)), 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(j.work, "job.sh")
	body := fmt.Sprintf("#!/bin/bash\n#SBATCH -N2 -o %s/slurm-%%j.out\nsrun ft-launcher --nproc-per-node 1 --no-python %s\n", j.work, rank)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := c.Command(ctx, "sbatch", "--parsable", script)
	cmd.Env = append(cmd.Env, "PATH="+binDir+":"+os.Getenv("PATH"), "FTL_LAUNCH_MARKER="+j.marker,
		"TMPDIR="+filepath.Join(j.work, "tmp"))
	outb, err := cmd.Output()
	id, _, _ := strings.Cut(strings.TrimSpace(string(outb)), ";")
	if err != nil || id == "" {
		t.Fatalf("sbatch: %v: %s", err, outb)
	}
	j.ids = append(j.ids, id)
	waitFor(t, 2*time.Minute, "both ranks to start", func() bool {
		b, _ := os.ReadFile(started)
		return strings.Count(string(b), "x") >= 2
	})
	if etcd, _ := filepath.Glob(filepath.Join(j.work, "tmp", "ft-launcher-etcd-*")); len(etcd) == 0 {
		t.Fatalf("no embedded etcd data dir in the job's TMPDIR while it runs\n%s", j.logs())
	}
	if _, err := c.Run(ctx, "scancel", id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the job to leave Slurm", func() bool {
		out, _ := c.Run(ctx, "squeue", "-h", "-j", id, "-o", "%T")
		return out == ""
	})
	j.ids = nil // cancelled: cleanup only checks what is left
}
