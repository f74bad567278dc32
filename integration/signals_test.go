package integration

import (
	"errors"
	"fmt"
	"github.com/ftlauncher/ft-launcher/internal/testworkers"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// signalBound is how soon the launcher must be gone after a signal that
// ends it. The requirement is 1 s (measured: tens of milliseconds); the
// bound leaves room for a loaded CI machine while staying far below the
// waits the signal cuts short (a 600 s connect timeout, a 60 s term timeout).
const signalBound = 5 * time.Second

// emptyDir fails the test when dir holds anything (a monitor socket dir,
// an etcd data dir: the launcher's TMPDIR must be left as found).
func emptyDir(t *testing.T, dir string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		t.Errorf("left behind in the launcher's TMPDIR: %s", filepath.Join(dir, e.Name()))
	}
}

// waitExit waits for the launcher and returns how long after since it exited.
func (j *job) waitExit(since time.Time) (int, time.Duration) {
	j.t.Helper()
	code := j.wait(generous)
	return code, time.Since(since)
}

// TestSIGTERMDuringEtcdConnect: a signal while the launcher waits for an
// unreachable etcd (connect_timeout 600 s) ends it at once, with a
// signaled verdict and nothing left behind.
func TestSIGTERMDuringEtcdConnect(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	tmp := filepath.Join(j.dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	vpath := filepath.Join(j.dir, "verdict.json")
	s := j.script("never.sh", "echo started > \"$OUT/started\"\n")
	j.start([]string{"OUT=" + j.dir, "TMPDIR=" + tmp}, "--nnodes", "2", "--nproc-per-node", "1",
		"--rdzv-backend", "etcd", "--rdzv-endpoint", dead, "--rdzv-conf", "connect_timeout=600",
		"--verdict-file", vpath, "--log-dir", filepath.Join(j.dir, "logs"), "--no-python", s)
	// The event log is opened at the start of the set-up; the etcd connect
	// comes milliseconds later and then waits.
	waitFile(t, j.events, generous)
	time.Sleep(500 * time.Millisecond)
	select {
	case <-j.done:
		t.Fatalf("the launcher exited before the signal:\n%s", j.stderr.String())
	default:
	}
	sent := time.Now()
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took := j.waitExit(sent)
	t.Logf("exited %s after SIGTERM", took)
	if took > signalBound {
		t.Errorf("exited %s after SIGTERM during the etcd connect, want within %s", took, signalBound)
	}
	if code != 1 {
		t.Errorf("exit %d, want 1\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.Signaled, 1)
	if v.Signal != "SIGTERM" {
		t.Errorf("verdict signal %q, want SIGTERM", v.Signal)
	}
	if ev := j.eventsOf("signal_received"); len(ev) != 1 || ev[0]["state"] != "setup" {
		t.Errorf("signal_received events %v, want one in state setup", ev)
	}
	if _, err := os.Stat(filepath.Join(j.dir, "started")); err == nil {
		t.Error("a rank started")
	}
	if left := j.waitNoLeftovers(10 * time.Second); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
	emptyDir(t, tmp)
}

// TestSIGTERMAtRandomMomentsDuringStartup: SIGTERM 0-50 ms after the
// launcher starts, 20 times: whatever it was doing (runtime start,
// parsing, set-up, spawning ranks), it ends, and leaves no process and no
// socket directory. Once it runs past the runtime's start (about a
// millisecond), it handles the signal: a signaled verdict.
func TestSIGTERMAtRandomMomentsDuringStartup(t *testing.T) {
	skipShort(t)
	handled, early := 0, 0
	for i := 0; i < 20; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			j := newJob(t)
			tmp := filepath.Join(j.dir, "tmp")
			if err := os.Mkdir(tmp, 0o755); err != nil {
				t.Fatal(err)
			}
			vpath := filepath.Join(j.dir, "verdict.json")
			s := j.script("sleeper.sh", "exec sleep 30\n")
			delay := time.Duration(rand.IntN(51)) * time.Millisecond
			j.start([]string{"TMPDIR=" + tmp}, "--standalone", "--nproc-per-node", "2",
				"--verdict-file", vpath, "--log-dir", filepath.Join(j.dir, "logs"), "--no-python", s)
			time.Sleep(delay)
			if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			code := j.wait(generous)
			var ee *exec.ExitError
			switch {
			case errors.As(j.exitErr, &ee) && ee.Sys().(syscall.WaitStatus).Signaled():
				// Killed before the runtime let any handler run.
				if sig := ee.Sys().(syscall.WaitStatus).Signal(); sig != syscall.SIGTERM {
					t.Fatalf("after %s: killed by %v", delay, sig)
				}
				early++
			default:
				v := readVerdict(t, vpath)
				wantVerdict(t, v, verdict.Signaled, code)
				handled++
			}
			if left := j.waitNoLeftovers(10 * time.Second); len(left) > 0 {
				t.Fatalf("after %s: processes left behind: %v", delay, left)
			}
			emptyDir(t, tmp)
		})
	}
	t.Logf("%d handled with a signaled verdict, %d killed during the runtime's start", handled, early)
}

// TestSecondSIGTERMEscalates: ranks that ignore SIGTERM would hold the
// launcher for --term-timeout (60 s); a second SIGTERM after the repeat
// window (2 s, agent.DefaultSignalRepeatWindow) SIGKILLs them at once.
func TestSecondSIGTERMEscalates(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	s := j.script("stubborn.sh", `
trap '' TERM
echo $$ > "$OUT/rank$LOCAL_RANK.pid"
while :; do sleep 0.05; done
`)
	vpath := filepath.Join(j.dir, "verdict.json")
	j.start([]string{"OUT=" + j.dir}, "--standalone", "--nproc-per-node", "2", "--term-timeout", "60",
		"--verdict-file", vpath, "--no-python", s)
	var pids []int
	for lr := 0; lr < 2; lr++ {
		p := filepath.Join(j.dir, fmt.Sprintf("rank%d.pid", lr))
		waitFile(t, p, generous)
		time.Sleep(20 * time.Millisecond)
		pids = append(pids, readInt(t, p))
	}
	first := time.Now()
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	select {
	case <-j.done:
		t.Fatalf("the launcher exited on the first SIGTERM although its ranks ignore it:\n%s", j.stderr.String())
	default:
	}
	for _, pid := range pids {
		if !pidAlive(pid) {
			t.Fatalf("rank %d died of the first SIGTERM it ignores", pid)
		}
	}
	// Past the window, with a second of room for the launcher reading the
	// first signal late on a loaded machine (the window counts from then).
	time.Sleep(time.Until(first.Add(agent.DefaultSignalRepeatWindow + time.Second)))
	sent := time.Now()
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, took := j.waitExit(sent)
	t.Logf("exited %s after the second SIGTERM", took)
	if took > signalBound {
		t.Errorf("exited %s after the second SIGTERM, want within %s (not --term-timeout 60s)", took, signalBound)
	}
	if code != 1 {
		t.Errorf("exit %d, want 1 (ranks killed)\n%s", code, j.stderr.String())
	}
	for _, pid := range pids {
		if pidAlive(pid) {
			t.Errorf("rank %d survived the second SIGTERM", pid)
		}
	}
	wantVerdict(t, readVerdict(t, vpath), verdict.Signaled, 1)
	escalated := false
	for _, ev := range j.eventsOf("signal_received") {
		escalated = escalated || ev["escalated"] == true
	}
	if !escalated {
		t.Errorf("no escalated signal_received event: %v", j.eventsOf("signal_received"))
	}
	if left := j.waitNoLeftovers(10 * time.Second); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}

// TestSIGTERMAtRandomMomentsWhileHostingEtcd: the same for a launcher that
// hosts the embedded etcd (started, connected to, then waiting for the
// second node): it ends, and its etcd companion, its data directory and
// every socket directory go with it.
func TestSIGTERMAtRandomMomentsWhileHostingEtcd(t *testing.T) {
	skipShort(t)
	for i := 0; i < 6; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			j := newJob(t)
			tmp := filepath.Join(j.dir, "tmp")
			if err := os.Mkdir(tmp, 0o755); err != nil {
				t.Fatal(err)
			}
			ep := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
			vpath := filepath.Join(j.dir, "verdict.json")
			s := j.script("sleeper.sh", "exec sleep 30\n")
			delay := time.Duration(rand.IntN(401)) * time.Millisecond
			j.start([]string{"TMPDIR=" + tmp}, "--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1", "--local-addr", "127.0.0.1",
				"--verdict-file", vpath, "--log-dir", filepath.Join(j.dir, "logs"), "--no-python", s)
			time.Sleep(delay)
			if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				j.wait(generous)
				t.Fatalf("after %s: %v\n%s", delay, err, j.stderr.String())
			}
			sent := time.Now()
			code, took := j.waitExit(sent)
			var ee *exec.ExitError
			if !errors.As(j.exitErr, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
				wantVerdict(t, readVerdict(t, vpath), verdict.Signaled, code)
			}
			t.Logf("SIGTERM after %s: exit %d %s later", delay, code, took)
			if took > signalBound {
				t.Errorf("exited %s after SIGTERM, want within %s\n%s", took, signalBound, j.stderr.String())
			}
			if left := j.waitNoLeftovers(10 * time.Second); len(left) > 0 {
				t.Fatalf("after %s: processes left behind: %v", delay, left)
			}
			emptyDir(t, tmp)
		})
	}
}

// TestDoubleSIGTERMLetsRanksSave: at a time limit Slurm sends
// SIGTERM twice a few ms apart; the second copy within the repeat window
// must not SIGKILL ranks still saving on the first. Ranks whose handler
// needs 2 s save complete checkpoints when the launcher gets SIGTERM twice
// 10 ms apart, and the launcher ends as for a signal with nothing left.
func TestDoubleSIGTERMLetsRanksSave(t *testing.T) {
	skipShort(t)
	testenv.Require(t, testenv.SystemPython)
	j := newJob(t)
	py := filepath.Join(j.dir, "saver.py")
	if err := os.WriteFile(py, []byte(testworkers.SlowSaver), 0o644); err != nil {
		t.Fatal(err)
	}
	vpath := filepath.Join(j.dir, "verdict.json")
	j.start(nil, "--standalone", "--nproc-per-node", "2", "--term-timeout", "60",
		"--verdict-file", vpath, "--no-python", "/usr/bin/python3", py, j.dir)
	for lr := 0; lr < 2; lr++ {
		waitFile(t, filepath.Join(j.dir, fmt.Sprintf("ready%d", lr)), generous)
	}
	sent := time.Now()
	for i := 0; i < 2; i++ {
		if i > 0 {
			time.Sleep(10 * time.Millisecond)
		}
		if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	code, took := j.waitExit(sent)
	t.Logf("exited %s after the first SIGTERM", took)
	for lr := 0; lr < 2; lr++ {
		if err := testworkers.SlowSaverCheckpoint(j.dir, lr); err != nil {
			t.Error(err)
		}
	}
	if took < 2*time.Second {
		t.Errorf("exited %s after the first SIGTERM, before the ranks' 2 s save could end", took)
	}
	// The ranks saved and exited 0: a signaled verdict with clean ranks.
	if code != 0 {
		t.Errorf("exit %d, want 0 (stopped by a signal, every rank exited 0)\n%s", code, j.stderr.String())
	}
	wantVerdict(t, readVerdict(t, vpath), verdict.Signaled, 0)
	evs := j.eventsOf("signal_received")
	for _, ev := range evs {
		if ev["escalated"] == true {
			t.Errorf("the repeated SIGTERM escalated: %v", ev)
		}
	}
	t.Logf("signal_received events: %v", evs)
	if left := j.waitNoLeftovers(10 * time.Second); len(left) > 0 {
		t.Fatalf("processes left behind: %v", left)
	}
}
