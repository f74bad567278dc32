package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestTransitionTable checks transitionOK against the documented table for
// every pair of states.
func TestTransitionTable(t *testing.T) {
	states := []State{StateJoining, StateStandby, StateRunning, StateStopping, StateDeciding, StateEscalating, StateDone}
	legal := map[[2]State]bool{
		{StateJoining, StateStandby}: true, {StateJoining, StateRunning}: true, {StateJoining, StateDone}: true,
		{StateStandby, StateJoining}: true, {StateStandby, StateDone}: true,
		{StateRunning, StateStopping}: true, {StateRunning, StateDone}: true,
		{StateStopping, StateDeciding}: true,
		{StateDeciding, StateJoining}:  true, {StateDeciding, StateEscalating}: true, {StateDeciding, StateDone}: true,
		{StateEscalating, StateDone}: true,
	}
	for _, from := range states {
		for _, to := range states {
			if got := transitionOK(from, to); got != legal[[2]State{from, to}] {
				t.Errorf("transitionOK(%s, %s) = %v", from, to, got)
			}
		}
		if strings.HasPrefix(from.String(), "state(") {
			t.Errorf("state %d has no name", from)
		}
	}
}

// TestRun drives the agent through every transition with fakes; each case
// scripts the rendezvous and acts on the ranks, then checks the outcome.
// runCase is one scenario of TestRun.
type runCase struct {
	name  string
	setup func(h *harness)
	act   func(h *harness)
	check func(t *testing.T, h *harness, o Outcome)
}

func TestRun(t *testing.T) {
	lost := errors.New("etcd at http://127.0.0.9:2379 unreachable for more than 2s")
	tests := []runCase{
		{
			name:  "joining-running-stopping-deciding-done: success",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if o.Finished() || o.FinishedFlag.Path != "" {
					t.Errorf("finished without a flag: %+v", o.FinishedFlag)
				}
				if len(o.Cycles) != 1 || o.Cycles[0].End != "success" {
					t.Errorf("cycles %+v", o.Cycles)
				}
			},
		},
		{
			name: "success with the finished flag",
			setup: func(h *harness) {
				flag := filepath.Join(h.t.TempDir(), "finished")
				if err := os.WriteFile(flag, nil, 0o644); err != nil {
					h.t.Fatal(err)
				}
				h.env = []string{"FAULT_TOL_FINISHED_FLAG_FILE=" + flag}
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if !o.Finished() || !o.Verdict("job", "n", "h").Finished {
					t.Errorf("finished flag not seen: %+v", o.FinishedFlag)
				}
			},
		},
		{
			name:  "joining-standby-joining-running: a parked node runs in a later round",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, standbyIn(0), active(1, 0)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if o.LastRound != 1 || h.rdzv.nexts != 2 {
					t.Errorf("last round %d, Next called %d times", o.LastRound, h.rdzv.nexts)
				}
			},
		},
		{
			name: "standby-done: the job closed while parked (same kind and code as the others)",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, standbyIn(0),
					nextErr(&rendezvous.JobClosedError{Kind: verdict.RestartBudgetExhausted, Code: 1, Reason: "budget"}))
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.RestartBudgetExhausted, 1) },
		},
		{
			name: "joining-done: job closed with no-restart",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, nextErr(&rendezvous.JobClosedError{Kind: verdict.NoRestart, Code: 93, Reason: "stop"}))
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.NoRestart, 93) },
		},
		{
			name: "joining-done: a close record without a kind is read from its code",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, nextErr(&rendezvous.JobClosedError{Code: 93, Reason: "old launcher"}))
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.NoRestart, 93) },
		},
		{
			name: "joining-done: rendezvous lost",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, nextErr(fmt.Errorf("%w: %v", rendezvous.ErrRendezvousLost, lost)))
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.RendezvousLost, 1)
				if !strings.Contains(o.Reason, "127.0.0.9:2379") {
					t.Errorf("reason does not name the endpoint: %q", o.Reason)
				}
			},
		},
		{
			name: "joining-done: round did not close",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, nextErr(fmt.Errorf("%w: need 2 nodes", rendezvous.ErrJoinTimeout)))
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.NotEnoughNodes, 1) },
		},
		{
			name: "joining-done: health check failed quarantines this node",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, nextErr(fmt.Errorf("%w: gpu 3", rendezvous.ErrHealthCheck)))
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceHealthCheck)
			},
		},
		{
			// Not the job's kind (nor rendezvous_lost) but node_replaced,
			// with the job's code.
			name: "joining-done: a node replaced by a spare parks until the job ends: node_replaced with the job's code",
			setup: func(h *harness) {
				q := &rendezvous.QuarantineError{Addr: "10.0.0.1", Cause: policy.NodeLost, Reason: "node 10.0.0.1/42 lost (gossip)", Round: 3}
				h.rdzv.next = append(h.rdzv.next, nextErr(fmt.Errorf("rendezvous: %w", &rendezvous.JobClosedError{
					Kind: verdict.Succeeded, Code: 0, Reason: "all nodes succeeded", Quarantine: q})))
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeReplaced, 0)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceLost)
				if !strings.Contains(o.Quarantined[0].Detail, "cannot become active again") || !strings.Contains(o.Reason, "replaced by a spare in round 3") {
					t.Errorf("quarantine detail %q, reason %q", o.Quarantined[0].Detail, o.Reason)
				}
			},
		},
		{
			name: "joining-done: a replaced node takes the job's code when the job failed",
			setup: func(h *harness) {
				q := &rendezvous.QuarantineError{Addr: "10.0.0.1", Cause: policy.NodeLost, Reason: "node 10.0.0.1/42 lost (gossip, lease expired)", Round: 0}
				h.rdzv.next = append(h.rdzv.next, nextErr(fmt.Errorf("rendezvous: %w", &rendezvous.JobClosedError{
					Kind: verdict.RestartBudgetExhausted, Code: 1, Reason: "restart budget exhausted", Quarantine: q})))
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.NodeReplaced, 1) },
		},
		{
			name:  "running-stopping-deciding-joining: a fence kills the ranks at once and reports a stopped node",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 0)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndFenced, Round: 0, Node: "10.0.0.1/42",
					Reason: "fenced: this node's lease could not be renewed", Cause: policy.NodeStopped})
				g2 := h.ranks.wait(h.t)
				g.mu.Lock()
				stopped := append([]syscall.Signal(nil), g.stopped...)
				g.mu.Unlock()
				if len(stopped) != 1 || stopped[0] != syscall.SIGKILL {
					h.t.Errorf("fenced ranks stopped with %v, want SIGKILL at once", stopped)
				}
				g2.exit(0, 0, 0)
				g2.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(o.Quarantined) != 0 {
					t.Errorf("quarantined %+v after a fence: want none", o.Quarantined)
				}
				if len(h.rdzv.fails) != 1 || h.rdzv.fails[0].kind != policy.NodeStopped || h.rdzv.fails[0].round != 0 {
					t.Errorf("fails %+v: want one node_stopped report for round 0", h.rdzv.fails)
				}
				if o.Cycles[0].End != "fenced" {
					t.Errorf("cycle 0 end %q, want fenced", o.Cycles[0].End)
				}
				if evs := h.events(eventlog.Fenced); len(evs) != 1 || evs[0]["ranks_stopped_at"] == nil {
					t.Errorf("fenced events %v: want one with ranks_stopped_at", evs)
				}
			},
		},
		{
			name: "joining-done: a signal while waiting for a round",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, func(ctx context.Context) (rendezvous.Assignment, error) {
					return rendezvous.Assignment{}, blockUntilDone(ctx)
				})
			},
			act: func(h *harness) { h.sigs <- syscall.SIGTERM },
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				if o.Signal != syscall.SIGTERM {
					t.Errorf("signal %v", o.Signal)
				}
			},
		},
		{
			name: "running-done: ranks cannot start; the job is closed for every node",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.ranks.startErr = errors.New("exec format error")
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.FatalError, 1)
				if len(h.rdzv.shutdowns) != 1 || h.rdzv.shutdowns[0].kind != verdict.FatalError {
					t.Errorf("shutdowns %+v", h.rdzv.shutdowns)
				}
			},
		},
		{
			name:  "deciding-joining: a rank crash restarts, then success",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(1, 3, 0)
				g = h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.fails) != 1 || h.rdzv.fails[0].kind != policy.RankCrash || !strings.Contains(h.rdzv.fails[0].reason, "exited with code 3") {
					t.Errorf("fails %+v", h.rdzv.fails)
				}
				if o.RestartsUsed != 1 || len(o.Cycles) != 2 || o.Cycles[0].End != "rank_failure" {
					t.Errorf("restarts %d cycles %+v", o.RestartsUsed, o.Cycles)
				}
				if g := h.ranks.groups[0]; len(g.stopped) != 1 || g.stopped[0] != syscall.SIGTERM {
					t.Errorf("first cycle stopped with %v", g.stopped)
				}
				for name, want := range map[string]float64{"ftlauncher_restarts_total": 1,
					`ftlauncher_rank_exits_total{result="failure"}`: 2, // the crash, then its peer stopped by SIGTERM
					`ftlauncher_rank_exits_total{result="success"}`: 2} {
					if got := h.metric(name); got != want {
						t.Errorf("%s = %v, want %v", name, got, want)
					}
				}
			},
		},
		{
			name:  "hang: a rank killed by its monitor is reported as a hang",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.mons.mu.Lock()
				h.mons.fired[0] = true
				h.mons.mu.Unlock()
				g.exit(0, 0, syscall.SIGKILL)
				h.mons.hangs <- monitor.Hang{Cycle: 0, LocalRank: 0, GlobalRank: 0, Kind: "section", Section: "step",
					Timeout: time.Second, Elapsed: time.Second, Signal: syscall.SIGKILL}
				g = h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.fails) != 1 || h.rdzv.fails[0].kind != policy.RankHang || !strings.Contains(h.rdzv.fails[0].reason, "section 'step'") {
					t.Errorf("fails %+v", h.rdzv.fails)
				}
				if o.Cycles[0].End != "hang" {
					t.Errorf("cycle end %q", o.Cycles[0].End)
				}
				if got := h.metric(`ftlauncher_hang_kills_total{timeout_kind="section"}`); got != 1 {
					t.Errorf("hang kills %v", got)
				}
			},
		},
		{
			name: "deciding-done: restart budget exhausted",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 3))
				h.rdzv.fail = func(context.Context, failCall) (rendezvous.Decision, error) {
					return rendezvous.Decision{Action: policy.CloseJob, Close: verdict.RestartBudgetExhausted, Code: 1,
						Reason: "restart budget exhausted (3 of 3 restarts used)", RestartsUsed: 3}, nil
				}
			},
			act: func(h *harness) { h.ranks.wait(h.t).exit(0, 1, 0) },
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.RestartBudgetExhausted, 1)
				if o.RestartsUsed != 3 {
					t.Errorf("restarts used %d", o.RestartsUsed)
				}
				if len(h.rdzv.departs) != 0 {
					t.Errorf("a failed job departed: %q", h.rdzv.departs)
				}
			},
		},
		{
			name: "deciding-done: the rendezvous is lost while reporting a failure",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.rdzv.fail = func(context.Context, failCall) (rendezvous.Decision, error) {
					return rendezvous.Decision{}, fmt.Errorf("end round 0: %w", rendezvous.ErrRendezvousLost)
				}
			},
			act:   func(h *harness) { h.ranks.wait(h.t).exit(0, 1, 0) },
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.RendezvousLost, 1) },
		},
		{
			name: "deciding-done: a report the rendezvous never answers is bounded",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.callTimeout = 300 * time.Millisecond
				h.rdzv.fail = func(ctx context.Context, _ failCall) (rendezvous.Decision, error) {
					return rendezvous.Decision{}, blockUntilDone(ctx)
				}
			},
			act:   func(h *harness) { h.ranks.wait(h.t).exit(0, 1, 0) },
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.RendezvousLost, 1) },
		},
		{
			name: "deciding-done: a signal while a report is blocked",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.rdzv.fail = func(ctx context.Context, _ failCall) (rendezvous.Decision, error) {
					return rendezvous.Decision{}, blockUntilDone(ctx)
				}
			},
			act: func(h *harness) {
				h.ranks.wait(h.t).exit(0, 1, 0)
				waitFor(h.t, func() bool { h.rdzv.mu.Lock(); defer h.rdzv.mu.Unlock(); return len(h.rdzv.fails) == 1 })
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.Signaled, 1) },
		},
		{
			name: "deciding-joining: another node failed the round after ours succeeded",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1))
				calls := 0
				h.rdzv.succeed = func(context.Context, int) (int, error) {
					calls++
					if calls == 1 {
						return 1, rendezvous.ErrRoundRestarted
					}
					return 0, nil
				}
			},
			act: func(h *harness) {
				for i := 0; i < 2; i++ {
					g := h.ranks.wait(h.t)
					g.exit(0, 0, 0)
					g.exit(1, 0, 0)
				}
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if o.LastRound != 1 {
					t.Errorf("last round %d", o.LastRound)
				}
			},
		},
		{
			name: "deciding-done: another node's ranks failed",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.rdzv.succeed = func(context.Context, int) (int, error) { return 1, nil }
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.FatalError, 1) },
		},
		{
			name:  "round ended by a lost node: restart, the node is quarantined",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 0)) },
			act: func(h *harness) {
				h.ranks.wait(h.t)
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Node: "10.0.0.2/7",
					Reason: "node 10.0.0.2/7 lost (gossip)", Cause: policy.NodeLost})
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				wantQuarantine(t, o, "10.0.0.2/7", verdict.EvidenceLost)
				if len(h.rdzv.fails) != 0 || o.Cycles[0].End != "round_ended" {
					t.Errorf("fails %+v cycles %+v", h.rdzv.fails, o.Cycles)
				}
			},
		},
		{
			name:  "round ended by the job closing elsewhere: same kind",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				h.ranks.wait(h.t)
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndJobClosed, Round: 0, Code: 93,
					Close: verdict.NoRestart, Reason: "rank 5 requested ShutdownWorkload"})
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.NoRestart, 93) },
		},
		{
			name:  "deciding-escalating-done: ShutdownWorkload closes the job with the no-restart code",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				h.ranks.wait(h.t)
				h.mons.reqs <- monitor.WorkloadRequest{GlobalRank: 1, Action: "ShutdownWorkload", Description: "done for good"}
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NoRestart, 93)
				if len(h.rdzv.shutdowns) != 1 || h.rdzv.shutdowns[0] != (shutdownCall{verdict.NoRestart, 93}) {
					t.Errorf("shutdowns %+v", h.rdzv.shutdowns)
				}
			},
		},
		{
			name:  "deciding-escalating-done: ExcludeThisNode leaves the job",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				// reqs is unbuffered: the agent's loop has the request, and
				// handles it before the exit below.
				h.mons.reqs <- monitor.WorkloadRequest{GlobalRank: 0, Action: "ExcludeThisNode", Description: "bad gpu"}
				g.exit(0, 1, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceExcluded)
				if len(h.rdzv.leaves) != 1 || len(h.rdzv.fails) != 0 {
					t.Errorf("leaves %v fails %v", h.rdzv.leaves, h.rdzv.fails)
				}
			},
		},
		{
			name:  "running-stopping-done: SIGTERM is forwarded; ranks that exit 0 give exit 0",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				// Both ranks exited 0 before the signal: success wins the race
				// or the signal does; either way exit 0.
				if o.ExitCode() != 0 {
					t.Errorf("outcome %+v exit %d", o, o.ExitCode())
				}
			},
		},
		{
			name:  "running-stopping-done: SIGTERM with running ranks",
			setup: func(h *harness) { h.rdzv.next = append(h.rdzv.next, active(0, 0)) },
			act: func(h *harness) {
				h.ranks.wait(h.t)
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				if g := h.ranks.groups[0]; len(g.stopped) != 1 || g.stopped[0] != syscall.SIGTERM {
					t.Errorf("stopped with %v", g.stopped)
				}
				if len(h.rdzv.departs) != 1 || !strings.Contains(h.rdzv.departs[0], "stopped by SIGTERM") ||
					!strings.Contains(h.rdzv.departs[0], "10.0.0.1/42") {
					t.Errorf("departs %q: want one naming the node and the signal", h.rdzv.departs)
				}
			},
		},
		{
			name: "stopping: a signal while stopping for a restart ends the node; a second one SIGKILLs",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1))
				h.ranks.stopBlocks = true
				h.cfg.WorkersStopTimeout = time.Minute
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(1, 1, 0)
				waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.stopped) == 1 })
				h.sigs <- syscall.SIGTERM
				h.sigs <- syscall.SIGINT
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Signaled, 1)
				g := h.ranks.groups[0]
				if len(g.signalled) != 1 || g.signalled[0] != syscall.SIGKILL {
					t.Errorf("signalled %v", g.signalled)
				}
				if len(h.rdzv.fails) != 0 || len(h.ranks.groups) != 1 {
					t.Errorf("restarted after a signal: fails %v groups %d", h.rdzv.fails, len(h.ranks.groups))
				}
			},
		},
	}
	tests = append(tests, walltimeCases()...)
	tests = append(tests, repeatSignalCases()...)
	tests = append(tests, spareCases()...)
	runAll(t, tests)
}

func TestExitCode(t *testing.T) {
	tests := []struct {
		o    Outcome
		code int
	}{
		{Outcome{Kind: verdict.Succeeded}, 0},
		{Outcome{Kind: verdict.RestartBudgetExhausted}, 1},
		{Outcome{Kind: verdict.NoRestart}, 93},
		{Outcome{Kind: verdict.NoRestart, Code: 42}, 42},
		{Outcome{Kind: verdict.NodeExcluded}, 1},
		{Outcome{Kind: verdict.RendezvousLost}, 1},
		{Outcome{Kind: verdict.NotEnoughNodes}, 1},
		{Outcome{Kind: verdict.Signaled, RanksClean: true}, 0},
		{Outcome{Kind: verdict.Signaled}, 1},
		{Outcome{Kind: verdict.FatalError}, 1},
		{Outcome{Kind: verdict.Walltime, RanksClean: true}, 0},
		{Outcome{Kind: verdict.Walltime}, 1},
	}
	for _, tc := range tests {
		if got := tc.o.ExitCode(); got != tc.code {
			t.Errorf("%+v: exit %d, want %d", tc.o, got, tc.code)
		}
	}
}

// TestCyclesBounded: a job that restarts thousands of times keeps the
// newest 64 cycles and the count of all of them.
func TestCyclesBounded(t *testing.T) {
	r := newRunState(time.Now(), 1000)
	for i := 0; i < 1000; i++ {
		r.cycle = cycleTiming{round: i}
		r.finishCycle(cycleEnd{kind: endRankFailure})
	}
	if len(r.cycles) != maxCycles || r.cyclesTotal != 1000 || r.cycles[0].Round != 1000-maxCycles || r.cycles[maxCycles-1].Round != 999 {
		t.Fatalf("%d cycles kept (first %d, last %d), %d total", len(r.cycles), r.cycles[0].Round, r.cycles[len(r.cycles)-1].Round, r.cyclesTotal)
	}
}

// runAll runs each case on a harness of its own: setup, Run, act, then
// check the outcome once Run has returned (in state done).
func runAll(t *testing.T, tests []runCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			if tc.setup != nil {
				tc.setup(h)
			}
			out := h.start()
			if tc.act != nil {
				tc.act(h)
			}
			o := h.outcome(out)
			if h.agent.State() != StateDone {
				t.Errorf("state %v after Run", h.agent.State())
			}
			tc.check(t, h, o)
		})
	}
}
