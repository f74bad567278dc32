package agent

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// withSpares is active(round, restarts) with standbys parked in the round.
func withSpares(round, restarts, standbys int) func(context.Context) (rendezvous.Assignment, error) {
	return func(ctx context.Context) (rendezvous.Assignment, error) {
		a, err := active(round, restarts)(ctx)
		a.Standbys = standbys
		return a, err
	}
}

// TestFailingNode: a node whose rank exits 1 with no explanation in two
// rounds running leaves for a spare when one stands by and its report
// ended the round; otherwise it keeps its place and its verdict names it.
func TestFailingNode(t *testing.T) {
	decide := func(ended bool) func(context.Context, failCall) (rendezvous.Decision, error) {
		return func(_ context.Context, c failCall) (rendezvous.Decision, error) {
			return rendezvous.Decision{Restart: true, RestartsUsed: c.round + 1, Ended: ended}, nil
		}
	}
	failTwice := func(h *harness) {
		for range 2 {
			g := h.ranks.wait(h.t)
			g.exit(0, 1, 0)
		}
	}
	failTwiceThenSucceed := func(h *harness) {
		failTwice(h)
		g := h.ranks.wait(h.t)
		g.exit(0, 0, 0)
		g.exit(1, 0, 0)
	}
	runAll(t, []runCase{
		{
			name: "a spare stands by: swapped out, quarantined with the evidence",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, withSpares(0, 0, 1), withSpares(1, 1, 1))
				h.rdzv.fail = decide(true)
			},
			act: failTwice,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceRankFailures)
				if len(h.rdzv.leaves) != 1 || len(h.rdzv.fails) != 2 || !strings.Contains(h.rdzv.leaves[0], "2 of its latest 3 rounds") {
					t.Errorf("leaves %q fails %v, want one leave after the second failure", h.rdzv.leaves, h.rdzv.fails)
				}
				fn := o.FailingNode
				if fn == nil || !fn.SwappedOut || len(fn.Rounds) != 2 || fn.Window != 3 || !strings.Contains(fn.Detail, "exited 1 with no explanation") {
					t.Errorf("failing node %+v", fn)
				}
			},
		},
		{
			name: "no spare: keeps its place, named in the verdict",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, withSpares(0, 0, 0), withSpares(1, 1, 0), withSpares(2, 2, 0))
				h.rdzv.fail = decide(true)
			},
			act: failTwiceThenSucceed,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.leaves) != 0 || len(o.Quarantined) != 0 {
					t.Errorf("leaves %q quarantined %+v, want none", h.rdzv.leaves, o.Quarantined)
				}
				if fn := o.FailingNode; fn == nil || fn.SwappedOut || len(fn.Rounds) != 2 {
					t.Errorf("failing node %+v, want rounds 0 and 1, not swapped out", fn)
				}
			},
		},
		{
			name: "another node's report ended the round: keeps its place",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, withSpares(0, 0, 1), withSpares(1, 1, 1), withSpares(2, 2, 1))
				h.rdzv.fail = decide(false)
			},
			act: failTwiceThenSucceed,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.leaves) != 0 || o.FailingNode == nil || o.FailingNode.SwappedOut {
					t.Errorf("leaves %q failing node %+v", h.rdzv.leaves, o.FailingNode)
				}
			},
		},
		{
			name: "this node hosts the job's embedded etcd: keeps its place",
			setup: func(h *harness) {
				h.cfg.Rdzv.Mode, h.cfg.Rdzv.HostsEtcd = configs.RdzvEmbedded, true
				h.rdzv.next = append(h.rdzv.next, withSpares(0, 0, 1), withSpares(1, 1, 1), withSpares(2, 2, 1))
				h.rdzv.fail = decide(true)
			},
			act: failTwiceThenSucceed,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.leaves) != 0 || o.FailingNode == nil || o.FailingNode.SwappedOut {
					t.Errorf("leaves %q failing node %+v, want it kept", h.rdzv.leaves, o.FailingNode)
				}
				if evs := h.events("node_failing"); len(evs) == 0 || !strings.Contains(fmt.Sprint(evs[len(evs)-1]["why"]), "embedded etcd") {
					t.Errorf("node_failing events %v, want the embedded etcd named as why", evs)
				}
			},
		},
		{
			name: "killed by SIGTERM (a request): no evidence",
			setup: func(h *harness) {
				h.rdzv.next = append(h.rdzv.next, withSpares(0, 0, 1), withSpares(1, 1, 1), withSpares(2, 2, 1))
				h.rdzv.fail = decide(true)
			},
			act: func(h *harness) {
				for range 2 {
					g := h.ranks.wait(h.t)
					g.exit(0, 0, 15)
				}
				g := h.ranks.wait(h.t)
				g.exit(0, 0, 0)
				g.exit(1, 0, 0)
			},
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if len(h.rdzv.leaves) != 0 || o.FailingNode != nil {
					t.Errorf("leaves %q failing node %+v, want none", h.rdzv.leaves, o.FailingNode)
				}
			},
		},
	})
}
