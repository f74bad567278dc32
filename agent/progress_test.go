package agent

import (
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// progressMonitors is fakeMonitors with the progress side of
// *monitor.Manager (whose own counting is tested in package monitor).
type progressMonitors struct {
	*fakeMonitors
	progress *verdict.Progress
	steps    map[int]int64 // local rank -> steps in the current cycle
	iter     map[int]int64
}

func (m *progressMonitors) Progress() *verdict.Progress { return m.progress }

func (m *progressMonitors) RankCycle(lr int) (int64, *int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if it, ok := m.iter[lr]; ok {
		return m.steps[lr], &it
	}
	return m.steps[lr], nil
}

// TestVerdictProgressAndRankFailures: the outcome carries the monitors'
// progress and one rank failure per failed rank (a crash with its exit
// code, a signal death, a hang), each with the rank's steps and iteration
// in that cycle; ranks stopped by the launcher are not failures.
func TestVerdictProgressAndRankFailures(t *testing.T) {
	h := newHarness(t)
	first, last := int64(100), int64(142)
	m := &progressMonitors{fakeMonitors: h.mons, steps: map[int]int64{1: 17}, iter: map[int]int64{1: 117},
		progress: &verdict.Progress{Steps: 42, Checkpoints: 2, Heartbeats: 50, FirstIteration: &first, LastIteration: &last}}
	h.monitors = m
	h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1), active(2, 2), active(3, 3))
	out := h.start()
	g := h.ranks.wait(t)
	g.exit(1, 3, 0) // round 0: local rank 1 crashes with 3 after 17 steps
	g = h.ranks.wait(t)
	m.mu.Lock()
	m.steps, m.iter = map[int]int64{0: 5}, map[int]int64{}
	m.mu.Unlock()
	g.exit(0, 0, syscall.SIGSEGV) // round 1: local rank 0 killed by SIGSEGV, no iteration reported
	g = h.ranks.wait(t)
	h.mons.mu.Lock()
	h.mons.fired[1] = true
	h.mons.mu.Unlock()
	g.exit(1, 0, syscall.SIGKILL) // round 2: local rank 1 hung, killed by its monitor
	h.mons.hangs <- monitor.Hang{Cycle: 2, LocalRank: 1, GlobalRank: 1, Kind: "section", Section: "step",
		Timeout: time.Second, Elapsed: time.Second, Signal: syscall.SIGKILL}
	g = h.ranks.wait(t)
	g.exit(0, 0, 0)
	g.exit(1, 0, 0)
	o := h.outcome(out)
	want(t, o, verdict.Succeeded, 0)
	v := o.Verdict("job", "n", "h")
	if v.Progress != m.progress {
		t.Errorf("verdict progress %+v, want the monitors' %+v", v.Progress, m.progress)
	}
	if len(v.RankFailures) != 3 {
		t.Fatalf("rank failures %+v, want 3", v.RankFailures)
	}
	it117 := int64(117)
	wantF := []verdict.RankFailure{
		{Round: 0, Rank: 1, LocalRank: 1, ExitCode: 3, Kind: verdict.FailureCrash, Steps: 17, Iteration: &it117},
		{Round: 1, Rank: 0, LocalRank: 0, Signal: "SIGSEGV", Kind: verdict.FailureCrash, Steps: 5},
		{Round: 2, Rank: 1, LocalRank: 1, Signal: "SIGKILL", Kind: verdict.FailureHang, Steps: 0},
	}
	for i, w := range wantF {
		g := v.RankFailures[i]
		if g.Round != w.Round || g.Rank != w.Rank || g.LocalRank != w.LocalRank || g.ExitCode != w.ExitCode ||
			g.Signal != w.Signal || g.Kind != w.Kind || g.Steps != w.Steps || (g.Iteration == nil) != (w.Iteration == nil) ||
			(g.Iteration != nil && *g.Iteration != *w.Iteration) || g.At.IsZero() {
			t.Errorf("rank failure %d = %+v, want %+v", i, g, w)
		}
	}
}

// TestRankFailuresBounded: only the newest verdict.MaxRankFailures are kept.
func TestRankFailuresBounded(t *testing.T) {
	h := newHarness(t)
	h.cfg.MaxRestarts = 100
	n := verdict.MaxRankFailures + 3
	for i := 0; i < n; i++ {
		h.rdzv.next = append(h.rdzv.next, active(i, i))
	}
	h.rdzv.next = append(h.rdzv.next, active(n, n))
	out := h.start()
	for i := 0; i < n; i++ {
		h.ranks.wait(t).exit(0, i+1, 0)
	}
	g := h.ranks.wait(t)
	g.exit(0, 0, 0)
	g.exit(1, 0, 0)
	o := h.outcome(out)
	if len(o.RankFailures) != verdict.MaxRankFailures {
		t.Fatalf("%d rank failures kept, want %d", len(o.RankFailures), verdict.MaxRankFailures)
	}
	if f := o.RankFailures[0]; f.Round != 3 || f.ExitCode != 4 {
		t.Errorf("oldest kept failure %+v, want round 3 exit 4", f)
	}
	if f := o.RankFailures[len(o.RankFailures)-1]; f.Round != n-1 || f.ExitCode != n {
		t.Errorf("newest failure %+v, want round %d exit %d", f, n-1, n)
	}
	if o.Progress != nil {
		t.Errorf("progress %+v without a progress reporter, want nil", o.Progress)
	}
}
