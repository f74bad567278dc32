package stacks

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const python = "/usr/bin/python3"

// rankScripts are ranks blocked in ways a dump must see through. Each
// prints "ready" before it blocks.
var rankScripts = map[string]string{
	"lock": `
import threading, time
def worker():
    time.sleep(3600)
threading.Thread(target=worker, daemon=True).start()
lock = threading.Lock()
def step():
    lock.acquire()
    print("ready", flush=True)
    lock.acquire()  # LOCKLINE
step()
`,
	"fifo": `
import os, sys
def load(path):
    print("ready", flush=True)
    fd = os.open(path, os.O_RDWR)  # RDWR: the open does not wait for a writer
    return os.read(fd, 1)  # FIFOLINE
load(sys.argv[1])
`,
	"stopped": `
import os, signal
print("ready", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
`,
}

// start runs script as a rank would: env from c.Env, output to a pipe
// until "ready".
func start(t *testing.T, argv []string, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("%v: %q, %v", argv, line, err)
	}
	return cmd
}

func write(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func lineOf(t *testing.T, script, marker string) int {
	t.Helper()
	for i, l := range strings.Split(script, "\n") {
		if strings.Contains(l, marker) {
			return i + 1
		}
	}
	t.Fatalf("no %s", marker)
	return 0
}

// TestCollect: the ranks of one node, each blocked differently, and one
// that is not Python, all collected in one call.
func TestCollect(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	// The user's own sitecustomize must still run (the hook chains to it).
	user := filepath.Join(dir, "user")
	os.Mkdir(user, 0o700)
	marker := filepath.Join(dir, "user-sitecustomize-ran")
	write(t, user, "sitecustomize.py", fmt.Sprintf("open(%q, 'w').close()\n", marker))
	env := c.Env(append(os.Environ(), "PYTHONPATH="+user))

	lock := write(t, dir, "lock.py", rankScripts["lock"])
	fifoScript := write(t, dir, "fifo.py", rankScripts["fifo"])
	stopped := write(t, dir, "stopped.py", rankScripts["stopped"])
	pids := map[int]int{
		0: start(t, []string{python, "-u", lock}, env).Process.Pid,
		1: start(t, []string{python, "-u", fifoScript, fifo}, env).Process.Pid,
		// A rank started through a shell: its Python child answers.
		2: start(t, []string{"/bin/sh", "-c", python + " -u " + lock + "; :"}, env).Process.Pid,
		3: start(t, []string{"/bin/sh", "-c", "echo ready; exec sleep 3600"}, env).Process.Pid,
		4: start(t, []string{python, "-u", stopped}, env).Process.Pid,
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("the user's sitecustomize did not run: %v", err)
	}
	// Wait until rank 4 is stopped (it stops itself after "ready").
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(readStat(pids[4]), ") T ") && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // ranks 0-2 block right after "ready"

	begin := time.Now()
	got := c.Collect(context.Background(), pids, 0)
	took := time.Since(begin)
	if took > 10*DefaultBound { // bounded by DefaultBound; generous for a loaded machine
		t.Errorf("Collect took %s, bound %s", took, DefaultBound)
	}
	want := []struct {
		state State
		has   []string
	}{
		{StateDumped, []string{fmt.Sprintf(`lock.py", line %d in step`, lineOf(t, rankScripts["lock"], "LOCKLINE")), "in worker"}},
		{StateDumped, []string{fmt.Sprintf(`fifo.py", line %d in load`, lineOf(t, rankScripts["fifo"], "FIFOLINE"))}},
		{StateDumped, []string{fmt.Sprintf(`lock.py", line %d in step`, lineOf(t, rankScripts["lock"], "LOCKLINE"))}},
		{StateNoHook, nil},
		{StateStopped, nil},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d ranks, want %d", len(got), len(want))
	}
	for i, w := range want {
		r := got[i]
		if r.LocalRank != i || r.State != w.state {
			t.Errorf("rank %d: local rank %d state %s, want %s", i, r.LocalRank, r.State, w.state)
		}
		for _, s := range w.has {
			if !strings.Contains(string(r.Dump), s) {
				t.Errorf("rank %d: dump lacks %q:\n%s", i, s, r.Dump)
			}
		}
		t.Logf("rank %d: %s pid %d dumped by %d in %s, proc %c wchan %q", i, r.State, r.PID, r.DumpedPID, r.Took, r.Proc, r.WChan)
	}
	if got[2].DumpedPID == got[2].PID || got[2].DumpedPID == 0 {
		t.Errorf("rank 2 (through a shell): dumped by %d, want its Python child", got[2].DumpedPID)
	}
	// A second collection takes only the new dump.
	again := c.Collect(context.Background(), map[int]int{0: pids[0]}, 0)
	if n := strings.Count(string(again[0].Dump), "in step"); n != 1 {
		t.Errorf("second collection holds %d dumps of the main thread, want 1:\n%s", n, again[0].Dump)
	}
}

func readStat(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return string(b)
}

// TestFatal: a rank killed by SIGSEGV leaves its stack in its dump file.
func TestFatal(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dir := t.TempDir()
	script := write(t, dir, "segv.py", "import ctypes\ndef crash():\n    ctypes.string_at(0)\ncrash()\n")
	cmd := exec.Command(python, "-u", script)
	cmd.Env = c.Env(os.Environ())
	err = cmd.Run()
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSEGV {
		t.Fatalf("want a death by SIGSEGV, got %v", err)
	}
	b, n := c.Fatal(cmd.Process.Pid, 0)
	if !strings.Contains(string(b), "Fatal Python error: Segmentation fault") || !strings.Contains(string(b), `segv.py", line 3 in crash`) {
		t.Fatalf("fatal dump:\n%s", b)
	}
	if again, _ := c.Fatal(cmd.Process.Pid, n); again != nil {
		t.Errorf("nothing new after the offset, got %q", again)
	}
	c.Forget(cmd.Process.Pid)
	if b, _ := c.Fatal(cmd.Process.Pid, 0); b != nil {
		t.Error("Forget left the file")
	}
}

// TestEnv: the hook goes first on PYTHONPATH, once, whatever was there.
func TestEnv(t *testing.T) {
	c := &Collector{hookDir: "/h", dumpDir: "/d"}
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{[]string{"A=1"}, "/h"},
		{[]string{"PYTHONPATH="}, "/h"},
		{[]string{"PYTHONPATH=/u:/v"}, "/h:/u:/v"},
		{[]string{DirEnv + "=/old", "PYTHONPATH=/u"}, "/h:/u"},
	} {
		got := c.Env(tc.in)
		pp, dirs := "", 0
		for _, kv := range got {
			if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
				pp = v
			}
			if v, ok := strings.CutPrefix(kv, DirEnv+"="); ok {
				dirs++
				if v != "/d" {
					t.Errorf("%v: %s=%s", tc.in, DirEnv, v)
				}
			}
		}
		if pp != tc.want || dirs != 1 {
			t.Errorf("%v: PYTHONPATH %q (%d dump dirs), want %q", tc.in, pp, dirs, tc.want)
		}
	}
}

// gloo is a rank of a 3-rank gloo group on 127.0.0.1: each does one
// all_reduce, then rank 1 deadlocks on a lock before the second while
// ranks 0 and 2 wait for it in the all_reduce.
const gloo = `
import os, sys, threading
import torch, torch.distributed as dist
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=rank, world_size=3)
t = torch.ones(4)
dist.all_reduce(t)
print("ready", flush=True)
lock = threading.Lock()
def step():
    if rank == 1:
        lock.acquire()
        lock.acquire()  # LOCKLINE
    dist.all_reduce(t)  # REDUCELINE
step()
`

// TestJudgeRealRanks: real torch ranks, one deadlocked, two waiting in
// the collective it never joins: the stacks name the deadlocked one.
func TestJudgeRealRanks(t *testing.T) {
	c, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	script := write(t, t.TempDir(), "train.py", gloo)
	env := c.Env(os.Environ())
	port := freePort(t)
	cmds := make([]*exec.Cmd, 3)
	done := make(chan int, 3)
	for i := range cmds {
		go func() {
			cmds[i] = start(t, []string{python, "-u", script, fmt.Sprint(i), port}, env)
			done <- i
		}()
	}
	for range cmds {
		<-done
	}
	time.Sleep(300 * time.Millisecond) // past "ready" into the second all_reduce
	pids := map[int]int{}
	for i, cmd := range cmds {
		pids[i] = cmd.Process.Pid
	}
	var sums []Summary
	for _, r := range c.Collect(context.Background(), pids, 0) {
		s := Summarize(r, r.LocalRank)
		t.Logf("rank %d: %s %s %s %s", s.Rank, s.State, s.Activity, s.Collective, s.Place)
		sums = append(sums, s)
	}
	f := Judge(sums)
	if !f.Known || len(f.Culprits) != 1 || f.Culprits[0] != 1 {
		t.Fatalf("finding %+v: want rank 1, known", f)
	}
	want := []string{
		fmt.Sprintf("rank 1 hung: in train.py:%d in step, not in a collective", lineOf(t, gloo, "LOCKLINE")),
		fmt.Sprintf("ranks 0, 2: in all_reduce at train.py:%d in step", lineOf(t, gloo, "REDUCELINE")),
	}
	for _, w := range want {
		if !strings.Contains(f.Text, w) {
			t.Errorf("text %q lacks %q", f.Text, w)
		}
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
}

// TestStaleDirsRemoved: the directory of a launcher that died without
// closing its collector (SIGKILL) goes at the next New; a live one stays.
func TestStaleDirsRemoved(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	live, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	dead, err := New()
	if err != nil {
		t.Fatal(err)
	}
	dead.lock.Close() // what the kernel does when its launcher dies
	again, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if _, err := os.Stat(dead.dir); !os.IsNotExist(err) {
		t.Errorf("the dead launcher's dir is still there: %v", err)
	}
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("the live launcher's dir was removed: %v", err)
	}
}
