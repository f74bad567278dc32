package procfs

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Stat
		ok   bool
	}{
		{"plain", "123 (sleep) S 1 123 123 0", Stat{123, 1, 123, 'S', "sleep", 0, 0, 0}, true},
		{"parens and spaces in comm", "7 (a b) (c)) Z 5 6 7", Stat{7, 5, 6, 'Z', "a b) (c)", 0, 0, 0}, true},
		{"trailing newline", "9 (x) R 2 9 9 0 0\n", Stat{9, 2, 9, 'R', "x", 0, 0, 0}, true},
		{"start time", "42 (sh) S 1 42 42 0 -1 4194560 10 0 0 0 0 0 0 0 20 0 1 0 987654 1 2\n", Stat{42, 1, 42, 'S', "sh", 987654, 0, 0}, true},
		{"cpu time", "42 (sh) R 1 42 42 0 -1 4194560 10 0 0 0 12 3 0 0 20 0 1 0 987654 1 2\n", Stat{42, 1, 42, 'R', "sh", 987654, 15, 0}, true},
		{"nice", "42 (python3) R 1 42 42 0 -1 4194560 10 0 0 0 12 3 0 0 39 19 1 0 987654 1 2\n", Stat{42, 1, 42, 'R', "python3", 987654, 15, 19}, true},
		{"garbage", "garbage", Stat{}, false},
		{"too few fields", "1 (x) S", Stat{}, false},
		{"bad pid", "x (y) S 1 2", Stat{}, false},
		{"long state", "1 (x) SS 1 2", Stat{}, false},
		{"bad ppid", "1 (x) S a 2", Stat{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
				t.Errorf("Parse(%q) = %+v, %v", tc.in, got, err)
			}
		})
	}
}

func TestReadSelfAndList(t *testing.T) {
	me, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if me.PID != os.Getpid() || me.PPID != os.Getppid() || me.PGID != syscall.Getpgrp() || me.Dead() {
		t.Errorf("Read(self) = %+v", me)
	}
	all, err := List()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range all {
		// Not the state: this process may run in one read and sleep in the other.
		found = found || (p.PID == me.PID && p.PPID == me.PPID && p.PGID == me.PGID && p.Comm == me.Comm)
	}
	if !found {
		t.Errorf("List has no %+v among %d processes", me, len(all))
	}
	if _, err := Read(-1); err == nil {
		t.Error("Read(-1) succeeded")
	}
}

// TestGroupAlive: a group is alive while a member runs, and not once its
// only member is a zombie or reaped.
func TestGroupAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	if !GroupAlive(pgid) {
		t.Error("running group reported dead")
	}
	_ = cmd.Process.Kill()
	deadline := time.Now().Add(10 * time.Second)
	for GroupAlive(pgid) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // the zombie stays until Wait below
	}
	if GroupAlive(pgid) {
		t.Error("group of a zombie reported alive")
	}
	if st, err := Read(pgid); err != nil || !st.Dead() {
		t.Errorf("unreaped child: %+v %v, want a zombie", st, err)
	}
	_ = cmd.Wait()
	if GroupAlive(pgid) {
		t.Error("reaped group reported alive")
	}
	if GroupAlive(0) || GroupAlive(-1) {
		t.Error("non-positive pgid reported alive")
	}
}

// TestStoppedRealProcess: a real child is Stopped after SIGSTOP (state T)
// and not before nor after SIGCONT.
func TestStoppedRealProcess(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	waitState := func(want bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, err := Read(pid)
			if err != nil {
				t.Fatal(err)
			}
			if st.Stopped() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("state %c: Stopped() = %v, want %v", st.State, st.Stopped(), want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitState(false)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitState(true)
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitState(false)
}

// TestThreads: this process's thread ids include its main thread (its
// pid); a process that does not exist is an error.
func TestThreads(t *testing.T) {
	tids, err := Threads(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, tid := range tids {
		found = found || tid == os.Getpid()
	}
	if !found || len(tids) < 2 { // a Go test binary runs several threads
		t.Fatalf("threads %v: want the main thread %d among several", tids, os.Getpid())
	}
	if _, err := Threads(1<<22 + 12345); err == nil {
		t.Fatal("threads of a process that does not exist: no error")
	}
}

// TestGroupActivity: a group's CPU time grows while a member computes, and
// its I/O bytes while one writes; an unknown group has no activity.
func TestGroupActivity(t *testing.T) {
	if _, ok := GroupActivity(1 << 30); ok {
		t.Fatal("activity of a process group that does not exist")
	}
	cmd := exec.Command("sh", "-c", `i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; head -c 4000000 /dev/zero > /dev/null; sleep 60`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		a, ok := GroupActivity(cmd.Process.Pid)
		if !ok {
			t.Fatal("the group has no live member")
		}
		if a.CPU > 0 && a.IOBytes >= 8000000 { // head read 4 MB and wrote 4 MB
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("activity %+v after 60 s: want CPU > 0 and >= 8 MB of I/O", a)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
