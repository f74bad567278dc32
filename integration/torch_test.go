package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// These tests train a real small DDP model (Debian's python3-torch, gloo on
// CPU) under ft-launcher. /usr/bin/python3 is Debian's interpreter: the
// python3 first on PATH may be another one without torch.
const debianPython = "/usr/bin/python3"

const torchTimeout = 5 * time.Minute

// requireTorch: scripts/test.sh installs python3-torch, so without it
// this is a broken machine: a failure under CI, a skip naming it elsewhere.
func requireTorch(t *testing.T) {
	t.Helper()
	testenv.Require(t, testenv.Torch)
}

func trainScript(t *testing.T) string {
	p, err := filepath.Abs("../examples/ddp_train.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

type weights struct {
	SHA256          string `json:"sha256"`
	ResumedFromStep int    `json:"resumed_from_step"`
	WorldSize       int    `json:"world_size"`
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
	if w.SHA256 == "" {
		t.Fatalf("final weights without a hash: %s", b)
	}
	return w
}

// reference trains once without faults; the result is shared by the tests
// that compare against it.
type referenceRun struct {
	once sync.Once
	w    weights
	err  string
}

var reference referenceRun // written once under sync.Once

const nranks = "2"

func referenceWeights(t *testing.T) weights {
	t.Helper()
	reference.once.Do(func() {
		j := newJob(t)
		out := filepath.Join(j.dir, "ref.json")
		code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython}, "--standalone",
			"--nproc-per-node", nranks, trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out)
		if code != 0 {
			reference.err = fmt.Sprintf("uninterrupted run exited %d\n%s", code, j.stderr.String())
			return
		}
		reference.w = readWeights(t, out)
	})
	if reference.err != "" {
		t.Fatal(reference.err)
	}
	return reference.w
}

func TestTorchDDPCrashResumesWithSameWeights(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	flag := filepath.Join(j.dir, "finished")
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython, "FAULT_TOL_FINISHED_FLAG_FILE=" + flag},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2",
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--crash-at-step", "25", "--crash-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	w := readWeights(t, out)
	if w.SHA256 != ref.SHA256 {
		t.Fatalf("weights after crash+resume %s differ from the uninterrupted run %s", w.SHA256, ref.SHA256)
	}
	if w.ResumedFromStep != 20 {
		t.Errorf("resumed from step %d, want 20 (last checkpoint before the crash at 25)", w.ResumedFromStep)
	}
	if n := len(j.eventsOf("restart")); n != 1 {
		t.Errorf("%d restart events, want 1", n)
	}
	if n := len(j.eventsOf("training_finished")); n != 1 {
		t.Errorf("%d training_finished events, want 1 (finished flag %s)", n, flag)
	}
}

func TestTorchDDPHangInSectionIsDetectedAndResumes(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2",
		"--ft-rank-section-timeouts", "setup:600,step:4,checkpointing:120",
		"--ft-rank-out-of-section-timeout", "none", "--ft-rank-heartbeat-timeout", "none",
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--hang-at-step", "25", "--hang-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	// Rank 1 hangs inside its step section; rank 0 then waits in the
	// all-reduce inside its own step section, so its timeout may fire too.
	hangs := j.eventsOf("rank_hang")
	sawRank1 := false
	for _, h := range hangs {
		if h["timeout_kind"] != "section" || h["section"] != "step" || h["round"] != float64(0) {
			t.Fatalf("rank_hang %v, want a 'step' section timeout in round 0", h)
		}
		if el, _ := h["elapsed_s"].(float64); el < 4 {
			t.Errorf("hang acted on after %.3fs, before the 4s timeout", el)
		}
		sawRank1 = sawRank1 || h["rank"] == float64(1)
	}
	if !sawRank1 {
		t.Fatalf("rank_hang events %v do not name the hung rank 1", hangs)
	}
	w := readWeights(t, out)
	if w.SHA256 != ref.SHA256 {
		t.Fatalf("weights after hang+resume %s differ from the uninterrupted run %s", w.SHA256, ref.SHA256)
	}
	if !strings.Contains(fmt.Sprint(j.eventsOf("restart")), "hung") {
		t.Errorf("restart reason does not say the rank hung: %v", j.eventsOf("restart"))
	}
}

// TestTorchDDPNodeLossResumesOnStandby trains across two active launchers of
// two ranks each with a third launcher on standby (--nnodes 2:3). One active
// node (not the one hosting the embedded etcd) is SIGKILLed mid-run; the
// standby takes its place in the next round, training resumes from the last
// checkpoint with the same world size, and the final weights equal those of
// an uninterrupted 4-rank run.
func TestTorchDDPNodeLossResumesOnStandby(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := uninterruptedWeights(t, "4")
	// The same scenario with the standby idle, and with a small torch job
	// as filler work on it (reclaimed when it is promoted).
	for _, tc := range []struct{ name, filler string }{{"idle standby", ""}, {"torch filler on the standby", torchFiller}} {
		t.Run(tc.name, func(t *testing.T) { torchNodeLoss(t, want, tc.filler) })
	}
}

func torchNodeLoss(t *testing.T, want weights, fill string) {
	c := newCluster(t, embeddedEndpoint(t))
	ckpt := filepath.Join(c.dir, "ckpt")
	out := filepath.Join(c.dir, "w.json")
	for i := 0; i < 3; i++ {
		args := []string{"--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "3", "--rdzv-backend", "c10d"}
		if fill != "" {
			args = append(args, "--spare-filler", fill)
		}
		c.addNode([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + c.dir}, append(args,
			trainScript(t), "--ckpt-dir", ckpt, "--out", out, "--step-sleep", "0.1")...)
	}
	// Kill an active node other than node 0 (the etcd host) once the
	// checkpoint of step 20 exists.
	waitFile(t, filepath.Join(ckpt, "ckpt_00000020.pt"), torchTimeout)
	victim := activeVictim(t, c)
	standby := 3 - victim // nodes are 0, 1, 2: the one that was neither 0 nor the victim
	if fill != "" {
		waitFor(t, torchTimeout, func() bool { return len(fillerPids(t, c.dir, standby)) > 0 })
	}
	if err := c.nodes[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		code := n.wait(torchTimeout)
		if i != victim && code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	got := readWeights(t, out)
	if got.WorldSize != 4 || got.ResumedFromStep < 20 {
		t.Fatalf("final run: world size %d, resumed from step %d; want 4 and >= 20", got.WorldSize, got.ResumedFromStep)
	}
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights after node loss %s differ from the uninterrupted run %s", got.SHA256, want.SHA256)
	}
	if len(c.nodes[standby].eventsOf("cycle_started")) == 0 {
		t.Fatalf("the standby node %d never ran ranks", standby)
	}
	if fill != "" {
		if len(c.nodes[standby].eventsOf("filler_reclaimed")) != 1 {
			t.Errorf("the standby's filler was not reclaimed once")
		}
		for _, p := range fillerPids(t, c.dir, standby) {
			if pidAlive(p) {
				t.Errorf("filler process %d is alive", p)
			}
		}
	}
}
