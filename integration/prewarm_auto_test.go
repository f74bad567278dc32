package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// --prewarm auto (docs/prewarm.md): the standbys import what the ranks of
// the previous cycle imported, learned through the hook the launcher puts
// on the ranks' PYTHONPATH, and never a module that starts a thread.

// autoRank records, at its start, which of $WATCH are already imported
// (a standby imported them) and what the hook could have left visible,
// then imports $IMPORTS_<round> (else $IMPORTS), runs a pool of 2
// multiprocessing workers per start method in $MP (comma-separated), writes
// $OUT/rec-<round>.json, waits for $OUT/go-<round> and fails, up to round
// $LAST, which succeeds. The main guard keeps spawn and forkserver workers,
// which import the script as __mp_main__, to the worker function.
const autoRank = `import builtins, json, os, sys, time


def worker(x):
    return {"x": x * x, "argv": sys.argv, "pythonpath": os.environ.get("PYTHONPATH"),
            "report_var": os.environ.get("FT_LAUNCHER_PREWARM_REPORT"),
            "hook_on_path": any("ft-launcher-prewarm-" in p for p in sys.path)}


if __name__ == "__main__":
    rnd = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    rec = {
        "pre": sorted(m for m in os.environ["WATCH"].split(",") if m in sys.modules),
        "pythonpath": os.environ.get("PYTHONPATH"),
        "report_var": os.environ.get("FT_LAUNCHER_PREWARM_REPORT"),
        "hook_on_path": any("ft-launcher-prewarm-" in p for p in sys.path),
        "sitecustomize": getattr(builtins, "_ftl_test_sitecustomize", False),
        "argv": sys.argv,
        "mp": {},
    }
    for m in filter(None, os.environ.get("IMPORTS_%d" % rnd, os.environ.get("IMPORTS", "")).split(",")):
        __import__(m)
    for method in filter(None, os.environ.get("MP", "").split(",")):
        import multiprocessing
        with multiprocessing.get_context(method).Pool(2) as pool:
            rec["mp"][method] = pool.map(worker, [1, 2])
    out = os.environ["OUT"]
    with open(os.path.join(out, "rec-%d.json" % rnd), "w") as f:
        json.dump(rec, f)
    last = int(os.environ["LAST"])
    while rnd < last and not os.path.exists(os.path.join(out, "go-%d" % rnd)):
        time.sleep(0.02)
    sys.exit(1 if rnd < last else 0)
`

type autoRec struct {
	Pre           []string                 `json:"pre"`
	PythonPath    *string                  `json:"pythonpath"`
	ReportVar     *string                  `json:"report_var"`
	HookOnPath    bool                     `json:"hook_on_path"`
	SiteCustomize bool                     `json:"sitecustomize"`
	Argv          []string                 `json:"argv"`
	MP            map[string][]autoMPChild `json:"mp"`
}

// autoMPChild is what a multiprocessing worker of autoRank saw.
type autoMPChild struct {
	X          int      `json:"x"`
	Argv       []string `json:"argv"`
	PythonPath *string  `json:"pythonpath"`
	ReportVar  *string  `json:"report_var"`
	HookOnPath bool     `json:"hook_on_path"`
}

type autoState struct {
	Version  int `json:"version"`
	Commands map[string]struct {
		Argv    []string `json:"argv"`
		Modules []struct {
			Name string `json:"name"`
		} `json:"modules"`
		Unsafe []string `json:"unsafe"`
		Cycles int      `json:"cycles"`
	} `json:"commands"`
}

// autoJob runs autoRank with one local rank under --prewarm auto through
// rounds 0..last: each round ends once round+1 standbys were ready (so
// the next round starts on the newest). It returns the job, the records by
// round and the state file.
func autoJob(t *testing.T, last int, env ...string) (*job, []autoRec, autoState) {
	t.Helper()
	j := newJob(t)
	script := filepath.Join(j.dir, "auto_rank.py")
	if err := os.WriteFile(script, []byte(autoRank), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := filepath.Abs("testdata/prewarmauto")
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir, "XDG_STATE_HOME=" + filepath.Join(j.dir, "state"),
		"PYTHONPATH=" + lib, "LAST=" + strconv.Itoa(last)}
	j.start(append(base, env...), "--standalone", "--nproc-per-node", "1", "--max-restarts", strconv.Itoa(last),
		"--prewarm", "auto", "--verdict-file", filepath.Join(j.dir, "verdict.json"), script)
	for r := range last {
		j.waitEvents("prewarm_ready", r+1, standbyTimeout)
		if err := os.WriteFile(filepath.Join(j.dir, "go-"+strconv.Itoa(r)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if code := j.wait(2 * time.Minute); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	recs := make([]autoRec, last+1)
	for r := range recs {
		b, err := os.ReadFile(filepath.Join(j.dir, "rec-"+strconv.Itoa(r)+".json"))
		if err != nil {
			t.Fatalf("round %d record: %v\n%s", r, err, j.stderr.String())
		}
		if err := json.Unmarshal(b, &recs[r]); err != nil {
			t.Fatal(err)
		}
		// What the hook must not leave visible, cold (round 0) and warm.
		if recs[r].PythonPath == nil || *recs[r].PythonPath != lib || recs[r].ReportVar != nil || recs[r].HookOnPath || !recs[r].SiteCustomize {
			t.Errorf("round %d: PYTHONPATH %v (want %s), report variable %v, hook on sys.path %v, user's sitecustomize ran %v",
				r, deref(recs[r].PythonPath), lib, deref(recs[r].ReportVar), recs[r].HookOnPath, recs[r].SiteCustomize)
		}
	}
	if got := j.warmRounds(); len(got) != last {
		t.Errorf("rounds started warm %v, want 1..%d", got, last)
	}
	var st autoState
	b, err := os.ReadFile(filepath.Join(j.dir, "state", "ft-launcher", "prewarm-auto.json"))
	if err == nil {
		err = json.Unmarshal(b, &st)
	}
	if err != nil {
		t.Fatalf("state file: %v", err)
	}
	return j, recs, st
}

func deref(p *string) string {
	if p == nil {
		return "<unset>"
	}
	return *p
}

// TestPrewarmAutoLearnsWhatTheRanksImport: a torch rank's imports (torch
// and a package of its own) are learned from the first cycle and imported
// by the standby the third cycle starts on; a module first imported in the
// second cycle is imported by the fourth cycle's standby. The hook leaves
// PYTHONPATH, sys.path and the environment as they were and runs the
// user's sitecustomize. The list is kept per command line in the state
// file, in the event log and in the verdict.
func TestPrewarmAutoLearnsWhatTheRanksImport(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	j, recs, st := autoJob(t, 3, "WATCH=torch,ftl_auto_a,ftl_auto_a.sub,ftl_auto_b",
		"IMPORTS_0=torch,ftl_auto_a", "IMPORTS=torch,ftl_auto_a,ftl_auto_b")
	want := [][]string{
		{},        // cold
		{"torch"}, // the built-in list: nothing learned yet
		{"ftl_auto_a", "ftl_auto_a.sub", "torch"},               // learned from round 0
		{"ftl_auto_a", "ftl_auto_a.sub", "ftl_auto_b", "torch"}, // ftl_auto_b learned from round 1
	}
	for r, w := range want {
		if !slices.Equal(recs[r].Pre, w) {
			t.Errorf("round %d started with %v imported, want %v", r, recs[r].Pre, w)
		}
	}
	if len(st.Commands) != 1 {
		t.Fatalf("state file has %d command lines, want 1: %+v", len(st.Commands), st)
	}
	for key, c := range st.Commands {
		var names []string
		for _, m := range c.Modules {
			names = append(names, m.Name)
		}
		if !slices.Contains(names, "torch") || !slices.Contains(names, "ftl_auto_a") || !slices.Contains(names, "ftl_auto_b") ||
			slices.Contains(names, "auto_rank") || len(names) > 64 {
			t.Errorf("learned list %v: want torch, ftl_auto_a, ftl_auto_b, not the script, at most 64", names)
		}
		if !slices.Equal(c.Argv, []string{debianPython, "-u", filepath.Join(j.dir, "auto_rank.py")}) {
			t.Errorf("command line %s: argv %v", key, c.Argv)
		}
	}
	learned := j.eventsOf("prewarm_learned")
	if len(learned) < 2 {
		t.Fatalf("%d prewarm_learned events, want at least 2 (rounds 1 and 2)", len(learned))
	}
	if mods := learned[len(learned)-1]["modules"].([]any); !slices.Contains(mods, any("ftl_auto_b")) {
		t.Errorf("last prewarm_learned modules %v lack ftl_auto_b", mods)
	}
	if !strings.Contains(j.stderr.String(), "prewarm auto: learned the modules the ranks import") {
		t.Errorf("no log line for the learned list:\n%s", j.stderr.String())
	}
	// --print-config shows the list for the same command line.
	pc := exec.Command(bins.launcher, "--print-config", "--standalone", "--nproc-per-node", "1", "--prewarm", "auto",
		filepath.Join(j.dir, "auto_rank.py"))
	lib, _ := filepath.Abs("testdata/prewarmauto")
	pc.Env = append(os.Environ(), "PYTHON_EXEC="+debianPython, "XDG_STATE_HOME="+filepath.Join(j.dir, "state"), "PYTHONPATH="+lib)
	pc.Dir = j.dir
	if out, err := pc.Output(); err != nil || !strings.Contains(string(out), "prewarm: auto") ||
		!regexp.MustCompile(`# +learned from \d+ rank reports .*ftl_auto_b`).Match(out) {
		t.Errorf("--print-config (%v) does not show the learned list:\n%s", err, out)
	}
	v := readVerdict(t, filepath.Join(j.dir, "verdict.json"))
	if v.PrewarmAuto == nil || !slices.Contains(v.PrewarmAuto.Modules, "ftl_auto_b") || v.PrewarmAuto.Default {
		t.Errorf("verdict prewarm_auto %+v: want the learned list with ftl_auto_b", v.PrewarmAuto)
	}
}

// TestPrewarmAutoMultiprocessingStartMethods: a rank that runs worker
// pools with the spawn, forkserver and fork start methods works cold and
// warm under --prewarm auto (the warm rank started from a standby that
// imported torch): the workers compute, see the rank's argv and the
// PYTHONPATH it was given, and neither the hook's directory nor its report
// variable (so they report nothing). docs/prewarm.md, "Not the default".
func TestPrewarmAutoMultiprocessingStartMethods(t *testing.T) {
	skipShort(t)
	requireTorch(t) // the first standby imports the built-in torch list
	j, recs, _ := autoJob(t, 1, "WATCH=torch", "MP=spawn,forkserver,fork")
	lib, err := filepath.Abs("testdata/prewarmauto")
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{filepath.Join(j.dir, "auto_rank.py")}
	if !slices.Equal(recs[1].Pre, []string{"torch"}) {
		t.Errorf("round 1 started with %v imported, want [torch] (a standby's)", recs[1].Pre)
	}
	for r, rec := range recs {
		if !slices.Equal(rec.Argv, argv) {
			t.Errorf("round %d: sys.argv %v, want %v", r, rec.Argv, argv)
		}
		for _, method := range []string{"spawn", "forkserver", "fork"} {
			ws := rec.MP[method]
			if len(ws) != 2 || ws[0].X != 1 || ws[1].X != 4 {
				t.Errorf("round %d, %s: workers returned %+v, want x 1 and 4", r, method, ws)
				continue
			}
			for _, w := range ws {
				if !slices.Equal(w.Argv, argv) || w.PythonPath == nil || *w.PythonPath != lib || w.ReportVar != nil || w.HookOnPath {
					t.Errorf("round %d, %s worker: argv %v (want %v), PYTHONPATH %s (want %s), report variable %s, hook on sys.path %v",
						r, method, w.Argv, argv, deref(w.PythonPath), lib, deref(w.ReportVar), w.HookOnPath)
				}
			}
		}
	}
}

// TestPrewarmAutoLeavesOutAThreadStartingModule: a module that starts a
// thread at import, learned from a rank, makes its standby report it; it
// is left out for good (state file, prewarm_unsafe), the standby starts
// again without it, and the next cycle starts warm without it imported.
func TestPrewarmAutoLeavesOutAThreadStartingModule(t *testing.T) {
	skipShort(t)
	requireTorch(t) // the first standby imports the built-in torch list
	j, recs, st := autoJob(t, 2, "WATCH=ftl_threadmod,ftl_auto_a", "IMPORTS=ftl_threadmod,ftl_auto_a")
	unsafe := j.eventsOf("prewarm_unsafe")
	if len(unsafe) != 1 || unsafe[0]["module"] != "ftl_threadmod" || !strings.Contains(unsafe[0]["reason"].(string), "thread") {
		t.Fatalf("prewarm_unsafe events %v, want one for ftl_threadmod starting a thread", unsafe)
	}
	if !slices.Equal(recs[2].Pre, []string{"ftl_auto_a"}) {
		t.Errorf("round 2 started with %v imported, want [ftl_auto_a] (not ftl_threadmod)", recs[2].Pre)
	}
	for _, c := range st.Commands {
		if !slices.Equal(c.Unsafe, []string{"ftl_threadmod"}) {
			t.Errorf("state file unsafe %v, want [ftl_threadmod]", c.Unsafe)
		}
		for _, m := range c.Modules {
			if m.Name == "ftl_threadmod" {
				t.Errorf("ftl_threadmod still in the learned list")
			}
		}
	}
	if !strings.Contains(j.stderr.String(), "not safe to import in a standby") {
		t.Errorf("no warning naming the unsafe module:\n%s", j.stderr.String())
	}
}

// TestPrewarmAutoIgnoredWithNoPython: --prewarm auto with --no-python says
// it is ignored, starts no standby and gives the ranks no hook.
func TestPrewarmAutoIgnoredWithNoPython(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	sh := j.script("env.sh", "env > \"$OUT/env.txt\"\n")
	code := j.run(time.Minute, []string{"OUT=" + j.dir, "XDG_STATE_HOME=" + filepath.Join(j.dir, "state")},
		"--standalone", "--nproc-per-node", "1", "--prewarm", "auto", "--no-python", sh)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	if !strings.Contains(j.stderr.String(), "--prewarm auto is ignored with --no-python") {
		t.Errorf("no log line saying auto is ignored:\n%s", j.stderr.String())
	}
	env, err := os.ReadFile(filepath.Join(j.dir, "env.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(env), "FT_LAUNCHER_PREWARM_REPORT") || strings.Contains(string(env), "ft-launcher-prewarm-") {
		t.Errorf("the rank got the hook:\n%s", env)
	}
	for _, k := range []string{"prewarm_ready", "prewarm_fallback", "prewarm_learned"} {
		if evs := j.eventsOf(k); len(evs) != 0 {
			t.Errorf("%d %s events with --no-python", len(evs), k)
		}
	}
	if _, err := os.Stat(filepath.Join(j.dir, "state")); !os.IsNotExist(err) {
		t.Errorf("a state directory was made: %v", err)
	}
}

// TestLibuvHint: a rank failing with torch's error for a build without
// libuv (Debian's torch 2.6 under the agent store) makes the launcher say
// what to do, once per run, in its log and the event log.
func TestLibuvHint(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name  string
		args  []string
		want  string
		avoid string
	}{
		{"agent store", nil, "--agent-store off and USE_LIBUV=0", ""},
		{"rank-0 store", []string{"--agent-store", "off"}, "set USE_LIBUV=0", "--agent-store off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t)
			// What torch 2.6's rendezvous raises, verbatim (ranklogs/testdata has real rank logs).
			script := filepath.Join(j.dir, "libuv.py")
			body := "raise RuntimeError(\"use_libuv was requested but PyTorch was build without libuv support\")\n"
			if err := os.WriteFile(script, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			args := append([]string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--prewarm", "off",
				"--log-dir", filepath.Join(j.dir, "logs"), "--redirects", "3"}, tc.args...)
			code := j.run(time.Minute, []string{"PYTHON_EXEC=" + debianPython}, append(args, script)...)
			if code == 0 {
				t.Fatalf("exit 0, want a failure\n%s", j.stderr.String())
			}
			hints := j.eventsOf("rank_failure_hint")
			if len(hints) != 1 || hints[0]["cause"] != "torch_without_libuv" {
				t.Fatalf("rank_failure_hint events %v, want one torch_without_libuv (2 ranks, 2 rounds)", hints)
			}
			out := j.stderr.String()
			if n := strings.Count(out, "hint: the ranks' torch is built without libuv"); n != 1 || !strings.Contains(out, tc.want) {
				t.Errorf("%d hint lines, want 1 with %q:\n%s", n, tc.want, out)
			}
			if tc.avoid != "" && strings.Contains(hints[0]["hint"].(string), tc.avoid) {
				t.Errorf("hint %q says %q", hints[0]["hint"], tc.avoid)
			}
		})
	}
}

// TestPrewarmAutoFirstCycleOnLaunchStandbys: a command line whose imports
// an earlier job learned starts its next job's first cycle on standbys
// started at launch (docs/prewarm.md, "The first cycle"): round 0's rank
// has the learned package imported before its code runs, the event says
// so, and what the hook leaves visible is what a cold rank sees. The first
// job's round 0 was cold: nothing was learned then.
func TestPrewarmAutoFirstCycleOnLaunchStandbys(t *testing.T) {
	skipShort(t)
	requireTorch(t) // the first job's standby imports the built-in torch list
	j1 := newJob(t)
	script := filepath.Join(j1.dir, "auto_rank.py")
	if err := os.WriteFile(script, []byte(autoRank), 0o644); err != nil {
		t.Fatal(err)
	}
	lib, err := filepath.Abs("testdata/prewarmauto")
	if err != nil {
		t.Fatal(err)
	}
	env := func(last int) []string {
		return []string{"PYTHON_EXEC=" + debianPython, "OUT=" + j1.dir, "XDG_STATE_HOME=" + filepath.Join(j1.dir, "state"),
			"PYTHONPATH=" + lib, "LAST=" + strconv.Itoa(last), "WATCH=ftl_auto_a,ftl_auto_a.sub", "IMPORTS=ftl_auto_a"}
	}
	args := func(last int) []string {
		return []string{"--standalone", "--nproc-per-node", "1", "--max-restarts", strconv.Itoa(last), "--prewarm", "auto", script}
	}
	record := func(r int) autoRec {
		t.Helper()
		var rec autoRec
		b, err := os.ReadFile(filepath.Join(j1.dir, "rec-"+strconv.Itoa(r)+".json"))
		if err == nil {
			err = json.Unmarshal(b, &rec)
		}
		if err != nil {
			t.Fatalf("round %d record: %v", r, err)
		}
		return rec
	}

	// Job 1: round 0 cold (learns ftl_auto_a), round 1 on a standby.
	j1.start(env(1), args(1)...)
	j1.waitEvents("prewarm_ready", 1, standbyTimeout)
	if err := os.WriteFile(filepath.Join(j1.dir, "go-0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if code := j1.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job 1: exit %d\n%s", code, j1.stderr.String())
	}
	if got := j1.warmRounds(); len(got["0"]) != 0 {
		t.Fatalf("job 1 started round 0 warm %v: nothing was learned yet", got)
	}
	if rec := record(0); len(rec.Pre) != 0 {
		t.Fatalf("job 1 round 0 (cold) had %v imported", rec.Pre)
	}

	// Job 2, the same command line in the same directory: round 0 on the
	// standby started at launch.
	j2 := newJob(t)
	j2.dir = j1.dir // the rank's working directory is part of the command line
	j2.start(env(0), args(0)...)
	if code := j2.wait(2 * time.Minute); code != 0 {
		t.Fatalf("job 2: exit %d\n%s", code, j2.stderr.String())
	}
	started := j2.eventsOf("prewarm_started")
	if len(started) == 0 || fmt.Sprint(started[0]["round"]) != "0" || started[0]["launched"] != true {
		t.Fatalf("job 2 prewarm_started %v, want round 0 on the launch standbys (fallbacks %v)\n%s",
			started, j2.eventsOf("prewarm_fallback"), j2.stderr.String())
	}
	rec := record(0)
	if !slices.Equal(rec.Pre, []string{"ftl_auto_a", "ftl_auto_a.sub"}) {
		t.Errorf("job 2 round 0 started with %v imported, want the learned ftl_auto_a, ftl_auto_a.sub", rec.Pre)
	}
	if rec.PythonPath == nil || *rec.PythonPath != lib || rec.ReportVar != nil || rec.HookOnPath || !rec.SiteCustomize {
		t.Errorf("job 2 round 0: PYTHONPATH %v (want %s), report variable %v, hook on sys.path %v, user's sitecustomize ran %v",
			deref(rec.PythonPath), lib, deref(rec.ReportVar), rec.HookOnPath, rec.SiteCustomize)
	}
	if !strings.Contains(j2.stderr.String(), "prewarm auto: starting standbys at launch") {
		t.Errorf("no log line for the launch standbys:\n%s", j2.stderr.String())
	}
}
