package runclock

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestAfterFiresAfterRunningTime(t *testing.T) {
	for _, d := range []time.Duration{0, 300 * time.Millisecond, time.Second} {
		start := time.Now()
		done, stop := After(d)
		select {
		case <-done:
		case <-time.After(d + 10*time.Second):
			t.Fatalf("After(%s) did not fire", d)
		}
		stop()
		stop() // idempotent
		if took := time.Since(start); took < d {
			t.Errorf("After(%s) fired after %s", d, took)
		}
	}
}

func TestWithTimeout(t *testing.T) {
	ctx, cancel := WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("not cancelled")
	}
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Errorf("cause %v, want the deadline", context.Cause(ctx))
	}
	ctx2, cancel2 := WithTimeout(context.Background(), time.Hour)
	cancel2()
	if !errors.Is(context.Cause(ctx2), context.Canceled) {
		t.Errorf("cancelled early: cause %v", context.Cause(ctx2))
	}
}

// TestFrozenTimeDoesNotCount freezes this test's own process (a child
// re-run of the test binary that stops itself with SIGSTOP for 6 s and is
// continued by the parent): a 5 s running-time timer started before the
// freeze has not fired right after it, while a wall-clock one would have.
func TestFrozenTimeDoesNotCount(t *testing.T) {
	testenv.SkipShort(t, "stops a child process for 6 s")
	if os.Getenv("RUNCLOCK_CHILD") == "1" {
		done, stop := After(5 * time.Second)
		defer stop()
		time.Sleep(300 * time.Millisecond)
		_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP) // the parent continues us 6 s later
		time.Sleep(200 * time.Millisecond)
		select {
		case <-done:
			os.Stdout.WriteString("fired\n")
		default:
			os.Stdout.WriteString("pending\n")
		}
		<-done
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFrozenTimeDoesNotCount$", "-test.v")
	cmd.Env = append(os.Environ(), "RUNCLOCK_CHILD=1")
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Wait for the child to stop itself, then continue it 6 s later.
	deadline := time.Now().Add(30 * time.Second)
	for !stopped(cmd.Process.Pid) {
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("the child never stopped itself")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(6 * time.Second)
	_ = cmd.Process.Signal(syscall.SIGCONT)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "pending") {
		t.Errorf("the timer fired across the freeze:\n%s", out.String())
	}
}

func stopped(pid int) bool {
	st, err := procfs.Read(pid)
	return err == nil && st.State == 'T'
}
