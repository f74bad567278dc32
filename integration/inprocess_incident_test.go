package integration

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
)

// One incident, one restart (docs/inprocess.md): ranks killed together are
// all replaced and none is kept as a survivor; a survivor that never
// rejoins is replaced within the round without failing the healthy ones.
// Real torch 1.13 gloo DDP ranks of examples/ddp_train_inprocess.py.

// TestInProcessTwoKilledAtOnce: a 4-rank job; local ranks 1 and 2 are
// SIGKILLed back to back (kill -9 of two pids) once the step-20
// checkpoint exists. Both are replaced, ranks 0 and 3 keep their
// processes and rejoin, the job spends exactly one restart (no fallback)
// and ends with the uninterrupted run's weights.
func TestInProcessTwoKilledAtOnce(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := uninterruptedWeights(t, "4")
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	ckpt := filepath.Join(j.dir, "ckpt")
	verdictPath := filepath.Join(j.dir, "verdict.json")
	j.start([]string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--restart-mode", "in-process",
		"--verdict-file", verdictPath, "--nproc-per-node", "4", "--max-restarts", "3",
		inprocessScript(t), "--ckpt-dir", ckpt, "--out", out, "--step-sleep", "0.3")
	waitFile(t, filepath.Join(ckpt, "ckpt_00000020.pt"), torchTimeout)
	pids := cyclePIDs(t, j)[0]
	if len(pids) != 4 {
		t.Fatalf("round 0 pids %v, want 4", pids)
	}
	killed := time.Now()
	for _, lr := range []int{1, 2} {
		if err := syscall.Kill(pids[lr], syscall.SIGKILL); err != nil {
			t.Fatalf("kill local rank %d (pid %d): %v", lr, pids[lr], err)
		}
	}
	if code := j.wait(torchTimeout); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	if left := j.waitNoLeftovers(5 * time.Second); len(left) > 0 {
		t.Fatalf("left behind: %s", hangdump.Describe(left))
	}
	if m := restartModes(j); !slices.Equal(m, []string{"in-process"}) {
		t.Fatalf("restart modes %v, want one in-process restart\n%s", m, j.stderr.String())
	}
	if fb := j.eventsOf("inprocess_fallback"); len(fb) != 0 {
		t.Fatalf("inprocess_fallback events %v, want none", fb)
	}
	kept := j.eventsOf("inprocess_kept")
	if len(kept) != 1 || fmt.Sprint(kept[0]["survivors"]) != "[0 3]" || fmt.Sprint(kept[0]["failed"]) != "[1 2]" {
		t.Fatalf("inprocess_kept %v, want survivors [0 3] and failed [1 2]", kept)
	}
	notified := map[float64]bool{}
	for _, n := range j.eventsOf("inprocess_notice") {
		notified[n["local_rank"].(float64)] = true
	}
	if len(notified) != 2 || !notified[0] || !notified[3] {
		t.Fatalf("notices to local ranks %v, want 0 and 3 only", notified)
	}
	if n := len(j.eventsOf("inprocess_first_step")); n != 2 {
		t.Fatalf("%d first-step reports, want the two survivors'", n)
	}
	round1 := cyclePIDs(t, j)[1]
	for lr := range 4 {
		if same := round1[lr] == pids[lr]; same != (lr == 0 || lr == 3) {
			t.Fatalf("round 0 pids %v, round 1 pids %v: only local ranks 1 and 2 should be new processes", pids, round1)
		}
	}
	v := readVerdict(t, verdictPath)
	if v.RestartsUsed != 1 || len(v.Cycles) != 2 || v.Cycles[1].Mode != "in-process" || v.Cycles[1].InProcessFallback != "" {
		t.Fatalf("verdict restarts_used %d, cycles %+v; want one in-process restart", v.RestartsUsed, v.Cycles)
	}
	if got := readWeights(t, out); got.SHA256 != want.SHA256 || got.WorldSize != 4 {
		t.Fatalf("weights %s world %d, want %s world 4", got.SHA256, got.WorldSize, want.SHA256)
	}
	if fs := j.eventsOf("inprocess_first_step"); len(fs) > 0 {
		// For docs/benchmarks.md: kill -> the survivors' first step.
		for _, f := range fs {
			t.Logf("local rank %v: since_failure_s %.3f (teardown %.3f rejoin %.3f restore %.3f first_step %.3f)",
				f["local_rank"], f["since_failure_s"], f["teardown_s"], f["rejoin_s"], f["restore_s"], f["first_step_s"])
		}
		t.Logf("in-process phases (verdict, ms): %v; kill at %s", v.Cycles[1].InProcessMS, killed.Format(time.RFC3339Nano))
	}
}

// TestInProcessStuckSurvivor: rank 1 crashes at step 25 and the survivor
// at local rank stuck ignores the restart notice (it swallows the failed
// collective and sleeps, never opening its new monitor session). At the
// rejoin bound the launcher kills it and starts a replacement within the
// round; the survivors that opened their session wait for it and rejoin
// (the bound starts again); nothing falls back to the full restart, one
// restart is spent, and the weights are the uninterrupted run's.
func TestInProcessStuckSurvivor(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	for _, tc := range []struct{ ranks, stuck int }{{2, 0}, {4, 2}} {
		t.Run(fmt.Sprintf("%d ranks, local rank %d stuck", tc.ranks, tc.stuck), func(t *testing.T) {
			want := uninterruptedWeights(t, strconv.Itoa(tc.ranks))
			const bound = 20 * time.Second
			j, got := runInProcess(t, []string{"--nproc-per-node", strconv.Itoa(tc.ranks), "--max-restarts", "3",
				"--inprocess-rejoin-timeout", strconv.Itoa(int(bound.Seconds()))},
				inprocessScript(t), "--crash-at-step", "25", "--crash-rank", "1", "--stuck-rank", strconv.Itoa(tc.stuck))
			requireOneInProcessRestart(t, j, got, want)
			replaced := map[float64]map[string]any{}
			for _, r := range j.eventsOf("inprocess_replaced") {
				if r["why"] == "rejoin_timeout" {
					replaced[r["local_rank"].(float64)] = r
				}
			}
			r, ok := replaced[float64(tc.stuck)]
			if !ok {
				t.Fatalf("inprocess_replaced %v, want the stuck local rank %d", j.eventsOf("inprocess_replaced"), tc.stuck)
			}
			// Replaced at the bound after its notice: not before, not much after.
			var notice map[string]any
			for _, n := range j.eventsOf("inprocess_notice") {
				if n["local_rank"] == float64(tc.stuck) {
					notice = n
				}
			}
			if notice == nil {
				t.Fatalf("no notice to local rank %d", tc.stuck)
			}
			sent, err1 := time.Parse(time.RFC3339Nano, notice["ts"].(string))
			at, err2 := time.Parse(time.RFC3339Nano, r["ts"].(string))
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			if d := at.Sub(sent); d < bound || d > bound+15*time.Second {
				t.Fatalf("replaced %s after its notice, want at the %s bound", d, bound)
			}
			// Every other survivor took its first step of round 1 in its
			// own process: none was failed by the stuck one.
			steps := map[float64]bool{}
			for _, f := range j.eventsOf("inprocess_first_step") {
				steps[f["local_rank"].(float64)] = true
			}
			for lr := range tc.ranks {
				if lr == 1 || lr == tc.stuck {
					continue
				}
				if _, gone := replaced[float64(lr)]; gone {
					t.Logf("local rank %d was blocked in a collective on the stuck rank and was replaced with it", lr)
					continue
				}
				if !steps[float64(lr)] {
					t.Fatalf("survivor %d took no first step of round 1 (first steps %v, replaced %v)", lr, steps, replaced)
				}
			}
			if tc.ranks == 4 && len(steps) == 0 {
				t.Fatalf("no survivor rejoined")
			}
		})
	}
}

// TestInProcessStoppedSurvivor: local rank 2 is frozen by a SIGSTOP at step
// 25 (the fault campaign's hang), then rank 1 crashes. Rank 2 is not a
// crash and has not exited, so it would be kept as a survivor, and being
// stopped it would not take its notice until the rejoin bound (60 s here).
// The launcher sees that its process is stopped (state T) when the round
// begins, kills it and starts it afresh with the crashed rank
// (inprocess_replaced, why "stopped"); rank 0 stays and rejoins. One
// in-process restart, no fallback, and the uninterrupted run's weights.
func TestInProcessStoppedSurvivor(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := uninterruptedWeights(t, "3")
	j, got := runInProcess(t, []string{"--nproc-per-node", "3", "--max-restarts", "3", "--inprocess-rejoin-timeout", "60"},
		inprocessScript(t), "--crash-at-step", "25", "--crash-rank", "1", "--stopped-rank", "2")
	requireOneInProcessRestart(t, j, got, want)
	var stopped []map[string]any
	for _, r := range j.eventsOf("inprocess_replaced") {
		if r["why"] == "rejoin_timeout" {
			t.Fatalf("inprocess_replaced %v: the stopped rank waited for the rejoin bound", r)
		}
		if r["why"] == "stopped" {
			stopped = append(stopped, r)
		}
	}
	if len(stopped) != 1 || stopped[0]["local_rank"] != float64(2) {
		t.Fatalf("inprocess_replaced with why stopped: %v, want one for local rank 2 (all: %v)", stopped, j.eventsOf("inprocess_replaced"))
	}
}

// requireOneInProcessRestart fails the test unless the job ended with the
// uninterrupted run's weights after exactly one in-process restart that
// did not fall back to the full restart.
func requireOneInProcessRestart(t *testing.T, j *job, got, want weights) {
	t.Helper()
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
	}
	if m := restartModes(j); !slices.Equal(m, []string{"in-process"}) {
		t.Fatalf("restart modes %v, want one in-process restart", m)
	}
	if fb := j.eventsOf("inprocess_fallback"); len(fb) != 0 {
		t.Fatalf("inprocess_fallback events %v, want none", fb)
	}
}
