package prewarm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestLaunchStandbysTakeTheFirstCycle: under --prewarm auto with a
// command line whose imports an earlier job learned, Launch starts a
// standby per local rank before any cycle, and the first cycle's ranks are
// those standbys (waiting for an import still going rather than starting
// cold), with the cycle's environment. A command line not learned yet, or
// a fixed module list, starts nothing at launch: the first cycle is cold.
func TestLaunchStandbysTakeTheFirstCycle(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	script := writeScript(t, spareRank)
	argv := []string{python, "-u", script}
	for _, tc := range []struct {
		name     string
		auto     bool
		learned  bool
		launched bool
	}{
		{"auto learned", true, true, true},
		{"auto not learned yet", true, false, false},
		{"fixed modules", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReaper(t)
			ev := &events{}
			o := Options{Reaper: r, OnEvent: ev.add}
			state := ""
			if tc.auto {
				// Nothing learned: a state file that does not exist yet.
				state = filepath.Join(t.TempDir(), "prewarm-auto.json")
				if tc.learned {
					state = learnedState(t, argv, os.Getenv("PYTHONPATH"), "json")
				}
			}
			st := jsonStarter(t, o, state)

			st.Launch(parkSpecs(script, 2))
			st.mu.Lock()
			var pids []int
			for lr := range 2 {
				if s := st.standby[lr]; s != nil {
					pids = append(pids, s.pid)
				}
			}
			st.mu.Unlock()
			if want := map[bool]int{true: 2, false: 0}[tc.launched]; len(pids) != want {
				t.Fatalf("%d standbys after Launch, want %d", len(pids), want)
			}

			// The cycle starts at once: the standbys are likely still
			// importing, and the ranks wait for them.
			out := runPromoted(t, st, script)
			started := recsOf[eventlog.PrewarmStartedEvent](ev)
			fallbacks := recsOf[eventlog.PrewarmFallbackEvent](ev)
			if !tc.launched {
				if len(started) != 0 || len(fallbacks) != 2 || fallbacks[0].Path != PathCold {
					t.Fatalf("first cycle: warm %v, fallbacks %v; want both ranks cold", started, fallbacks)
				}
				return
			}
			if len(started) != 1 || !started[0].Launched || !slices.Equal(started[0].LocalRanks, []int{0, 1}) {
				t.Fatalf("warm events %v (fallbacks %v), want both ranks on their launch standbys", started, fallbacks)
			}
			for _, f := range fallbacks {
				if f.Path != PathWaited {
					t.Fatalf("fallback %+v: a launch standby still importing must be waited for", f)
				}
			}
			for lr := range 2 {
				rec := readSpareRank(t, out, lr)
				if rec.PID != pids[lr] || !rec.Preloaded {
					t.Errorf("local rank %d ran as pid %d (json preloaded %v), want its launch standby %d", lr, rec.PID, rec.Preloaded, pids[lr])
				}
				if rec.Env["RANK"] != fmt.Sprint(2+lr) || rec.Env["WORLD_SIZE"] != "4" {
					t.Errorf("local rank %d: the cycle's values not given: %v", lr, rec.Env)
				}
				if _, stale := rec.Env["FTL_PARKED"]; stale {
					t.Errorf("local rank %d sees the launch-time environment", lr)
				}
			}
		})
	}
}

// TestLaunchStandbysPausedWhenParked: a node whose first round makes it a
// spare keeps its launch standbys, but stops those still importing
// (SIGSTOP) while the active nodes start, and continues them after
// RefillDelay; they then become ready as a parked spare's.
func TestLaunchStandbysPausedWhenParked(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	dir := t.TempDir()
	// A module whose import takes a while: the standbys are still
	// importing when the node is parked.
	if err := os.WriteFile(filepath.Join(dir, "ftl_slow_mod.py"), []byte("import time\ntime.sleep(1.5)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script := writeScript(t, spareRank)
	argv := []string{python, "-u", script}
	path := learnedState(t, argv, dir, "ftl_slow_mod")
	r := newReaper(t)
	ev := &events{}
	o := Options{Reaper: r, OnEvent: ev.add, RefillDelay: 700 * time.Millisecond}
	var err error
	if o.Auto, err = NewLearner(path); err != nil {
		t.Fatal(err)
	}
	st, err := NewStarter(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	specs := parkSpecs(script, 2)
	for i := range specs {
		specs[i].Env = append(specs[i].Env, "PYTHONPATH="+dir)
	}
	st.Launch(specs)
	st.Park(specs)
	paused := waitEvent[eventlog.PrewarmPausedEvent](t, ev, 1)[0]
	if !slices.Equal(paused.LocalRanks, []int{0, 1}) {
		t.Fatalf("paused %v, want both launch standbys", paused.LocalRanks)
	}
	st.mu.Lock()
	var pids []int
	for lr := range 2 {
		if s := st.standby[lr]; s != nil && s.paused {
			pids = append(pids, s.pid)
		}
	}
	st.mu.Unlock()
	if len(pids) != 2 {
		t.Fatalf("%d standbys marked paused, want 2", len(pids))
	}
	for _, pid := range pids {
		waitStopped(t, pid)
	}
	st.mu.Lock()
	for lr, s := range st.standby {
		if s.launched {
			t.Errorf("local rank %d: the parked spare's standby is still marked as the first cycle's", lr)
		}
	}
	st.mu.Unlock()
	waitEvent[eventlog.PrewarmResumedEvent](t, ev, 1)
	ready := waitEvent[eventlog.PrewarmSpareReadyEvent](t, ev, 1)[0]
	if !slices.Equal(ready.PIDs, pids) {
		t.Fatalf("spare ready with standbys %v, want the launch standbys %v", ready.PIDs, pids)
	}
}
