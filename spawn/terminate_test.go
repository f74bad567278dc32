package spawn

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestTerminate(t *testing.T) {
	testenv.SkipShort(t, "terminates real process trees with grace timers")
	r := newReaper(t)
	const (
		grace     = 3 * time.Second
		longGrace = time.Minute
	)
	tests := []struct {
		name     string
		script   string // writes $READY once its traps are set
		stop     bool   // SIGSTOP the group before terminating it
		sig      syscall.Signal
		reaped   bool // wait on the reap notification instead of /proc
		escalate bool
		code     int            // wanted exit code, when sig is 0
		killedBy syscall.Signal // wanted terminating signal
	}{
		{name: "exits on SIGTERM", script: `echo 1 > "$READY"; exec sleep 1000`,
			sig: syscall.SIGTERM, killedBy: syscall.SIGTERM},
		{name: "exits on SIGTERM, reap notification", script: `echo 1 > "$READY"; exec sleep 1000`,
			sig: syscall.SIGTERM, reaped: true, killedBy: syscall.SIGTERM},
		{name: "ignores SIGTERM", script: `trap '' TERM; echo 1 > "$READY"; while :; do sleep 1; done`,
			sig: syscall.SIGTERM, escalate: true, killedBy: syscall.SIGKILL},
		{name: "ignores SIGTERM, reap notification", script: `trap '' TERM; echo 1 > "$READY"; while :; do sleep 1; done`,
			sig: syscall.SIGTERM, reaped: true, escalate: true, killedBy: syscall.SIGKILL},
		// A stopped shell could not run its trap without SIGCONT: it would
		// be SIGKILLed after the grace instead of exiting 7.
		{name: "SIGSTOPped handles SIGTERM", script: `trap 'exit 7' TERM; echo 1 > "$READY"; while :; do sleep 0.05; done`,
			stop: true, sig: syscall.SIGTERM, code: 7},
		{name: "SIGKILL never escalates", script: `trap '' TERM; echo 1 > "$READY"; exec sleep 1000`,
			sig: syscall.SIGKILL, killedBy: syscall.SIGKILL},
		{name: "signal 0 means SIGKILL", script: `echo 1 > "$READY"; exec sleep 1000`,
			killedBy: syscall.SIGKILL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ready := filepath.Join(t.TempDir(), "ready")
			spec := sh(0, tc.script)
			spec.Env = []string{"READY=" + ready, "PATH=/usr/bin:/bin"}
			g := startGroup(t, r, []Spec{spec})
			waitFileInt(t, ready)
			pid := g.PIDs()[0]
			if tc.stop {
				if err := unix.Kill(-pid, syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				waitStopped(t, pid)
			}
			// A case that must not escalate gets a grace far longer than
			// it takes, so that "ended at once" is told from "waited out
			// the grace" on a loaded machine too.
			var opts TerminateOptions
			opts.Grace = grace
			if !tc.escalate {
				opts.Grace = longGrace
			}
			if tc.reaped {
				opts.Reaped = g.rank(0).done
			}
			var early Termination
			opts.Signalled = func(tm Termination) { early = tm }
			start := time.Now()
			res := Terminate(context.Background(), pid, tc.sig, opts)
			took := time.Since(start)
			want := tc.sig
			if want == 0 {
				want = syscall.SIGKILL
			}
			if res.Err != nil || res.Target != -pid || res.Signal != want || res.Escalated != tc.escalate {
				t.Errorf("Terminate = %+v, want target %d signal %v escalated %v", res, -pid, want, tc.escalate)
			}
			if early.SignalledAt.IsZero() || !early.SignalledAt.Equal(res.SignalledAt) || early.Escalated {
				t.Errorf("Signalled saw %+v, result %+v", early, res)
			}
			if tc.escalate && took < grace {
				t.Errorf("escalated after %v, before the grace %v", took, grace)
			}
			if !tc.escalate && took >= longGrace {
				t.Errorf("took %v (the whole grace) for a rank that ended at once", took)
			}
			e := collect(t, g, 1)[0]
			if e.Signal != tc.killedBy || (tc.killedBy == 0 && e.Code != tc.code) {
				t.Errorf("exit %v, want signal %v code %d", e, tc.killedBy, tc.code)
			}
		})
	}
}

// TestTerminateLoneProcess: a pid that does not lead a process group (here
// a rank's child) is signalled alone; its group is left untouched.
func TestTerminateLoneProcess(t *testing.T) {
	r := newReaper(t)
	out := filepath.Join(t.TempDir(), "child")
	g := startGroup(t, r, []Spec{sh(0, "sleep 1000 & echo $! > "+out+"; wait $!")})
	child := waitFileInt(t, out)
	res := Terminate(context.Background(), child, syscall.SIGTERM, TerminateOptions{Grace: 3 * time.Second})
	if res.Err != nil || res.Target != child || res.Escalated {
		t.Errorf("Terminate = %+v, want target %d, no escalation", res, child)
	}
	e := collect(t, g, 1)[0] // the shell's wait returns once its child died
	if e.Code != 128+int(syscall.SIGTERM) {
		t.Errorf("rank %v, want it to exit normally after its child died by SIGTERM", e)
	}
}

func TestTerminateRefusesLowPIDs(t *testing.T) {
	for _, pid := range []int{-5, 0, 1} {
		if res := Terminate(context.Background(), pid, syscall.SIGTERM, TerminateOptions{}); res.Err == nil {
			t.Errorf("Terminate(%d) = %+v, want an error", pid, res)
		}
	}
}

// TestTerminateContextCancel: a cancelled context ends the grace early and a
// surviving rank is SIGKILLed.
func TestTerminateContextCancel(t *testing.T) {
	r := newReaper(t)
	ready := filepath.Join(t.TempDir(), "ready")
	g := startGroup(t, r, []Spec{sh(0, "trap '' TERM; echo 1 > "+ready+"; while :; do sleep 1; done")})
	waitFileInt(t, ready)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	res := Terminate(ctx, g.PIDs()[0], syscall.SIGTERM, TerminateOptions{Grace: time.Minute})
	if !res.Escalated || time.Since(start) > 10*time.Second {
		t.Errorf("Terminate = %+v after %v, want an early escalation", res, time.Since(start))
	}
	if e := collect(t, g, 1)[0]; e.Signal != syscall.SIGKILL {
		t.Errorf("exit %v, want SIGKILL", e)
	}
}

// TestStopContinuesStoppedRank: Stop's SIGTERM reaches a SIGSTOPped rank
// that handles it, with no escalation.
func TestStopContinuesStoppedRank(t *testing.T) {
	r := newReaper(t)
	ready := filepath.Join(t.TempDir(), "ready")
	g := startGroup(t, r, []Spec{sh(0, "trap 'exit 7' TERM; echo 1 > "+ready+"; while :; do sleep 0.05; done")})
	waitFileInt(t, ready)
	pid := g.PIDs()[0]
	if err := unix.Kill(-pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, pid)
	res := g.Stop(syscall.SIGTERM, 5*time.Second)
	if len(res.Escalated) != 0 || len(res.Exits) != 1 || res.Exits[0].Code != 7 {
		t.Errorf("Stop = %+v, want rank 0 exiting 7 without escalation", res)
	}
}

// waitStopped waits until every process in the group pgid is stopped. A
// member in D with a stopped child in the group counts too: dash runs
// commands with vfork, and a SIGSTOP that lands between the vfork and the
// exec stops the child while the shell sleeps in D until the child execs,
// which it does once continued (seen under load, where that window is long).
func waitStopped(t *testing.T, pgid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last []procfs.Stat
	for time.Now().Before(deadline) {
		all, err := procfs.List()
		if err != nil {
			t.Fatal(err)
		}
		last = last[:0]
		stoppedChild := map[int]bool{}
		for _, st := range all {
			if st.PGID == pgid {
				last = append(last, st)
				if st.State == 'T' {
					stoppedChild[st.PPID] = true
				}
			}
		}
		stopped := len(last) > 0
		for _, st := range last {
			if st.State != 'T' && (st.State != 'D' || !stoppedChild[st.PID]) {
				stopped = false
			}
		}
		if stopped {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("group %d never stopped: %+v", pgid, last)
}
