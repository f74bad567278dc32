package agent

// Agent-level tests (Run with fakes) of which ranks an in-process restart
// keeps and which it starts afresh: survivors gone before their round,
// dying with the failure (the settle), stuck at the rejoin bound, racing
// their notices, parked with a standby.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestInProcessSurvivorGone: a kept survivor that ended before its round
// started (it gave up waiting for its notice while the round waited for a
// node), or could not take its notice and ended when killed, is started
// afresh with the failed ranks: no failure is reported for it, no second
// restart is spent, and the other survivors still restart in process.
// When no survivor is left the node's ranks all start afresh (mode full).
func TestInProcessSurvivorGone(t *testing.T) {
	tests := []struct {
		name      string
		nproc     int
		died      []int // survivors that end while the node waits for the round
		refused   []int // survivors whose notice fails
		wantFresh []int
		wantStay  []int
	}{
		{"ended while waiting for the round", 3, []int{0}, nil, []int{0, 1}, []int{2}},
		{"notice refused, killed", 3, nil, []int{2}, []int{1, 2}, []int{0}},
		{"every survivor gone", 3, []int{0}, []int{2}, []int{0, 1, 2}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, 0, 1, 2)
			h.cfg.NProcPerNode = tc.nproc
			release := make(chan struct{})
			h.rdzv.next[1] = func(ctx context.Context) (rendezvous.Assignment, error) {
				<-release
				return active(1, 1)(ctx)
			}
			out := h.start()
			g0 := h.ranks.wait(t)
			g0.exit(1, 1, 0) // ranks 0 and 2 are kept
			waitFor(t, func() bool {
				h.rdzv.mu.Lock()
				defer h.rdzv.mu.Unlock()
				return len(h.rdzv.fails) == 1
			})
			for _, lr := range tc.died {
				g0.exit(lr, 1, 0) // "no restart notice within 60 s"
			}
			m.mu.Lock()
			for _, lr := range tc.refused { // its session ended (it is exiting)
				if m.refuse == nil {
					m.refuse = map[int]bool{}
				}
				m.refuse[lr] = true
			}
			m.mu.Unlock()
			close(release)
			g1 := h.ranks.wait(t)
			var fresh []int
			for _, s := range g1.specs {
				fresh = append(fresh, s.LocalRank)
			}
			if !slices.Equal(fresh, tc.wantFresh) {
				t.Fatalf("round 1 started local ranks %v; want %v", fresh, tc.wantFresh)
			}
			var noticed []int
			for range tc.wantStay {
				noticed = append(noticed, m.notice(t).LocalRank)
			}
			if !slices.Equal(noticed, tc.wantStay) {
				t.Fatalf("notices to %v; want %v", noticed, tc.wantStay)
			}
			for _, lr := range tc.wantStay {
				for _, ph := range []string{"rejoined", "first_step"} {
					m.reports <- monitor.InProcessReport{LocalRank: lr, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: ph}}
				}
			}
			for lr := range tc.nproc {
				if slices.Contains(tc.wantStay, lr) {
					g0.exit(lr, 0, 0)
				} else {
					g1.exit(lr, 0, 0)
				}
			}
			o := h.outcome(out)
			if o.Kind != verdict.Succeeded {
				t.Fatalf("outcome %+v", o)
			}
			h.rdzv.mu.Lock()
			fails := len(h.rdzv.fails)
			h.rdzv.mu.Unlock()
			if fails != 1 {
				t.Fatalf("%d failures reported; want 1 (a survivor's end before its round is not a failure)", fails)
			}
			var replaced []int
			for _, e := range h.events(EventInProcessReplaced) {
				replaced = append(replaced, int(e["local_rank"].(float64)))
			}
			gone := slices.Sorted(slices.Values(append(append([]int{}, tc.died...), tc.refused...)))
			if !slices.Equal(replaced, gone) {
				t.Fatalf("inprocess_replaced events for %v; want %v", replaced, gone)
			}
			if fb := h.events(EventInProcessFallback); len(fb) != 0 {
				t.Fatalf("fallback events %v", fb)
			}
			wantMode := "in-process"
			if len(tc.wantStay) == 0 {
				wantMode = "full"
			}
			if len(o.Cycles) != 2 || o.Cycles[1].Mode != wantMode {
				t.Fatalf("cycles %+v; want the second %s", o.Cycles, wantMode)
			}
		})
	}
}

// TestInProcessKeptThroughStandby: survivors kept for an in-process
// restart are stopped when the next round parks this node as a standby
// (another node took its slot); they are never notified into a later
// round, and the filler parks only after they stopped.
func TestInProcessKeptThroughStandby(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	h.spare = &fakeSpare{}
	h.rdzv.next = append(h.rdzv.next[:1], standbyIn(1), active(2, 1))
	out := h.start()
	g0 := h.ranks.wait(t)
	h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Reason: "a rank of node b failed",
		Cause: policy.RankCrash, Action: policy.RestartInPlace})
	g2 := h.ranks.wait(t)
	if len(g2.specs) != 2 || stoppedCount(g0) != 1 {
		t.Fatalf("round 2 started %d ranks and the survivors were stopped %d times; want 2 fresh ranks, survivors stopped once",
			len(g2.specs), stoppedCount(g0))
	}
	select {
	case n := <-m.notices:
		t.Fatalf("notice %+v sent to survivors of round 0", n)
	default:
	}
	h.rdzv.endRound(2, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 2, Code: 1, Close: verdict.FatalError, Reason: "closed"})
	h.outcome(out)
	kept := h.events(EventInProcessKept)
	if len(kept) != 1 || !strings.Contains(kept[0]["why"].(string), "the round ended (a rank of node b failed)") {
		t.Fatalf("inprocess_kept events %v; want one whose why names the round's end", kept)
	}
	rs := h.events(eventlog.Restart)
	if len(rs) != 1 || rs[0]["action"] != string(policy.RestartInProcess) {
		t.Fatalf("restart events %v; want one with action %s", rs, policy.RestartInProcess)
	}
}

// TestInProcessNoticeRaces: the notices go out after the replacement
// ranks started (a survivor that reconnects at once then finds the cycle
// begun), and two races at notice time end the cycle as a failure during
// the in-process restart, never a hang: a survivor notified a moment ago
// exits, and another's session is gone when its notice is sent.
func TestInProcessNoticeRaces(t *testing.T) {
	h, m := ipHarness(t, 0, 1, 2)
	h.cfg.NProcPerNode = 3
	var g0 *fakeGroup
	startedAtNotice := map[int]int{}
	rn := &racyNotify{ipMonitors: m, refuse: 2}
	rn.before = func(lr int) {
		h.ranks.mu.Lock()
		startedAtNotice[lr] = len(h.ranks.groups)
		h.ranks.mu.Unlock()
		if lr == 2 {
			g0.exit(0, 1, 0) // survivor 0, notified just before, ends
		}
	}
	h.monitors = rn
	out := h.start()
	g0 = h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	if len(g1.specs) != 1 || g1.specs[0].LocalRank != 1 {
		t.Fatalf("round 1 started %d ranks; want local rank 1", len(g1.specs))
	}
	if n := m.notice(t); n.LocalRank != 0 {
		t.Fatalf("notice %+v", n)
	}
	g2 := h.ranks.wait(t) // the cycle ended: a full restart
	if len(g2.specs) != 3 {
		t.Fatalf("after the races, %d ranks started; want a full restart of 3", len(g2.specs))
	}
	for lr, n := range startedAtNotice {
		if n != 2 {
			t.Errorf("local rank %d was notified when %d groups had started; want 2 (after the replacement)", lr, n)
		}
	}
	for lr := range 3 {
		g2.exit(lr, 0, 0)
	}
	if o := h.outcome(out); o.Kind != verdict.Succeeded || o.Cycles[1].InProcessFallback != "notice_failed" {
		t.Fatalf("outcome %+v; want success, the in-process cycle's fallback notice_failed", o)
	}
}

// TestInProcessSettleWindow: ranks that die together with the failed one
// are all replaced and none of them is kept as a survivor; the incident
// spends one restart. A second rank's exit comes within the settle window,
// or after it while its process is already ending (SIGKILLed, not reaped
// yet: the liveness check finds it). A rank that dies well after the
// window is a survivor that ended before its round (replaced too, spending
// nothing more).
func TestInProcessSettleWindow(t *testing.T) {
	for _, tc := range []struct {
		name    string
		ending  bool          // the second rank is ending when the first exit is seen
		after   time.Duration // its exit comes this long after the first's
		replace []int         // local ranks the in-process restart starts
	}{
		{"second exit within the window", false, 30 * time.Millisecond, []int{1, 2}},
		{"second rank ending, exit after the window", true, 400 * time.Millisecond, []int{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, 0, 1, 2)
			h.cfg.NProcPerNode = 3
			out := h.start()
			g0 := h.ranks.wait(t)
			if tc.ending {
				g0.mu.Lock()
				g0.ending = map[int]bool{2: true}
				g0.mu.Unlock()
			}
			g0.exit(1, 0, syscall.SIGKILL)
			time.AfterFunc(tc.after, func() { g0.exit(2, 0, syscall.SIGKILL) })
			g1 := h.ranks.wait(t)
			var started []int
			for _, sp := range g1.specs {
				started = append(started, sp.LocalRank)
			}
			if !slices.Equal(started, tc.replace) {
				t.Fatalf("the in-process restart started local ranks %v, want %v", started, tc.replace)
			}
			if n := m.notice(t); n.LocalRank != 0 {
				t.Fatalf("notice to local rank %d, want only the survivor 0", n.LocalRank)
			}
			m.noMoreNotices(t)
			m.rejoined(0, 1)
			g0.exit(0, 0, 0)
			g1.exit(1, 0, 0)
			g1.exit(2, 0, 0)
			wantOneInProcessRestart(t, h, out)
			kept := h.events(EventInProcessKept)
			if len(kept) != 1 || fmt.Sprint(kept[0]["survivors"]) != "[0]" || fmt.Sprint(kept[0]["failed"]) != "[1 2]" {
				t.Fatalf("inprocess_kept %v, want survivors [0], failed [1 2]", kept)
			}
			if fb := h.events(EventInProcessFallback); len(fb) != 0 {
				t.Fatalf("fallbacks %v", fb)
			}
			if got := h.metric(`ftlauncher_restarts_by_mode_total{mode="in-process"}`); got != 1 {
				t.Fatalf("in-process restarts metric %v, want 1", got)
			}
		})
	}
}

// TestInProcessAllDieTogether: both ranks of a node killed at once: no
// survivor is kept, one full restart.
func TestInProcessAllDieTogether(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 0, syscall.SIGKILL)
	time.AfterFunc(20*time.Millisecond, func() { g0.exit(0, 0, syscall.SIGKILL) })
	g1 := h.ranks.wait(t)
	if len(g1.specs) != 2 {
		t.Fatalf("restart started %d ranks, want both", len(g1.specs))
	}
	m.noMoreNotices(t)
	g1.exit(0, 0, 0)
	g1.exit(1, 0, 0)
	o := h.outcome(out)
	if o.Kind != verdict.Succeeded || len(o.Cycles) != 2 || o.Cycles[1].Mode != "full" {
		t.Fatalf("outcome %+v", o)
	}
	if n := len(h.events(EventInProcessKept)); n != 0 {
		t.Fatalf("%d inprocess_kept events, want none", n)
	}
	h.rdzv.mu.Lock()
	defer h.rdzv.mu.Unlock()
	if len(h.rdzv.fails) != 1 {
		t.Fatalf("fails %+v, want one", h.rdzv.fails)
	}
}

// TestInProcessStuckSurvivorReplaced: of two survivors, one opens its new
// session (it waits in init_process_group) and one never does (stuck). At
// the bound the stuck one is killed and replaced within the round, the
// bound starts again for the other, which then rejoins: no fallback, one
// restart for the incident.
func TestInProcessStuckSurvivorReplaced(t *testing.T) {
	h, m := ipHarness(t, 0, 1, 2)
	h.cfg.NProcPerNode = 3
	const bound = 2 * time.Second
	h.cfg.InProcessRejoinTimeout = bound
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	m.notice(t)
	m.notice(t)
	m.setCapable(2, false) // local rank 2 never opens its session of round 1
	g2 := h.ranks.wait(t)
	if len(g2.specs) != 1 || g2.specs[0].LocalRank != 2 {
		t.Fatalf("replacement started %v, want local rank 2", g2.specs)
	}
	// The stuck rank is killed once its replacement started.
	var sig []syscall.Signal
	var pid int
	var replaced bool
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		g0.mu.Lock()
		sig = slices.Clone(g0.signalled)
		g0.mu.Unlock()
		m.mu.Lock()
		pid, replaced = m.replace[2]
		m.mu.Unlock()
		if len(sig) > 0 && replaced {
			break
		}
	}
	if len(sig) != 1 || sig[0] != syscall.SIGKILL {
		t.Fatalf("survivors' group signals %v, want one SIGKILL (the stuck rank)", sig)
	}
	if !replaced || pid != 1002 {
		t.Fatalf("monitors told of replacement pid %d (%v), want 1002", pid, replaced)
	}
	// Past the first bound (the replacement came after it), inside the
	// second: the bound started again at the replacement.
	time.Sleep(bound / 2)
	m.rejoined(0, 1)
	g0.exit(0, 0, 0)
	g1.exit(1, 0, 0)
	g2.exit(2, 0, 0)
	wantOneInProcessRestart(t, h, out)
	rep := h.events(EventInProcessReplaced)
	if len(rep) != 1 || rep[0]["local_rank"] != float64(2) || rep[0]["why"] != "rejoin_timeout" {
		t.Fatalf("inprocess_replaced %v, want local rank 2 (rejoin_timeout)", rep)
	}
	if fb := h.events(EventInProcessFallback); len(fb) != 0 {
		t.Fatalf("fallbacks %v", fb)
	}
	if n := len(h.events(EventInProcessFirstStep)); n != 1 {
		t.Fatalf("%d first steps, want the healthy survivor's", n)
	}
}
