package monitor

import (
	"os"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestProgressOverCycles: the progress sums steps, checkpoints and
// heartbeats over cycles and local ranks, with the lowest and highest
// iteration; RankCycle reports how far a rank came in its cycle, even after
// it crashed (its session is gone). A section other than "step" counts as
// a step only when it carries a new iteration (an nvrx client's sections).
func TestProgressOverCycles(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := newManager(t, 2, nil, "")
	if p := m.Progress(); p != nil {
		t.Fatalf("progress before any rank connected: %+v, want nil", p)
	}
	// Cycle 0: rank 0 steps 4 and 5, checkpoints, then crashes with 3;
	// rank 1 only heartbeats.
	r0 := startRank(t, m, "connect;hb;open step 4;close step;hb;open step 5;close step;"+
		"open checkpointing;close checkpointing;hb;exit 3")
	r1 := startProc(t, m, []string{"FTL_HELPER=connect;hb;hb;mark done;sleep 30s;exit 0",
		"FT_RANK_MONITOR_IPC_SOCKET=" + m.RankSocket(1), "LOCAL_RANK=1"}, os.Args[0], "-test.run=^$")
	m.BeginCycle(0, map[int]int{0: r0.cmd.Process.Pid, 1: r1.cmd.Process.Pid})
	if st := r0.exited(t, 30*time.Second); st.ExitCode() != 3 {
		t.Fatalf("rank 0 exit %v, want 3", st)
	}
	r1.waitLine(t, "done", 30*time.Second)
	eventually(t, 10*time.Second, "rank 0's session ended", func() bool { return !m.RankStatus(0).Connected })
	m.RankStatus(1) // drains rank 1's session
	steps, it := m.RankCycle(0)
	if steps != 2 || it == nil || *it != 5 {
		t.Fatalf("RankCycle(0) after the crash = %d steps, iteration %v; want 2, 5", steps, it)
	}
	if steps, it := m.RankCycle(1); steps != 0 || it != nil {
		t.Errorf("RankCycle(1) = %d, %v; want 0 steps, no iteration", steps, it)
	}
	m.EndCycle()

	// Cycle 1: rank 0 as an nvrx-style client: sections carrying the
	// iteration (10 twice, then 11: two new iterations).
	r0 = startRank(t, m, "connect;hb;open forward 10;close forward;open backward 10;close backward;"+
		"open forward 11;close forward;hb;mark done;sleep 30s;exit 0")
	m.BeginCycle(1, map[int]int{0: r0.cmd.Process.Pid, 1: noSuchPID})
	r0.waitLine(t, "done", 30*time.Second)
	m.RankStatus(0)
	if steps, it := m.RankCycle(0); steps != 2 || it == nil || *it != 11 {
		t.Errorf("RankCycle(0) in cycle 1 = %d, %v; want 2 steps, iteration 11", steps, it)
	}
	live := m.Progress() // the running cycle counts
	m.EndCycle()
	p := m.Progress()
	if p == nil {
		t.Fatal("progress nil after ranks connected")
	}
	if p.Steps != 4 || p.Checkpoints != 1 {
		t.Errorf("progress %+v: want 4 steps (2 + 2 new iterations), 1 checkpoint", *p)
	}
	if p.Heartbeats < 7 {
		t.Errorf("progress %+v: want at least 7 heartbeats (3 + 2 + 2)", *p)
	}
	if p.FirstIteration == nil || *p.FirstIteration != 4 || p.LastIteration == nil || *p.LastIteration != 11 {
		t.Errorf("progress iterations %v..%v, want 4..11", p.FirstIteration, p.LastIteration)
	}
	if p.LastStepAt.IsZero() || p.LastStepAt.After(time.Now()) {
		t.Errorf("last step at %v", p.LastStepAt)
	}
	if live == nil || live.Steps != p.Steps || live.Checkpoints != p.Checkpoints {
		t.Errorf("progress during the cycle %+v, after it %+v: want the same steps and checkpoints", live, p)
	}
	if !p.Advanced() {
		t.Error("Advanced() false for a run with steps")
	}
	// A new cycle does not count twice what was folded.
	m.BeginCycle(2, map[int]int{0: noSuchPID, 1: noSuchPID})
	m.EndCycle()
	if q := m.Progress(); q.Steps != p.Steps || q.Checkpoints != p.Checkpoints || q.Heartbeats != p.Heartbeats {
		t.Errorf("progress after an empty cycle %+v, want %+v", *q, *p)
	}
}

// TestProgressNilWithoutClient: ranks that never connect (an
// uninstrumented script) leave no progress: nil, not zero counts.
func TestProgressNilWithoutClient(t *testing.T) {
	t.Parallel()
	m := newManager(t, 1, nil, "")
	m.BeginCycle(0, map[int]int{0: noSuchPID})
	m.EndCycle()
	m.BeginCycle(1, map[int]int{0: noSuchPID})
	if p := m.Progress(); p != nil {
		t.Fatalf("progress %+v, want nil", *p)
	}
	if steps, it := m.RankCycle(0); steps != 0 || it != nil {
		t.Errorf("RankCycle = %d, %v; want 0, nil", steps, it)
	}
	if steps, it := m.RankCycle(5); steps != 0 || it != nil {
		t.Errorf("RankCycle(out of range) = %d, %v; want 0, nil", steps, it)
	}
}
