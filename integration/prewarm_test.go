package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
)

// These tests run ranks on prewarmed standby interpreters (--prewarm):
// the DDP example restarted warm ends with the weights of an uninterrupted
// cold run; a script sees what it sees cold; broken standbys fall back.

const torchModules = "torch,torch.distributed"

// standbyTimeout bounds a wait for standbys to import: they import at nice
// 19, behind every busy process of a loaded machine, so beside a load-20
// burner a torch import of 2 CPU-seconds takes a minute or more
// (docs/testing.md).
const standbyTimeout = 6 * time.Minute

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
			// A standby's import at nice 19 is as slow as the machine's
			// load makes it: say what each process was doing and how much
			// CPU it got.
			j.t.Fatalf("fewer than %d %s events within %s; the job's processes:\n%s\n%s", n, kind, timeout,
				hangdump.Describe(j.leftovers()), j.stderr.String())
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

// runGatedOnStandbys runs the DDP example with --fault-gate: its ranks
// wait before the injected fault until every local rank's standby is ready,
// so that the restart is warm however loaded the machine is (standbys
// import at nice 19 and may get little CPU beside other work).
func (j *job) runGatedOnStandbys(env []string, args ...string) int {
	j.t.Helper()
	gate := filepath.Join(j.dir, "fault-gate")
	j.start(env, append(args, "--fault-gate", gate)...)
	n, _ := strconv.Atoi(nranks)
	j.waitEvents("prewarm_ready", n, torchTimeout)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		j.t.Fatal(err)
	}
	return j.wait(torchTimeout)
}

func requireWarmRestart(t *testing.T, j *job) {
	t.Helper()
	if got := j.warmRounds()["1"]; len(got) != 2 {
		t.Fatalf("round 1 started warm on local ranks %v, want both; fallbacks: %v", got, j.eventsOf("prewarm_fallback"))
	}
}

func TestPrewarmTorchDDPCrashResumesWithSameWeights(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	code := j.runGatedOnStandbys([]string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2", "--prewarm", torchModules,
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--crash-at-step", "25", "--crash-rank", "1")
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
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	code := j.runGatedOnStandbys([]string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2", "--prewarm", torchModules,
		"--ft-rank-section-timeouts", "setup:600,step:4,checkpointing:120",
		"--ft-rank-out-of-section-timeout", "none", "--ft-rank-heartbeat-timeout", "none",
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
		"--hang-at-step", "25", "--hang-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	// A 'step' section hang, of rank 1 or of rank 0: the first timer to
	// expire is the one recorded, and rank 0, blocked in rank 1's
	// collective inside its own step section, may have entered that
	// section first (seen at load 5 with a build beside the tests). Naming
	// the rank that hung is not what this test checks (docs/report.md).
	sawStep := false
	for _, h := range j.eventsOf("rank_hang") {
		sawStep = sawStep || h["section"] == "step"
	}
	if !sawStep {
		t.Fatalf("no 'step' section hang: %v", j.eventsOf("rank_hang"))
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
    "nice": os.getpriority(os.PRIO_PROCESS, 0),  # the standby imported at nice 19
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
	j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir, "XDG_STATE_HOME=" + filepath.Join(j.dir, "state")}, append(args, target...)...)
	if prewarm != "off" {
		j.waitEvents("prewarm_ready", 2, standbyTimeout)
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
	for _, k := range []string{"MASTER_PORT", "FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET", "TORCHELASTIC_ERROR_FILE", "FT_LAUNCHER_STACKS_DIR"} {
		if _, ok := env[k]; !ok {
			continue
		}
		env[k] = "<set>"
	}
	return fix(m).(map[string]any)
}

// TestPrewarmRankSeesWhatAColdRankSees compares round 1's records (argv,
// path[0], __name__, __file__, env, process group, signals, stdio) cold and
// warm, for a script and for -m, and under --prewarm auto (whose hook
// must leave no trace: PYTHONPATH, environment, fds).
func TestPrewarmRankSeesWhatAColdRankSees(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name    string
		module  bool
		prewarm string
	}{{"script", false, "json"}, {"module", true, "json"}, {"auto", false, "auto"}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.prewarm == "auto" {
				requireTorch(t) // the standbys import the built-in torch list
			}
			cold, _ := recordRun(t, tc.module, "off", nil)
			warm, wj := recordRun(t, tc.module, tc.prewarm, nil)
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
	skipShort(t)
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

// prewarmTorchRank is a real torch rank: gloo process group and one
// all_reduce, then it writes its pid to $OUT/step-<round>-<rank>; in round
// 0 it then waits for $OUT/go and exits 1 (a crash, so the next round
// restarts it).
const prewarmTorchRank = `import os, time
import torch
import torch.distributed as dist

rnd, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
assert t.item() == 3, t
with open(os.path.join(os.environ["OUT"], "step-%s-%s" % (rnd, rank)), "w") as f:
    f.write(str(os.getpid()))
if rnd == "0":
    while not os.path.exists(os.path.join(os.environ["OUT"], "go")):
        time.sleep(0.02)
    os._exit(1)
`

// TestPrewarmTorchCrashPaths: real torch ranks crash once; the restart's
// path per rank is read from the event log. Late (the standbys are ready):
// warm. Early (the standbys are still importing, made slow and
// deterministic by a --prewarm module that burns CPU until the test
// releases it): waited for (auto) or stopped (--prewarm-importing stop). The rank of round 1 is the
// standby's process exactly when the path says so, a stopped standby is
// gone, and nothing of the job outlives the launcher.
func TestPrewarmTorchCrashPaths(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	slowSrc, err := os.ReadFile(filepath.Join("..", "prewarm", "testdata", "ftl_slowimport.py"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		slow      bool
		importing string
		path      string // of both ranks in round 1; "warm": no fallback event
	}{
		{"late crash: warm", false, "auto", "warm"},
		{"early crash: waited", true, "auto", "waited"},
		{"early crash: stopped", true, "stop", "stopped"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t)
			slowDir := filepath.Join(j.dir, "slow")
			if err := os.MkdirAll(slowDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(j.dir, "ftl_slowimport.py"), slowSrc, 0o644); err != nil {
				t.Fatal(err)
			}
			script := filepath.Join(j.dir, "rank.py")
			if err := os.WriteFile(script, []byte(prewarmTorchRank), 0o644); err != nil {
				t.Fatal(err)
			}
			modules := torchModules
			if tc.slow {
				modules += ",ftl_slowimport"
			}
			j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir, "FTL_SLOW_DIR=" + slowDir},
				"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
				"--prewarm", modules, "--prewarm-importing", tc.importing, script)
			var standbys []int
			if tc.slow {
				// Both standbys are in the slow import: crash now.
				deadline := time.Now().Add(standbyTimeout)
				for len(standbys) < 2 {
					if time.Now().After(deadline) {
						t.Fatalf("the standbys did not reach the slow import\n%s", j.stderr.String())
					}
					time.Sleep(20 * time.Millisecond)
					m, _ := filepath.Glob(filepath.Join(slowDir, "importing-*"))
					standbys = standbys[:0]
					for _, p := range m {
						standbys = append(standbys, readIntSuffix(t, p))
					}
				}
				if n := len(j.eventsOf("prewarm_ready")); n != 0 {
					t.Fatalf("%d standbys ready before the crash", n)
				}
			} else {
				for _, e := range j.waitEvents("prewarm_ready", 2, standbyTimeout) {
					standbys = append(standbys, int(e["pid"].(float64)))
				}
			}
			if err := os.WriteFile(filepath.Join(j.dir, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.path == "waited" {
				// The slow imports end once the launcher said it waits for them.
				for _, e := range j.waitEvents("prewarm_waiting", 2, standbyTimeout) {
					if e["round"] != "1" || !slices.Contains(standbys, int(e["pid"].(float64))) {
						t.Errorf("waiting event %v: want round 1, one of the standbys %v", e, standbys)
					}
				}
				if err := os.WriteFile(filepath.Join(slowDir, "release"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if code := j.wait(torchTimeout); code != 0 {
				t.Fatalf("exit %d\n%s", code, j.stderr.String())
			}
			var round1 []map[string]any
			for _, f := range j.eventsOf("prewarm_fallback") {
				if f["round"] == "1" {
					round1 = append(round1, f)
				}
			}
			warm := j.warmRounds()["1"]
			switch tc.path {
			case "warm":
				if len(round1) != 0 || len(warm) != 2 {
					t.Fatalf("round 1: warm on %v, fallbacks %v; want both warm", warm, round1)
				}
			default:
				if len(round1) != 2 {
					t.Fatalf("round 1 fallbacks %v, want one per rank", round1)
				}
				for _, f := range round1 {
					if f["path"] != tc.path || !strings.Contains(fmt.Sprint(f["reason"]), "still importing") {
						t.Errorf("round 1 fallback %v, want path %s", f, tc.path)
					}
					if cpu, _ := f["standby_cpu_ms"].(float64); cpu < 200 {
						t.Errorf("standby_cpu_ms %v: want at least the 0.2 s the slow import had used", f["standby_cpu_ms"])
					}
					if _, ok := f["wait_ms"]; ok != (tc.path == "waited") {
						t.Errorf("wait_ms in %v: want it exactly when the rank waited", f)
					}
				}
				if wantWarm := tc.path == "waited"; (len(warm) == 2) != wantWarm {
					t.Errorf("round 1 warm on %v; want both %v", warm, wantWarm)
				}
			}
			// Round 1's ranks are the standbys' processes exactly when warm.
			var ranks []int
			for _, r := range []string{"0", "1"} {
				ranks = append(ranks, readInt(t, filepath.Join(j.dir, "step-1-"+r)))
			}
			sort.Ints(ranks)
			sort.Ints(standbys)
			if same := reflect.DeepEqual(ranks, standbys); same != (tc.path != "stopped") {
				t.Errorf("round 1 ran in pids %v, the standbys were %v (path %s)", ranks, standbys, tc.path)
			}
			if left := j.waitNoLeftovers(10 * time.Second); len(left) != 0 {
				t.Fatalf("processes left after the launcher exited:\n%s", hangdump.Describe(left))
			}
			for _, pid := range standbys {
				if pidAlive(pid) {
					t.Errorf("standby %d is alive after the launcher exited", pid)
				}
			}
		})
	}
}

// readIntSuffix is the number after the last '-' of path's base name.
func readIntSuffix(t *testing.T, path string) int {
	t.Helper()
	b := filepath.Base(path)
	n, err := strconv.Atoi(b[strings.LastIndexByte(b, '-')+1:])
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}
