package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run ranks on prewarmed standby interpreters (--prewarm):
// the DDP example restarted warm ends with the weights of an uninterrupted
// cold run; a script sees what it sees cold; broken standbys fall back.

const torchModules = "torch,torch.distributed"

// waitEvents waits until the event log has n events of kind.
func (j *job) waitEvents(kind string, n int, timeout time.Duration) []map[string]any {
	j.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(j.events); err == nil {
			if evs := j.eventsOf(kind); len(evs) >= n {
				return evs
			}
		}
		select {
		case <-j.done:
			j.t.Fatalf("launcher exited before %d %s events\n%s", n, kind, j.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			j.t.Fatalf("fewer than %d %s events within %s\n%s", n, kind, timeout, j.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// warmRounds maps round -> local ranks started on standbys.
func (j *job) warmRounds() map[string][]float64 {
	out := map[string][]float64{}
	for _, e := range j.eventsOf("prewarm_started") {
		for _, lr := range e["local_ranks"].([]any) {
			out[fmt.Sprint(e["round"])] = append(out[fmt.Sprint(e["round"])], lr.(float64))
		}
	}
	return out
}

func requireWarmRestart(t *testing.T, j *job) {
	t.Helper()
	if got := j.warmRounds()["1"]; len(got) != 2 {
		t.Fatalf("round 1 started warm on local ranks %v, want both; fallbacks: %v", got, j.eventsOf("prewarm_fallback"))
	}
}

func TestPrewarmTorchDDPCrashResumesWithSameWeights(t *testing.T) {
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	// The step sleep leaves the standbys time to import torch before the crash.
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2", "--prewarm", torchModules,
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--crash-at-step", "25", "--crash-rank", "1", "--step-sleep", "0.4")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	requireWarmRestart(t, j)
	w := readWeights(t, out)
	if w.SHA256 != ref.SHA256 {
		t.Fatalf("weights after a warm restart %s differ from the uninterrupted cold run %s", w.SHA256, ref.SHA256)
	}
	if w.ResumedFromStep != 20 {
		t.Errorf("resumed from step %d, want 20", w.ResumedFromStep)
	}
	if n := len(j.eventsOf("restart")); n != 1 {
		t.Errorf("%d restart events, want 1", n)
	}
}

func TestPrewarmTorchDDPHangInSectionResumesWithSameWeights(t *testing.T) {
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2", "--prewarm", torchModules,
		"--ft-rank-section-timeouts", "setup:600,step:4,checkpointing:120",
		"--ft-rank-out-of-section-timeout", "none", "--ft-rank-heartbeat-timeout", "none",
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--hang-at-step", "25", "--hang-rank", "1", "--step-sleep", "0.3")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	sawRank1 := false
	for _, h := range j.eventsOf("rank_hang") {
		sawRank1 = sawRank1 || (h["rank"] == float64(1) && h["section"] == "step")
	}
	if !sawRank1 {
		t.Fatalf("no 'step' section hang of rank 1: %v", j.eventsOf("rank_hang"))
	}
	requireWarmRestart(t, j)
	if w := readWeights(t, out); w.SHA256 != ref.SHA256 {
		t.Fatalf("weights after hang and warm restart %s differ from the uninterrupted cold run %s", w.SHA256, ref.SHA256)
	}
}

// prewarmRecorder writes what a rank can observe of its start to $OUT/rec-<round>-<rank>.json;
// in round 0 it waits for $OUT/go and exits 1 (so the next round restarts it).
const prewarmRecorder = `import json, os, signal, sys, time


def target(fd):
    return os.readlink("/proc/self/fd/%d" % fd)


def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return line.split()[1]


sigs = {}
for s in signal.valid_signals():
    try:
        h = signal.getsignal(s)
    except (OSError, ValueError):
        continue
    sigs[int(s)] = h if isinstance(h, int) else getattr(h, "__name__", repr(h))
rnd = os.environ["TORCHELASTIC_RESTART_COUNT"]
rec = {
    "argv": sys.argv, "orig_argv": sys.orig_argv, "path0": sys.path[0], "name": __name__,
    "file": __file__, "main": sorted(k for k in globals() if k.startswith("__")),
    "env": dict(os.environ), "cwd": os.getcwd(),
    "own_pgid": os.getpgid(0) == os.getpid(), "signals": sigs,
    "sig_ign": status("SigIgn"), "sig_blk": status("SigBlk"),
    "stdout": target(1), "stderr": target(2), "stdin": target(0),
    "stdio": [sys.stdout.write_through, sys.stdout.line_buffering, sys.stderr.errors, str(sys.flags)],
    "fds": sorted(os.listdir("/proc/self/fd")),
}
print("out", rnd, os.environ["RANK"])
print("err", rnd, os.environ["RANK"], file=sys.stderr)
with open(os.path.join(os.environ["OUT"], "rec-%s-%s.json" % (rnd, os.environ["LOCAL_RANK"])), "w") as f:
    json.dump(rec, f)
if rnd == "0":
    while not os.path.exists(os.path.join(os.environ["OUT"], "go")):
        time.sleep(0.02)
    sys.exit(1)
`

// recordRun runs the prewarmRecorder (as a script or with -m) under the launcher
// and returns round 1's records by local rank. With prewarm it starts the
// restart only once both standbys are ready; before is called then.
func recordRun(t *testing.T, module bool, prewarm string, before func(j *job)) (map[string]map[string]any, *job) {
	j := newJob(t)
	if err := os.WriteFile(filepath.Join(j.dir, "recmod.py"), []byte(prewarmRecorder), 0o644); err != nil {
		t.Fatal(err)
	}
	target := []string{filepath.Join(j.dir, "recmod.py"), "a b", "--c=1", "${local_rank}"}
	if module {
		target = []string{"-m", "recmod", "x", "${local_rank}"}
	}
	args := []string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		"--log-dir", filepath.Join(j.dir, "logs"), "--redirects", "3"}
	args = append(args, "--prewarm", prewarm) // "off": cold, also under FTL_TEST_PREWARM
	j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir}, append(args, target...)...)
	if prewarm != "off" {
		j.waitEvents("prewarm_ready", 2, time.Minute)
	}
	if before != nil {
		before(j)
	}
	if err := os.WriteFile(filepath.Join(j.dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(time.Minute); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	recs := map[string]map[string]any{}
	for _, lr := range []string{"0", "1"} {
		b, err := os.ReadFile(filepath.Join(j.dir, "rec-1-"+lr+".json"))
		if err != nil {
			t.Fatalf("round 1 record: %v\n%s", err, j.stderr.String())
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		recs[lr] = normaliseRecord(m, j)
	}
	return recs, j
}

var (
	logDirSuffix = regexp.MustCompile(`\$RUNID_[0-9]+/`)
	inode        = regexp.MustCompile(`(pipe|socket):\[[0-9]+\]`)
)

// normaliseRecord takes out what differs between any two launcher runs:
// the job's directory, its test marker, run id, ports and monitor sockets.
func normaliseRecord(m map[string]any, j *job) map[string]any {
	env := m["env"].(map[string]any)
	runID, _ := env["TORCHELASTIC_RUN_ID"].(string)
	var fix func(v any) any
	fix = func(v any) any {
		switch x := v.(type) {
		case string:
			x = strings.ReplaceAll(strings.ReplaceAll(x, j.dir, "$DIR"), j.marker, "$MARKER")
			if runID != "" {
				x = strings.ReplaceAll(x, runID, "$RUNID")
			}
			return inode.ReplaceAllString(logDirSuffix.ReplaceAllString(x, "$$RUNID_N/"), "$1:[N]")
		case []any:
			for i := range x {
				x[i] = fix(x[i])
			}
		case map[string]any:
			for k := range x {
				x[k] = fix(x[k])
			}
		}
		return v
	}
	for _, k := range []string{"MASTER_PORT", "FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET", "TORCHELASTIC_ERROR_FILE"} {
		if _, ok := env[k]; !ok {
			continue
		}
		env[k] = "<set>"
	}
	return fix(m).(map[string]any)
}

// TestPrewarmRankSeesWhatAColdRankSees compares round 1's records (argv,
// path[0], __name__, __file__, env, process group, signals, stdio) cold and
// warm, for a script and for -m.
func TestPrewarmRankSeesWhatAColdRankSees(t *testing.T) {
	for _, tc := range []struct {
		name   string
		module bool
	}{{"script", false}, {"module", true}} {
		t.Run(tc.name, func(t *testing.T) {
			cold, _ := recordRun(t, tc.module, "off", nil)
			warm, wj := recordRun(t, tc.module, "json", nil)
			if got := wj.warmRounds()["1"]; len(got) != 2 {
				t.Fatalf("round 1 warm on %v, want both local ranks", got)
			}
			for lr := range cold {
				if !reflect.DeepEqual(cold[lr], warm[lr]) {
					var d []string
					for k, v := range cold[lr] {
						if !reflect.DeepEqual(v, warm[lr][k]) {
							d = append(d, fmt.Sprintf("%s:\n  cold %v\n  warm %v", k, v, warm[lr][k]))
						}
					}
					sort.Strings(d)
					t.Errorf("local rank %s differs warm:\n%s", lr, strings.Join(d, "\n"))
				}
			}
			// What the ranks printed is in round 1's log files, as cold.
			logs, _ := filepath.Glob(filepath.Join(wj.dir, "logs", "*", "attempt_1", "*", "std*.log"))
			all := ""
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				all += string(b)
			}
			for _, want := range []string{"out 1 0", "err 1 0", "out 1 1", "err 1 1"} {
				if !strings.Contains(all, want) {
					t.Errorf("round 1 logs %v lack %q: %q", logs, want, all)
				}
			}
		})
	}
}

// TestPrewarmBrokenStandbyFallsBackCold: standbys SIGKILLed before the
// restart, or whose imports fail, leave the restart to cold starts, said
// in the log and the event log, and the job still succeeds.
func TestPrewarmBrokenStandbyFallsBackCold(t *testing.T) {
	t.Run("killed", func(t *testing.T) {
		_, j := recordRun(t, false, "json", func(j *job) {
			for _, e := range j.eventsOf("prewarm_ready") {
				pid := int(e["pid"].(float64))
				if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
					t.Fatalf("kill standby %d: %v", pid, err)
				}
			}
			time.Sleep(300 * time.Millisecond) // reaped before the restart
		})
		if w := j.warmRounds(); len(w) != 0 {
			t.Fatalf("warm starts %v after the standbys were killed", w)
		}
		fb := j.eventsOf("prewarm_fallback")
		if !strings.Contains(fmt.Sprint(fb), "killed by signal 9") {
			t.Fatalf("fallback events %v do not say the standby was killed", fb)
		}
	})
	t.Run("import fails", func(t *testing.T) {
		j := newJob(t)
		if err := os.WriteFile(filepath.Join(j.dir, "recmod.py"), []byte(prewarmRecorder), 0o644); err != nil {
			t.Fatal(err)
		}
		j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir}, "--standalone", "--nproc-per-node", "2",
			"--max-restarts", "1", "--prewarm", "json,no_such_module_ftl", filepath.Join(j.dir, "recmod.py"))
		j.waitEvents("prewarm_disabled", 1, time.Minute)
		if err := os.WriteFile(filepath.Join(j.dir, "go"), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if code := j.wait(time.Minute); code != 0 {
			t.Fatalf("exit %d\n%s", code, j.stderr.String())
		}
		if !strings.Contains(j.stderr.String(), "could not import the --prewarm modules") ||
			!strings.Contains(j.stderr.String(), "No module named 'no_such_module_ftl'") {
			t.Fatalf("no clear message about the failed import:\n%s", j.stderr.String())
		}
		if w := j.warmRounds(); len(w) != 0 {
			t.Fatalf("warm starts %v with failing imports", w)
		}
		if _, err := os.Stat(filepath.Join(j.dir, "rec-1-1.json")); err != nil {
			t.Fatalf("round 1 did not run cold: %v", err)
		}
	})
}
