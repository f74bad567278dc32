// Package integration holds end-to-end tests: the real ft-launcher binary,
// real rank processes, real PyTorch and real etcd.
package integration

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// binDir holds the binaries built once for the whole package.
type binaries struct{ launcher, resumer string }

var bins binaries // written once in TestMain, read-only afterwards

// skipShort skips every test of this package under -short: each one runs
// the real binary (docs/testing.md, "The fast lane").
func skipShort(t *testing.T) {
	t.Helper()
	testenv.SkipShort(t, "end-to-end: runs the real ft-launcher binary")
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips: no binary to build
	}
	dir, err := os.MkdirTemp("", "ftl-integration-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins.launcher = filepath.Join(dir, "ft-launcher")
	bins.resumer = filepath.Join(dir, "ft-resumer")
	// ft-launcher-etcd (the embedded etcd server) must sit beside ft-launcher.
	cmd := exec.Command("go", "build", "-o", dir+"/", "../cmd/ft-launcher", "../cmd/ft-launcher-etcd", "../cmd/ft-resumer")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build ft-launcher:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	etcdDirs := func() map[string]bool {
		got := map[string]bool{}
		ms, _ := filepath.Glob(filepath.Join(os.TempDir(), "ft-launcher-etcd-*"))
		for _, m := range ms {
			got[m] = true
		}
		return got
	}
	before := etcdDirs()
	code := m.Run()
	os.RemoveAll(dir)
	// No test may leave a process or an etcd data directory behind.
	time.Sleep(500 * time.Millisecond)
	if left := processesWithEnvPrefix(fmt.Sprintf("FTL_TEST_MARKER=%d-", os.Getpid())); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: processes left behind by the tests: %v\n", left)
		code = 1
	}
	for d := range etcdDirs() {
		if !before[d] {
			fmt.Fprintf(os.Stderr, "FAIL: etcd data directory left behind by the tests: %s\n", d)
			code = 1
		}
	}
	os.Exit(code)
}

// job is one launcher run under test.
type job struct {
	t      *testing.T
	dir    string // scratch dir for scripts, logs and outputs
	marker string // FTL_TEST_MARKER value inherited by every descendant
	events string
	cmd    *exec.Cmd
	// The launcher's output, written by exec's copiers while the test
	// reads it (waits that fail mid-run print it): locked.
	stdout  lockedbuf.Buffer
	stderr  lockedbuf.Buffer
	done    chan struct{}
	exitErr error
	bin     string // the launcher's executable ("": bins.launcher)
}

func newJob(t *testing.T) *job {
	t.Helper()
	dir := t.TempDir()
	j := &job{t: t, dir: dir, marker: testMarker(t),
		events: filepath.Join(dir, "events.jsonl")}
	t.Cleanup(j.cleanup)
	return j
}

// testMarker is unique per test and starts with this test binary's pid, so
// concurrent test runs never mistake each other's processes for leftovers.
func testMarker(t *testing.T) string {
	return fmt.Sprintf("%d-%s-%d", os.Getpid(), strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())
}

// script writes an executable sh script into the job dir and returns its path.
func (j *job) script(name, body string) string {
	j.t.Helper()
	p := filepath.Join(j.dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		j.t.Fatal(err)
	}
	return p
}

// start starts ft-launcher with args (the event log flag is added, and
// --prewarm $FTL_TEST_PREWARM for Python ranks when that is set, so the
// suite can run with warm restarts: FTL_TEST_PREWARM=torch,torch.distributed).
func (j *job) start(env []string, args ...string) {
	j.t.Helper()
	full := append([]string{"--event-log", j.events}, prewarmArgs(args)...)
	full = append(full, args...)
	bin := bins.launcher
	if j.bin != "" {
		bin = j.bin
	}
	j.cmd = exec.Command(bin, full...)
	j.cmd.Env = append(append(append(os.Environ(), "FTL_TEST_MARKER="+j.marker), hangdump.Env...), env...)
	j.cmd.Dir = j.dir
	j.cmd.Stdout, j.cmd.Stderr = &j.stdout, &j.stderr
	if err := j.cmd.Start(); err != nil {
		j.t.Fatal(err)
	}
	j.done = make(chan struct{})
	go func() { j.exitErr = j.cmd.Wait(); close(j.done) }()
}

// prewarmArgs is --prewarm $FTL_TEST_PREWARM unless it is unset or the
// ranks are not Python (--no-python).
func prewarmArgs(args []string) []string {
	mods := os.Getenv("FTL_TEST_PREWARM")
	if mods == "" || slices.Contains(args, "--no-python") || slices.Contains(args, "--prewarm") {
		return nil
	}
	return []string{"--prewarm", mods}
}

// wait waits for the launcher to exit and returns its exit code.
func (j *job) wait(timeout time.Duration) int {
	j.t.Helper()
	// Running time, not wall time: a CI sandbox frozen for minutes must
	// not read as a launcher that hangs (internal/runclock).
	expired, stop := runclock.After(timeout)
	defer stop()
	select {
	case <-j.done:
	case <-expired:
		// Record what is still alive, then have the ranks print their
		// Python tracebacks and the launcher its goroutines (hangdump.Env,
		// set by start) before reading its output: the buffer may only be
		// read once the process is gone.
		left := j.leftovers()
		procs := hangdump.Describe(left)
		hangdump.Abort(left)
		select {
		case <-j.done:
		case <-time.After(10 * time.Second):
			_ = j.cmd.Process.Kill()
			<-j.done
		}
		// What a reader needs first (CI keeps a failure's first lines):
		// processes, stacks in short, the event log; then all of it.
		out := j.stderr.String()
		evs, _ := os.ReadFile(j.events)
		j.t.Fatalf("ft-launcher did not exit within %s\nprocesses of the job:\n%s\nthe launcher's goroutines:\n%s\nthe ranks' Python threads:\n%s\nevent log:\n%s\nstderr:\n%s",
			timeout, procs, hangdump.Goroutines(out), hangdump.Python(out), evs, out)
	}
	if j.exitErr == nil {
		return 0
	}
	if ee, ok := j.exitErr.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	j.t.Fatalf("wait: %v", j.exitErr)
	return -1
}

func (j *job) run(timeout time.Duration, env []string, args ...string) int {
	j.t.Helper()
	j.start(env, args...)
	return j.wait(timeout)
}

// events reads the JSON-lines event log.
func (j *job) eventsOf(kind string) []map[string]any {
	j.t.Helper()
	evs, err := eventlog.Read(j.events)
	if err != nil {
		j.t.Fatalf("read event log: %v", err)
	}
	var out []map[string]any
	for _, e := range evs {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// leftovers lists live processes (not zombies) that carry this job's marker.
func (j *job) leftovers() []int {
	return processesWithEnv("FTL_TEST_MARKER=" + j.marker)
}

func processesWithEnv(kv string) []int { return hangdump.PIDs(kv) }

// processesWithEnvPrefix lists live processes with a variable starting with p.
func processesWithEnvPrefix(p string) []int {
	return hangdump.Matching(func(environ []byte) bool {
		return bytes.HasPrefix(environ, []byte(p)) || bytes.Contains(environ, []byte("\x00"+p))
	})
}

// waitNoLeftovers waits (generously) until no process of the job remains.
func (j *job) waitNoLeftovers(timeout time.Duration) []int {
	deadline := time.Now().Add(timeout)
	for {
		left := j.leftovers()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cleanup kills anything the job left behind so no test leaks processes.
func (j *job) cleanup() {
	if j.cmd != nil && j.cmd.Process != nil {
		select {
		case <-j.done:
		default:
			_ = j.cmd.Process.Kill()
			<-j.done
		}
	}
	// Ranks die with their launcher at once; the embedded etcd gets SIGTERM
	// and removes its data directory first: give it a moment.
	for _, pid := range j.waitNoLeftovers(5 * time.Second) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// waitFile waits until path exists.
func waitFile(t *testing.T, path string, timeout time.Duration) {
	t.Helper()
	ctx, cancel := runclock.WithTimeout(context.Background(), timeout)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s did not appear within %s", path, timeout)
}

func readInt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return n
}

func pidAlive(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}
