package integration

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestFailureCauseWithoutErrorFile: a rank crashes with no torch error
// file (no @record) in five ways; the verdict's rank failure, the restart
// reason and a rank_failure_cause event say why, read from what the rank
// left: the launcher's hook's traceback (inherited output), the rank's
// stderr log (--redirects), faulthandler's stack of a SIGSEGV or a
// SIGABRT (the hook's, or the program's own in its stderr log).
func TestFailureCauseWithoutErrorFile(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name  string
		flags []string
		env   string
		body  string
		want  verdict.FailureCause
	}{
		{"uncaught exception, output inherited", nil, "", `
def step(i):
    raise ValueError("bad batch %d" % i)
step(3)
`, verdict.FailureCause{Exception: "ValueError", Message: "bad batch 3", Where: "crash.py:3 in step", Source: "excepthook"}},
		{"printed traceback, output redirected", []string{"--redirects", "3"}, "", `
import sys, traceback
def step():
    try:
        {}["missing"]
    except KeyError:
        traceback.print_exc()
        sys.exit(1)
step()
`, verdict.FailureCause{Exception: "KeyError", Message: "'missing'", Where: "crash.py:5 in step", Source: "output"}},
		{"SIGSEGV", nil, "", `
import ctypes
def load():
    ctypes.string_at(0)
load()
`, verdict.FailureCause{Signal: "SIGSEGV", Where: "crash.py:4 in load", Source: "faulthandler"}},
		{"SIGSEGV, the program's own faulthandler, output redirected", []string{"--redirects", "3"}, "PYTHONFAULTHANDLER=1", `
import ctypes
def load():
    ctypes.string_at(0)
load()
`, verdict.FailureCause{Signal: "SIGSEGV", Where: "crash.py:4 in load", Source: "output"}},
		{"SIGABRT", nil, "", `
import os
def check():
    os.abort()
check()
`, verdict.FailureCause{Signal: "SIGABRT", Where: "crash.py:4 in check", Source: "faulthandler"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			// j.script adds a first line (#!/bin/sh): the body's empty
			// first line stands for it in the line numbers.
			script := j.script("crash.py", strings.TrimPrefix(tc.body, "\n"))
			// The harness turns faulthandler on for every job (to dump a
			// stuck test's ranks); a rank here has it only when asked.
			env := []string{"PYTHON_EXEC=" + debianPython, "PYTHONFAULTHANDLER=" + strings.TrimPrefix(tc.env, "PYTHONFAULTHANDLER=")}
			vpath := filepath.Join(j.dir, "verdict.json")
			args := append([]string{"--standalone", "--nproc-per-node", "1", "--max-restarts", "0", "--verdict-file", vpath}, tc.flags...)
			code := j.run(time.Minute, env, append(args, script)...)
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s", code, j.stderr.String())
			}
			v := readVerdict(t, vpath)
			if len(v.RankFailures) != 1 || v.RankFailures[0].Cause == nil {
				t.Fatalf("rank failures %+v: want one, with a cause", v.RankFailures)
			}
			if got := *v.RankFailures[0].Cause; got != tc.want {
				t.Errorf("cause %+v, want %+v", got, tc.want)
			}
			if !strings.Contains(v.Reason, tc.want.String()) {
				t.Errorf("reason %q lacks %q", v.Reason, tc.want.String())
			}
			if ev := j.eventsOf("rank_failure_cause"); len(ev) != 1 {
				t.Errorf("rank_failure_cause events %v, want 1", ev)
			}
		})
	}
}

// TestSameFailureStopsTheJob: rank 1 raises the same exception at the same
// line in every round; after the third time in a row the job stops with
// the no-restart exit code (93) and says why, with 3 of its 6 restarts
// left. When the place changes from round to round, every restart is
// spent.
func TestSameFailureStopsTheJob(t *testing.T) {
	skipShort(t)
	for _, tc := range []struct {
		name  string
		body  string
		code  int
		kind  verdict.Kind
		cycle int
	}{
		{"the same failure", `
import os
def step():
    if os.environ["RANK"] == "1":
        raise RuntimeError("deterministic bug")
step()
`, 93, verdict.NoRestart, 3},
		{"a different place each round", `
import os
def a(): raise RuntimeError("here")
def b(): raise RuntimeError("there")
if os.environ["RANK"] == "1":
    (a if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) % 2 else b)()
`, 1, verdict.RestartBudgetExhausted, 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			script := j.script("bug.py", tc.body) // line 1 is #!/bin/sh, line 2 empty
			vpath := filepath.Join(j.dir, "verdict.json")
			code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
				"--max-restarts", "6", "--verdict-file", vpath, script)
			v := readVerdict(t, vpath)
			if code != tc.code || v.Kind != tc.kind || len(v.Cycles) != tc.cycle {
				t.Fatalf("exit %d, verdict %s after %d cycles (%s); want %d, %s after %d", code, v.Kind, len(v.Cycles), v.Reason,
					tc.code, tc.kind, tc.cycle)
			}
			if tc.kind == verdict.NoRestart && !strings.Contains(v.Reason, "the same failure 3 rounds in a row (rounds 0-2): rank 1 RuntimeError: deterministic bug at bug.py:6 in step") {
				t.Errorf("reason %q", v.Reason)
			}
		})
	}
}
