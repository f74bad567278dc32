package prewarm

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/spawn"
)

func TestCycleReady(t *testing.T) {
	type mark struct{ round, lr int }
	specs := func(round string, lrs ...int) []spawn.Spec {
		var out []spawn.Spec
		for _, lr := range lrs {
			out = append(out, spawn.Spec{LocalRank: lr, Env: []string{"TORCHELASTIC_RESTART_COUNT=" + round}})
		}
		return out
	}
	for _, tc := range []struct {
		name  string
		specs []spawn.Spec
		marks []mark
		done  bool
	}{
		{"every rank training", specs("3", 0, 1), []mark{{3, 1}, {3, 0}}, true},
		{"one rank still on its way", specs("3", 0, 1), []mark{{3, 1}}, false},
		{"a mark twice counts once", specs("3", 0, 1), []mark{{3, 1}, {3, 1}}, false},
		{"another round's heartbeat is ignored", specs("3", 0, 1), []mark{{2, 0}, {3, 1}}, false},
		{"a rank the cycle did not start is ignored", specs("3", 1), []mark{{3, 0}}, false},
		{"an in-process restart's one replacement", specs("5", 1), []mark{{5, 1}}, true},
		{"a cycle that starts no rank keeps its delay", nil, []mark{{3, 0}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCycleReady(tc.specs)
			for _, m := range tc.marks {
				c.training(m.round, m.lr)
			}
			done := false
			select {
			case <-c.done:
				done = true
			default:
			}
			if done != tc.done {
				t.Fatalf("done %v, want %v", done, tc.done)
			}
		})
	}
}

// TestRefillStartsOnceRanksTrain: with a refill delay far longer than the
// test, the new standbys start as soon as every rank of the cycle sent
// its first heartbeat (RankTraining), and not before.
func TestRefillStartsOnceRanksTrain(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	base := t.TempDir()
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: []string{"json"}, OnEvent: ev.add, RefillDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	spec := func(lr int) spawn.Spec {
		d := filepath.Join(base, fmt.Sprint(lr))
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		o, e := logFiles(t, d)
		sp := recordCase{}.spec(t, d, filepath.Join(d, "record.json"), o, e,
			"LOCAL_RANK="+fmt.Sprint(lr), "TORCHELASTIC_RESTART_COUNT=4")
		sp.LocalRank = lr
		return sp
	}
	g, err := st.StartGroup([]spawn.Spec{spec(0), spec(1)})
	if err != nil {
		t.Fatal(err)
	}
	waitAll(t, g, 2)
	standbys := func() int {
		st.mu.Lock()
		defer st.mu.Unlock()
		return len(st.standby)
	}
	st.RankTraining(4, 0)
	st.RankTraining(3, 1) // an older round's: not this cycle's rank 1
	// The refill's goroutine runs within milliseconds of a wake-up; give
	// it far more, then check that it is still waiting.
	time.Sleep(300 * time.Millisecond)
	if n := standbys(); n != 0 {
		t.Fatalf("%d standbys started before every rank trained", n)
	}
	st.RankTraining(4, 1)
	waitReady(t, st, 0)
	waitReady(t, st, 1)
}

func TestRefillGate(t *testing.T) {
	for _, tc := range []struct {
		name               string
		warm, cold, paused int
		low                bool
		launched           bool
		atOnce             bool
		delay              time.Duration
	}{
		{"every rank warm, standbys at nice 19", 4, 0, 0, true, false, true, time.Second},
		{"a cold rank still importing", 3, 1, 0, true, false, false, time.Second},
		{"every rank cold", 0, 4, 0, true, false, false, time.Second},
		{"standbys paused by this cycle", 1, 0, 1, true, false, false, time.Second},
		{"standbys at the launcher's priority", 4, 0, 0, false, false, false, time.Second},
		{"no rank started", 0, 0, 0, true, false, false, time.Second},
		// The first cycle on the standbys started at launch: its ranks
		// have not trained yet; the refill waits for them, up to refillHold.
		{"first cycle on launch standbys", 4, 0, 0, true, true, false, refillHold},
		{"first cycle on launch standbys, at the launcher's priority", 4, 0, 0, false, true, false, refillHold},
		{"first cycle, a launch standby failed: a cold rank", 3, 1, 0, true, true, false, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &Starter{prio: priority{low: tc.low}, o: Options{RefillDelay: time.Second}}
			gate, delay := st.refillGate(tc.warm, tc.cold, tc.paused, tc.launched, newCycleReady([]spawn.Spec{{LocalRank: 0}}))
			open := false
			select {
			case <-gate:
				open = true
			default:
			}
			if open != tc.atOnce || delay != tc.delay {
				t.Fatalf("refill at once %v after %s, want %v after %s", open, delay, tc.atOnce, tc.delay)
			}
		})
	}
}
