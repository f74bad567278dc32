package procfs

import (
	"os/exec"
	"testing"
	"time"
)

// TestEnding: a running child is not ending; once SIGKILLed it is, before
// its parent reaps it (pending SIGKILL, exiting or a zombie) and after.
func TestEnding(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if Ending(pid) {
		t.Fatal("a running child is reported ending")
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !Ending(pid) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if !Ending(pid) {
		t.Fatal("a SIGKILLed child that is not reaped is not reported ending")
	}
	_ = cmd.Wait()
	if !Ending(pid) {
		t.Fatal("a reaped child is not reported ending")
	}
	if Ending(0) || Ending(-1) {
		t.Fatal("a non-positive pid is reported ending")
	}
}

func TestEndingParsers(t *testing.T) {
	for _, tc := range []struct {
		stat  string
		flags uint64
		ok    bool
	}{
		{"12 (py thon) R 1 12 12 0 -1 4194368 0 0", 4194368, true},
		{"12 (x) R 1 12 12 0 -1 4194372 0", 4194372, true}, // PF_EXITING set
		{"12 (x) R 1 12", 0, false},
		{"12 x R", 0, false},
	} {
		got, ok := statFlags([]byte(tc.stat))
		if got != tc.flags || ok != tc.ok {
			t.Errorf("statFlags(%q) = %d, %v; want %d, %v", tc.stat, got, ok, tc.flags, tc.ok)
		}
	}
	for _, tc := range []struct {
		status string
		want   bool
	}{
		{"Name:\tx\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n", false},
		{"Name:\tx\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n", true},
		{"ShdPnd:\t0000000000000102\n", true},
		{"SigPnd:\t0000000000000200\n", false}, // SIGUSR1 (10) only
		{"SigPnd:\tzz\n", false},
	} {
		if got := sigkillPending([]byte(tc.status)); got != tc.want {
			t.Errorf("sigkillPending(%q) = %v, want %v", tc.status, got, tc.want)
		}
	}
}
