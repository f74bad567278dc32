package clientpython

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/internal/netutil"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestTeardownEndsPeersCollective: with real torch and gloo, InProcess's
// teardown ends the connections its group's init opened, so a peer blocked
// in a collective on this rank fails at once and can rejoin, even when the
// destroyed group stays alive (torch 2.6; tests/torch_teardown.py keeps a
// reference to stand for it under torch 1.13). Without the shutdown the
// peer's all_reduce waits out the group's 300 s timeout.
func TestTeardownEndsPeersCollective(t *testing.T) {
	testenv.SkipShort(t, "runs the real launcher with Python ranks")
	testenv.Require(t, testenv.Torch)
	dir := t.TempDir()
	port, err := netutil.FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := func(rank int) (*exec.Cmd, *lockedbuf.Buffer) {
		out := &lockedbuf.Buffer{}
		cmd := exec.CommandContext(ctx, testenv.DebianPython, "tests/torch_teardown.py", strconv.Itoa(rank), strconv.Itoa(port), dir)
		cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1", "PYTHONUNBUFFERED=1")
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start rank %d: %v", rank, err)
		}
		return cmd, out
	}
	r0, out0 := start(0)
	r1, out1 := start(1)
	ended0, ended1 := make(chan error, 1), make(chan error, 1)
	go func() { ended0 <- r0.Wait() }()
	go func() { ended1 <- r1.Wait() }()
	defer func() { // both end, whatever failed
		_ = r0.Process.Kill()
		_ = r1.Process.Kill()
		<-ended0
		<-ended1
	}()

	select {
	case err := <-ended1:
		ended1 <- err // for the deferred wait
		if err != nil {
			t.Fatalf("rank 1: %v\nrank 1:\n%s\nrank 0:\n%s", err, out1, out0)
		}
	case <-time.After(90 * time.Second): // the group's timeout is 300 s: only the teardown ends it sooner
		t.Fatalf("rank 1's all_reduce did not fail after rank 0's teardown\nrank 0:\n%s", out0)
	}
	if !strings.Contains(out1.String(), "collective failed:") {
		t.Fatalf("rank 1 did not report its collective failing:\n%s", out1)
	}
	if !strings.Contains(out0.String(), "torn down") {
		t.Fatalf("rank 1's collective ended before rank 0's teardown:\nrank 0:\n%s\nrank 1:\n%s", out0, out1)
	}
	if err := os.WriteFile(filepath.Join(dir, "done"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err = <-ended0
	ended0 <- err
	if err != nil {
		t.Fatalf("rank 0: %v\n%s", err, out0)
	}
	t.Logf("rank 0: %s\nrank 1: %s", strings.TrimSpace(out0.String()), strings.TrimSpace(out1.String()))
}
