package spawn

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

const helperEnv = "SPAWN_TEST_HELPER"

// TestMain doubles as the Pdeathsig helper: the test binary re-executes
// itself with helperEnv set (the os/exec self-exec trick, no extra build).
func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "pdeathsig":
		pdeathsigHelper()
		return
	case "contain":
		containHelper()
		return
	}
	os.Exit(m.Run())
}

// pdeathsigHelper starts one rank, churns OS threads (goroutines that exit
// while locked kill their thread), prints the rank pid and blocks until killed.
func pdeathsigHelper() {
	r, err := NewReaper(nil)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	g, err := r.StartGroup([]Spec{{LocalRank: 0, Argv: []string{"sleep", "1000"}}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := 0; i < 20; i++ {
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked: the thread dies with the goroutine
			close(done)
		}()
		<-done
	}
	fmt.Println(g.PIDs()[0])
	select {}
}

func newReaper(t *testing.T) *Reaper {
	t.Helper()
	r, err := NewReaper(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
		assertNoChildren(t)
	})
	return r
}

func startGroup(t *testing.T, r *Reaper, specs []Spec) *Group {
	t.Helper()
	g, err := r.StartGroup(specs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGKILL, 0) })
	return g
}

func sh(rank int, script string) Spec {
	return Spec{LocalRank: rank, Argv: []string{"sh", "-c", script}}
}

// collect reads n exits, failing after a generous timeout.
func collect(t *testing.T, g *Group, n int) map[int]Exit {
	t.Helper()
	got := make(map[int]Exit)
	timeout := time.After(30 * time.Second)
	for len(got) < n {
		select {
		case e := <-g.Exits():
			got[e.LocalRank] = e
		case <-timeout:
			t.Fatalf("only %d of %d ranks exited: %v", len(got), n, got)
		}
	}
	return got
}

// pidState returns the /proc state letter of pid, or 0 when it is gone.
func pidState(pid int) byte {
	ps, err := procfs.Read(pid)
	if err != nil {
		return 0
	}
	return ps.State
}

func waitGone(t *testing.T, pid int, what string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if pidState(pid) == 0 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s (pid %d) still present, state %q", what, pid, pidState(pid))
}

// waitFileInt polls for a file holding one integer written by a script.
func waitFileInt(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(path)
		if err == nil && strings.HasSuffix(string(b), "\n") {
			n, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return n
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never written", path)
	return 0
}

// assertNoChildren checks that no process has this test binary as parent.
func assertNoChildren(t *testing.T) {
	t.Helper()
	procs, err := procfs.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if p.PPID == os.Getpid() {
			t.Errorf("leftover child pid %d (%s) state %c", p.PID, p.Comm, p.State)
		}
	}
}

func TestExitReporting(t *testing.T) {
	r := newReaper(t)
	tests := []struct {
		name       string
		script     string
		code       int
		sig        syscall.Signal
		torch      int
		failed     bool
		wantString string
	}{
		{"success", "exit 0", 0, 0, 0, false, "exited with code 0"},
		{"true", "/bin/true", 0, 0, 0, false, "exited with code 0"},
		{"code3", "exit 3", 3, 0, 3, true, "exited with code 3"},
		{"sigkill", "kill -9 $$", -1, syscall.SIGKILL, -9, true, "killed by signal 9 (SIGKILL)"},
		{"sigterm", "kill -TERM $$", -1, syscall.SIGTERM, -15, true, "killed by signal 15 (SIGTERM)"},
	}
	specs := make([]Spec, len(tests))
	for i, tc := range tests {
		specs[i] = sh(i, tc.script)
	}
	g := startGroup(t, r, specs)
	if len(g.PIDs()) != len(tests) {
		t.Fatalf("PIDs: %v", g.PIDs())
	}
	got := collect(t, g, len(tests))
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := got[i]
			if e.PID != g.PIDs()[i] {
				t.Errorf("pid %d, want %d", e.PID, g.PIDs()[i])
			}
			if e.Code != tc.code || e.Signal != tc.sig || e.TorchExitCode() != tc.torch || e.Failed() != tc.failed {
				t.Errorf("got %+v torch=%d failed=%v", e, e.TorchExitCode(), e.Failed())
			}
			if !strings.Contains(e.String(), tc.wantString) {
				t.Errorf("String() = %q, want it to contain %q", e.String(), tc.wantString)
			}
			if e.At.IsZero() {
				t.Error("At not set")
			}
		})
	}
	// A reaped rank is not an error to signal.
	if err := g.Signal(0, syscall.SIGTERM); err != nil {
		t.Errorf("Signal on exited rank: %v", err)
	}
	if err := g.Signal(99, syscall.SIGTERM); err == nil {
		t.Error("Signal on unknown rank: want error")
	}
}

func TestStdoutEnvDir(t *testing.T) {
	r := newReaper(t)
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	g := startGroup(t, r, []Spec{{
		LocalRank: 0,
		Argv:      []string{"sh", "-c", `echo "$FOO $(pwd)"; echo err >&2`},
		Env:       []string{"FOO=bar", "PATH=" + os.Getenv("PATH")},
		Dir:       dir,
		Stdout:    out,
		Stderr:    out,
	}})
	if e := collect(t, g, 1)[0]; e.Failed() {
		t.Fatalf("exit %v", e)
	}
	b, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	if want := "bar " + dir + "\nerr\n"; string(b) != want {
		t.Errorf("output %q, want %q", b, want)
	}
}

func TestSignalAndPgid(t *testing.T) {
	r := newReaper(t)
	// sleep itself, not sh -c: dash catches SIGINT-like signals in ways that
	// race with its fork; SIGUSR1/2 are never inherited as ignored.
	g := startGroup(t, r, []Spec{
		{LocalRank: 0, Argv: []string{"sleep", "1000"}},
		{LocalRank: 1, Argv: []string{"sleep", "1000"}},
	})
	for lr, pid := range g.PIDs() {
		ps, err := procfs.Read(pid)
		if err != nil {
			t.Fatal(err)
		}
		if ps.PGID != pid || ps.PPID != os.Getpid() {
			t.Errorf("rank %d: pgid %d ppid %d, want pgid %d ppid %d", lr, ps.PGID, ps.PPID, pid, os.Getpid())
		}
	}
	if err := g.Signal(1, syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	e := collect(t, g, 1)[1]
	if e.LocalRank != 1 || e.Signal != syscall.SIGUSR2 {
		t.Fatalf("got %v, want rank 1 killed by SIGUSR2", e)
	}
	g.SignalAll(syscall.SIGUSR1)
	e = collect(t, g, 1)[0]
	if e.LocalRank != 0 || e.Signal != syscall.SIGUSR1 {
		t.Fatalf("got %v, want rank 0 killed by SIGUSR1", e)
	}
}

func TestStopEscalatesIgnoredSIGTERM(t *testing.T) {
	r := newReaper(t)
	ready := filepath.Join(t.TempDir(), "ready")
	g := startGroup(t, r, []Spec{
		sh(0, "sleep 1000"),
		sh(1, "trap '' TERM; echo 1 > "+ready+"; while :; do sleep 1; done"),
	})
	waitFileInt(t, ready)
	grace := 300 * time.Millisecond
	start := time.Now()
	res := g.Stop(syscall.SIGTERM, grace)
	took := time.Since(start)
	if !slices.Equal(res.Escalated, []int{1}) {
		t.Errorf("Escalated = %v, want [1]", res.Escalated)
	}
	if len(res.Leftover) != 0 {
		t.Errorf("Leftover = %v", res.Leftover)
	}
	if len(res.Exits) != 2 {
		t.Fatalf("Exits = %v", res.Exits)
	}
	if res.Exits[0].Signal != syscall.SIGTERM || res.Exits[1].Signal != syscall.SIGKILL {
		t.Errorf("Exits = %v, want rank 0 SIGTERM, rank 1 SIGKILL", res.Exits)
	}
	if took < grace {
		t.Errorf("Stop returned after %v, before the grace %v", took, grace)
	}
	for _, pid := range g.PIDs() {
		if s := pidState(pid); s != 0 {
			t.Errorf("pid %d still present (%c)", pid, s)
		}
	}
}

func TestStopKillsGrandchildren(t *testing.T) {
	r := newReaper(t)
	dir := t.TempDir()
	same := filepath.Join(dir, "same")
	escaped := filepath.Join(dir, "escaped")
	g := startGroup(t, r, []Spec{
		// A grandchild in the rank's process group that ignores SIGTERM
		// (ignored dispositions survive exec); the rank itself dies on SIGTERM.
		sh(0, "(trap '' TERM; exec sleep 1000) & echo $! > "+same+"; wait"),
		// A grandchild that escapes into its own session.
		sh(1, "setsid sleep 1000 & echo $! > "+escaped+"; wait"),
	})
	gcSame := waitFileInt(t, same)
	gcEsc := waitFileInt(t, escaped)
	// The escapee must really have left the rank's group before we stop.
	deadline := time.Now().Add(20 * time.Second)
	for {
		ps, err := procfs.Read(gcEsc)
		if err == nil && ps.PGID == gcEsc && ps.Comm == "sleep" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("escapee never ran setsid: %+v %v", ps, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ps, _ := procfs.Read(gcSame); ps.PGID != g.PIDs()[0] {
		t.Fatalf("same-group grandchild pgid %d, want %d", ps.PGID, g.PIDs()[0])
	}

	res := g.Stop(syscall.SIGTERM, 5*time.Second)
	if len(res.Escalated) != 0 || len(res.Leftover) != 0 {
		t.Errorf("Stop = %+v, want no escalation and no leftover", res)
	}
	for _, pid := range []int{gcSame, gcEsc, g.PIDs()[0], g.PIDs()[1]} {
		if s := pidState(pid); s != 0 {
			t.Errorf("pid %d still present (state %c) after Stop", pid, s)
		}
	}
}

func TestOrphanedGrandchildIsReaped(t *testing.T) {
	r := newReaper(t)
	gcFile := filepath.Join(t.TempDir(), "gc")
	g := startGroup(t, r, []Spec{sh(0, "sleep 1 & echo $! > "+gcFile+"; exit 0")})
	gc := waitFileInt(t, gcFile)
	if e := collect(t, g, 1)[0]; e.Failed() {
		t.Fatalf("rank: %v", e)
	}
	// The rank is gone, so the grandchild was reparented to us (subreaper).
	if ps, err := procfs.Read(gc); err == nil && ps.PPID != os.Getpid() {
		t.Fatalf("orphan ppid %d, want the launcher %d", ps.PPID, os.Getpid())
	}
	waitGone(t, gc, "exited orphan (zombie not reaped?)")
}

func TestPdeathsigKillsRankWhenLauncherDies(t *testing.T) {
	r := newReaper(t)
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	g := startGroup(t, r, []Spec{{
		LocalRank: 0,
		Argv:      []string{self, "-test.run=^$"},
		Env:       append(os.Environ(), helperEnv+"=pdeathsig"),
		Stdout:    pw,
	}})
	pw.Close()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("helper output: %q %v", line, err)
	}
	rank, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("helper said %q", line)
	}
	// Thread churn in the helper must not have killed the rank.
	time.Sleep(200 * time.Millisecond)
	if s := pidState(rank); s == 0 || s == 'Z' {
		t.Fatalf("rank %d died while its launcher was alive (state %q)", rank, s)
	}
	if err := g.Signal(0, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if e := collect(t, g, 1)[0]; e.Signal != syscall.SIGKILL {
		t.Fatalf("helper exit %v", e)
	}
	waitGone(t, rank, "rank of SIGKILLed launcher")
}

func TestStartGroupMissingExecutable(t *testing.T) {
	r := newReaper(t)
	missing := filepath.Join(t.TempDir(), "no-such-program")
	g, err := r.StartGroup([]Spec{sh(0, "sleep 1000"), sh(1, "sleep 1000"), {LocalRank: 2, Argv: []string{missing}}})
	if err == nil {
		g.Stop(syscall.SIGKILL, 0)
		t.Fatal("want error")
	}
	if !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "local rank 2") {
		t.Errorf("error %q does not name the executable and rank", err)
	}
	assertNoChildren(t)
	if n := r.liveCount(); n != 0 {
		t.Errorf("%d tracked children left", n)
	}

	_, err = r.StartGroup([]Spec{{LocalRank: 0, Argv: []string{"no-such-program-in-path-xyz"}}})
	if err == nil || !strings.Contains(err.Error(), "no-such-program-in-path-xyz") {
		t.Errorf("PATH lookup error = %v", err)
	}
	if _, err := r.StartGroup([]Spec{sh(0, "true"), sh(0, "true")}); err == nil {
		t.Error("duplicate local rank: want error")
	}
}

func TestRun(t *testing.T) {
	r := newReaper(t)
	out, exit, err := r.Run(context.Background(), []string{"sh", "-c", "echo out; echo err >&2; exit 7"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if exit.Code != 7 || exit.Signal != 0 || !exit.Failed() {
		t.Errorf("exit %+v, want code 7", exit)
	}
	if string(out) != "out\nerr\n" {
		t.Errorf("out %q", out)
	}

	// A background process left by the helper must not keep Run waiting.
	out, exit, err = r.Run(context.Background(), []string{"sh", "-c", "sleep 1000 & echo bg"}, nil)
	if err != nil || exit.Failed() || string(out) != "bg\n" {
		t.Errorf("with background child: out %q exit %v err %v", out, exit, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, exit, err = r.Run(ctx, []string{"sleep", "1000"}, nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err %v, want deadline exceeded", err)
	}
	if exit.Signal != syscall.SIGKILL {
		t.Errorf("exit %v, want SIGKILL", exit)
	}

	if _, _, err := r.Run(context.Background(), []string{"/nonexistent/tool"}, nil); err == nil || !strings.Contains(err.Error(), "/nonexistent/tool") {
		t.Errorf("missing tool err %v", err)
	}
}

// TestKeptChildSurvivesTheSweep: a child started outside the Reaper and
// registered with Keep (the cgroup guardian) is not an orphan for a stop's
// sweep, while an unregistered one is.
func TestKeptChildSurvivesTheSweep(t *testing.T) {
	r := newReaper(t)
	start := func() *exec.Cmd {
		c := exec.Command("sleep", "60")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			// Dead (a zombie for the Reaper's Close to reap) before
			// Close runs: Close does not wait for kept children.
			_ = c.Process.Kill()
			for i := 0; i < 200; i++ {
				b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
				if err != nil || strings.Contains(string(b), ") Z ") {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
		return c
	}
	kept, stray := start(), start()
	r.Keep(kept.Process.Pid)
	g, err := r.StartGroup([]Spec{{LocalRank: 0, Argv: []string{"sleep", "60"}}})
	if err != nil {
		t.Fatal(err)
	}
	g.Stop(syscall.SIGTERM, time.Second)
	if err := syscall.Kill(kept.Process.Pid, 0); err != nil {
		t.Fatalf("the kept child was swept: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", stray.Process.Pid))
	if len(b) > 0 && !strings.Contains(string(b), ") Z ") {
		t.Fatalf("the unregistered child was not swept: %s", b)
	}
}

// TestCloseLeavesKeptChildAlone: Close does not wait for a kept child (the
// cgroup guardian lives until the launcher exits) nor report it unreaped:
// every launcher exit waited the full bound for it once.
func TestCloseLeavesKeptChildAlone(t *testing.T) {
	var logs strings.Builder
	r, err := NewReaper(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command("sleep", "60")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	r.Keep(c.Process.Pid)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(c.Process.Pid, 0); err != nil {
		t.Fatalf("the kept child is gone after Close: %v", err)
	}
	if strings.Contains(logs.String(), "unreaped") {
		t.Errorf("Close reported the kept child: %s", logs.String())
	}
	_ = c.Process.Kill()
	_ = c.Wait()
}

// TestEndingBeforeReaped: of two ranks SIGKILLed together, the one whose
// exit has not been delivered yet is already ending (the in-process
// restart must not keep it as a survivor); a live rank is not.
func TestEndingBeforeReaped(t *testing.T) {
	r := newReaper(t)
	g := startGroup(t, r, []Spec{
		{LocalRank: 0, Argv: []string{"sleep", "1000"}},
		{LocalRank: 1, Argv: []string{"sleep", "1000"}},
		{LocalRank: 2, Argv: []string{"sleep", "1000"}},
	})
	t.Cleanup(func() { g.Stop(syscall.SIGKILL, 0) })
	pids := g.PIDs()
	for lr := range 3 {
		if g.Ending(lr) {
			t.Fatalf("running local rank %d reported ending", lr)
		}
	}
	_ = syscall.Kill(pids[0], syscall.SIGKILL)
	_ = syscall.Kill(pids[1], syscall.SIGKILL)
	// Within a few ms (the agent looks after its settle window of 100 ms;
	// the kernel goes from the pending SIGKILL to do_exit in microseconds).
	deadline := time.Now().Add(20 * time.Millisecond)
	for lr := range 2 {
		for !g.Ending(lr) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if !g.Ending(lr) {
			t.Fatalf("local rank %d SIGKILLed a moment ago is not reported ending", lr)
		}
	}
	if g.Ending(2) {
		t.Fatal("live local rank 2 reported ending")
	}
	collect(t, g, 2)
	if !g.Ending(0) || !g.Ending(1) || !g.Ending(7) {
		t.Fatal("reaped ranks (or an unknown one) are not reported ending")
	}
}
