package agent

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestInProcessTransitionTable checks the in-process states' rows and
// columns of the transition table (TestTransitionTable checks the rest).
func TestInProcessTransitionTable(t *testing.T) {
	states := []State{StateJoining, StateStandby, StateRunning, StateRejoining, StateKeeping, StateStopping,
		StateDeciding, StateEscalating, StateDone}
	legal := map[[2]State]bool{
		{StateJoining, StateRejoining}:  true,
		{StateRunning, StateKeeping}:    true,
		{StateRejoining, StateStopping}: true, {StateRejoining, StateKeeping}: true, {StateRejoining, StateDone}: true,
		{StateKeeping, StateDeciding}: true, {StateKeeping, StateStopping}: true,
	}
	for _, from := range states {
		for _, to := range states {
			if from != StateKeeping && from != StateRejoining && to != StateKeeping && to != StateRejoining {
				continue
			}
			if got := transitionOK(from, to); got != legal[[2]State{from, to}] {
				t.Errorf("transitionOK(%s, %s) = %v", from, to, got)
			}
		}
	}
	for _, s := range []State{StateKeeping, StateRejoining} {
		if s.String() != map[State]string{StateKeeping: "keeping", StateRejoining: "rejoining"}[s] {
			t.Errorf("state %d is named %q", s, s)
		}
	}
}

// stateTrace is a log handler that keeps the agent's state transitions.
type stateTrace struct {
	mu    sync.Mutex
	moves []string // "from>to"
}

func (s *stateTrace) Enabled(context.Context, slog.Level) bool { return true }
func (s *stateTrace) WithAttrs([]slog.Attr) slog.Handler       { return s }
func (s *stateTrace) WithGroup(string) slog.Handler            { return s }
func (s *stateTrace) Handle(_ context.Context, r slog.Record) error {
	if r.Message != "agent state" {
		return nil
	}
	var from, to string
	r.Attrs(func(a slog.Attr) bool {
		switch a.Key {
		case "from":
			from = a.Value.String()
		case "to":
			to = a.Value.String()
		}
		return true
	})
	s.mu.Lock()
	s.moves = append(s.moves, from+">"+to)
	s.mu.Unlock()
	return nil
}

func (s *stateTrace) path() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.moves)
}

// TestInProcessStates: the in-process restart is visible in the states a
// node passes: a crash with a registered survivor goes running → keeping
// → deciding (the survivor stays) and the next round is rejoining; a
// crash whose survivor did not register goes keeping → stopping and the
// next round is running.
func TestInProcessStates(t *testing.T) {
	tests := []struct {
		name    string
		capable []int
		kept    bool
		want    []string
	}{
		{"the survivor stays", []int{0, 1}, true, []string{"joining>running", "running>keeping", "keeping>deciding",
			"deciding>joining", "joining>rejoining", "rejoining>stopping", "stopping>deciding", "deciding>done"}},
		{"the survivor did not register: every rank stops", []int{1}, false, []string{"joining>running", "running>keeping",
			"keeping>stopping", "stopping>deciding", "deciding>joining", "joining>running", "running>stopping",
			"stopping>deciding", "deciding>done"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, m := ipHarness(t, tc.capable...)
			trace := &stateTrace{}
			h.logHandler = trace
			out := h.start()
			g0 := h.ranks.wait(t)
			g0.exit(1, 1, 0)
			g1 := h.ranks.wait(t)
			if tc.kept {
				m.notice(t)
				m.reports <- monitor.InProcessReport{LocalRank: 0, InProcessReport: ftwire.InProcessReport{Round: 1, Phase: "first_step"}}
				g0.exit(0, 0, 0)
			} else {
				wantFullRestart(t, m, g0, g1)
				g1.exit(0, 0, 0)
			}
			g1.exit(1, 0, 0)
			if o := h.outcome(out); o.Kind != verdict.Succeeded {
				t.Fatalf("outcome %+v", o)
			}
			if got := trace.path(); !slices.Equal(got, tc.want) {
				t.Fatalf("states %v\nwant   %v", got, tc.want)
			}
		})
	}
}
