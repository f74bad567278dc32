package agent

// Agent-level tests (Run with fakes) of in-process restarts: the restart,
// its fallbacks to the full restart, what it records (verdict, metrics,
// ledger, events). inprocess_unit_test.go tests the unit without Run;
// the fakes are in inprocess_fakes_test.go.

import (
	"context"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestInProcessRestart: rank 1 crashes; rank 0 registered, so it is kept
// (never stopped), only rank 1 starts again, rank 0 gets the next round's
// notice with its rank, world size and store prefix; its reports complete
// the restart, and the verdict's cycle says in-process with its phases.
func TestInProcessRestart(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	if len(g1.specs) != 1 || g1.specs[0].LocalRank != 1 {
		t.Fatalf("in-process restart started %d ranks (%v); want only local rank 1", len(g1.specs), g1.specs)
	}
	n := m.notice(t)
	want := ftwire.Rejoin{Round: 1, Rank: 0, LocalRank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 29500,
		StorePrefix: "/worker/attempt_1", DeadlineS: 10}
	n.Reason = ""
	if n != want {
		t.Fatalf("notice %+v, want %+v", n, want)
	}
	if c := stoppedCount(g0); c != 0 {
		t.Fatalf("the survivors' group was stopped %d times before the restart", c)
	}
	m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "rejoined", TeardownS: 0.01, RejoinS: 0.02}}
	m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "first_step",
		TeardownS: 0.01, RejoinS: 0.02, RestoreS: 0.03, FirstStepS: 0.04}}
	g0.exit(0, 0, 0)
	g1.exit(1, 0, 0)
	o := h.outcome(out)
	if o.Kind != verdict.Succeeded {
		t.Fatalf("outcome %+v", o)
	}
	if len(h.rdzv.fails) != 1 || h.rdzv.fails[0].kind != policy.RankCrash {
		t.Fatalf("fails %+v", h.rdzv.fails)
	}
	if len(o.Cycles) != 2 || o.Cycles[0].Mode != "full" || o.Cycles[1].Mode != "in-process" {
		t.Fatalf("cycles %+v", o.Cycles)
	}
	ph := o.Cycles[1].InProcessMS
	for _, p := range []string{"notice", "teardown", "rejoin", "restore", "first_step", "total"} {
		if _, ok := ph[p]; !ok {
			t.Fatalf("in-process phases %v lack %q", ph, p)
		}
	}
	if ph["restore"] != 30 {
		t.Fatalf("restore phase %v ms, want 30", ph["restore"])
	}
	if got := h.metric(`ftlauncher_restarts_by_mode_total{mode="in-process"}`); got != 1 {
		t.Fatalf("in-process restarts metric %v", got)
	}
	rs := h.events(eventlog.Restart)
	if len(rs) != 1 || rs[0]["action"] != string(policy.RestartInProcess) || rs[0]["mode"] != string(policy.ModeInProcess) {
		t.Fatalf("restart events %v; want one with action %s, mode %s", rs, policy.RestartInProcess, policy.ModeInProcess)
	}
}

// TestInProcessFullRestart: the cases that restart every rank as today.
func TestInProcessFullRestart(t *testing.T) {
	tests := []struct {
		name    string
		mode    string
		capable []int
	}{
		{"a survivor did not register", configs.RestartInProcess, []int{1}},
		{"mode full", configs.RestartFull, []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, tc.capable...)
			h.cfg.RestartMode = tc.mode
			out := h.start()
			g0 := h.ranks.wait(t)
			g0.exit(1, 1, 0)
			g1 := h.ranks.wait(t)
			wantFullRestart(t, m, g0, g1)
			g1.exit(0, 0, 0)
			g1.exit(1, 0, 0)
			o := h.outcome(out)
			if o.Kind != verdict.Succeeded || o.Cycles[1].Mode != "full" {
				t.Fatalf("outcome %+v", o)
			}
			if got := h.metric(`ftlauncher_restarts_by_mode_total{mode="full"}`); got != 1 {
				t.Fatalf("full restarts metric %v", got)
			}
			rs := h.events(eventlog.Restart)
			if len(rs) != 1 || rs[0]["action"] != string(policy.RestartInPlace) || rs[0]["mode"] != string(policy.ModeFull) {
				t.Fatalf("restart events %v; want one with action %s, mode %s", rs, policy.RestartInPlace, policy.ModeFull)
			}
		})
	}
}

// TestInProcessRejoinTimeout: a survivor that does not rejoin within the
// bound is killed; its death is a failure during the in-process restart,
// so the job falls back to a full restart (counted).
func TestInProcessRejoinTimeout(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	h.cfg.InProcessRejoinTimeout = 200 * time.Millisecond
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	m.notice(t)
	// No report: the bound passes, rank 0 is killed, the cycle fails.
	g2 := h.ranks.wait(t)
	if len(g2.specs) != 2 {
		t.Fatalf("fallback started %d ranks; want a full restart of 2", len(g2.specs))
	}
	if stoppedCount(g1) != 1 {
		t.Fatalf("the replacement rank was not stopped for the full restart")
	}
	g0.mu.Lock()
	sig := g0.signalled
	g0.mu.Unlock()
	if len(sig) != 1 || sig[0] != syscall.SIGKILL {
		t.Fatalf("survivor signals %v, want one SIGKILL", sig)
	}
	g2.exit(0, 0, 0)
	g2.exit(1, 0, 0)
	o := h.outcome(out)
	if o.Kind != verdict.Succeeded || len(o.Cycles) != 3 || o.Cycles[2].Mode != "full" {
		t.Fatalf("outcome %+v", o)
	}
	if c := o.Cycles; c[1].Mode != "in-process" || c[1].InProcessFallback != "rejoin_timeout" || c[2].InProcessFallback != "" {
		t.Fatalf("cycles %+v; want the in-process cycle's fallback rejoin_timeout", c)
	}
	if got := h.metric(`ftlauncher_inprocess_fallbacks_total{why="rejoin_timeout"}`); got != 1 {
		t.Fatalf("fallback metric %v", got)
	}
	if len(h.rdzv.fails) != 2 {
		t.Fatalf("fails %+v: both restarts count against the budget", h.rdzv.fails)
	}
}

// TestInProcessFailureDuringRestart: a failure after the notice and
// before the survivor's first step makes the next restart a full one. The
// replacement rank crashes, or the survivor exits with code 0 before it
// rejoined (its training function had returned and it was finishing when
// the peer failed): it never will, so its exit is a failure during the
// in-process restart, not a rank done, and the job does not wait for it.
func TestInProcessFailureDuringRestart(t *testing.T) {
	for _, tc := range []struct {
		name       string
		survivor   bool   // the survivor exits 0; else the replacement crashes
		wantReason string // in the second failure's report
	}{
		{"the replacement crashes", false, "exited with code 1"},
		{"the survivor leaves cleanly", true, "exited with code 0 during the in-process restart"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, 0, 1)
			out := h.start()
			g0 := h.ranks.wait(t)
			g0.exit(1, 1, 0)
			g1 := h.ranks.wait(t)
			m.notice(t)
			stopped := g0 // the group the full restart stops: the survivor's
			if tc.survivor {
				g0.exit(0, 0, 0)
				stopped = g1
			} else {
				g1.exit(1, 1, 0)
			}
			g2 := h.ranks.wait(t)
			if len(g2.specs) != 2 {
				t.Fatalf("a failure during the in-process restart started %d ranks; want a full restart of 2", len(g2.specs))
			}
			if stoppedCount(stopped) != 1 {
				t.Fatal("the ranks left of the in-process round were not stopped for the full restart")
			}
			g2.exit(0, 0, 0)
			g2.exit(1, 0, 0)
			o := h.outcome(out)
			if o.Kind != verdict.Succeeded {
				t.Fatalf("outcome %+v", o)
			}
			if len(o.Cycles) != 3 || o.Cycles[1].InProcessFallback != "failure_during" || o.Cycles[0].InProcessFallback != "" {
				t.Fatalf("cycles %+v; want the in-process cycle's fallback failure_during", o.Cycles)
			}
			if got := h.metric(`ftlauncher_inprocess_fallbacks_total{why="failure_during"}`); got != 1 {
				t.Fatalf("fallback metric %v", got)
			}
			h.rdzv.mu.Lock()
			defer h.rdzv.mu.Unlock()
			if len(h.rdzv.fails) != 2 || !strings.Contains(h.rdzv.fails[1].reason, tc.wantReason) {
				t.Fatalf("fails %+v; want the second failure reported with %q", h.rdzv.fails, tc.wantReason)
			}
		})
	}
}

// TestInProcessLedgerRestarts: a job with an in-process restart and then a
// full one (the replacement crashed before the survivor's first step) ends
// with one Active lease that counts both, written with the lease's end:
// the store gets no write per restart.
func TestInProcessLedgerRestarts(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	h.store = newMemStore()
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	m.notice(t)
	if recs := h.store.all(); len(recs) != 1 || recs[0].Restarts != nil {
		t.Fatalf("store after the in-process restart %+v: the count waits for the lease's next write", recs)
	}
	// The survivor completes the restart; then it no longer registers, so
	// the next failure restarts fully.
	m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "rejoined", TeardownS: 0.01, RejoinS: 0.02}}
	m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "first_step",
		TeardownS: 0.01, RejoinS: 0.02, RestoreS: 0.03, FirstStepS: 0.04}}
	m.mu.Lock()
	m.capable[0] = false
	m.mu.Unlock()
	g1.exit(1, 1, 0)
	g2 := h.ranks.wait(t)
	g2.exit(0, 0, 0)
	g2.exit(1, 0, 0)
	o := h.outcome(out)
	if o.Kind != verdict.Succeeded || len(o.Cycles) != 3 || o.Cycles[1].Mode != "in-process" || o.Cycles[2].Mode != "full" {
		t.Fatalf("outcome %+v", o)
	}
	want := map[string]int{"in-process": 1, "full": 1}
	recs := h.store.all()
	if len(recs) != 1 || recs[0].Role != ledger.Active || recs[0].Reason != ledger.JobSucceeded || !maps.Equal(recs[0].Restarts, want) {
		t.Fatalf("stored ledger %+v; want one Active lease ended JobSucceeded with restarts %v", recs, want)
	}
	if len(o.Ledger) != 1 || !maps.Equal(o.Ledger[0].Restarts, want) {
		t.Fatalf("verdict ledger %+v", o.Ledger)
	}
	// The lease keeps the in-process restart's phases (the longest of
	// each over the lease).
	ph := recs[0].InProcessMaxMS
	if ph["restore"] != 30 || ph["first_step"] != 40 || ph["total"] <= 0 || len(ph) != 6 {
		t.Fatalf("stored lease's in-process phases %v", ph)
	}
	if !maps.Equal(o.Ledger[0].InProcessMaxMS, ph) {
		t.Fatalf("verdict ledger phases %v, stored %v", o.Ledger[0].InProcessMaxMS, ph)
	}
}

// TestInProcessPeerRoundEnd: another node's failure ends the round; this
// node's ranks all registered, so they all stay and get notices, and no
// rank starts.
func TestInProcessPeerRoundEnd(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	out := h.start()
	g0 := h.ranks.wait(t)
	h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Reason: "a rank of node b failed", Cause: policy.RankCrash})
	got := map[int]ftwire.Rejoin{}
	for range 2 {
		n := m.notice(t)
		got[n.LocalRank] = n
	}
	if got[0].Rank != 0 || got[1].Rank != 1 || got[1].Round != 1 {
		t.Fatalf("notices %+v", got)
	}
	select {
	case g := <-h.ranks.started:
		t.Fatalf("ranks %v started though every rank stayed", g.specs)
	case <-time.After(200 * time.Millisecond):
	}
	if stoppedCount(g0) != 0 {
		t.Fatal("survivors stopped")
	}
	// The job closes: the kept ranks are stopped, nothing is left behind.
	h.rdzv.endRound(1, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 1, Code: 1, Close: verdict.FatalError, Reason: "closed"})
	o := h.outcome(out)
	if o.ExitCode() == 0 || stoppedCount(g0) != 1 {
		t.Fatalf("outcome %+v, survivors stopped %d times", o, stoppedCount(g0))
	}
}

// TestInProcessBudget: an in-process restart goes through the same
// budget: when the rendezvous closes the job instead, the kept survivors
// are stopped and nothing is left behind.
func TestInProcessBudget(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	h.rdzv.fail = func(_ context.Context, c failCall) (rendezvous.Decision, error) {
		return rendezvous.Decision{Close: verdict.RestartBudgetExhausted, Code: 1, Reason: "budget spent", RestartsUsed: 3}, nil
	}
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	o := h.outcome(out)
	if o.Kind != verdict.RestartBudgetExhausted || stoppedCount(g0) != 1 {
		t.Fatalf("outcome %+v, survivors stopped %d times", o, stoppedCount(g0))
	}
	select {
	case n := <-m.notices:
		t.Fatalf("notice %+v after a close", n)
	default:
	}
}

// TestInProcessHangSilentSurvivor: a hang restarts in process only when
// every survivor heartbeated clearly after the hung rank's last heartbeat
// (its monitor's Hang.LastHeartbeat); a survivor that did not means the
// full restart, at once, with one restart spent. TestSilentSurvivor
// (inprocess_unit_test.go) has every case of "clearly after".
func TestInProcessHangSilentSurvivor(t *testing.T) {
	hungAt := time.Now().Add(-3 * time.Second)
	tests := []struct {
		name      string
		silence   map[int]monitor.Silence
		inProcess bool
	}{
		// The hung rank's last heartbeat: hungAt (Hang.LastHeartbeat).
		{"survivor heartbeated after the hung rank stopped", map[int]monitor.Silence{0: {Last: hungAt.Add(time.Second), Timeout: 3 * time.Second, MaxInterval: 300 * time.Millisecond}}, true},
		{"survivor without a monitor session", nil, false},
		{"survivor stopped with it (a collective)", map[int]monitor.Silence{0: {Last: hungAt.Add(5 * time.Millisecond), Timeout: 3 * time.Second, MaxInterval: 300 * time.Millisecond}}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, 0, 1)
			m.silence = tc.silence
			out := h.start()
			g0 := h.ranks.wait(t)
			m.fakeMonitors.mu.Lock()
			m.fired[1] = true
			m.fakeMonitors.mu.Unlock()
			g0.exit(1, 0, syscall.SIGKILL)
			hang := monitor.Hang{Cycle: 0, LocalRank: 1, GlobalRank: 1, Kind: "heartbeat", Timeout: 3 * time.Second,
				Elapsed: 3 * time.Second, ExpiredAt: hungAt.Add(3 * time.Second), LastHeartbeat: hungAt, Signal: syscall.SIGKILL}
			m.fakeMonitors.mu.Lock()
			m.hang = &hang
			m.fakeMonitors.mu.Unlock()
			m.hangs <- hang
			g1 := h.ranks.wait(t)
			if tc.inProcess {
				if len(g1.specs) != 1 || g1.specs[0].LocalRank != 1 || stoppedCount(g0) != 0 {
					t.Fatalf("started %d ranks, survivors stopped %d times; want only local rank 1, survivor kept",
						len(g1.specs), stoppedCount(g0))
				}
				m.notice(t)
				m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "rejoined"}}
				m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "first_step"}}
				g0.exit(0, 0, 0)
				g1.exit(1, 0, 0)
			} else {
				wantFullRestart(t, m, g0, g1)
				g1.exit(0, 0, 0)
				g1.exit(1, 0, 0)
			}
			o := h.outcome(out)
			mode := string(map[bool]policy.Mode{true: policy.ModeInProcess, false: policy.ModeFull}[tc.inProcess])
			if o.Kind != verdict.Succeeded || len(o.Cycles) != 2 || o.Cycles[0].End != "hang" || o.Cycles[1].Mode != mode {
				t.Fatalf("outcome %+v; want a hang, then a %s cycle", o, mode)
			}
			if len(h.rdzv.fails) != 1 || h.rdzv.fails[0].kind != policy.RankHang {
				t.Fatalf("fails %+v: one hang, one restart spent", h.rdzv.fails)
			}
			if got := h.metric(`ftlauncher_inprocess_fallbacks_total{why="rejoin_timeout"}`); got != 0 {
				t.Fatalf("rejoin_timeout fallbacks %v", got)
			}
		})
	}
}

// TestInProcessPeerHang: another node's rank hung. This node knows only
// when the round ended; it takes the hung rank's last heartbeat as that
// moment less its ranks' heartbeat timeout: ranks that heartbeated clearly
// after it stay, ranks silent since about then (blocked in a collective
// with the hung rank) restart fully.
func TestInProcessPeerHang(t *testing.T) {
	for _, tc := range []struct {
		name      string
		silentFor time.Duration // before the round's end, of a 3 s timeout
		inProcess bool
	}{
		{"ranks heartbeating", 100 * time.Millisecond, true},
		{"ranks silent since the hung rank stopped", 2990 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, 0, 1)
			last := time.Now().Add(-tc.silentFor)
			m.silence = map[int]monitor.Silence{}
			for lr := range 2 {
				m.silence[lr] = monitor.Silence{Last: last, Timeout: 3 * time.Second, MaxInterval: 200 * time.Millisecond}
			}
			out := h.start()
			g0 := h.ranks.wait(t)
			h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Reason: "a rank of node b hung", Cause: policy.RankHang})
			if tc.inProcess {
				for range 2 {
					m.notice(t)
				}
				if stoppedCount(g0) != 0 {
					t.Fatal("survivors stopped")
				}
			} else {
				wantFullRestart(t, m, g0, h.ranks.wait(t))
			}
			h.rdzv.endRound(1, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 1, Code: 1, Close: verdict.FatalError, Reason: "closed"})
			o := h.outcome(out)
			mode := string(map[bool]policy.Mode{true: policy.ModeInProcess, false: policy.ModeFull}[tc.inProcess])
			if len(o.Cycles) != 2 || o.Cycles[1].Mode != mode {
				t.Fatalf("cycles %+v; want the second %s", o.Cycles, mode)
			}
		})
	}
}

// TestInProcessFreshRoundEscalates: a node whose ranks all started afresh
// in a restarted round (here after a full restart; a promoted spare is
// alike) treats a failure before each of its ranks reported its first step
// of the round as a failure during the job's restart: a full restart, as
// on the nodes whose survivors have not stepped either. Once its ranks
// stepped, a failure restarts in process again.
func TestInProcessFreshRoundEscalates(t *testing.T) {
	h, m := ipHarness(t, 1) // rank 0 not registered: round 0's failure restarts fully
	h.rdzv.next = append(h.rdzv.next, active(3, 3))
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	wantFullRestart(t, m, g0, g1)
	m.mu.Lock()
	m.capable[0] = true
	m.mu.Unlock()
	g1.exit(1, 1, 0) // round 1, before the first step
	g2 := h.ranks.wait(t)
	wantFullRestart(t, m, g1, g2)
	fb := h.events(EventInProcessFallback)
	if len(fb) != 1 || fb[0]["why"] != "failure_during" {
		t.Fatalf("fallback events %v; want one failure_during", fb)
	}
	for lr := range 2 { // round 2: both ranks stepped
		m.reports <- monitor.InProcessReport{LocalRank: lr, InProcessReport: ftwire.InProcessReport{Round: 2, Phase: "first_step"}}
	}
	g2.exit(1, 1, 0)
	g3 := h.ranks.wait(t)
	if len(g3.specs) != 1 || g3.specs[0].LocalRank != 1 {
		t.Fatalf("after the ranks stepped, the restart started %d ranks; want only local rank 1 (in process)", len(g3.specs))
	}
	if n := m.notice(t); n.Round != 3 || n.LocalRank != 0 {
		t.Fatalf("notice %+v", n)
	}
	h.rdzv.endRound(3, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 3, Code: 1, Close: verdict.FatalError, Reason: "closed"})
	h.outcome(out)
}

// TestInProcessNoAPIRecordsNothing: under --restart-mode in-process, ranks
// that do not use the API (never register, never report a step) restart
// fully as under full, and nothing in-process is recorded, in any round.
func TestInProcessNoAPIRecordsNothing(t *testing.T) {
	h, m := ipHarness(t) // nobody registered
	out := h.start()
	g0 := h.ranks.wait(t)
	g0.exit(1, 1, 0)
	g1 := h.ranks.wait(t)
	wantFullRestart(t, m, g0, g1)
	g1.exit(1, 1, 0)
	g2 := h.ranks.wait(t)
	wantFullRestart(t, m, g1, g2)
	h.rdzv.endRound(2, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 2, Code: 1, Reason: "closed"})
	o := h.outcome(out)
	if fb := h.events(EventInProcessFallback); len(fb) != 0 {
		t.Fatalf("in-process fallbacks %v recorded for ranks that never used the API", fb)
	}
	for i, c := range o.Cycles {
		if c.Mode != "full" || c.InProcessFallback != "" {
			t.Fatalf("cycle %d: mode %q, fallback %q", i, c.Mode, c.InProcessFallback)
		}
	}
}

// TestReportsReadInFullMode: ranks that use the API report a fresh rank's
// first step under --restart-mode full too; the agent reads them, so the
// monitor's channel never fills.
func TestReportsReadInFullMode(t *testing.T) {
	h, m := ipHarness(t, 0, 1)
	h.cfg.RestartMode = configs.RestartFull
	out := h.start()
	g0 := h.ranks.wait(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 { // each send waits for the agent to read it
			m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 0, Phase: "first_step"}}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the reports were not read in full mode")
	}
	g0.exit(0, 0, 0)
	g0.exit(1, 0, 0)
	if o := h.outcome(out); o.Kind != verdict.Succeeded {
		t.Fatalf("outcome %+v", o)
	}
}
