package procfs

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		in        string
		run, wait uint64
		ok        bool
	}{
		{"1562750 0 1\n", 1562750, 0, true},
		{"10 20 3", 10, 20, true},
		{"10", 0, 0, false},
		{"x 2 3", 0, 0, false},
	} {
		run, wait, ok := parseSchedstat([]byte(tc.in))
		if run != tc.run || wait != tc.wait || ok != tc.ok {
			t.Errorf("%q: %d %d %v, want %d %d %v", tc.in, run, wait, ok, tc.run, tc.wait, tc.ok)
		}
	}
}

// TestGroupDemand: a group that computes accrues demand, one that sleeps
// does not.
func TestGroupDemand(t *testing.T) {
	start := func(script string) int {
		cmd := exec.Command("/bin/sh", "-c", script)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() })
		return cmd.Process.Pid
	}
	busy, idle := start("while :; do :; done"), start("exec sleep 60")
	time.Sleep(50 * time.Millisecond)
	b0, ok1 := GroupDemand(busy)
	i0, ok2 := GroupDemand(idle)
	time.Sleep(300 * time.Millisecond)
	b1, _ := GroupDemand(busy)
	i1, _ := GroupDemand(idle)
	if !ok1 || !ok2 {
		t.Fatal("no schedstat")
	}
	if d := b1 - b0; d < 100*time.Millisecond {
		t.Errorf("busy group: %v of demand in 300 ms, want most of it", d)
	}
	if d := i1 - i0; d > 10*time.Millisecond {
		t.Errorf("sleeping group: %v of demand in 300 ms, want about none", d)
	}
}
