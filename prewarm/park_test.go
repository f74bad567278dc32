package prewarm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// spareRank is a rank that writes its pid, environment and whether json
// was imported before its own code ran, to $OUT/rank-$LOCAL_RANK.json.
const spareRank = `import os, sys
pre = "json" in sys.modules
import json
with open(os.path.join(os.environ["OUT"], "rank-%s.json" % os.environ["LOCAL_RANK"]), "w") as f:
    json.dump({"pid": os.getpid(), "env": dict(os.environ), "preloaded": pre}, f)
`

// learnedState writes a state file in which an earlier job learned
// modules for the command line argv (with pythonpath), and returns its
// path.
func learnedState(t *testing.T, argv []string, pythonpath string, modules ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "prewarm-auto.json")
	l, err := NewLearner(path)
	if err != nil {
		t.Fatal(err)
	}
	l.Learn(CommandKey(argv, RankDir(""), pythonpath), argv, RankDir(""), [][]string{modules})
	if err := l.Save(); err != nil {
		t.Fatal(err)
	}
	return path
}

// jsonStarter is a Starter of o whose standbys import json: under
// --prewarm auto with the state file state, else by name ("" state).
func jsonStarter(t *testing.T, o Options, state string) *Starter {
	t.Helper()
	if state != "" {
		var err error
		if o.Auto, err = NewLearner(state); err != nil {
			t.Fatal(err)
		}
	} else {
		o.Modules = []string{"json"}
	}
	st, err := NewStarter(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// runPromoted starts 2 ranks of script with an assignment's values
// (promoteSpecs) on st, waits until both succeeded and returns the
// directory their records are in.
func runPromoted(t *testing.T, st *Starter, script string) string {
	t.Helper()
	out := t.TempDir()
	g, err := st.StartGroup(promoteSpecs(t, script, out, 2))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range waitAll(t, g, 2) {
		if e.Code != 0 {
			t.Fatalf("rank %d: %v", e.LocalRank, e)
		}
	}
	return out
}

// spareRankRecord is what spareRank wrote.
type spareRankRecord struct {
	PID       int               `json:"pid"`
	Env       map[string]string `json:"env"`
	Preloaded bool              `json:"preloaded"`
}

// readSpareRank reads local rank lr's record from out.
func readSpareRank(t *testing.T, out string, lr int) spareRankRecord {
	t.Helper()
	var rec spareRankRecord
	b, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("rank-%d.json", lr)))
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// spareSpecs are n ranks of script as a parked spare knows them: the
// launch line and environment without the assignment's values, plus
// FTL_PARKED (what must not reach the rank).
func parkSpecs(script string, n int) []spawn.Spec {
	specs := make([]spawn.Spec, n)
	for lr := range specs {
		env := append(os.Environ(), "LOCAL_RANK="+strconv.Itoa(lr), "FTL_PARKED=1")
		specs[lr] = spawn.Spec{LocalRank: lr, Argv: []string{python, "-u", script}, Env: env}
	}
	return specs
}

// promoteSpecs are the same ranks as the promotion starts them: the
// assignment's values given, FTL_PARKED not.
func promoteSpecs(t *testing.T, script, out string, n int) []spawn.Spec {
	specs := make([]spawn.Spec, n)
	for lr := range specs {
		o, e := logFiles(t, t.TempDir())
		env := append(os.Environ(), "OUT="+out, "LOCAL_RANK="+strconv.Itoa(lr), "RANK="+strconv.Itoa(2+lr),
			"WORLD_SIZE=4", "MASTER_ADDR=127.0.0.9", "TORCHELASTIC_RESTART_COUNT=1")
		specs[lr] = spawn.Spec{LocalRank: lr, Argv: []string{python, "-u", script}, Env: env, Stdout: o, Stderr: e}
	}
	return specs
}

func writeScript(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "rank.py")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// waitEvent waits until ev holds n records of type T.
func waitEvent[T eventlog.Record](t *testing.T, ev *events, n int) []T {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		if got := recsOf[T](ev); len(got) >= n {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
	var zero T
	t.Fatalf("fewer than %d %s events within %s: %v", n, zero.Kind(), testTimeout, ev.got)
	return nil
}

// alive reports whether pid is a live process (not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := len(s) - 1
	for i > 0 && s[i] != ')' {
		i--
	}
	return i+2 < len(s) && s[i+2] != 'Z'
}

// TestParkedSpareStartsWarm: a parked spare's standbys (fixed modules,
// and --prewarm auto with a list learned by an earlier job and kept in
// the state file) are ready before any cycle; the promotion hands every
// rank to them, with the promotion's environment only.
func TestParkedSpareStartsWarm(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	script := writeScript(t, spareRank)
	for _, tc := range []struct {
		name string
		auto bool
	}{{"modules", false}, {"auto learned", true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReaper(t)
			ev := &events{}
			o := Options{Reaper: r, OnEvent: ev.add, RefillDelay: -1}
			state := ""
			if tc.auto {
				// What an earlier job learned for this command line, in
				// the state file the spare reads.
				state = learnedState(t, []string{python, "-u", script}, os.Getenv("PYTHONPATH"), "json")
			}
			st := jsonStarter(t, o, state)

			st.Park(parkSpecs(script, 2))
			ready := waitEvent[eventlog.PrewarmSpareReadyEvent](t, ev, 1)[0]
			if !slices.Equal(ready.LocalRanks, []int{0, 1}) || !slices.Equal(ready.Modules, []string{"json"}) {
				t.Fatalf("spare ready event %+v, want local ranks 0,1 importing json", ready)
			}
			standbys := ready.PIDs

			out := runPromoted(t, st, script)
			warm := recsOf[eventlog.PrewarmStartedEvent](ev)
			if len(warm) != 1 || !warm[0].Spare || warm[0].ParkedMS == nil || !slices.Equal(warm[0].LocalRanks, []int{0, 1}) {
				t.Fatalf("warm events %v (fallbacks %v), want both ranks of the promoted spare", warm, ev.of(EventFallback))
			}
			for lr := range 2 {
				rec := readSpareRank(t, out, lr)
				if rec.PID != standbys[lr] || !rec.Preloaded {
					t.Errorf("local rank %d ran as pid %d (json preloaded %v), want its standby %d", lr, rec.PID, rec.Preloaded, standbys[lr])
				}
				if rec.Env["RANK"] != strconv.Itoa(2+lr) || rec.Env["WORLD_SIZE"] != "4" || rec.Env["MASTER_ADDR"] != "127.0.0.9" {
					t.Errorf("local rank %d: the promotion's values not given: %v", lr, rec.Env)
				}
				if _, stale := rec.Env["FTL_PARKED"]; stale {
					t.Errorf("local rank %d sees the parked spare's environment", lr)
				}
			}
		})
	}
}

// TestParkedSpareReplacesDeadStandby: a parked spare's standby that dies
// is started again after a backoff; past SpareRestarts it is given up
// with a log line and event, and its rank starts cold at the promotion.
// Close leaves no standby behind.
func TestParkedSpareReplacesDeadStandby(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	script := writeScript(t, spareRank)
	r := newReaper(t)
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json"}, OnEvent: ev.add, RefillDelay: -1, SpareRestarts: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.Park(parkSpecs(script, 2))
	first := waitEvent[eventlog.PrewarmSpareReadyEvent](t, ev, 1)[0].PIDs
	if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	died := waitEvent[eventlog.PrewarmSpareDiedEvent](t, ev, 1)[0]
	if died.LocalRank != 0 || died.RestartInMS == nil || *died.RestartInMS != 1000 || died.GaveUp {
		t.Fatalf("died event %+v, want local rank 0 restarted in 1 s", died)
	}
	second := waitEvent[eventlog.PrewarmSpareReadyEvent](t, ev, 2)[1].PIDs
	if second[0] == first[0] || second[1] != first[1] {
		t.Fatalf("standbys %v after killing %d of %v: want a new one for local rank 0 only", second, first[0], first)
	}
	if err := syscall.Kill(second[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	gave := waitEvent[eventlog.PrewarmSpareDiedEvent](t, ev, 2)[1]
	if !gave.GaveUp || gave.Deaths != 2 || gave.RestartInMS != nil {
		t.Fatalf("second died event %+v, want given up after 2 deaths", gave)
	}
	time.Sleep(1500 * time.Millisecond) // past the first backoff: nothing more starts
	if n := len(ev.of(EventReady)); n != 3 {
		t.Fatalf("%d standbys became ready, want 3 (2 + 1 restart)", n)
	}

	out := t.TempDir()
	g, err := st.StartGroup(promoteSpecs(t, script, out, 2))
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, 2)
	fb := recsOf[eventlog.PrewarmFallbackEvent](ev)
	if w := recsOf[eventlog.PrewarmStartedEvent](ev); len(w) != 1 || !slices.Equal(w[0].LocalRanks, []int{1}) ||
		len(fb) != 1 || fb[0].LocalRank != 0 || fb[0].Reason != "no standby" {
		t.Fatalf("warm %v, fallbacks %v: want local rank 1 warm, 0 cold with no standby", w, fb)
	}
	st.Close()
	for _, pid := range append(first, second...) {
		if alive(pid) {
			t.Errorf("standby %d alive after Close", pid)
		}
	}
}

// TestParkedSpareCloseDuringBackoff: Close while a dead standby's restart
// waits ends the wait; nothing is started afterwards and no standby
// outlives Close.
func TestParkedSpareCloseDuringBackoff(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	script := writeScript(t, spareRank)
	r := newReaper(t)
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json"}, OnEvent: ev.add, RefillDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	st.Park(parkSpecs(script, 2))
	pids := waitEvent[eventlog.PrewarmSpareReadyEvent](t, ev, 1)[0].PIDs
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitEvent[eventlog.PrewarmSpareDiedEvent](t, ev, 1)
	st.Close()
	time.Sleep(1500 * time.Millisecond) // past the backoff
	if n := len(ev.of(EventReady)); n != 2 {
		t.Fatalf("%d standbys became ready, want the first 2 only", n)
	}
	st.mu.Lock()
	left := len(st.standby)
	st.mu.Unlock()
	if left != 0 || alive(pids[1]) {
		t.Fatalf("after Close: %d standbys kept, standby %d alive %v", left, pids[1], alive(pids[1]))
	}
}

// TestParkedSparePromotedBeforeStandbys: a spare promoted within
// RefillDelay of parking has no standby yet: its ranks start cold, and
// the park's pending start gives way to the cycle's own refill (the
// standbys then have the promotion's environment, not the park's).
func TestParkedSparePromotedBeforeStandbys(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	script := writeScript(t, spareRank)
	r := newReaper(t)
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json"}, OnEvent: ev.add, RefillDelay: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	st.Park(parkSpecs(script, 2))
	g, err := st.StartGroup(promoteSpecs(t, script, t.TempDir(), 2))
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, 2)
	fb := recsOf[eventlog.PrewarmFallbackEvent](ev)
	if len(fb) != 2 || fb[0].Reason != "no standby" || len(ev.of(EventWarm)) != 0 {
		t.Fatalf("fallbacks %v, warm %v: want both ranks cold with no standby", fb, ev.of(EventWarm))
	}
	for lr := range 2 {
		s := waitReady(t, st, lr)
		if !slices.Contains(s.spec.Env, "RANK="+strconv.Itoa(2+lr)) || slices.Contains(s.spec.Env, "FTL_PARKED=1") {
			t.Errorf("local rank %d's standby was started from the park's specs, not the cycle's", lr)
		}
	}
	waitEvent[eventlog.PrewarmReadyEvent](t, ev, 2)
	time.Sleep(300 * time.Millisecond) // a third would be the park's
	if n := len(ev.of(EventReady)); n != 2 || len(ev.of(EventSpareReady)) != 0 {
		t.Fatalf("%d standbys ready (spare ready %v), want the cycle's 2 only", n, ev.of(EventSpareReady))
	}
}
