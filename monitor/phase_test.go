package monitor

import (
	"testing"
	"time"
)

func TestPhaseTransitions(t *testing.T) {
	const (
		idle = phaseIdle
		wait = phaseWaiting
		init = phaseInitial
		hb   = phaseHeartbeating
		hung = phaseHung
		end  = phaseEnded
	)
	// legal[from] is every phase reachable from it in one step.
	legal := map[rankPhase][]rankPhase{
		idle: {idle, wait},
		wait: {wait, init, end},
		init: {init, wait, hb, hung, end},
		hb:   {hb, wait, init, hung, end},
		hung: {hung, end},
		end:  {end, idle, wait},
	}
	all := []rankPhase{idle, wait, init, hb, hung, end}
	for _, from := range all {
		for _, to := range all {
			want := false
			for _, p := range legal[from] {
				want = want || p == to
			}
			if got := phaseTransitionOK(from, to); got != want {
				t.Errorf("%v -> %v: legal %v, want %v", from, to, got, want)
			}
		}
	}
	if phaseTransitionOK(rankPhase(99), idle) || phaseTransitionOK(idle, rankPhase(99)) {
		t.Error("an unknown phase is reachable")
	}
}

func TestPhaseString(t *testing.T) {
	tests := []struct {
		p    rankPhase
		want string
	}{
		{phaseIdle, "idle"},
		{phaseWaiting, "waiting-for-session"},
		{phaseInitial, "initial-heartbeat-pending"},
		{phaseHeartbeating, "heartbeating"},
		{phaseHung, "hung"},
		{phaseEnded, "ended"},
		{rankPhase(42), "phase(42)"},
	}
	for _, tc := range tests {
		if got := tc.p.String(); got != tc.want {
			t.Errorf("%d: %q, want %q", tc.p, got, tc.want)
		}
	}
}

// TestRankPhaseLifecycle drives one rank monitor through a cycle without
// sockets and checks the phase after each event.
func TestRankPhaseLifecycle(t *testing.T) {
	m := newManager(t, 1, nil, "")
	r := m.ranks[0]
	step := func(what string, want rankPhase, f func()) {
		t.Helper()
		f()
		if got := r.loadPhase(); got != want {
			t.Fatalf("after %s: phase %v, want %v", what, got, want)
		}
	}
	step("manager start", phaseIdle, func() {})
	step("begin", phaseWaiting, func() { r.begin(1, noSuchPID, Timeouts{InitialHeartbeat: time.Hour, Heartbeat: time.Hour}, 0, false) })
	gen := r.gen.Load()
	step("init", phaseInitial, func() { r.init(gen, initInfo{globalRank: 3}) })
	step("heartbeat", phaseHeartbeating, func() { r.heartbeat(gen) })
	step("section open", phaseHeartbeating, func() { r.openSection(gen, "step", nil, m.mono()) })
	step("disconnect", phaseWaiting, func() { r.disconnect(gen) })
	gen = r.gen.Load()
	step("stale init", phaseWaiting, func() { r.init(gen-1, initInfo{}) })
	step("re-init", phaseInitial, func() { r.init(gen, initInfo{}) })
	step("end", phaseEnded, func() { r.end() })
	step("heartbeat after the end", phaseEnded, func() { r.heartbeat(gen) })
	step("begin without a process", phaseIdle, func() { r.begin(2, 0, Timeouts{}, 0, false) })
	step("end of an idle rank", phaseIdle, func() { r.end() })
}

// TestRankPhaseHungIsSticky: once a hang fired, neither a disconnect nor a
// new session makes the rank evaluated again in that cycle.
func TestRankPhaseHungIsSticky(t *testing.T) {
	m := newManager(t, 1, nil, "")
	r := m.ranks[0]
	r.begin(1, noSuchPID, Timeouts{InitialHeartbeat: time.Millisecond}, 0, false)
	gen := r.gen.Load()
	r.init(gen, initInfo{})
	select {
	case h := <-m.Hangs():
		if h.Kind != KindInitialHeartbeat {
			t.Errorf("hang %+v", h)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no hang")
	}
	for _, ev := range []struct {
		what string
		f    func()
	}{
		{"hung", func() {}},
		{"heartbeat", func() { r.heartbeat(gen) }},
		{"disconnect", func() { r.disconnect(gen) }},
		{"new session", func() { r.init(r.gen.Load(), initInfo{}) }},
	} {
		ev.f()
		if got := r.loadPhase(); got != phaseHung {
			t.Fatalf("after %s: phase %v, want hung", ev.what, got)
		}
	}
	if _, ok := m.FiredHang(1, 0); !ok {
		t.Error("FiredHang lost the hang")
	}
	r.end()
	if got := r.loadPhase(); got != phaseEnded {
		t.Errorf("after end: %v", got)
	}
	if _, ok := m.FiredHang(1, 0); !ok {
		t.Error("FiredHang forgot the hang when the cycle ended")
	}
	r.begin(2, noSuchPID, Timeouts{}, 0, false)
	if _, ok := m.FiredHang(2, 0); ok || r.loadPhase() != phaseWaiting {
		t.Errorf("next cycle: phase %v, fired hang carried over %v", r.loadPhase(), ok)
	}
}
