package agent

// Fakes and helpers of the in-process tests: monitors with an in-process
// side, the harness with them, and the checks the tests share.

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// ipMonitors are fake monitors with in-process support: which local ranks
// registered, the notices sent, and a channel for survivors' reports. The
// reports channel is unbuffered: a send returns once the agent's loop has
// taken the report, and the loop handles it before anything the test sends
// next (a rank's exit), so no sleep is needed to order the two.
type ipMonitors struct {
	*fakeMonitors
	mu      sync.Mutex
	capable map[int]bool
	notices chan ftwire.Rejoin
	reports chan monitor.InProcessReport
	begun   []int
	silence map[int]monitor.Silence // local rank -> what Silence reports (absent: no clock)
	refuse  map[int]bool            // local ranks whose notice fails (no session)
	replace map[int]int             // local rank -> the pid ReplaceRank gave it
}

func newIPMonitors(capable ...int) *ipMonitors {
	m := &ipMonitors{fakeMonitors: newFakeMonitors(), capable: map[int]bool{},
		notices: make(chan ftwire.Rejoin, 8), reports: make(chan monitor.InProcessReport)}
	for _, lr := range capable {
		m.capable[lr] = true
	}
	return m
}

func (m *ipMonitors) InProcessCapable(lr int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.capable[lr] && !m.refuse[lr]
}

func (m *ipMonitors) Silence(lr int) (monitor.Silence, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.silence[lr]
	return s, ok
}

func (m *ipMonitors) Notify(lr int, n ftwire.Rejoin) error {
	m.mu.Lock()
	refused := m.refuse[lr]
	m.mu.Unlock()
	if refused {
		return fmt.Errorf("monitor: local rank %d has no session", lr)
	}
	m.notices <- n
	return nil
}

func (m *ipMonitors) InProcessReports() <-chan monitor.InProcessReport {
	return m.reports
}

func (m *ipMonitors) ReplaceRank(lr, pid int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.replace == nil {
		m.replace = map[int]int{}
	}
	m.replace[lr] = pid
}

// setCapable says whether local rank lr has an in-process session now.
func (m *ipMonitors) setCapable(lr int, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.capable[lr] = ok
}

func (m *ipMonitors) BeginCycle(cycle int, _ map[int]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.begun = append(m.begun, cycle)
}

// Signal makes the fake rank die of sig (the agent kills a survivor that
// does not rejoin through it).
func (g *fakeGroup) Signal(lr int, sig syscall.Signal) error {
	g.mu.Lock()
	g.signalled = append(g.signalled, sig)
	g.mu.Unlock()
	g.exit(lr, 0, sig)
	return nil
}

func (m *ipMonitors) notice(t *testing.T) ftwire.Rejoin {
	t.Helper()
	select {
	case n := <-m.notices:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no in-process notice sent")
		return ftwire.Rejoin{}
	}
}

func ipHarness(t *testing.T, capable ...int) (*harness, *ipMonitors) {
	h := newHarness(t)
	h.cfg.RestartMode = configs.RestartInProcess
	h.cfg.InProcessRejoinTimeout = 10 * time.Second
	m := newIPMonitors(capable...)
	h.monitors = m
	h.agentStore = &fakeStore{ranks: h.ranks}
	h.rdzv.next = append(h.rdzv.next, active(0, 0), active(1, 1), active(2, 2))
	return h, m
}

// wantFullRestart asserts that the restart after g0's cycle was a full
// one: g1 started both ranks, g0 was stopped once, no notice was sent.
func wantFullRestart(t *testing.T, m *ipMonitors, g0, g1 *fakeGroup) {
	t.Helper()
	if len(g1.specs) != 2 || stoppedCount(g0) != 1 {
		t.Fatalf("restart started %d ranks, old group stopped %d times; want a full restart", len(g1.specs), stoppedCount(g0))
	}
	select {
	case n := <-m.notices:
		t.Fatalf("notice %+v sent on a full restart", n)
	default:
	}
}

func stoppedCount(g *fakeGroup) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.stopped)
}

// racyNotify runs before(lr) just before each notice, and refuses the
// notices of refuse as a monitor does whose session went away meanwhile.
type racyNotify struct {
	*ipMonitors
	before func(lr int)
	refuse int
}

func (r *racyNotify) Notify(lr int, n ftwire.Rejoin) error {
	r.before(lr)
	if lr == r.refuse {
		return fmt.Errorf("monitor: local rank %d has no session", lr)
	}
	return r.ipMonitors.Notify(lr, n)
}

// report sends a survivor's rejoined and first_step reports for round.
func (m *ipMonitors) rejoined(lr, round int) {
	m.reports <- monitor.InProcessReport{LocalRank: lr, InProcessReport: ftwire.InProcessReport{Round: round, Phase: "rejoined"}}
	m.reports <- monitor.InProcessReport{LocalRank: lr, InProcessReport: ftwire.InProcessReport{Round: round, Phase: "first_step"}}
}

// noMoreNotices fails when a notice other than those already read was sent.
func (m *ipMonitors) noMoreNotices(t *testing.T) {
	t.Helper()
	select {
	case n := <-m.notices:
		t.Fatalf("unexpected notice %+v", n)
	default:
	}
}

// wantOneInProcessRestart checks that the job succeeded after exactly one
// in-process restart (two cycles, the second in-process, no fallback) and
// that one failure was reported for the incident.
func wantOneInProcessRestart(t *testing.T, h *harness, out <-chan Outcome) {
	t.Helper()
	o := h.outcome(out)
	if o.Kind != verdict.Succeeded || len(o.Cycles) != 2 || o.Cycles[1].Mode != "in-process" || o.Cycles[1].InProcessFallback != "" {
		t.Fatalf("outcome %+v", o)
	}
	h.rdzv.mu.Lock()
	fails := len(h.rdzv.fails)
	h.rdzv.mu.Unlock()
	if fails != 1 {
		t.Fatalf("%d failures reported, want one restart for the incident", fails)
	}
}
