package monitor

import (
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// recorder collects what a Manager gives Options.OnEvent.
type recorder struct {
	mu   sync.Mutex
	recs []map[string]any
}

func (r *recorder) add(kind string, f map[string]any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := map[string]any{"event": kind}
	for k, v := range f {
		c[k] = v
	}
	r.recs = append(r.recs, c)
}

func (r *recorder) of(kind string) []map[string]any {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]any
	for _, e := range r.recs {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
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
	for _, kind := range []string{EventFirstHeartbeat, EventFirstStep, EventCheckpoint, EventCycleSteps} {
		got := rec.of(kind)
		if len(got) != 1 {
			t.Fatalf("%d %s records, want 1: %v", len(got), kind, rec.recs)
		}
		if got[0]["round"] != 3 || got[0]["local_rank"] != 0 {
			t.Errorf("%s record %v: want round 3, local rank 0", kind, got[0])
		}
	}
	if at, _ := rec.of(EventFirstHeartbeat)[0]["at"].(time.Time); at.Before(begun.Add(-time.Second)) || at.After(time.Now()) {
		t.Errorf("first heartbeat at %v, not during the cycle", at)
	}
	if it := rec.of(EventFirstStep)[0]["iteration"]; it != int64(4) {
		t.Errorf("first step iteration %v, want 4 (the client sent it)", it)
	}
	if s := rec.of(EventCheckpoint)[0]["steps"]; s != int64(2) {
		t.Errorf("checkpoint after %v steps, want 2", s)
	}
	sum := rec.of(EventCycleSteps)[0]
	if sum["steps"] != int64(4) || sum["steps_since_checkpoint"] != int64(2) || sum["checkpoints"] != int64(1) {
		t.Errorf("cycle summary %v: want 4 steps, 2 since the 1 checkpoint", sum)
	}
}
