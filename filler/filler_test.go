package filler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// The filler runs real processes through a real spawn.Reaper (this test
// process becomes a child subreaper, as the launcher is).

func newReaper(t *testing.T) *spawn.Reaper {
	t.Helper()
	r, err := spawn.NewReaper(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

type events struct {
	mu   sync.Mutex
	k    []string
	recs []eventlog.Record
}

func (e *events) add(rec eventlog.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.k = append(e.k, rec.Kind())
	e.recs = append(e.recs, rec)
}

func (e *events) count(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, k := range e.k {
		if k == kind {
			n++
		}
	}
	return n
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	return len(f) > 0 && f[0] != "Z"
}

func readPids(t *testing.T, dir string) []int {
	t.Helper()
	var out []int
	ms, _ := filepath.Glob(filepath.Join(dir, "pid.*"))
	for _, m := range ms {
		b, _ := os.ReadFile(m)
		if p, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func TestEnvDropsJobVariables(t *testing.T) {
	env := Env([]string{"PATH=/bin", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29500", "RANK=3", "WORLD_SIZE=8",
		"TORCHELASTIC_RUN_ID=job", "FT_RANK_MONITOR_IPC_SOCKET=/x", "FT_LAUNCHER_VERDICT_FILE=/v", "PET_NNODES=2",
		"CUDA_VISIBLE_DEVICES=0,1", "HOME=/root"})
	got := strings.Join(env, " ")
	if got != "PATH=/bin CUDA_VISIBLE_DEVICES=0,1 HOME=/root FT_LAUNCHER_FILLER=1" {
		t.Fatalf("filler env %q", got)
	}
}

// TestReclaimKillsTheWholeTree: a shell that starts a child ignoring
// SIGTERM, a setsid child and a double-forked daemon; Reclaim leaves none.
func TestReclaimKillsTheWholeTree(t *testing.T) {
	dir := t.TempDir()
	ev := &events{}
	f := New(newReaper(t), Options{
		Command: `trap '' TERM; echo $$ > pid.sh; env > env.txt
(trap '' TERM; sleep 300 & echo $! > pid.ignoring; wait) &
setsid sh -c 'echo $$ > pid.setsid; exec sleep 300' &
sh -c 'sh -c "echo \$\$ > pid.daemon; exec sleep 300" &' 
echo filler running
wait`,
		Env: append(os.Environ(), "MASTER_ADDR=10.9.9.9"), Dir: dir, LogPath: LogPath(dir), OnEvent: ev.add,
		Logger: slog.New(slog.DiscardHandler)})
	f.Park()
	waitUntil(t, "the filler tree", func() bool { return len(readPids(t, dir)) == 4 })
	pids := readPids(t, dir)
	for _, p := range pids {
		if !alive(p) {
			t.Fatalf("filler process %d not running", p)
		}
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env.txt"))
	if !strings.Contains(string(env), "FT_LAUNCHER_FILLER=1") || strings.Contains(string(env), "MASTER_ADDR") {
		t.Fatalf("filler env:\n%s", env)
	}
	took, err := f.Reclaim(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pids {
		if alive(p) {
			t.Errorf("process %d of the filler survived the reclaim", p)
		}
	}
	if ev.count(EventReclaimed) != 1 || took <= 0 {
		t.Errorf("events %v took %v", ev.k, took)
	}
	if log, _ := os.ReadFile(LogPath(dir)); !strings.Contains(string(log), "filler running") {
		t.Errorf("filler log: %q", log)
	}
	if f.Running() {
		t.Error("still running after reclaim")
	}
	// Reclaiming again (nothing runs) is a no-op.
	if _, err := f.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestRestartedWithBackoffAndBounded(t *testing.T) {
	dir := t.TempDir()
	ev := &events{}
	f := New(newReaper(t), Options{Command: "echo start >> starts; exit 3", Dir: dir, LogPath: LogPath(dir),
		Budget: policy.RestartBudget{Limit: 2, Backoff: 20 * time.Millisecond}, OnEvent: ev.add})
	f.Park()
	waitUntil(t, "the filler to give up", func() bool { return ev.count(EventGaveUp) == 1 })
	b, _ := os.ReadFile(filepath.Join(dir, "starts"))
	if n := strings.Count(string(b), "start"); n != 3 || ev.count(EventStarted) != 3 || ev.count(EventExited) != 3 {
		t.Fatalf("started %d times, events %v; want 3 starts", n, ev.k)
	}
	if _, err := f.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestParkTwiceStartsOnce(t *testing.T) {
	dir := t.TempDir()
	ev := &events{}
	f := New(newReaper(t), Options{Command: "exec sleep 300", Dir: dir, LogPath: LogPath(dir), OnEvent: ev.add})
	f.Park()
	f.Park()
	waitUntil(t, "a start", func() bool { return ev.count(EventStarted) == 1 })
	time.Sleep(100 * time.Millisecond)
	if ev.count(EventStarted) != 1 {
		t.Fatalf("events %v", ev.k)
	}
	f.Close()
}

func TestReclaimWaitsForGPUs(t *testing.T) {
	tests := []struct {
		name     string
		busyFor  int32 // polls that report busy
		wantFail bool
	}{
		{"free at once", 0, false},
		{"free after three polls", 3, false},
		{"never free", 1 << 30, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			var polls atomic.Int32
			check := func(context.Context) (bool, string, error) {
				if polls.Add(1) <= tc.busyFor {
					return false, "pid 4242 holds GPU 0", nil
				}
				return true, "", nil
			}
			f := New(newReaper(t), Options{Command: "exec sleep 300", Dir: dir, LogPath: LogPath(dir),
				GPUCheck: check, GPUPoll: 10 * time.Millisecond, ReclaimTimeout: 500 * time.Millisecond})
			f.Park()
			waitUntil(t, "the filler", f.Running)
			time.Sleep(50 * time.Millisecond)
			_, err := f.Reclaim(context.Background())
			if (err != nil) != tc.wantFail {
				t.Fatalf("reclaim: %v", err)
			}
			if tc.wantFail && !strings.Contains(err.Error(), "pid 4242 holds GPU 0") {
				t.Fatalf("error does not say what holds the GPU: %v", err)
			}
		})
	}
}

// TestNvidiaSMICheck parses nvidia-smi's CSV output. There is no GPU on
// this machine: the outputs below stand in for nvidia-smi's answers.
func TestNvidiaSMICheck(t *testing.T) {
	tests := []struct {
		name      string
		apps, mem string
		err       error
		free      bool
		busy      string
	}{
		{"idle", "", "0, 3\n1, 0\n", nil, true, ""},
		{"no running processes line", "No running processes found\n", "0, 0\n", nil, true, ""},
		{"a context", "4242, 1024\n", "0, 1100\n", nil, false, "4242, 1024"},
		{"memory above tolerance", "", "0, 12\n1, 2048\n", nil, false, "GPU 1 uses 2048 MiB"},
		{"nvidia-smi fails", "", "", errors.New("exit status 9"), false, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := func(_ context.Context, argv []string) ([]byte, error) {
				if tc.err != nil {
					return nil, tc.err
				}
				if strings.HasPrefix(argv[1], "--query-compute-apps") {
					return []byte(tc.apps), nil
				}
				return []byte(tc.mem), nil
			}
			free, busy, err := NvidiaSMICheck(run, 512)(context.Background())
			if free != tc.free || (tc.err != nil) != (err != nil) || !strings.Contains(busy, tc.busy) {
				t.Fatalf("free %v busy %q err %v", free, busy, err)
			}
		})
	}
}

// The filler is in its own process group, apart from the launcher's.
func TestOwnProcessGroup(t *testing.T) {
	dir := t.TempDir()
	f := New(newReaper(t), Options{Command: "echo $$ > pid.sh; exec sleep 300", Dir: dir, LogPath: LogPath(dir)})
	f.Park()
	waitUntil(t, "the filler", func() bool { return len(readPids(t, dir)) == 1 })
	pid := readPids(t, dir)[0]
	pgid, err := syscall.Getpgid(pid)
	if err != nil || pgid != pid || pgid == syscall.Getpgrp() {
		t.Fatalf("filler pgid %d (pid %d, ours %d): %v", pgid, pid, syscall.Getpgrp(), err)
	}
	f.Close()
	if alive(pid) {
		t.Fatal("filler alive after Close")
	}
}

// TestOwnCgroup: with a cgroup v2 parent (the launcher's containment), the
// filler runs in a child cgroup of its own, and the reclaim kills
// everything in it (a setsid escapee included) and removes it. Needs a
// writable cgroup v2 hierarchy with cgroup.kill (internal/testenv: a skip
// saying so, or a failure under CI).
func TestOwnCgroup(t *testing.T) {
	var parent string
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
			continue
		}
		dir := filepath.Join(root, fmt.Sprintf("ftl-fillertest-%d", os.Getpid()))
		if err := os.Mkdir(dir, 0o755); err == nil {
			parent = dir
			break
		}
	}
	if parent == "" {
		testenv.Missing(t, testenv.CgroupV2Kill, "no writable cgroup v2 hierarchy here (without one the filler relies on the process-group and orphan sweep)")
	}
	t.Cleanup(func() { _ = os.Remove(parent) })
	if _, err := os.Stat(filepath.Join(parent, "cgroup.kill")); err != nil {
		testenv.Missing(t, testenv.CgroupV2Kill, "cgroup v2 without cgroup.kill (kernel older than 5.14)")
	}
	dir := t.TempDir()
	f := New(newReaper(t), Options{Command: `echo $$ > pid.sh; setsid sh -c 'echo $$ > pid.setsid; exec sleep 600' & exec sleep 600`,
		Dir: dir, LogPath: LogPath(dir), CgroupParent: parent, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	f.Park()
	waitUntil(t, "the filler", func() bool { return len(readPids(t, dir)) == 2 })
	var cg string
	waitUntil(t, "the filler's own cgroup", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		cg = f.cgroup
		return cg != ""
	})
	sh := readPids(t, dir)
	waitUntil(t, "the filler's processes in its cgroup", func() bool { return len(cgroupPids(cg)) >= 1 })
	if _, err := f.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, p := range sh {
		if alive(p) {
			t.Errorf("filler process %d alive after the reclaim", p)
		}
	}
	if _, err := os.Stat(cg); !os.IsNotExist(err) {
		t.Errorf("the filler's cgroup %s was not removed: %v", cg, err)
	}
}
