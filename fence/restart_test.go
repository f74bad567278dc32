package fence

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// TestDefaultBudget: the watchdog's restart budget over sequences of
// deaths: a death is repaired at once, a crash loop gives up after 3
// restarts within 30 s, and deaths far enough apart are repaired forever.
func TestDefaultBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tests := []struct {
		name   string
		lives  []time.Duration // how long each incarnation ran before it died, in order
		wantOK []bool
		wait0  time.Duration // the wait of the first restart
	}{
		{"one quick death", []time.Duration{time.Second}, []bool{true}, 0},
		{"one death after a long life", []time.Duration{time.Hour}, []bool{true}, 0},
		{"crash loop", []time.Duration{0, 10 * time.Millisecond, time.Second, 0}, []bool{true, true, true, false}, 0},
		{"deaths 11 s apart", []time.Duration{11 * time.Second, 11 * time.Second, 11 * time.Second, 11 * time.Second, 11 * time.Second},
			[]bool{true, true, true, true, true}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := policy.RestartTracker{Budget: DefaultBudget()}
			started := t0
			for i, life := range tc.lives {
				wait, ok := tr.Next(started.Add(life), started)
				if ok != tc.wantOK[i] || i == 0 && wait != tc.wait0 || wait > time.Second {
					t.Fatalf("death %d (after %s): wait %v, restart %v; want restart %v, a wait of at most 1 s", i, life, wait, ok, tc.wantOK[i])
				}
				started = started.Add(life + wait + 50*time.Millisecond) // the restart
			}
		})
	}
}

// TestStartRefusesBadBudget: a budget that could never restart is an error
// naming what is allowed.
func TestStartRefusesBadBudget(t *testing.T) {
	r, err := spawn.NewReaper(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	_, err = Start(r, Options{Argv: []string{os.Args[0]}, Budget: policy.RestartBudget{Window: time.Second}})
	if err == nil || !strings.Contains(err.Error(), "want Limit >= 1") {
		t.Fatalf("Start with Limit 0: %v, want an error naming the allowed values", err)
	}
}

// killWatchdog SIGKILLs the running watchdog process and returns its pid.
func killWatchdog(t *testing.T, wd *Watchdog) int {
	t.Helper()
	pid := wd.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL watchdog %d: %v", pid, err)
	}
	return pid
}

// TestWatchdogRestartedWithItsState: a SIGKILLed watchdog is replaced by a
// new process that is given the guarded groups and the deadline again:
//
//   - deadline ahead: the new watchdog kills exactly the guarded (not the
//     unguarded) group at that deadline, never before, without any command
//     after the restart;
//   - deadline passing while no watchdog runs: the new one kills the
//     guarded groups as soon as it reads its state.
func TestWatchdogRestartedWithItsState(t *testing.T) {
	testenv.SkipShort(t, "runs the fence watchdog as real processes")
	tests := []struct {
		name       string
		deadline   time.Duration // from just before the kill
		wantKilled []int         // indexes into pgids: 0 was unguarded
	}{
		{"deadline ahead", 2 * time.Second, []int{1}},
		{"deadline passes while it is dead", 50 * time.Millisecond, []int{1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			restarts := make(chan Restart, 4)
			rg := newRigWith(t, func(o *Options) { o.OnRestart = func(r Restart) { restarts <- r } })
			rg.guardAll()
			rg.wd.Unguard(rg.pgids[0])
			deadline := time.Now().Add(tc.deadline)
			rg.wd.Extend(deadline)
			old := killWatchdog(t, rg.wd)
			var rs Restart
			select {
			case rs = <-restarts:
			case <-time.After(30 * time.Second):
				t.Fatalf("watchdog %d not restarted within 30 s", old)
			}
			if rs.OldPID != old || rs.NewPID == old || rs.NewPID != rg.wd.PID() || rs.Exit != "killed by SIGKILL" ||
				rs.Signal != "SIGKILL" || rs.Guarded != 1 || !rs.Armed || rs.Restarts != 1 || rs.Attempts != 1 {
				t.Errorf("restart %+v: want old pid %d, a new pid, killed by SIGKILL, 1 group, armed, first restart, 1 attempt", rs, old)
			}
			if st, err := procfs.Read(rs.NewPID); err != nil || st.Dead() {
				t.Fatalf("the new watchdog %d does not run: %+v %v", rs.NewPID, st, err)
			}
			t.Logf("restart %+v", rs)
			got := rg.exits(1, 15*time.Second)
			if len(got) != 1 || got[0].PID != rg.pgids[1] || got[0].Signal != syscall.SIGKILL {
				t.Fatalf("rank exits %v, want the guarded group %d killed by SIGKILL", got, rg.pgids[1])
			}
			if got[0].At.Before(deadline) {
				t.Errorf("the guarded rank died %s before the deadline", deadline.Sub(got[0].At))
			}
			select {
			case rep := <-rg.reports:
				if rep.Reason != "deadline" || !slices.Equal(rep.Killed, []int{rg.pgids[1]}) || rep.AtNs < rep.DeadlineNs {
					t.Errorf("report %+v, want the deadline fence of %d, not before it", rep, rg.pgids[1])
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no fence report from the restarted watchdog")
			}
			if more := rg.exits(1, 500*time.Millisecond); len(more) > 0 {
				t.Errorf("the unguarded group died too: %v", more)
			}
		})
	}
}

// TestWatchdogNotRestartable: when no watchdog can run any more, the
// launcher side kills the guarded groups itself (and any group guarded
// later, at once) and reports why; nothing runs unprotected.
//
//   - its executable is gone (removed after the start): every restart
//     attempt fails;
//   - it dies at once again and again: the death after the budget's last
//     restart is not restarted.
func TestWatchdogNotRestartable(t *testing.T) {
	testenv.SkipShort(t, "runs the fence watchdog as real processes")
	tests := []struct {
		name   string
		kills  int // SIGKILLs of the watchdog, each after the previous restart
		remove bool
		want   string // in GiveUp.Reason
	}{
		{"executable gone", 1, true, "the last start failed"},
		{"crash loop", 2, false, "died again after"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "watchdog.test")
			copyFile(t, os.Args[0], bin)
			restarts := make(chan Restart, 4)
			gaveUp := make(chan GiveUp, 1)
			rg := newRigWith(t, func(o *Options) {
				o.Argv = []string{bin}
				o.Budget = policy.RestartBudget{Limit: map[bool]int{true: 3, false: 1}[tc.remove], Window: time.Hour, Backoff: 10 * time.Millisecond}
				o.OnRestart = func(r Restart) { restarts <- r }
				o.OnGiveUp = func(g GiveUp) { gaveUp <- g }
			})
			rg.guardAll()
			rg.wd.Extend(time.Now().Add(time.Hour))
			if tc.remove {
				if err := os.Remove(bin); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < tc.kills; i++ {
				killWatchdog(t, rg.wd)
				if i < tc.kills-1 {
					select {
					case <-restarts:
					case <-time.After(30 * time.Second):
						t.Fatal("watchdog not restarted within 30 s")
					}
				}
			}
			var g GiveUp
			select {
			case g = <-gaveUp:
			case r := <-restarts:
				t.Fatalf("restarted (%+v), want given up", r)
			case <-time.After(30 * time.Second):
				t.Fatal("neither restarted nor given up within 30 s")
			}
			if !strings.Contains(g.Reason, tc.want) || rg.wd.GaveUp() != g.Reason {
				t.Errorf("gave up: %+v (GaveUp %q), want a reason with %q", g, rg.wd.GaveUp(), tc.want)
			}
			want := slices.Sorted(slices.Values(rg.pgids))
			if !slices.Equal(g.Killed, want) {
				t.Errorf("killed %v, want the guarded groups %v", g.Killed, want)
			}
			got := rg.exits(2, 15*time.Second)
			if len(got) != 2 {
				t.Fatalf("ranks killed: %v, want both", got)
			}
			for _, e := range got {
				if e.Signal != syscall.SIGKILL {
					t.Errorf("rank %s, want killed by SIGKILL", e)
				}
			}
			// A group guarded now is killed at once.
			ng, err := rg.r.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{"sleep", "600"}}})
			if err != nil {
				t.Fatal(err)
			}
			defer ng.Stop(syscall.SIGKILL, 0)
			rg.wd.Guard(ng.PIDs()[0])
			select {
			case e := <-ng.Exits():
				if e.Signal != syscall.SIGKILL {
					t.Errorf("rank guarded after the give-up: %s, want killed by SIGKILL", e)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("a rank guarded after the give-up still runs")
			}
		})
	}
}

// TestCloseDuringRestartLeavesNothing: Close while a dead watchdog is
// being replaced ends the new one too, and no restart follows Close.
func TestCloseDuringRestartLeavesNothing(t *testing.T) {
	testenv.SkipShort(t, "runs the fence watchdog as real processes")
	restarts := make(chan Restart, 4)
	rg := newRigWith(t, func(o *Options) { o.OnRestart = func(r Restart) { restarts <- r } })
	rg.guardAll()
	killWatchdog(t, rg.wd)
	rg.wd.Close() // at once: before, during or after the restart
	select {
	case r := <-restarts:
		if _, err := procfs.Read(r.NewPID); err == nil {
			t.Errorf("restarted watchdog %d still present after Close", r.NewPID)
		}
	default:
	}
	if pid := rg.wd.PID(); pid > 0 {
		if _, err := procfs.Read(pid); err == nil {
			t.Errorf("watchdog %d still present after Close", pid)
		}
	}
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
