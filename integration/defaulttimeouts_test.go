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

// checkDefaultHang asserts that the job's rank_hang events are in round
// 0, by the default heartbeat clock, declared within defaultHangBound of
// the rank's last heartbeat, one of them rank's, and that a restart
// followed.
func checkDefaultHang(t *testing.T, name string, j *job, rank int) {
	t.Helper()
	hangs := j.eventsOf("rank_hang")
	if len(hangs) == 0 {
		t.Errorf("%s: no rank_hang event\n%s", name, j.stderr.String())
		return
	}
	found := false
	for _, h := range hangs {
		if h["round"] != float64(0) || h["timeout_kind"] != "heartbeat" || h["default_timeout"] != true {
			t.Errorf("%s: rank_hang %v, want a default heartbeat clock in round 0", name, h)
		}
		el, _ := h["elapsed_s"].(float64)
		if el < 60 || el > defaultHangBound.Seconds() {
			t.Errorf("%s: rank_hang %v: silent %.1f s when declared, want 60 s to %v", name, h, el, defaultHangBound)
		}
		found = found || h["rank"] == float64(rank)
	}
	if !found {
		t.Errorf("%s: rank_hang events %v name no rank %d", name, hangs, rank)
	}
	if len(j.eventsOf("restart")) == 0 {
		t.Errorf("%s: no restart after the hang", name)
	}
}

// TestDefaultClocks runs five jobs side by side (their ranks mostly wait,
// so they share the machine as one test instead of five in turn):
//
//   - catches a hang in the first run: 2 torch gloo ranks under
//     --restart-mode in-process heartbeat with ctx.step(); rank 1 hangs at
//     step 40 and rank 0 waits for it in the next all_reduce. The hang is
//     detected within defaultHangBound, the ranks are restarted, the job
//     finishes;
//   - catches an nvrx hang: the same for ranks that speak nvrx's protocol
//     (RankMonitorClient of nvrx v0.6) and only heartbeat;
//   - spares slow phases: a 30 s first step and a 20 s save, each idle, for
//     ranks that announce the save as a section, for ranks of the Python
//     client that only heartbeat, and for nvrx ranks that only heartbeat:
//     no hang and no restart.
func TestDefaultClocks(t *testing.T) {
	skipShort(t)
	native, _ := filepath.Abs("testdata/slow_phases_worker.py")
	nvrx, _ := filepath.Abs("testdata/nvrx_worker.py")
	type run struct {
		name string
		args []string
		hang bool // the job must see rank 1 hang, and finish after a restart
		j    *job
	}
	ipDir := t.TempDir()
	runs := []*run{
		{name: "torch ranks in process mode, rank 1 hangs at step 40", hang: true, args: []string{"--standalone", "--nproc-per-node", "2",
			"--restart-mode", "in-process", "--max-restarts", "2", inprocessScript(t), "--ckpt-dir", filepath.Join(ipDir, "ckpt"),
			"--out", filepath.Join(ipDir, "w.json"), "--steps", "60", "--hang-at-step", "40", "--hang-rank", "1", "--hang-quiet-steps", "0"}},
		{name: "nvrx ranks, rank 1 stops heartbeating", hang: true, args: []string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", nvrx, "hang20"}},
		{name: "python client, save in a section", args: []string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", native, "--sections"}},
		{name: "python client, heartbeats only", args: []string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", native}},
		{name: "nvrx client, heartbeats only", args: []string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", nvrx, "slow", "30", "20"}},
	}
	for _, r := range runs {
		r.j = newJob(t)
		r.j.start([]string{"PYTHON_EXEC=" + debianPython}, r.args...)
	}
	for _, r := range runs {
		code := r.j.wait(torchTimeout)
		if code != 0 {
			t.Errorf("%s: exit %d, want 0\n%s", r.name, code, r.j.stderr.String())
			continue
		}
		if r.hang {
			checkDefaultHang(t, r.name, r.j, 1)
		} else if h, rs := r.j.eventsOf("rank_hang"), r.j.eventsOf("restart"); len(h) != 0 || len(rs) != 0 {
			t.Errorf("%s: rank_hang %v, restart %v: want none", r.name, h, rs)
		}
		if len(r.j.eventsOf("job_succeeded")) != 1 {
			t.Errorf("%s: the job did not succeed", r.name)
		}
	}
}
