package integration

import (
	"path/filepath"
	"testing"
	"time"
)

// The default clocks (docs/timeouts.md, "With no timeout configured"): no
// --ft-*-timeout flag and no config file in any of these jobs.

// defaultHangBound is the documented bound of a hang's detection by the
// default step clock after its learning: the 60 s floor (5 x these jobs'
// longest step is less), the 2 s activity check, and slack for a loaded
// machine.
const defaultHangBound = 60*time.Second + 2*time.Second + 20*time.Second

// checkDefaultHang asserts that the job's first rank_hang is rank's, in
// round 0, by the default heartbeat clock, declared within
// defaultHangBound of the rank's last heartbeat.
func checkDefaultHang(t *testing.T, j *job, rank int) {
	t.Helper()
	hangs := j.eventsOf("rank_hang")
	if len(hangs) == 0 {
		t.Fatalf("no rank_hang event\n%s", j.stderr.String())
	}
	found := false
	for _, h := range hangs {
		if h["round"] != float64(0) || h["timeout_kind"] != "heartbeat" || h["default_timeout"] != true {
			t.Fatalf("rank_hang %v, want a default heartbeat clock in round 0", h)
		}
		el, _ := h["elapsed_s"].(float64)
		if el < 60 || el > defaultHangBound.Seconds() {
			t.Fatalf("rank_hang %v: silent %.1f s when declared, want 60 s to %v", h, el, defaultHangBound)
		}
		found = found || h["rank"] == float64(rank)
	}
	if !found {
		t.Fatalf("rank_hang events %v name no rank %d", hangs, rank)
	}
	if len(j.eventsOf("restart")) == 0 {
		t.Fatal("no restart after the hang")
	}
}

// TestDefaultClocksCatchAHangInTheFirstRun: 2 torch gloo ranks under
// --restart-mode in-process heartbeat with ctx.step(); rank 1 hangs at step
// 40 and rank 0 waits for it in the next all_reduce. With the defaults the
// hang is detected within defaultHangBound, the ranks are restarted, and
// the job finishes.
func TestDefaultClocksCatchAHangInTheFirstRun(t *testing.T) {
	skipShort(t)
	t.Parallel()
	j := newJob(t)
	args := []string{"--standalone", "--nproc-per-node", "2", "--restart-mode", "in-process", "--max-restarts", "2",
		inprocessScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", filepath.Join(j.dir, "w.json"),
		"--steps", "60", "--hang-at-step", "40", "--hang-rank", "1", "--hang-quiet-steps", "0"}
	if code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython}, args...); code != 0 {
		t.Fatalf("exit %d, want 0 after the hang's restart\n%s", code, j.stderr.String())
	}
	checkDefaultHang(t, j, 1)
	if len(j.eventsOf("job_succeeded")) != 1 {
		t.Fatal("the job did not finish after the restart")
	}
}

// TestDefaultClocksCatchAnNvrxHang: the same for a rank that speaks nvrx's
// protocol (RankMonitorClient of nvrx v0.6) and only heartbeats.
func TestDefaultClocksCatchAnNvrxHang(t *testing.T) {
	skipShort(t)
	t.Parallel()
	worker, _ := filepath.Abs("testdata/nvrx_worker.py")
	j := newJob(t)
	code := j.run(4*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--max-restarts", "1", worker, "hang20")
	if code != 0 {
		t.Fatalf("exit %d, want 0 after one restart\n%s", code, j.stderr.String())
	}
	checkDefaultHang(t, j, 1)
}

// TestDefaultClocksSpareSlowPhases: a 30 s first step and a 20 s save,
// each idle, with the defaults: no hang and no restart, for ranks that
// announce the save as a section, for ranks of the Python client that only
// heartbeat, and for nvrx ranks that only heartbeat.
func TestDefaultClocksSpareSlowPhases(t *testing.T) {
	skipShort(t)
	t.Parallel()
	native, _ := filepath.Abs("testdata/slow_phases_worker.py")
	nvrx, _ := filepath.Abs("testdata/nvrx_worker.py")
	for _, tc := range []struct {
		name string
		rank []string
	}{
		{"python client, save in a section", []string{native, "--sections"}},
		{"python client, heartbeats only", []string{native}},
		{"nvrx client, heartbeats only", []string{nvrx, "slow", "30", "20"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			args := append([]string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1"}, tc.rank...)
			if code := j.run(4*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, args...); code != 0 {
				t.Fatalf("exit %d\n%s", code, j.stderr.String())
			}
			if h, r := j.eventsOf("rank_hang"), j.eventsOf("restart"); len(h) != 0 || len(r) != 0 {
				t.Fatalf("rank_hang %v, restart %v: want none", h, r)
			}
			if len(j.eventsOf("job_succeeded")) != 1 {
				t.Fatal("the job did not succeed")
			}
		})
	}
}
