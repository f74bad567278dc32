package agent

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/straggler"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// peerSpeeds is a SpeedExchange that holds this node's samples beside a
// second node's, whose ranks are busy a fixed share of the time: it
// stands in for the etcd rendezvous and another launcher (the real pair
// runs in integration.TestStragglerSwappedForSpare).
type peerSpeeds struct {
	mu       sync.Mutex
	mine     []byte
	peerBusy float64
	result   []byte
}

func (p *peerSpeeds) PublishSpeed(_ context.Context, _ int, b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mine = b
	return nil
}

func (p *peerSpeeds) Speeds(context.Context, int) ([][]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	peer, _ := json.Marshal(straggler.NodeSample{Node: "10.0.0.2/7", At: time.Now().UnixMilli(), WindowS: 0.05,
		Ranks: []straggler.RankBusy{{Rank: 2, Busy: p.peerBusy}, {Rank: 3, LocalRank: 1, Busy: p.peerBusy}}})
	return [][]byte{p.mine, peer}, nil
}

func (p *peerSpeeds) PublishSpeedResult(_ context.Context, _ int, b []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.result = b
	return nil
}

func (p *peerSpeeds) SpeedResult(context.Context, int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.result, nil
}

// readEvents is the agent's event log.
func readEvents(t *testing.T, path string) []map[string]any {
	t.Helper()
	all, err := eventlog.Read(path)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// busyDemand is a process group demanding the CPU all the time.
func busyDemand(start time.Time) func(int) (time.Duration, bool) {
	return func(int) (time.Duration, bool) { return time.Since(start), true }
}

// TestStraggler: this node's ranks demand the CPU all the time while the
// other node's are busy 40% of it: this node is a straggler once the
// window has passed. With --ft-straggler swap and a spare standing by it
// leaves at once (no state save to wait for here: the window passes
// without one); with report, or with no spare, it is reported and runs on.
func TestStraggler(t *testing.T) {
	active2 := func(standbys int) func(context.Context) (rendezvous.Assignment, error) {
		return func(ctx context.Context) (rendezvous.Assignment, error) {
			a, err := active(0, 0)(ctx)
			a.GroupWorldSize, a.WorldSize, a.Standbys = 2, 4, standbys
			return a, err
		}
	}
	setup := func(mode string, standbys int) func(h *harness) {
		return func(h *harness) {
			h.cfg.FT.Straggler, h.cfg.FT.StragglerWindow = mode, 0.3
			h.speed = &peerSpeeds{peerBusy: 0.4}
			h.speedInterval = 50 * time.Millisecond
			h.demand = busyDemand(time.Now())
			h.rdzv.next = append(h.rdzv.next, active2(standbys))
		}
	}
	runFor := func(h *harness) { // the ranks run 2 s, then finish
		g := h.ranks.wait(h.t)
		time.Sleep(2 * time.Second)
		g.exit(0, 0, 0)
		g.exit(1, 0, 0)
	}
	stragglerEvents := func(t *testing.T, h *harness) []string {
		var actions []string
		for _, e := range readEvents(t, h.eventsPath) {
			if e["event"] == "straggler" {
				actions = append(actions, e["action"].(string))
			}
		}
		return actions
	}
	runAll(t, []runCase{
		{
			name:  "swap with a spare: swapped out, quarantined",
			setup: setup(configs.StragglerSwap, 1),
			act:   func(h *harness) { h.ranks.wait(h.t) },
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.NodeExcluded, 1)
				wantQuarantine(t, o, "10.0.0.1/42", verdict.EvidenceStraggler)
				if len(h.rdzv.leaves) != 1 || !strings.Contains(h.rdzv.leaves[0], "straggler") || len(h.rdzv.fails) != 0 {
					t.Errorf("leaves %q fails %v, want one leave and no failure", h.rdzv.leaves, h.rdzv.fails)
				}
				if a := stragglerEvents(t, h); strings.Join(a, ",") != "swapping,swapped" {
					t.Errorf("straggler events %v, want swapping then swapped", a)
				}
				if len(o.Cycles) != 1 || o.Cycles[0].End != "straggler" {
					t.Errorf("cycles %+v", o.Cycles)
				}
			},
		},
		{
			name:  "report: reported, never acted on",
			setup: setup(configs.StragglerReport, 1),
			act:   runFor,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if a := stragglerEvents(t, h); strings.Join(a, ",") != "reported" || len(h.rdzv.leaves) != 0 {
					t.Errorf("straggler events %v leaves %q, want reported once and no leave", a, h.rdzv.leaves)
				}
				speeds := 0
				for _, e := range readEvents(t, h.eventsPath) {
					if e["event"] == "rank_speed" && e["node_speed"].(float64) > 0 {
						speeds++
						if sp := e["node_speed"].(float64); sp < 0.3 || sp > 0.5 {
							t.Errorf("node speed %.2f, want about 0.4 (the peer's busy share over this node's 1.0)", sp)
						}
					}
				}
				if speeds == 0 {
					t.Error("no rank_speed event with a judged speed")
				}
			},
		},
		{
			name:  "swap without a spare: kept",
			setup: setup(configs.StragglerSwap, 0),
			act:   runFor,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if a := stragglerEvents(t, h); strings.Join(a, ",") != "kept" || len(h.rdzv.leaves) != 0 {
					t.Errorf("straggler events %v leaves %q, want kept and no leave", a, h.rdzv.leaves)
				}
			},
		},
		{
			name: "swap on the node that hosts the job's embedded etcd: kept",
			setup: func(h *harness) {
				setup(configs.StragglerSwap, 1)(h)
				h.cfg.Rdzv.Mode, h.cfg.Rdzv.HostsEtcd = configs.RdzvEmbedded, true
			},
			act: runFor,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				if a := stragglerEvents(t, h); strings.Join(a, ",") != "kept" || len(h.rdzv.leaves) != 0 {
					t.Errorf("straggler events %v leaves %q, want kept and no leave", a, h.rdzv.leaves)
				}
			},
		},
		{
			name:  "off: nothing measured",
			setup: setup(configs.StragglerOff, 1),
			act:   runFor,
			check: func(t *testing.T, h *harness, o Outcome) {
				want(t, o, verdict.Succeeded, 0)
				for _, e := range readEvents(t, h.eventsPath) {
					if e["event"] == "rank_speed" || e["event"] == "straggler" {
						t.Fatalf("event %v with --ft-straggler off", e)
					}
				}
			},
		},
	})
}
