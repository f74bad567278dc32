package prewarm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/spawn"
)

func TestDecideImporting(t *testing.T) {
	const s, ms = time.Second, time.Millisecond
	measured := importStats{Wall: 3 * s, CPU: 1200 * ms}
	for _, tc := range []struct {
		name    string
		policy  Importing
		now     importing
		last    importStats
		wait    bool
		maxWait time.Duration
		reason  string
	}{
		{"no measurement, the standby works: wait", ImportingAuto, importing{2 * s, 400 * ms}, importStats{}, true, firstWait, "no import measured yet"},
		{"no measurement, barely started: stop", ImportingAuto, importing{50 * ms, 30 * ms}, importStats{}, false, 0, "used only 30ms CPU"},
		{"no measurement, blocked (no CPU): stop", ImportingAuto, importing{5 * s, 40 * ms}, importStats{}, false, 0, "under 100ms"},
		{"half done: wait, bounded by the import's wall time", ImportingAuto, importing{s, 600 * ms}, measured, true, 4 * s, "about 600ms CPU of import left against 1.2s"},
		{"over the last import's CPU: wait", ImportingAuto, importing{4 * s, 1500 * ms}, measured, true, 4 * s, "about 0s CPU of import left"},
		{"under a tenth: stop", ImportingAuto, importing{300 * ms, 100 * ms}, measured, false, 0, "under 10%"},
		{"CPU unknown: stop", ImportingAuto, importing{s, -1}, measured, false, 0, "CPU time is unknown"},
		{"the bound is at least the import's CPU", ImportingAuto, importing{s, 600 * ms}, importStats{Wall: 500 * ms, CPU: 1200 * ms}, true, 2200 * ms, "left against"},
		{"policy wait, barely started", ImportingWait, importing{10 * ms, 0}, importStats{}, true, firstWait, "--prewarm-importing wait"},
		{"policy wait, measured", ImportingWait, importing{10 * ms, 0}, measured, true, 4 * s, "--prewarm-importing wait"},
		{"policy stop, nearly done", ImportingStop, importing{3 * s, 1100 * ms}, measured, false, 0, "--prewarm-importing stop"},
		{"no measurement, an earlier wait ran out: stop", ImportingAuto, importing{2 * s, 400 * ms}, importStats{Unended: 10 * s}, false, 0, "a wait of 10s for an earlier standby's import ran out"},
		{"policy wait, an earlier wait ran out: wait", ImportingWait, importing{2 * s, 400 * ms}, importStats{Unended: 10 * s}, true, firstWait, "--prewarm-importing wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := decideImporting(tc.policy, tc.now, tc.last)
			if c.Wait != tc.wait || c.MaxWait != tc.maxWait || !strings.Contains(c.Reason, tc.reason) {
				t.Errorf("decideImporting(%s, %+v, %+v) = %+v; want wait %v, max wait %s, reason with %q",
					tc.policy, tc.now, tc.last, c, tc.wait, tc.maxWait, tc.reason)
			}
		})
	}
}

func TestParseImporting(t *testing.T) {
	for in, want := range map[string]Importing{"auto": ImportingAuto, " Wait": ImportingWait, "STOP": ImportingStop, "": "", "kill": ""} {
		got, err := ParseImporting(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("ParseImporting(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := NewStarter(Options{Reaper: newReaper(t), Modules: []string{"json"}, Importing: "later"}); err == nil ||
		!strings.Contains(err.Error(), "auto, wait or stop") {
		t.Errorf("NewStarter with a bad importing policy: %v", err)
	}
}

func TestProcessCPU(t *testing.T) {
	var ru syscall.Rusage
	end := time.Now().Add(150 * time.Millisecond)
	for time.Now().Before(end) { // use some CPU
	}
	got, err := processCPU(os.Getpid())
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	want := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	if err != nil || got <= 0 || got > want+50*time.Millisecond || got < want-100*time.Millisecond {
		t.Errorf("processCPU(self) = %s, %v; getrusage says %s", got, err, want)
	}
	if _, err := processCPU(1 << 30); err == nil {
		t.Error("processCPU of no process succeeded")
	}
}

// slowCycle runs cycle 1 cold with standbys importing ftl_slowimport
// (mode burn or sleep), waits until the standby of local rank 0 is in that
// import, and returns the directory the module watches and the standby.
func slowCycle(t *testing.T, st *Starter, base, mode string) (string, *standby) {
	t.Helper()
	dir := filepath.Join(base, "slow")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run(t, warm(st), filepath.Join(base, "1"), recordCase{}, "FTL_SLOW_DIR="+dir, "FTL_SLOW_MODE="+mode)
	deadline := time.Now().Add(testTimeout)
	for {
		m, _ := filepath.Glob(filepath.Join(dir, "importing-*"))
		st.mu.Lock()
		s := st.standby[0]
		st.mu.Unlock()
		if len(m) > 0 && s != nil {
			if m[0] != filepath.Join(dir, fmt.Sprint("importing-", s.pid)) {
				t.Fatalf("marker %s is not the standby's (pid %d)", m[0], s.pid)
			}
			return dir, s
		}
		if time.Now().After(deadline) {
			t.Fatalf("the standby did not start its slow import within %s", testTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRestartWhileImporting: a restart that comes while the standby is
// still importing waits for it (it works: CPU), stops it (it does not, or
// --prewarm-importing stop) or, when the wait runs out, stops it then and
// starts cold; the event says which, and no standby is left behind.
func TestRestartWhileImporting(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	for _, tc := range []struct {
		name     string
		mode     string
		policy   Importing
		last     importStats // pretend an earlier import was measured
		release  time.Duration
		path     Path
		reason   string
		warm     bool
		waitedAt time.Duration // the wait lasted at least this long
	}{
		{"works: waited", "burn", ImportingAuto, importStats{}, 500 * time.Millisecond, PathWaited, "no import measured yet", true, 400 * time.Millisecond},
		{"blocked: stopped", "sleep", ImportingAuto, importStats{}, -1, PathStopped, "used only", false, 0},
		{"policy stop", "burn", ImportingStop, importStats{}, -1, PathStopped, "--prewarm-importing stop", false, 0},
		{"wait runs out: cold", "burn", ImportingWait, importStats{Wall: 100 * time.Millisecond, CPU: 100 * time.Millisecond}, -1, PathCold, "import had not ended (at most 1.1s)", false, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReaper(t)
			base := t.TempDir()
			ev := &events{}
			st, err := NewStarter(Options{Reaper: r, Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add,
				RefillDelay: -1, Importing: tc.policy})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(st.Close)
			dir, s := slowCycle(t, st, base, tc.mode)
			st.mu.Lock()
			st.lastImport = tc.last
			st.mu.Unlock()
			if tc.release >= 0 {
				time.AfterFunc(tc.release, func() { _ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o644) })
			}
			runCycle(t, st, filepath.Join(base, "2"))
			if warm := len(ev.of(EventWarm)) == 1; warm != tc.warm {
				t.Errorf("warm start %v, want %v", warm, tc.warm)
			}
			if n, want := len(ev.of(EventWaiting)), tc.waitedAt > 0; (n == 1) != want || n > 1 {
				t.Errorf("%d waiting events, want one: %v", n, want)
			}
			fb := recsOf[eventlog.PrewarmFallbackEvent](ev)
			if len(fb) != 2 {
				t.Fatalf("fallback events %v, want cycle 1's and cycle 2's", fb)
			}
			f := fb[1]
			if f.Path != tc.path || !strings.Contains(f.Reason, tc.reason) || !strings.Contains(f.Reason, stillImporting) {
				t.Fatalf("cycle 2 fallback %+v, want path %s, reason with %q", f, tc.path, tc.reason)
			}
			if f.StandbyCPUMS == nil || tc.mode == "burn" && *f.StandbyCPUMS < 150 {
				t.Errorf("standby_cpu_ms %v, want the CPU the standby had used (at least 200 ms)", f.StandbyCPUMS)
			}
			if isWait := f.WaitMS != nil; isWait != (tc.waitedAt > 0) || isWait && time.Duration(*f.WaitMS*float64(time.Millisecond)) < tc.waitedAt {
				t.Errorf("wait_ms %v, want at least %s", f.WaitMS, tc.waitedAt)
			}
			if !tc.warm {
				select { // stopped: killed and reaped
				case <-s.done:
				case <-time.After(10 * time.Second):
					t.Fatalf("the stopped standby %d is still running", s.pid)
				}
				if s.exit.Signal != syscall.SIGKILL {
					t.Errorf("the stopped standby exited %s, want killed", s.exit)
				}
			}
			if tc.release < 0 { // let the refilled standby finish its import
				_ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o644)
			}
			st.Close()
			if err := syscall.Kill(s.pid, 0); err != syscall.ESRCH {
				t.Errorf("standby %d still exists after Close: %v", s.pid, err)
			}
		})
	}
}

// TestUnendedWaitNotRepeated: with no import measured, a restart waits
// (up to firstWait) for a standby that works at its import; when that wait
// runs out (an import that never ends), the next restart does not wait
// again for the next standby: it stops it and starts cold at once, saying
// why.
func TestUnendedWaitNotRepeated(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	base := t.TempDir()
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add, RefillDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	dir, _ := slowCycle(t, st, base, "burn")
	slow := []string{"FTL_SLOW_DIR=" + dir, "FTL_SLOW_MODE=burn"}
	run(t, warm(st), filepath.Join(base, "2"), recordCase{}, slow...) // waits firstWait, then cold
	fb := recsOf[eventlog.PrewarmFallbackEvent](ev)
	if len(fb) != 2 || fb[1].Path != PathCold || !strings.Contains(fb[1].Reason, "import had not ended (at most 10s)") {
		t.Fatalf("cycle 2 fallback %v; want cold after a wait of 10s that ran out", fb)
	}
	deadline := time.Now().Add(testTimeout)
	for { // the refilled standby is in its import too
		st.mu.Lock()
		s := st.standby[0]
		st.mu.Unlock()
		if s != nil {
			if _, err := os.Stat(filepath.Join(dir, fmt.Sprint("importing-", s.pid))); err == nil {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no refilled standby in its import")
		}
		time.Sleep(20 * time.Millisecond)
	}
	run(t, warm(st), filepath.Join(base, "3"), recordCase{}, slow...)
	fb = recsOf[eventlog.PrewarmFallbackEvent](ev)
	if len(fb) != 3 || fb[2].Path != PathStopped || !strings.Contains(fb[2].Reason, "ran out") {
		t.Fatalf("cycle 3 fallback %v; want the standby stopped, naming the wait that ran out", fb)
	}
	if n := len(ev.of(EventWaiting)); n != 1 {
		t.Errorf("%d waiting events; want cycle 2's only (cycle 3 did not wait)", n)
	}
	_ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o644)
}

// TestRefillWaitsForColdImports: with a measured import, the standby of a
// rank that started cold starts only once the rank has used that much CPU
// (its own imports are done), not beside them.
func TestRefillWaitsForColdImports(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "burn.py")
	// Stands for a cold rank importing (0.8 s of CPU), then training idly.
	src := "import time\nwhile time.process_time() < 0.8:\n    pass\ntime.sleep(3)\n"
	if err := os.WriteFile(script, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := newStarter(t, r, "json")
	const need = 400 * time.Millisecond
	st.mu.Lock()
	st.lastImport = importStats{Wall: time.Second, CPU: need}
	st.mu.Unlock()
	o, e := logFiles(t, dir)
	g, err := st.StartGroup([]spawn.Spec{{LocalRank: 0, Argv: []string{python, "-u", script}, Env: os.Environ(), Stdout: o, Stderr: e}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Stop(syscall.SIGKILL, 0) })
	rank := g.PIDs()[0]
	deadline := time.Now().Add(testTimeout)
	for {
		// The rank's CPU first, then whether the standby exists: a standby
		// seen now was started when the rank had used at most this much.
		cpu, err := processCPU(rank)
		if err != nil {
			t.Fatalf("the rank ended before its standby started: %v", err)
		}
		st.mu.Lock()
		s := st.standby[0]
		st.mu.Unlock()
		if s != nil {
			if cpu < need-clockTick {
				t.Fatalf("the standby started when the cold rank had used %s CPU, under the measured import's %s", cpu, need)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no standby within %s", testTimeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procState is the state letter of /proc/PID/stat ('T': stopped).
func procState(t *testing.T, pid int) byte {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndexByte(string(b), ')')
	return b[i+2]
}

// waitStopped waits until pid is stopped (a signal is delivered when the
// process next runs, not when kill returns).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for procState(t, pid) != 'T' {
		if time.Now().After(deadline) {
			t.Fatalf("process %d is in state %c, want stopped (T)", pid, procState(t, pid))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestIdleStandbysPaused: a cycle that starts only some ranks (an
// in-process restart's replacement) pauses the standbys still importing
// whose ranks it does not start, so that their imports do not take CPU
// from the replacement's, and lets them go on when new standbys would
// start; a later cycle that needs a paused standby resumes it first.
func TestIdleStandbysPaused(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	base := t.TempDir()
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add,
		RefillDelay: 700 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	dir := filepath.Join(base, "slow")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Cycle 0: local ranks 0 and 1, cold; their standbys start importing
	// the slow module (burning CPU) once the delay passed.
	spec := func(cycle string, lr int) spawn.Spec {
		d := filepath.Join(base, cycle, fmt.Sprint(lr))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		o, e := logFiles(t, d)
		sp := recordCase{}.spec(t, d, filepath.Join(d, "record.json"), o, e, "FTL_SLOW_DIR="+dir, "FTL_SLOW_MODE=burn",
			"LOCAL_RANK="+fmt.Sprint(lr), "TORCHELASTIC_RESTART_COUNT="+cycle)
		sp.LocalRank = lr
		return sp
	}
	g, err := st.StartGroup([]spawn.Spec{spec("0", 0), spec("0", 1)})
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, 2)
	var sb [2]*standby
	deadline := time.Now().Add(testTimeout)
	for sb[0] == nil || sb[1] == nil {
		if time.Now().After(deadline) {
			t.Fatal("the standbys did not start their slow imports")
		}
		time.Sleep(20 * time.Millisecond)
		st.mu.Lock()
		sb[0], sb[1] = st.standby[0], st.standby[1]
		st.mu.Unlock()
		for i, s := range sb {
			if s != nil {
				if _, err := os.Stat(filepath.Join(dir, fmt.Sprint("importing-", s.pid))); err != nil {
					sb[i] = nil
				}
			}
		}
	}
	// Cycle 1 starts only local rank 1 (rank 0 survived in process): its
	// standby is waited for (released 300 ms on), rank 0's is paused.
	time.AfterFunc(300*time.Millisecond, func() { _ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o644) })
	g, err = st.StartGroup([]spawn.Spec{spec("1", 1)})
	if err != nil {
		t.Fatal(err)
	}
	if p := recsOf[eventlog.PrewarmPausedEvent](ev); len(p) != 1 || !slices.Equal(p[0].LocalRanks, []int{0}) || p[0].Round != "1" {
		t.Fatalf("paused events %v, want one for local rank 0 in round 1", p)
	}
	waitStopped(t, sb[0].pid)
	if fb := recsOf[eventlog.PrewarmFallbackEvent](ev); fb[len(fb)-1].Path != PathWaited || fb[len(fb)-1].LocalRank != 1 {
		t.Fatalf("cycle 1's rank 1 took %v, want its standby after waiting", fb[len(fb)-1])
	}
	waitAll(t, g, 1)
	// After the delay the paused standby goes on, and ends its import.
	waitReady(t, st, 0)
	if r := recsOf[eventlog.PrewarmResumedEvent](ev); len(r) != 1 || !slices.Equal(r[0].LocalRanks, []int{0}) {
		t.Fatalf("resumed events %v, want one for local rank 0", r)
	}
	if c := procState(t, sb[0].pid); c == 'T' {
		t.Fatal("rank 0's standby is still stopped")
	}
	// Its pause is not counted as import time: the measured import's wall
	// time bounds later waits.
	st.mu.Lock()
	pausedFor := sb[0].pausedFor
	st.mu.Unlock()
	if pausedFor < 500*time.Millisecond {
		t.Fatalf("paused for %s, want about the 0.7 s refill delay", pausedFor)
	}
	var ready *eventlog.PrewarmReadyEvent
	eventually := time.Now().Add(testTimeout)
	for ready == nil && time.Now().Before(eventually) {
		for _, e := range recsOf[eventlog.PrewarmReadyEvent](ev) {
			if e.LocalRank == 0 {
				ready = &e
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ready == nil {
		t.Fatal("no ready event for local rank 0")
	}
	wall := time.Since(sb[0].started)
	if imp := time.Duration(ready.ImportMS * float64(time.Millisecond)); imp > wall-pausedFor {
		t.Fatalf("measured import %s includes the %s pause (the standby is %s old)", imp, pausedFor, wall)
	}
	st.Close()
	if err := syscall.Kill(sb[0].pid, 0); err != syscall.ESRCH {
		t.Errorf("standby %d still exists after Close: %v", sb[0].pid, err)
	}
}

// TestPausedStandbyResumedWhenNeeded: a cycle that needs a standby an
// earlier cycle paused resumes it and hands it its rank; Close kills a
// paused standby.
func TestPausedStandbyResumedWhenNeeded(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	base := t.TempDir()
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add,
		RefillDelay: 3 * time.Second}) // the pause outlasts the next cycle's start
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	dir, s := slowCycle(t, st, base, "burn")      // local rank 0's standby importing
	if _, err := st.StartGroup(nil); err != nil { // a cycle without rank 0
		t.Fatal(err)
	}
	waitStopped(t, s.pid)
	time.AfterFunc(300*time.Millisecond, func() { _ = os.WriteFile(filepath.Join(dir, "release"), nil, 0o644) })
	runCycle(t, st, filepath.Join(base, "2"))
	if w := ev.of(EventWarm); len(w) != 1 {
		t.Fatalf("warm events %v: the resumed standby should have taken the rank", w)
	}
}

// TestClosePausedStandby: Close kills a paused (stopped) standby and
// reaps it.
func TestClosePausedStandby(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add,
		RefillDelay: 3 * time.Second}) // the pause lasts past Close
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	_, s := slowCycle(t, st, t.TempDir(), "burn")
	if _, err := st.StartGroup(nil); err != nil { // a cycle without rank 0: its standby pauses
		t.Fatal(err)
	}
	waitStopped(t, s.pid)
	st.Close()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the paused standby %d was not reaped after Close", s.pid)
	}
	if err := syscall.Kill(s.pid, 0); err != syscall.ESRCH {
		t.Errorf("standby %d still exists after Close: %v", s.pid, err)
	}
}
