package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestMain lets the test binary play `ft-resumer node` (FTR_NODE_TEST=1)
// and the launcher under it (first argument "ftr-child").
func TestMain(m *testing.M) {
	if len(os.Args) > 2 && os.Args[1] == "ftr-child" {
		os.Exit(nodeChild(os.Args[2], os.Args[3]))
	}
	if os.Getenv("FTR_NODE_TEST") == "1" {
		os.Unsetenv("FTR_NODE_TEST")
		os.Exit(cmdNode(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// nodeChild is the launcher's stand-in: it logs its pid, its verdict path
// and every signal it receives to logPath, one line each. Mode "verdict"
// first writes a verdict of its own, as ft-launcher does when it stops;
// SIGINT makes it exit 5.
func nodeChild(mode, logPath string) int {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return 90
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGHUP, syscall.SIGINT, syscall.SIGCONT)
	if mode == "verdict" {
		if err := verdict.Write(os.Getenv(verdict.EnvPath), verdict.Verdict{Kind: verdict.Signaled, PID: os.Getpid(), Reason: "child"}); err != nil {
			return 91
		}
	}
	fmt.Fprintf(f, "ready %d %s\n", os.Getpid(), os.Getenv(verdict.EnvPath))
	for s := range sigs {
		fmt.Fprintln(f, unix.SignalName(s.(syscall.Signal)))
		if s == syscall.SIGINT {
			return 5
		}
	}
	return 0
}

// nodeProc is `ft-resumer node -- CMD...` running as a separate process.
type nodeProc struct {
	cmd    *exec.Cmd
	stderr bytes.Buffer
	done   chan struct{}
	log    string
	dir    string
}

func startNode(t *testing.T, env []string, args ...string) *nodeProc {
	t.Helper()
	dir := t.TempDir()
	p := &nodeProc{done: make(chan struct{}), log: filepath.Join(dir, "child.log"), dir: dir}
	for i, a := range args {
		args[i] = strings.ReplaceAll(a, "LOG", p.log)
	}
	p.cmd = exec.Command(os.Args[0], append([]string{"--"}, args...)...)
	p.cmd.Env = append(append(os.Environ(), "FTR_NODE_TEST=1", "FT_RESUMER_JOB_DIR="+dir, "SLURMD_NODENAME=n7",
		verdict.EnvPath+"="), env...)
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if pid := p.childPID(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return p
}

// lines returns the child's log.
func (p *nodeProc) lines() []string {
	b, _ := os.ReadFile(p.log)
	return strings.Fields(strings.ReplaceAll(string(b), "\n", " \n"))
}

func (p *nodeProc) childPID() int {
	b, _ := os.ReadFile(p.log)
	f := strings.Fields(string(b))
	if len(f) > 1 && f[0] == "ready" {
		n, _ := strconv.Atoi(f[1])
		return n
	}
	return 0
}

// waitFor waits until the child's log has a line for which ok holds.
func (p *nodeProc) waitLog(t *testing.T, what string, ok func(string) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(p.log)
		if ok(string(b)) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	b, _ := os.ReadFile(p.log)
	t.Fatalf("child log never had %s:\n%s\nnode stderr:\n%s", what, b, p.stderr.String())
}

func (p *nodeProc) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("ft-resumer node did not exit\n%s", p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *nodeProc) verdictPath() string { return filepath.Join(p.dir, "verdict-n7.json") }

// TestNodeForwardsSignals: every signal reaches the launcher, a repeated
// SIGTERM 10 ms apart as two; ft-resumer node exits with the launcher's
// code and writes no verdict for an exit with a code.
func TestNodeForwardsSignals(t *testing.T) {
	p := startNode(t, nil, os.Args[0], "ftr-child", "plain", "LOG")
	p.waitLog(t, "ready", func(s string) bool { return strings.HasPrefix(s, "ready") })
	if want := "ready " + strconv.Itoa(p.childPID()) + " " + p.verdictPath(); !strings.Contains(strings.Join(p.lines(), " "), want) {
		t.Errorf("child log %q: want %q (the node's verdict path in its environment)", p.lines(), want)
	}
	node := p.cmd.Process
	for _, s := range []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGHUP} {
		if err := node.Signal(s); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.waitLog(t, "four signals", func(s string) bool { return strings.Count(s, "\n") >= 5 })
	got := strings.Fields(strings.TrimPrefix(strings.SplitN(readFile(t, p.log), "\n", 2)[1], "\n"))
	if strings.Join(got, " ") != "SIGTERM SIGTERM SIGUSR1 SIGHUP" {
		t.Errorf("signals the child received: %v, want SIGTERM SIGTERM SIGUSR1 SIGHUP", got)
	}
	if err := node.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if code := p.exit(t); code != 5 {
		t.Errorf("ft-resumer node exited %d, want the child's 5\n%s", code, p.stderr.String())
	}
	if _, err := os.Stat(p.verdictPath()); err == nil {
		t.Errorf("a verdict was written for a launcher that exited with a code")
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestNodeRecordsLauncherDeath: a launcher killed without a verdict gets
// one from ft-resumer node (fatal_error, this node quarantined with
// evidence launcher_died); its own verdict, a kill forwarded from outside,
// an exit with a code, or a teardown that kills ft-resumer node too leave
// none; the exit status is 128+N for a death by signal N.
func TestNodeRecordsLauncherDeath(t *testing.T) {
	child := func(mode string) []string { return []string{os.Args[0], "ftr-child", mode, "LOG"} }
	tests := []struct {
		name     string
		args     []string
		stale    bool // an earlier launcher's verdict is at the path
		act      func(t *testing.T, p *nodeProc)
		code     int
		recorded bool // ft-resumer node wrote the verdict
		sig      string
	}{
		{name: "SIGKILL without a verdict", args: child("plain"), code: 137, recorded: true, sig: "SIGKILL",
			act: func(t *testing.T, p *nodeProc) { killChild(t, p, syscall.SIGKILL) }},
		{name: "SIGSEGV, an earlier launcher's verdict there", args: []string{"/bin/sh", "-c", "kill -SEGV $$"},
			stale: true, code: 139, recorded: true, sig: "SIGSEGV"},
		{name: "SIGKILL after the launcher wrote its verdict", args: child("verdict"), code: 137,
			act: func(t *testing.T, p *nodeProc) { killChild(t, p, syscall.SIGKILL) }},
		{name: "killed by a forwarded SIGTERM", args: []string{"/bin/sh", "-c", "echo ready $$ > LOG; exec sleep 30"}, code: 143,
			act: func(t *testing.T, p *nodeProc) {
				p.waitLog(t, "ready", func(s string) bool { return strings.HasPrefix(s, "ready") })
				_ = p.cmd.Process.Signal(syscall.SIGTERM)
			}},
		{name: "exit with a code", args: []string{"/bin/sh", "-c", "exit 7"}, code: 7},
		{name: "the whole step SIGKILLed", args: child("plain"), code: -1,
			act: func(t *testing.T, p *nodeProc) {
				killChild(t, p, syscall.SIGKILL)
				_ = p.cmd.Process.Signal(syscall.SIGKILL)
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p *nodeProc
			if tt.stale {
				dir := t.TempDir()
				if err := verdict.Write(filepath.Join(dir, "verdict-n7.json"), verdict.Verdict{Kind: verdict.Succeeded, PID: 1}); err != nil {
					t.Fatal(err)
				}
				p = startNode(t, []string{verdict.EnvPath + "=" + filepath.Join(dir, "verdict-n7.json"), "FT_RESUMER_JOB_DIR="}, tt.args...)
				p.dir = dir
			} else {
				p = startNode(t, nil, tt.args...)
			}
			if tt.act != nil {
				tt.act(t, p)
			}
			if code := p.exit(t); code != tt.code {
				t.Fatalf("ft-resumer node exited %d, want %d\n%s", code, tt.code, p.stderr.String())
			}
			if tt.code == -1 {
				time.Sleep(2 * killSettle) // nothing may be written late either
			}
			v, err := verdict.Read(p.verdictPath())
			switch {
			case tt.recorded:
				if err != nil {
					t.Fatalf("no verdict recorded: %v\n%s", err, p.stderr.String())
				}
				if v.Kind != verdict.FatalError || v.ExitCode != tt.code || v.Signal != tt.sig ||
					!strings.Contains(v.Reason, "was killed by "+tt.sig+" without a verdict") {
					t.Errorf("verdict %+v: want fatal_error, exit %d, %s", v, tt.code, tt.sig)
				}
				if len(v.Quarantined) != 1 || v.Quarantined[0].Host != "n7" || v.Quarantined[0].Evidence != verdict.EvidenceLauncherDied {
					t.Errorf("quarantined %+v: want node n7, evidence launcher_died", v.Quarantined)
				}
				if !strings.Contains(p.stderr.String(), "quarantined: launcher_died") {
					t.Errorf("stderr does not say the node was recorded:\n%s", p.stderr.String())
				}
			case tt.name == "SIGKILL after the launcher wrote its verdict":
				if err != nil || v.Kind != verdict.Signaled || v.Reason != "child" {
					t.Errorf("the launcher's own verdict was replaced: %+v, %v", v, err)
				}
			case tt.stale:
				t.Fatal("unreachable")
			default:
				if err == nil {
					t.Errorf("verdict written: %+v", v)
				}
			}
		})
	}
}

// killChild waits for the child to be ready and signals it (not its parent).
func killChild(t *testing.T, p *nodeProc, s syscall.Signal) {
	t.Helper()
	p.waitLog(t, "ready", func(s string) bool { return strings.HasPrefix(s, "ready") })
	if err := syscall.Kill(p.childPID(), s); err != nil {
		t.Fatal(err)
	}
}
