package prewarm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// hookPrelude starts every script of TestHookReportsWhenImportsGoQuiet:
// quiet() lets more than the hook's quiet period pass with no audited
// event and no collection (a sleep raises neither).
const hookPrelude = `import os, sys, time
QUIET = sys.modules["_ftl_learn"]._QUIET


def quiet():
    time.sleep(2 * QUIET)


`

// TestHookReportsWhenImportsGoQuiet runs the --prewarm auto hook
// (hook/_ftl_learn.py) in a plain interpreter: a rank that dies without
// running atexit (os._exit) has reported what it imported once its
// imports went quiet and an audited event or a garbage collection came;
// none is written while it still imports, not even in an import that
// lasts (the start-up pays nothing), a
// later import is reported again, a forked child never reports, and the
// hook starts no thread.
func TestHookReportsWhenImportsGoQuiet(t *testing.T) {
	testenv.Require(t, testenv.SystemPython)
	for _, tc := range []struct {
		name   string
		script string
		quiet  string // replaces the hook's _QUIET when set
		want   []string
		absent []string // nil want and absent: no report at all
	}{
		{"audited event after the imports, then os._exit", `import ftl_hook_a, helper
quiet()
id(QUIET)  # audited: a training step raises such events (torch hashes tensors with id())
print("threads", len(os.listdir("/proc/self/task")))
os._exit(3)
`, "", []string{"ftl_hook_a"}, []string{"helper"}},
		{"garbage collection after the imports, then os._exit", `import ftl_hook_a
quiet()
keep = [[] for _ in range(20000)]  # allocates: the collector runs, nothing is audited
os._exit(3)
`, "", []string{"ftl_hook_a"}, nil},
		{"a later import is reported again", `import ftl_hook_a
quiet()
id(QUIET)
import ftl_hook_b
quiet()
id(QUIET)
os._exit(3)
`, "", []string{"ftl_hook_a", "ftl_hook_b"}, nil},
		{"still importing: no report", `import ftl_hook_a
id(QUIET)
keep = [[] for _ in range(20000)]
os._exit(3)
`, "60", nil, nil},
		{"one long import: no report", `import ftl_hook_slow
os._exit(3)
`, "", nil, nil},
		{"a forked child does not report", `import ftl_hook_a
quiet()
id(QUIET)
pid = os.fork()
if pid == 0:
    import ftl_hook_b
    quiet()
    id(QUIET)
    keep = [[] for _ in range(20000)]
    os._exit(0)
os.waitpid(pid, 0)
os._exit(3)
`, "", []string{"ftl_hook_a"}, []string{"ftl_hook_b"}},
		{"exit: atexit reports", `import ftl_hook_a
sys.exit(3)
`, "60", []string{"ftl_hook_a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			hook, lib, app := filepath.Join(dir, "hook"), filepath.Join(dir, "lib"), filepath.Join(dir, "app")
			for _, d := range []string{hook, lib, app} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for _, name := range []string{"sitecustomize.py", "_ftl_learn.py"} {
				b, err := hookFiles.ReadFile("hook/" + name)
				if err != nil {
					t.Fatal(err)
				}
				if tc.quiet != "" {
					b = []byte(strings.Replace(string(b), "\n_QUIET = 0.5\n", "\n_QUIET = "+tc.quiet+"\n", 1))
				}
				writeFile(t, filepath.Join(hook, name), string(b))
			}
			writeFile(t, filepath.Join(lib, "ftl_hook_a.py"), "A = 1\n")
			writeFile(t, filepath.Join(lib, "ftl_hook_b.py"), "B = 1\n")
			// Its import outlasts the quiet period and raises audited
			// events (as loading libtorch does).
			writeFile(t, filepath.Join(lib, "ftl_hook_slow.py"),
				"import sys, time\ntime.sleep(2 * sys.modules['_ftl_learn']._QUIET)\nid(time)\nkeep = [[] for _ in range(20000)]\n")
			writeFile(t, filepath.Join(app, "helper.py"), "H = 1\n") // the script's own code: never reported
			script := filepath.Join(app, "rank.py")
			writeFile(t, script, hookPrelude+tc.script)
			report := filepath.Join(dir, "report")

			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			cmd := exec.CommandContext(ctx, python, "-u", script)
			cmd.Dir = app
			cmd.Env = append(os.Environ(), "PYTHONPATH="+hook+string(os.PathListSeparator)+lib, ReportEnv+"="+report)
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := cmd.CombinedOutput() // waits: no process is left
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Fatalf("script: %v (want exit 3)\n%s", err, out)
			}
			if strings.Contains(string(out), "threads") && !strings.Contains(string(out), "threads 1\n") {
				t.Errorf("the hook started a thread: %s", out)
			}
			got, err := readReport(report)
			if tc.want == nil {
				if !os.IsNotExist(err) {
					t.Errorf("a report was written while the rank imported: %v %v", got, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("no report: %v\n%s", err, out)
			}
			for _, m := range tc.want {
				if !slices.Contains(got, m) {
					t.Errorf("report %v lacks %s", got, m)
				}
			}
			for _, m := range tc.absent {
				if slices.Contains(got, m) {
					t.Errorf("report %v has %s", got, m)
				}
			}
		})
	}
}

func writeFile(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}
