package prewarm

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// announcedRank records, at its first line, whether Options.Started had
// already been told its pid ($FTL_ANNOUNCED/announced-<pid> exists), then
// exits.
const announcedRank = `import os
ok = os.path.exists(os.path.join(os.environ["FTL_ANNOUNCED"], "announced-%d" % os.getpid()))
with open(os.environ["FTL_OUT"], "w") as f:
    f.write("%d %s" % (os.getpid(), ok))
`

// announcements is an Options.Started that records each call and marks
// the pid in dir for announcedRank.
type announcements struct {
	dir string
	mu  sync.Mutex
	got map[int][]int // local rank -> the pids it was told, in order
}

func (a *announcements) started(lr, pid int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.got[lr] = append(a.got[lr], pid)
	_ = os.WriteFile(filepath.Join(a.dir, fmt.Sprint("announced-", pid)), nil, 0o644)
}

func (a *announcements) of(lr int) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.got[lr]...)
}

// TestStartedBeforeHandover: a restart with one rank's standby ready and
// the other's still importing. The ready standby takes its rank at once and
// its code runs while StartGroup still waits for the other standby; each
// rank's pid reaches Options.Started before the rank's code runs (so the
// launcher's rank monitor can hold that rank's connection until the cycle
// begins), and StartGroup's pids are the ones announced.
func TestStartedBeforeHandover(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	td, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	script := filepath.Join(base, "rank.py")
	if err := os.WriteFile(script, []byte(announcedRank), 0o644); err != nil {
		t.Fatal(err)
	}
	ann := &announcements{dir: filepath.Join(base, "announced"), got: map[int][]int{}}
	if err := os.MkdirAll(ann.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Local rank 0's standby imports ftl_slowimport with its release
	// already there (done at once), local rank 1's waits for the test.
	slow := [2]string{filepath.Join(base, "slow0"), filepath.Join(base, "slow1")}
	for _, d := range slow {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(slow[0], "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	ev := &events{}
	st, err := NewStarter(Options{Reaper: newReaper(t), Modules: []string{"json", "ftl_slowimport"}, OnEvent: ev.add,
		RefillDelay: -1, Importing: ImportingWait, Started: ann.started})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	specs := func(cycle string) []spawn.Spec {
		out := make([]spawn.Spec, 2)
		for lr := range out {
			d := filepath.Join(base, cycle, fmt.Sprint(lr))
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
			o, e := logFiles(t, d)
			env := append(os.Environ(), "PYTHONPATH="+td, "FTL_SLOW_DIR="+slow[lr], "FTL_SLOW_MODE=sleep",
				"FTL_ANNOUNCED="+ann.dir, "FTL_OUT="+filepath.Join(d, "out"),
				"RANK="+fmt.Sprint(lr), "LOCAL_RANK="+fmt.Sprint(lr), "TORCHELASTIC_RESTART_COUNT="+cycle)
			out[lr] = spawn.Spec{LocalRank: lr, Argv: []string{python, "-u", script}, Env: env, Stdout: o, Stderr: e}
		}
		return out
	}
	readOut := func(cycle string, lr int) string {
		b, err := os.ReadFile(filepath.Join(base, cycle, fmt.Sprint(lr), "out"))
		if err != nil {
			return ""
		}
		return string(b)
	}

	// Cycle 0: cold; announced once started.
	g, err := st.StartGroup(specs("0"))
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, 2)
	for lr, pid := range g.PIDs() {
		if got := ann.of(lr); len(got) != 1 || got[0] != pid {
			t.Errorf("cycle 0, local rank %d (pid %d): announced %v, want its pid once", lr, pid, got)
		}
	}

	// Standby 0 ready (its import measured: the wait bound is set after it),
	// standby 1 held in its import.
	ready := waitReady(t, st, 0)
	deadline := time.Now().Add(testTimeout)
	for measured := false; !measured; {
		for _, e := range recsOf[eventlog.PrewarmReadyEvent](ev) {
			measured = measured || e.LocalRank == 0
		}
		if time.Now().After(deadline) {
			t.Fatal("no ready event for local rank 0")
		}
		time.Sleep(10 * time.Millisecond)
	}
	var held *standby
	for held == nil {
		st.mu.Lock()
		s := st.standby[1]
		st.mu.Unlock()
		if s != nil {
			if _, err := os.Stat(filepath.Join(slow[1], fmt.Sprint("importing-", s.pid))); err == nil {
				held = s
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("standby 1 did not reach its held import")
		}
		time.Sleep(10 * time.Millisecond)
	}
	st.mu.Lock()
	st.lastImport = importStats{Wall: time.Minute, CPU: time.Second} // a wait bound the test never reaches
	st.mu.Unlock()

	// Cycle 1: rank 0 runs on its standby while StartGroup waits for
	// standby 1.
	type result struct {
		g   *Group
		err error
	}
	returned := make(chan result, 1)
	go func() {
		g, err := st.StartGroup(specs("1"))
		returned <- result{g, err}
	}()
	for readOut("1", 0) == "" {
		select {
		case r := <-returned:
			t.Fatalf("StartGroup returned (%v) before rank 0 ran: standby 1 was not waited for", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("rank 0 did not run on its standby")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case r := <-returned:
		t.Fatalf("StartGroup returned (%v) while standby 1 is held", r.err)
	default:
	}
	if got, want := readOut("1", 0), fmt.Sprintf("%d True", ready.pid); got != want {
		t.Errorf("rank 0 recorded %q, want %q: its pid announced before its code ran", got, want)
	}
	if got := ann.of(1); len(got) != 1 {
		t.Errorf("local rank 1 announced %v while its standby imports, want only cycle 0's pid", got)
	}
	if err := os.WriteFile(filepath.Join(slow[1], "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-returned:
	case <-time.After(testTimeout):
		t.Fatal("StartGroup did not return once standby 1 was released")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	waitAll(t, r.g, 2)
	if got, want := readOut("1", 1), fmt.Sprintf("%d True", held.pid); got != want {
		t.Errorf("rank 1 recorded %q, want %q", got, want)
	}
	for lr, pid := range r.g.PIDs() {
		got := ann.of(lr)
		if len(got) != 2 || got[1] != pid {
			t.Errorf("cycle 1, local rank %d (pid %d): announced %v, want cycle 0's pid then this one", lr, pid, got)
		}
	}
	if fb := recsOf[eventlog.PrewarmFallbackEvent](ev); len(fb) != 3 || fb[2].Path != PathWaited || fb[2].LocalRank != 1 {
		t.Errorf("fallbacks %v: want cycle 0's two, then local rank 1 waited for", fb)
	}
	if w := recsOf[eventlog.PrewarmStartedEvent](ev); len(w) != 1 || !slices.Equal(w[0].LocalRanks, []int{0, 1}) {
		t.Errorf("warm events %v, want cycle 1's with both ranks", w)
	}
}
