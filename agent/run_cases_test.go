package agent

// TestRun's cases of a node at its time limit (walltimeCases) and of a
// spare (spareCases); TestRun (agent_test.go) runs them with its own.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// walltimeCases: the scheduler's pre-walltime warning is forwarded and
// never counted as a failure.
func walltimeCases() []runCase {
	wt := func(h *harness) {
		h.rdzv.next = append(h.rdzv.next, active(0, 0))
		h.walltime = []os.Signal{syscall.SIGUSR1}
	}
	return []runCase{
		{
			name:  "walltime: USR1 forwarded; a rank dying of it is not a failure",
			setup: wt,
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGUSR1
				waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.signalled) == 1 })
				g.exit(0, 0, syscall.SIGUSR1)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Walltime, 1)
				if g := h.ranks.groups[0]; g.signalled[0] != syscall.SIGUSR1 {
					t.Errorf("signalled %v", g.signalled)
				}
				if len(h.rdzv.fails) != 0 {
					t.Errorf("counted as a failure: %+v", h.rdzv.fails)
				}
			},
		},
		{
			name:  "walltime: the same warning twice (slurmstepd and ft-resumer node) is forwarded once",
			setup: wt,
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGUSR1
				h.sigs <- syscall.SIGUSR1
				waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.signalled) == 1 })
				time.Sleep(50 * time.Millisecond) // a second forward would show by now
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Walltime, 0)
				if g := h.ranks.groups[0]; len(g.signalled) != 1 {
					t.Errorf("ranks signalled %v, want SIGUSR1 once", g.signalled)
				}
			},
		},
		{
			name:  "walltime: ranks checkpoint and exit 0",
			setup: wt,
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGUSR1
				waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.signalled) == 1 })
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) { want(t, o, verdict.Walltime, 0) },
		},
		{
			name:  "walltime: SIGTERM after the warning",
			setup: wt,
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.sigs <- syscall.SIGUSR1
				waitFor(h.t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.signalled) == 1 })
				h.sigs <- syscall.SIGTERM
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Walltime, 1)
				if o.Signal != syscall.SIGTERM || !strings.Contains(o.Reason, "SIGUSR1") {
					t.Errorf("signal %v reason %q", o.Signal, o.Reason)
				}
			},
		},
	}
}

// TestWalltimeWarningAroundTheExit: under Slurm the pre-walltime warning
// reaches the ranks as it reaches the launcher (slurmstepd signals every
// process of the step), so a rank may save and exit 0 on it before the
// launcher reads its own copy: the job ended by walltime, not with
// success (a Slurm chain test saw "succeeded" once in CI). A warning
// already waiting beside the exit is taken first (select picks among
// ready cases at random: each case runs 8 times), and one that comes
// within Deps.WalltimeSettle of the last exit still counts.
func TestWalltimeWarningAroundTheExit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		settle time.Duration
		with   os.Signal // waiting beside the exit
		after  os.Signal // sent once the exit was taken
		kind   verdict.Kind
		signal os.Signal // the outcome's signal
	}{
		{"warning waiting beside the exit", 0, syscall.SIGUSR1, nil, verdict.Walltime, syscall.SIGUSR1},
		{"warning just after the exit, within the settle", 5 * time.Second, nil, syscall.SIGUSR1, verdict.Walltime, syscall.SIGUSR1},
		{"SIGTERM just after the exit, within the settle", 5 * time.Second, nil, syscall.SIGTERM, verdict.Signaled, syscall.SIGTERM},
		{"no signal: a success after the settle", 50 * time.Millisecond, nil, nil, verdict.Succeeded, nil},
	} {
		for i := range 8 {
			t.Run(fmt.Sprintf("%s/%d", tc.name, i), func(t *testing.T) {
				h := newHarness(t)
				h.cfg.NProcPerNode = 1
				h.rdzv.next = append(h.rdzv.next, active(0, 0))
				h.walltime, h.walltimeSettle = []os.Signal{syscall.SIGUSR1}, tc.settle
				var g *fakeGroup
				h.ranks.onStart = func(fg *fakeGroup) {
					g = fg
					if tc.with != nil {
						h.sigs <- tc.with
					}
					fg.exit(0, 0, 0) // saved and exited on the warning
				}
				out := h.start()
				h.ranks.wait(t)
				if tc.after != nil {
					waitFor(t, func() bool { return len(g.exits) == 0 }) // the agent took the exit
					time.Sleep(20 * time.Millisecond)
					h.sigs <- tc.after
				}
				o := h.outcome(out)
				if o.Kind != tc.kind || o.Signal != tc.signal || o.ExitCode() != 0 {
					t.Errorf("outcome %v (signal %v, exit %d, %q), want %v (signal %v, exit 0)", o.Kind, o.Signal, o.ExitCode(), o.Reason, tc.kind, tc.signal)
				}
			})
		}
	}
}

// spareCases: a standby runs filler work, reclaimed before its ranks start.
func spareCases() []runCase {
	return []runCase{
		{
			name: "spare: filler parked while standby, reclaimed before the ranks start",
			setup: func(h *harness) {
				h.spare = &fakeSpare{}
				h.rdzv.next = append(h.rdzv.next, standbyIn(0), active(1, 0))
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				h.spare.mu.Lock()
				calls := fmt.Sprint(h.spare.calls)
				h.spare.mu.Unlock()
				if calls != "[park reclaim]" {
					h.t.Errorf("filler calls before the ranks started: %s", calls)
				}
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if fmt.Sprint(h.spare.calls) != "[park reclaim close]" {
					t.Errorf("filler calls %v", h.spare.calls)
				}
				if o.Cycles[0].FillerReclaimMS != 3 {
					t.Errorf("reclaim time not recorded: %+v", o.Cycles[0])
				}
			},
		},
		{
			name: "ledger: a node lost, a spare with filler takes its place",
			setup: func(h *harness) {
				h.spare = &fakeSpare{}
				h.store = newMemStore()
				lostAt := time.Now().UTC().Add(-time.Second)
				h.store.recs["10.0.0.2/7#1"] = ledger.Record{Job: "job", Node: "10.0.0.2/7", Role: ledger.Active, GroupRank: 1, Seq: 1, Start: lostAt}
				h.rdzv.next = append(h.rdzv.next, standbyIn(0), func(context.Context) (rendezvous.Assignment, error) {
					// The round opened when a survivor recorded the loss.
					h.store.CloseOpen(context.Background(), "10.0.0.2/7", ledger.NodeFailure, "lost (gossip)", "10.0.0.3/9", time.Now().UTC())
					a, _ := active(1, 0)(nil)
					a.GroupRank, a.OpenedAt = 1, time.Now()
					return a, nil
				})
			},
			act: func(h *harness) {
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				var got []string
				for _, r := range h.store.all() {
					got = append(got, fmt.Sprintf("%s/%s/%s", r.Node, r.Role, r.Reason))
				}
				wantSeq := "[10.0.0.2/7/Active/NodeFailure 10.0.0.1/42/Filler/ReclaimedBySpare 10.0.0.1/42/Spare/Swap 10.0.0.1/42/Active/JobSucceeded]"
				if fmt.Sprint(got) != wantSeq {
					t.Errorf("ledger %v\nwant    %s", got, wantSeq)
				}
				if len(o.Ledger) != 3 || o.Ledger[2].Role != ledger.Active || o.Ledger[2].GroupRank != 1 {
					t.Errorf("verdict ledger %+v", o.Ledger)
				}
				for name, want := range map[string]float64{"ftlauncher_spares_allocated_total": 1, "ftlauncher_spares_swaps_total": 1,
					"ftlauncher_filler_preemptions_total": 1, "ftlauncher_spares_active": 0} {
					if got := h.metric(name); got != want {
						t.Errorf("%s = %v, want %v", name, got, want)
					}
				}
			},
		},
		{
			name: "ledger: a survivor records the lost peer's NodeFailure",
			setup: func(h *harness) {
				h.store = newMemStore()
				h.store.recs["10.0.0.2/7#1"] = ledger.Record{Job: "job", Node: "10.0.0.2/7", Role: ledger.Active, GroupRank: 1, Seq: 1, Start: time.Now().UTC()}
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 0))
			},
			act: func(h *harness) {
				h.ranks.wait(h.t)
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Node: "10.0.0.2/7",
					Reason: "node 10.0.0.2/7 lost (gossip)", Cause: policy.NodeLost})
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				r := h.store.recs["10.0.0.2/7#1"]
				if r.Reason != ledger.NodeFailure || r.ClosedBy != "10.0.0.1/42" {
					t.Errorf("lost peer's lease %+v", r)
				}
				own := h.store.recs["10.0.0.1/42#1"]
				if own.Role != ledger.Active || own.Reason != ledger.JobSucceeded || own.Cycle != 0 {
					t.Errorf("own lease %+v (a restart in place keeps one Active lease)", own)
				}
			},
		},
		{
			name: "ledger: a loss recorded with the round's end is not written again",
			setup: func(h *harness) {
				h.store = newMemStore()
				h.store.recs["10.0.0.2/7#1"] = ledger.Record{Job: "job", Node: "10.0.0.2/7", Role: ledger.Active, GroupRank: 1, Seq: 1, Start: time.Now().UTC()}
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 0), active(2, 0))
			},
			act: func(h *harness) {
				h.ranks.wait(h.t)
				// Another node's end txn recorded the loss: nothing to write here.
				h.rdzv.endRound(0, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 0, Node: "10.0.0.2/7",
					Reason: "node 10.0.0.2/7 lost (gossip)", Cause: policy.NodeLost, LedgerBy: "10.0.0.3/9"})
				h.ranks.wait(h.t)
				// This node's end txn recorded it: the records go to its verdict.
				at := time.Now().UTC()
				rec := ledger.Record{Job: "job", Node: "10.0.0.4/8", Role: ledger.Active, GroupRank: 2, Seq: 1, Start: at,
					End: &at, Reason: ledger.NodeFailure, ClosedBy: "10.0.0.1/42"}
				h.rdzv.endRound(1, rendezvous.RoundEnd{Kind: rendezvous.EndRestart, Round: 1, Node: "10.0.0.4/8",
					Reason: "node 10.0.0.4/8 lost (gossip)", Cause: policy.NodeLost, LedgerBy: "10.0.0.1/42", Ledger: []ledger.Record{rec}})
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				if r := h.store.recs["10.0.0.2/7#1"]; !r.Open() {
					t.Errorf("lost peer's lease written by this node: %+v", r)
				}
				found := false
				for _, r := range o.Ledger {
					found = found || (r.Node == "10.0.0.4/8" && r.Reason == ledger.NodeFailure)
				}
				if !found {
					t.Errorf("verdict ledger lacks the loss this node recorded: %+v", o.Ledger)
				}
			},
		},
		{
			name: "repeated hangs quarantine the node when the job can have spares",
			setup: func(h *harness) {
				h.cfg.NNodes = configs.NNodes{Min: 2, Max: 3}
				h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1), active(2, 2))
			},
			act: func(h *harness) {
				for i := 0; i < HangQuarantineThreshold; i++ {
					g := h.ranks.wait(h.t)
					h.mons.mu.Lock()
					h.mons.fired[0] = true
					h.mons.mu.Unlock()
					g.exit(0, 0, syscall.SIGKILL)
					h.mons.hangs <- monitor.Hang{Cycle: i, LocalRank: 0, Kind: "heartbeat", Timeout: time.Second, Signal: syscall.SIGKILL}
				}
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceHang)
				if len(h.rdzv.fails) != HangQuarantineThreshold-1 || len(h.rdzv.leaves) != 1 {
					t.Errorf("fails %d leaves %v", len(h.rdzv.fails), h.rdzv.leaves)
				}
			},
		},
		{
			name: "spare: a filler that cannot be reclaimed quarantines this node",
			setup: func(h *harness) {
				h.store = newMemStore()
				h.spare = &fakeSpare{reclaimE: errors.New("GPUs still in use: pid 4242 holds GPU 0")}
				h.rdzv.next = append(h.rdzv.next, standbyIn(0), active(1, 0))
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceFillerReclaim)
				if len(h.rdzv.leaves) != 1 || len(h.ranks.groups) != 0 {
					t.Errorf("leaves %v, %d rank groups started", h.rdzv.leaves, len(h.ranks.groups))
				}
				for _, r := range h.store.all() {
					if r.Reason != ledger.Quarantined {
						t.Errorf("lease %s/%s ended %s, want Quarantined", r.Node, r.Role, r.Reason)
					}
				}
			},
		},
	}
}
