package earlysig

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// The tests run scenarios in a child process (this test binary again, with
// EARLYSIG_SCENARIO set), because their outcome may be the death of the
// process by a signal, and because the Catcher is the process's.

const scenarioEnv = "EARLYSIG_SCENARIO"

func TestMain(m *testing.M) {
	if name := os.Getenv(scenarioEnv); name != "" {
		os.Exit(runScenario(name))
	}
	os.Exit(m.Run())
}

// self sends sig to this process and waits (generously) until the runtime
// has taken it: only then does the scenario go on.
func self(sig syscall.Signal) { _ = syscall.Kill(os.Getpid(), sig); time.Sleep(200 * time.Millisecond) }

// expect waits for sig on ch; exit 0 when it comes.
func expect(ch <-chan os.Signal, sig syscall.Signal) int {
	select {
	case s := <-ch:
		if s != sig {
			fmt.Printf("got %v, want %v\n", s, sig)
			return 3
		}
		fmt.Println("delivered", s)
		return 0
	case <-time.After(30 * time.Second):
		fmt.Println("nothing delivered")
		return 4
	}
}

func runScenario(name string) int {
	c := Take()
	switch name {
	case "early handled": // SIGTERM before the set is known, then handled
		self(syscall.SIGTERM)
		return expect(c.Handle([]syscall.Signal{syscall.SIGTERM, syscall.SIGINT}), syscall.SIGTERM)
	case "early unhandled": // SIGHUP before the set is known, not in it: default action
		self(syscall.SIGHUP)
		c.Handle([]syscall.Signal{syscall.SIGTERM})
		time.Sleep(5 * time.Second)
		return 0
	case "early unhandled, ignored by Go": // as a Go program does without this package
		self(syscall.SIGUSR1)
		c.Handle([]syscall.Signal{syscall.SIGTERM})
		self(syscall.SIGUSR1)
		fmt.Println("survived")
		return 0
	case "released": // SIGHUP after Handle without it: default action
		c.Handle([]syscall.Signal{syscall.SIGTERM})
		self(syscall.SIGHUP)
		time.Sleep(5 * time.Second)
		return 0
	case "ignored at start": // SIGHUP was ignored at exec (nohup): ignored again once released
		self(syscall.SIGHUP)
		c.Handle([]syscall.Signal{syscall.SIGTERM})
		self(syscall.SIGHUP)
		fmt.Println("survived")
		return 0
	case "during returns": // held during the parse, delivered by Handle
		c.During(func() { self(syscall.SIGINT) }, 30*time.Second)
		return expect(c.Handle([]syscall.Signal{syscall.SIGINT}), syscall.SIGINT)
	case "during stuck": // the parse never returns: the signal's default action
		c.During(func() {
			self(syscall.SIGTERM)
			select {}
		}, 300*time.Millisecond)
		return 5
	case "outside catchable": // a handled signal that is not caught early
		ch := c.Handle([]syscall.Signal{syscall.SIGTERM, syscall.SIGWINCH})
		self(syscall.SIGWINCH)
		return expect(ch, syscall.SIGWINCH)
	}
	return 6
}

func TestScenarios(t *testing.T) {
	testenv.SkipShort(t, "signals real child processes")
	tests := []struct {
		name      string
		ignoreHUP bool
		killedBy  syscall.Signal // 0: exits 0
	}{
		{"early handled", false, 0},
		{"early unhandled", false, syscall.SIGHUP},
		{"early unhandled, ignored by Go", false, 0},
		{"released", false, syscall.SIGHUP},
		{"ignored at start", true, 0},
		{"during returns", false, 0},
		{"during stuck", false, syscall.SIGTERM},
		{"outside catchable", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cmd *exec.Cmd
			if tt.ignoreHUP {
				// trap '' sets SIG_IGN, which exec keeps.
				cmd = exec.Command("/bin/sh", "-c", `trap '' HUP; exec "$0" -test.run=^$`, os.Args[0])
			} else {
				cmd = exec.Command(os.Args[0], "-test.run=^$")
			}
			cmd.Env = append(os.Environ(), scenarioEnv+"="+tt.name)
			done := make(chan struct{})
			var out []byte
			var err error
			go func() { out, err = cmd.CombinedOutput(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				t.Fatalf("scenario did not end; output:\n%s", out)
			}
			var ee *exec.ExitError
			switch {
			case tt.killedBy == 0 && err != nil:
				t.Fatalf("scenario failed: %v; output:\n%s", err, out)
			case tt.killedBy != 0 && !errors.As(err, &ee):
				t.Fatalf("scenario ended with %v, want death by %v; output:\n%s", err, tt.killedBy, out)
			case tt.killedBy != 0:
				ws := ee.Sys().(syscall.WaitStatus)
				if !ws.Signaled() || ws.Signal() != tt.killedBy {
					t.Fatalf("scenario ended with %v, want death by %v; output:\n%s", err, tt.killedBy, out)
				}
			}
			t.Logf("%s", out)
		})
	}
}

// TestCatchableAreTerminating: the signals a Go program exits on by
// default are caught early, and none the runtime or the kernel relies on.
func TestCatchableAreTerminating(t *testing.T) {
	never := map[syscall.Signal]bool{syscall.SIGCHLD: true, syscall.SIGURG: true, syscall.SIGPROF: true, syscall.SIGPIPE: true,
		syscall.SIGSEGV: true, syscall.SIGBUS: true, syscall.SIGFPE: true, syscall.SIGILL: true, syscall.SIGTSTP: true,
		syscall.SIGTTIN: true, syscall.SIGTTOU: true, syscall.SIGCONT: true, syscall.SIGWINCH: true, syscall.SIGKILL: true, syscall.SIGSTOP: true}
	must := []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGSTKFLT}
	got := map[syscall.Signal]bool{}
	for _, s := range Catchable() {
		if never[s] {
			t.Errorf("%v must not be caught early", s)
		}
		got[s] = true
	}
	for _, s := range must {
		if !got[s] {
			t.Errorf("%v (a Go program exits on it) is not caught early", s)
		}
	}
}
