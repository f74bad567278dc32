package resumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ForwardedSignals are the signals `ft-resumer step run` passes on to the
// job script's processes. USR1, USR2 and TERM are also recorded as Slurm's
// warning (--signal=B:SIG@N), which makes the job walltime-like.
var ForwardedSignals = []os.Signal{syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT}

// JobScript runs the user's job script for the generated wrapper. The
// script runs in its own process group with this process as its child
// subreaper, so that a signal reaches every process of it (srun included,
// which forwards it to the launchers of its step) and so that, after a
// warning, the processes the script leaves behind (an srun still saving
// when the script itself died of the signal) are waited for, not cut off
// when the batch script ends.
type JobScript struct {
	Argv   []string
	JobDir string    // the job's directory: WarningFile is written there
	Log    io.Writer // one line per forwarded signal (nil: discarded)
	// RepeatWindow: the same signal again within it is not forwarded
	// again (Slurm's TERM at the time limit reaches this process directly
	// and through the wrapper's trap).
	RepeatWindow time.Duration
	// AfterStart, when set, runs once the script has started, beside it
	// (the successor's submission: off the path to the first step); Run
	// returns only after it has returned.
	AfterStart func()
	// Env is added to this process's environment for the script.
	Env []string
}

// Run runs the script until it (and, after a warning signal, every process
// it left) has exited, forwarding what arrives on sigs. It returns the
// script's status as a shell reports it (128+n for a death by signal n).
func (j JobScript) Run(ctx context.Context, sigs <-chan os.Signal) (int, error) {
	if len(j.Argv) == 0 {
		return 2, errors.New("slurm: step run: no job script given")
	}
	// Orphans of the script become our children: waited for after a
	// warning. Failing this only loses that wait.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	cmd := exec.Command(j.Argv[0], j.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if len(j.Env) > 0 {
		cmd.Env = append(os.Environ(), j.Env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 127, fmt.Errorf("slurm: step run: %w", err)
	}
	pgid := cmd.Process.Pid
	hooked := make(chan struct{})
	go func() {
		defer close(hooked)
		if j.AfterStart != nil {
			j.AfterStart()
		}
	}()
	defer func() { <-hooked }()
	done := make(chan int, 1)
	go func() {
		err := cmd.Wait()
		done <- exitStatus(cmd.ProcessState, err)
	}()
	last := map[os.Signal]time.Time{}
	warned := false
	forward := func(s os.Signal) {
		now := time.Now()
		if t, ok := last[s]; ok && now.Sub(t) < j.RepeatWindow {
			return
		}
		last[s] = now
		name := strings.TrimPrefix(unix.SignalName(s.(syscall.Signal)), "SIG")
		if name == "USR1" || name == "USR2" || name == "TERM" {
			warned = true
			j.record(name, now)
		}
		j.logf("forwarding SIG%s to the job script's processes (group %d)", name, pgid)
		_ = unix.Kill(-pgid, s.(syscall.Signal))
	}
	rc := -1
	for rc < 0 {
		select {
		case s := <-sigs:
			forward(s)
		case rc = <-done:
		case <-ctx.Done():
			_ = unix.Kill(-pgid, syscall.SIGTERM)
			rc = <-done
		}
	}
	// The hook's own children (sbatch) must be its to wait for, not the
	// reaper's below.
	for waiting := true; waiting; {
		select {
		case s := <-sigs:
			forward(s)
		case <-hooked:
			waiting = false
		}
	}
	if !warned {
		return rc, nil
	}
	// After a warning the steps may still be saving: wait for what the
	// script left, still forwarding (Slurm ends it all at the time limit).
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(-1, &ws, 0, nil); errors.Is(err, unix.ECHILD) {
				return
			} else if err != nil && !errors.Is(err, unix.EINTR) {
				return
			}
		}
	}()
	for {
		select {
		case s := <-sigs:
			forward(s)
		case <-reaped:
			return rc, nil
		case <-ctx.Done():
			return rc, nil
		}
	}
}

func (j JobScript) record(sig string, at time.Time) {
	if j.JobDir == "" {
		return
	}
	f, err := os.OpenFile(filepath.Join(j.JobDir, WarningFile), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		j.logf("cannot record SIG%s: %v", sig, err)
		return
	}
	fmt.Fprintf(f, "%s %.6f\n", sig, float64(at.UnixNano())/1e9)
	_ = f.Close()
}

func (j JobScript) logf(format string, a ...any) {
	if j.Log != nil {
		fmt.Fprintf(j.Log, "ft-resumer: "+format+"\n", a...)
	}
}

// exitStatus is a process's status as a shell reports it.
func exitStatus(ps *os.ProcessState, err error) int {
	if ps == nil {
		return 127
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
