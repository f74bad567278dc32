package procfs

import (
	"bufio"
	"os/exec"
	"syscall"
	"testing"
)

func TestCaught(t *testing.T) {
	status := []byte("Name:\tpython3\nSigBlk:\t0000000000000000\nSigIgn:\t0000000001001000\nSigCgt:\t0000001180004002\n")
	for _, c := range []struct {
		sig  syscall.Signal
		want bool
	}{
		{syscall.SIGINT, true},   // bit 1
		{syscall.SIGUSR1, false}, // bit 9
		{syscall.SIGTERM, true},  // bit 14
		{syscall.SIGHUP, false},
		{37, true}, // bit 36: 0x10_0000_0000
		{0, false},
		{65, false},
	} {
		if got := caught(status, c.sig); got != c.want {
			t.Errorf("caught(%d) = %v, want %v", c.sig, got, c.want)
		}
	}
	if caught([]byte("Name:\tx\n"), syscall.SIGINT) {
		t.Error("no SigCgt line: want false")
	}
}

// TestCatchesProcess: a real process catches a signal only once it
// installed a handler for it.
func TestCatchesProcess(t *testing.T) {
	const sig = syscall.Signal(38)
	cmd := exec.Command("/usr/bin/python3", "-c",
		"import signal, sys, time\nsignal.signal(38, lambda *a: None)\nprint('ready', flush=True)\nsys.stdin.read()")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("python: %q, %v", line, err)
	}
	if !Catches(cmd.Process.Pid, sig) {
		t.Error("Catches(38) = false for a process with a handler")
	}
	if Catches(cmd.Process.Pid, 39) {
		t.Error("Catches(39) = true for a process without a handler")
	}
	if Catches(1<<30, sig) {
		t.Error("Catches of a missing pid = true")
	}
}
