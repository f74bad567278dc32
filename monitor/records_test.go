package monitor

import (
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// recorder collects what a Manager gives Options.OnEvent.
type recorder struct {
	mu   sync.Mutex
	recs []eventlog.Record
}

func (r *recorder) add(rec eventlog.Record) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec)
}

func (r *recorder) of(kind string) []eventlog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []eventlog.Record
	for _, e := range r.recs {
		if e.Kind() == kind {
			out = append(out, e)
		}
	}
	return out
}

// one is the only record of type T recorded; the test fails without
// exactly one.
func one[T eventlog.Record](t *testing.T, r *recorder) T {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var got []T
	for _, e := range r.recs {
		if x, ok := e.(T); ok {
			got = append(got, x)
		}
	}
	if len(got) != 1 {
		var zero T
		t.Fatalf("%d %s records, want 1: %v", len(got), zero.Kind(), r.recs)
	}
	return got[0]
}

// TestRankRecords: a rank's first heartbeat, first step and checkpoints,
// and its steps since the last checkpoint at the cycle's end, are recorded
// once each; ordinary heartbeats and steps are not.
func TestRankRecords(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	var rec recorder
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	m := startManager(t, Options{NLocal: 1, FT: ft, MinComputedTimeout: -1, OnEvent: rec.add})
	p := startRank(t, m, "connect;hb;hb;open step 4;close step;hb;open step 5;close step;"+
		"open checkpointing;close checkpointing;open step 6;close step;open step 7;close step;hb;mark done;sleep 30s;exit 0")
	begun := time.Now()
	m.BeginCycle(3, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "done", 30*time.Second)
	eventually(t, 10*time.Second, "first heartbeat, first step and checkpoint recorded", func() bool {
		m.RankStatus(0) // drains the session
		return len(rec.of(EventFirstHeartbeat)) == 1 && len(rec.of(EventFirstStep)) == 1 && len(rec.of(EventCheckpoint)) == 1
	})
	m.EndCycle()
	hb, step := one[eventlog.RankFirstHeartbeatEvent](t, &rec), one[eventlog.RankFirstStepEvent](t, &rec)
	ckpt, sum := one[eventlog.RankCheckpointEvent](t, &rec), one[eventlog.RankStepsEvent](t, &rec)
	for _, id := range [][3]int{{hb.Round, hb.LocalRank, hb.Rank}, {step.Round, step.LocalRank, step.Rank},
		{ckpt.Round, ckpt.LocalRank, ckpt.Rank}, {sum.Round, sum.LocalRank, sum.Rank}} {
		if id[0] != 3 || id[1] != 0 || id[2] < 0 || id[2] != hb.Rank {
			t.Errorf("records of round, local rank, rank %v: want 3, 0 and the client's rank (%d) in each", id, hb.Rank)
		}
	}
	if hb.At.Before(begun.Add(-time.Second)) || hb.At.After(time.Now()) || hb.SinceInitMS < 0 {
		t.Errorf("first heartbeat at %v (%v ms after its session began), not during the cycle", hb.At, hb.SinceInitMS)
	}
	if step.Iteration == nil || *step.Iteration != 4 {
		t.Errorf("first step iteration %v, want 4 (the client sent it)", step.Iteration)
	}
	if ckpt.Steps != 2 || ckpt.At.Before(ckpt.OpenedAt) {
		t.Errorf("checkpoint %+v: want after 2 steps, closed after it opened", ckpt)
	}
	if sum.Steps != 4 || sum.StepsSinceCheckpoint != 2 || sum.Checkpoints != 1 || sum.LastStepAt.Before(ckpt.At) {
		t.Errorf("cycle summary %+v: want 4 steps, 2 since the 1 checkpoint, the last after it", sum)
	}
}
