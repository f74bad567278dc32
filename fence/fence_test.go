package fence

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/spawn"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// parentEnv makes the test binary play a launcher in
// TestWatchdogSurvivesSIGSTOPOfParent.
const parentEnv = "FENCE_TEST_PARENT"

// TestMain lets the test binary be the watchdog (as ft-launcher re-executes
// itself) or the launcher-like parent of one.
func TestMain(m *testing.M) {
	if os.Getenv(ModeEnv) == "1" {
		os.Exit(Serve(os.Stdin, os.Stdout, os.Stderr))
	}
	if os.Getenv(parentEnv) == "1" {
		os.Exit(parentMain())
	}
	os.Exit(m.Run())
}

// rig is a reaper, two sleeping "ranks" in process groups of their own and
// a watchdog run by this test binary.
type rig struct {
	t       *testing.T
	r       *spawn.Reaper
	ranks   *spawn.Group
	pgids   []int
	wd      *Watchdog
	reports chan Report
}

func newRig(t *testing.T) *rig { return newRigWith(t, nil) }

// newRigWith is newRig with the watchdog's options changed by opt.
func newRigWith(t *testing.T, opt func(*Options)) *rig {
	t.Helper()
	r, err := spawn.NewReaper(nil)
	if err != nil {
		t.Fatal(err)
	}
	g, err := r.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{"sleep", "600"}}, {LocalRank: 1, Argv: []string{"sleep", "600"}}})
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	rg := &rig{t: t, r: r, ranks: g, reports: make(chan Report, 8)}
	rg.pgids = []int{g.PIDs()[0], g.PIDs()[1]}
	o := Options{Argv: []string{os.Args[0]}, OnFence: func(rep Report) { rg.reports <- rep }}
	if opt != nil {
		opt(&o)
	}
	rg.wd, err = Start(r, o)
	if err != nil {
		g.Stop(syscall.SIGKILL, 0)
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { // as the launcher: the ranks first, then the watchdog
		g.Stop(syscall.SIGKILL, 0)
		rg.wd.Close()
		r.Close()
		if _, err := procfs.Read(rg.wd.PID()); err == nil {
			t.Errorf("watchdog pid %d still present after Close", rg.wd.PID())
		}
	})
	return rg
}

// exits collects the ranks' exits for d; the rest are still running.
func (rg *rig) exits(n int, d time.Duration) []spawn.Exit {
	var out []spawn.Exit
	timeout := time.After(d)
	for len(out) < n {
		select {
		case e := <-rg.ranks.Exits():
			out = append(out, e)
		case <-timeout:
			return out
		}
	}
	return out
}

func TestWatchdog(t *testing.T) {
	testenv.SkipShort(t, "runs the fence watchdog as real processes")
	tests := []struct {
		name       string
		drive      func(rg *rig)
		wait       time.Duration // how long to watch the ranks
		wantKilled []int         // indexes into pgids
		wantReason string
	}{
		{name: "deadline passes", wait: 15 * time.Second, wantKilled: []int{0, 1}, wantReason: "deadline",
			drive: func(rg *rig) {
				rg.guardAll()
				rg.wd.Extend(time.Now().Add(300 * time.Millisecond))
			}},
		{name: "extended in time", wait: 0, drive: func(rg *rig) {
			rg.guardAll()
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
				rg.wd.Extend(time.Now().Add(1500 * time.Millisecond))
			}
		}},
		{name: "disarmed", wait: 2 * time.Second, drive: func(rg *rig) {
			rg.guardAll()
			rg.wd.Extend(time.Now().Add(500 * time.Millisecond))
			rg.wd.Disarm()
		}},
		{name: "never armed", wait: 2 * time.Second, drive: func(rg *rig) { rg.guardAll() }},
		{name: "unguarded group spared", wait: 15 * time.Second, wantKilled: []int{1}, wantReason: "deadline",
			drive: func(rg *rig) {
				rg.guardAll()
				rg.wd.Unguard(rg.pgids[0])
				rg.wd.Extend(time.Now().Add(300 * time.Millisecond))
			}},
		{name: "guarded after the deadline", wait: 15 * time.Second, wantKilled: []int{0, 1}, wantReason: "guard_after_deadline",
			drive: func(rg *rig) {
				rg.wd.Extend(time.Now().Add(-time.Millisecond))
				time.Sleep(300 * time.Millisecond) // the deadline fires on nothing
				rg.guardAll()
			}},
		{name: "EOF: launcher gone", wait: 15 * time.Second, wantKilled: []int{0, 1}, wantReason: "launcher_gone",
			drive: func(rg *rig) {
				rg.guardAll()
				rg.wd.Extend(time.Now().Add(time.Hour))
				rg.wd.Close() // EOF; returns once the watchdog exited and reported
				if _, err := procfs.Read(rg.wd.PID()); err == nil {
					rg.t.Errorf("watchdog pid %d still present after EOF", rg.wd.PID())
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t)
			tc.drive(rg)
			got := rg.exits(len(tc.wantKilled), tc.wait)
			var gotPids []int
			for _, e := range got {
				if e.Signal != syscall.SIGKILL {
					t.Errorf("rank %s, want killed by SIGKILL", e)
				}
				gotPids = append(gotPids, e.PID)
			}
			var want []int
			for _, i := range tc.wantKilled {
				want = append(want, rg.pgids[i])
			}
			slices.Sort(gotPids)
			slices.Sort(want)
			if !slices.Equal(gotPids, want) {
				t.Fatalf("killed %v, want %v", gotPids, want)
			}
			if len(want) == 0 {
				// Nothing died within the wait; also nothing was reported.
				select {
				case rep := <-rg.reports:
					t.Fatalf("unexpected fence report %+v", rep)
				default:
				}
				return
			}
			// One report per fence: a group guarded after the deadline is
			// killed (and reported) on its own.
			var reported []int
			for timeout := time.After(10 * time.Second); len(reported) < len(want); {
				select {
				case rep := <-rg.reports:
					if rep.Reason != tc.wantReason {
						t.Errorf("report %+v, want reason %s", rep, tc.wantReason)
					}
					if rep.Reason != "launcher_gone" && (rep.LateMs < 0 || rep.AtNs < rep.DeadlineNs) {
						t.Errorf("report %+v: fenced before the deadline", rep)
					}
					reported = append(reported, rep.Killed...)
				case <-timeout:
					t.Fatalf("reports name %v, want %v", reported, want)
				}
			}
			slices.Sort(reported)
			if !slices.Equal(reported, want) {
				t.Errorf("reports name %v, want %v", reported, want)
			}
		})
	}
}

func (rg *rig) guardAll() {
	for _, p := range rg.pgids {
		rg.wd.Guard(p)
	}
}

// TestBadCommandsIgnored: a malformed command is logged and changes
// nothing; the watchdog keeps serving.
func TestBadCommandsIgnored(t *testing.T) {
	w := &watchdog{report: &strings.Builder{}, log: &strings.Builder{}, guarded: map[int]uint64{}}
	for _, c := range []string{"guard x", "guard 1", "guard -5", "extend soon", "fence now", ""} {
		if err := w.command(c); err == nil {
			t.Errorf("command %q accepted", c)
		}
	}
	if w.armed || len(w.guarded) != 0 {
		t.Errorf("state changed by bad commands: %+v", w)
	}
}

// TestWatchdogSurvivesSIGSTOPOfParent: a launcher-like parent process
// guards a sleeping rank and is frozen by SIGSTOP; the watchdog, a separate
// process, kills the rank at the deadline while the parent is still
// stopped. After SIGCONT the parent reads the report and exits cleanly,
// leaving no process behind.
func TestWatchdogSurvivesSIGSTOPOfParent(t *testing.T) {
	testenv.SkipShort(t, "runs the fence watchdog as real processes")
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), parentEnv+"=1")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var rank, wdPid int
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for _, p := range []int{rank, wdPid} {
			if p > 0 {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatal("parent said nothing")
	}
	if _, err := fmt.Sscanf(lines.Text(), "ready %d %d", &rank, &wdPid); err != nil {
		t.Fatalf("parent: %q: %v", lines.Text(), err)
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	// The rank dies (a zombie: its stopped parent cannot reap it).
	for {
		st, err := procfs.Read(rank)
		if err != nil || st.Dead() {
			break
		}
		if time.Since(stopped) > 15*time.Second {
			t.Fatalf("rank %d still %c %v after the parent was stopped", rank, st.State, time.Since(stopped))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("rank killed %v after SIGSTOP of its parent", time.Since(stopped).Round(time.Millisecond))
	if st, err := procfs.Read(cmd.Process.Pid); err != nil || st.State != 'T' {
		t.Fatalf("parent not stopped while the rank was killed: %+v %v", st, err)
	}
	if st, err := procfs.Read(wdPid); err != nil || st.State == 'T' || st.Dead() {
		t.Fatalf("watchdog not running beside the stopped parent: %+v %v", st, err)
	}
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !lines.Scan() {
		t.Fatal("parent said nothing after SIGCONT")
	}
	if want := "fenced deadline " + strconv.Itoa(rank); lines.Text() != want {
		t.Errorf("parent got %q, want %q", lines.Text(), want)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("parent: %v", err)
	}
	for _, p := range []int{rank, wdPid} {
		if _, err := procfs.Read(p); err == nil {
			t.Errorf("pid %d left after the parent exited", p)
		}
	}
}

// parentMain is the launcher-like parent: one sleeping rank, guarded, a
// deadline 1.5 s ahead, never extended.
func parentMain() int {
	r, err := spawn.NewReaper(nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer r.Close()
	g, err := r.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{"sleep", "600"}}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer g.Stop(syscall.SIGKILL, 0)
	reports := make(chan Report, 1)
	wd, err := Start(r, Options{Argv: []string{os.Args[0]}, OnFence: func(rep Report) { reports <- rep }})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer wd.Close()
	wd.Guard(g.PIDs()[0])
	wd.Extend(time.Now().Add(1500 * time.Millisecond))
	fmt.Printf("ready %d %d\n", g.PIDs()[0], wd.PID())
	select {
	case rep := <-reports:
		fmt.Printf("fenced %s %s\n", rep.Reason, strings.Trim(fmt.Sprint(rep.Killed), "[]"))
		return 0
	case <-time.After(60 * time.Second):
		fmt.Println("no report")
		return 1
	}
}

// TestRankStopSparesWatchdog: the launcher's stop of a rank group (SIGTERM,
// then the sweep that SIGKILLs the groups and every untracked orphan of the
// launcher) leaves the watchdog running and serving.
func TestRankStopSparesWatchdog(t *testing.T) {
	rg := newRig(t)
	rg.guardAll()
	rg.ranks.Stop(syscall.SIGTERM, time.Second)
	for _, p := range rg.pgids {
		rg.wd.Unguard(p)
	}
	if st, err := procfs.Read(rg.wd.PID()); err != nil || st.Dead() || st.State == 'T' {
		t.Fatalf("watchdog not running after the ranks' stop: %+v %v", st, err)
	}
	g, err := rg.r.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{"sleep", "600"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop(syscall.SIGKILL, 0)
	rg.wd.Guard(g.PIDs()[0])
	rg.wd.Extend(time.Now().Add(200 * time.Millisecond))
	select {
	case e := <-g.Exits():
		if e.Signal != syscall.SIGKILL {
			t.Fatalf("new rank %s, want killed by the watchdog", e)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the watchdog did not fence a rank guarded after an earlier group's stop")
	}
}
