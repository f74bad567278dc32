// Package wheelinstall tests ft-launcher installed the way the field
// installs Python tools: the platform wheel built by scripts/wheel.sh,
// `pip install`ed into a fresh virtual environment of Debian's Python, then
// a real DDP job with a crash run through the installed command. It is a
// package of its own because building the release binaries from a cold
// cache takes minutes, which must not eat into the integration package's
// time limit.
package wheelinstall

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/internal/wheel"
)

// version is stamped into the binaries and the wheel; one no release has,
// so that the installed commands' --version shows they are this build.
const version = "0.0.1rc9"

// env is the environment of everything the test starts: this process's,
// less what would point Python or pip elsewhere than the venv, plus the
// marker by which the cleanup finds every process left behind, the venv's
// bin first on PATH (what `source venv/bin/activate` does) and no pip
// configuration of this machine (an index or links it adds would make the
// install test something else).
func env(marker, venv string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case k == "PATH", k == "PYTHONPATH", k == "PYTHONHOME", k == "PYTHON_EXEC", k == "VIRTUAL_ENV",
			strings.HasPrefix(k, "PIP_"):
			continue
		}
		out = append(out, kv)
	}
	path := os.Getenv("PATH")
	if venv != "" {
		path = filepath.Join(venv, "bin") + string(os.PathListSeparator) + path
		out = append(out, "VIRTUAL_ENV="+venv)
	}
	out = append(out, "PATH="+path, "FTL_TEST_MARKER="+marker, "PIP_CONFIG_FILE="+os.DevNull,
		"PIP_DISABLE_PIP_VERSION_CHECK=1")
	return append(out, hangdump.Env...)
}

// run runs a command to its end (at most timeout of running time) in its
// own process group, killed whole when the time is up, and returns its
// standard output; stderr goes into the failure message.
func run(t *testing.T, timeout time.Duration, dir string, environ []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := runclock.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, environ
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The go command's compilers are the script's grandchildren: the
	// whole group goes.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %s", name, strings.Join(args, " "), time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("%s %s: %v (ctx %v)\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, ctx.Err(), stdout.String(), stderr.String())
	}
	return stdout.String()
}

// lookPath finds a command on the given PATH, as the shell would.
func lookPath(path, name string) string {
	for _, d := range filepath.SplitList(path) {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func pathOf(environ []string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(environ[i], "PATH="); ok {
			return v
		}
	}
	return ""
}

func TestWheelInstallsIntoAFreshVenvAndRestartsACrashedJob(t *testing.T) {
	testenv.SkipShort(t, "builds the release binaries and a virtual environment, then runs a torch job")
	testenv.Require(t, testenv.Venv, testenv.Torch)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	marker := fmt.Sprintf("%d-%s-%d", os.Getpid(), t.Name(), time.Now().UnixNano())
	// Every process the test started is gone at its end: the job's are
	// killed if the launcher left any (it must not; the check below fails
	// the test for it), the builds' and pip's have exited.
	t.Cleanup(func() {
		for _, pid := range hangdump.PIDs("FTL_TEST_MARKER=" + marker) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	dir := t.TempDir()

	// The wheel for this machine, as release.sh builds it (the release
	// builds both architectures; one is enough to install here).
	wheels := filepath.Join(dir, "wheels")
	out := run(t, 30*time.Minute, repo, env(marker, ""), "./scripts/wheel.sh", "-o", wheels, version)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	whl := lines[len(lines)-1]
	want, err := wheel.File(version, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(whl) != want {
		t.Fatalf("scripts/wheel.sh wrote %q, want %s", whl, want)
	}
	if st, err := os.Stat(whl); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("%s: %.1f MB", want, float64(st.Size())/1e6)
	}

	// A fresh venv of Debian's Python; --system-site-packages so that
	// Debian's torch is importable in it, as a cluster image's would be.
	venv := filepath.Join(dir, "venv")
	run(t, 5*time.Minute, dir, env(marker, ""), testenv.DebianPython, "-m", "venv", "--system-site-packages", venv)
	venvEnv := env(marker, venv)
	py := filepath.Join(venv, "bin", "python")
	run(t, 5*time.Minute, dir, venvEnv, py, "-m", "pip", "install", "--no-index", whl)

	// The commands are on the activated venv's PATH, executable,
	// and they are this build.
	for _, c := range wheel.Commands {
		p := lookPath(pathOf(venvEnv), c)
		if p != filepath.Join(venv, "bin", c) {
			t.Fatalf("%s on the venv's PATH is %q, want the venv's own", c, p)
		}
		v := run(t, time.Minute, dir, venvEnv, p, "--version")
		if !strings.HasPrefix(v, c+" "+version+" (commit ") {
			t.Errorf("%s --version printed %q, want version %s", c, v, version)
		}
	}
	// The module, from the venv's interpreter:
	got := run(t, time.Minute, dir, venvEnv, py, "-c",
		"import ft_launcher_client; from ft_launcher_client import RankMonitorClient; print(ft_launcher_client.__file__)")
	if !strings.HasPrefix(strings.TrimSpace(got), venv+string(os.PathSeparator)) {
		t.Fatalf("ft_launcher_client imported from %q, not from the venv %s", got, venv)
	}

	// A real 2-rank DDP job (examples/ddp_train.py, gloo on CPU) run by
	// the installed ft-launcher from the activated venv: rank 1 crashes at
	// step 25, every rank restarts once and resumes from the checkpoint at
	// step 20. The ranks are the venv's python3 (PATH; no PYTHON_EXEC) and
	// import the venv's client: the script is copied out of the
	// repository, so its fallback to client/python finds nothing, and
	// train.py checks both before it hands over.
	job := filepath.Join(dir, "job")
	os.Mkdir(job, 0o755)
	src, err := os.ReadFile(filepath.Join(repo, "examples", "ddp_train.py"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(job, "ddp_train.py"), src, 0o644)
	os.WriteFile(filepath.Join(job, "train.py"), []byte(`import os, runpy, sys
venv = os.path.realpath(os.environ["VIRTUAL_ENV"])
assert os.path.realpath(sys.prefix) == venv, (sys.prefix, venv)
import ft_launcher_client
assert os.path.realpath(ft_launcher_client.__file__).startswith(venv + os.sep), ft_launcher_client.__file__
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_train.py")
sys.argv[0] = script
runpy.run_path(script, run_name="__main__")
`), 0o644)
	events := filepath.Join(job, "events.jsonl")
	weights := filepath.Join(job, "w.json")
	launcher := filepath.Join(venv, "bin", "ft-launcher")
	cmd := exec.Command(launcher, "--event-log", events, "--standalone", "--nproc-per-node", "2", "--max-restarts", "2",
		"train.py", "--ckpt-dir", filepath.Join(job, "ckpt"), "--out", weights, "--crash-at-step", "25", "--crash-rank", "1")
	cmd.Dir, cmd.Env = job, venvEnv
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	expired, stop := runclock.After(5 * time.Minute)
	defer stop()
	select {
	case err = <-done:
	case <-expired:
		left := hangdump.PIDs("FTL_TEST_MARKER=" + marker)
		procs := hangdump.Describe(left)
		hangdump.Abort(left)
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("the installed ft-launcher did not exit within 5 minutes\nprocesses:\n%s\nstderr:\n%s", procs, stderr.String())
	}
	t.Logf("the job through the installed ft-launcher: %s", time.Since(start).Round(100*time.Millisecond))
	if err != nil {
		t.Fatalf("the installed ft-launcher: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	evs, err := eventlog.Read(events)
	if err != nil {
		t.Fatal(err)
	}
	var restarts []map[string]any
	for _, e := range evs {
		if e["event"] == "restart" {
			restarts = append(restarts, e)
		}
	}
	if len(restarts) != 1 {
		t.Errorf("%d restart events, want exactly 1: %v\nstderr:\n%s", len(restarts), restarts, stderr.String())
	}
	b, err := os.ReadFile(weights)
	if err != nil {
		t.Fatalf("no final weights: %v\nstderr:\n%s", err, stderr.String())
	}
	var w struct {
		ResumedFromStep int `json:"resumed_from_step"`
	}
	if err := json.Unmarshal(b, &w); err != nil || w.ResumedFromStep != 20 {
		t.Errorf("final weights %s (%v): want resumed_from_step 20, the checkpoint before the crash at 25", b, err)
	}
	// The launcher leaves no rank behind; give the exit a moment to
	// settle before looking.
	deadline := time.Now().Add(5 * time.Second)
	for len(hangdump.PIDs("FTL_TEST_MARKER="+marker)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if left := hangdump.PIDs("FTL_TEST_MARKER=" + marker); len(left) > 0 {
		t.Errorf("processes left behind by the installed ft-launcher: %s", hangdump.Describe(left))
	}

	// pip uninstall reads RECORD: with it right, the commands and the
	// module go with the distribution.
	run(t, 2*time.Minute, dir, venvEnv, py, "-m", "pip", "uninstall", "--yes", wheel.Name)
	for _, c := range wheel.Commands {
		if p := filepath.Join(venv, "bin", c); fileExists(p) {
			t.Errorf("%s is still there after pip uninstall", p)
		}
	}
	imp := exec.Command(py, "-c", "import ft_launcher_client")
	imp.Env = venvEnv
	if out, err := imp.CombinedOutput(); err == nil {
		t.Errorf("ft_launcher_client is still importable after pip uninstall: %s", out)
	}
}
