package monitor

import (
	"log/slog"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// fakeHost is a rankHost without a Manager: a clock, and what the rank
// monitor hands it.
type fakeHost struct {
	epoch time.Time
	mu    sync.Mutex
	recs  []eventlog.Record
	hangs chan Hang
	pids  chan int
}

func newFakeHost() *fakeHost {
	return &fakeHost{epoch: time.Now(), hangs: make(chan Hang, 1), pids: make(chan int, 1)}
}

func (f *fakeHost) mono() int64                    { return int64(time.Since(f.epoch)) }
func (f *fakeHost) wall(mono int64) time.Time      { return f.epoch.Add(time.Duration(mono)) }
func (f *fakeHost) refuse(*rankMon, string, error) {}

func (f *fakeHost) emit(rec eventlog.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs = append(f.recs, rec)
}

func (f *fakeHost) judging() bool               { return false }
func (f *fakeHost) expired(*rankMon, Hang, int) { panic("no stacks without judging") }

func (f *fakeHost) hung(h Hang, pid int) {
	f.hangs <- h
	f.pids <- pid
}

// TestRankMonOwnHost: a rank monitor runs on its rankHost and rankConfig
// alone: its first heartbeat is recorded through the host with the rank's
// identity, and its expired heartbeat clock is handed to the host's hung
// with the configured termination signal and the rank's pid.
func TestRankMonOwnHost(t *testing.T) {
	t.Parallel()
	host := newFakeHost()
	cfg := rankConfig{log: slog.New(slog.DiscardHandler), record: true, signal: syscall.SIGUSR1,
		defaults: DefaultClocks{}.withConstants(), stalls: newStallLog(stallThreshold, host.mono())}
	r := newRankMon(host, cfg, 2)
	r.begin(5, noSuchPID, Timeouts{Heartbeat: 100 * time.Millisecond}, 0, false)
	c1, c2 := net.Pipe()
	t.Cleanup(func() { c1.Close(); c2.Close() })
	gen := r.install(c1)
	if !r.init(gen, initInfo{globalRank: 9}) {
		t.Fatal("init refused")
	}
	r.heartbeat(gen)
	select {
	case h := <-host.hangs:
		if pid := <-host.pids; h.Kind != KindHeartbeat || h.Cycle != 5 || h.LocalRank != 2 || h.GlobalRank != 9 ||
			h.Signal != syscall.SIGUSR1 || pid != noSuchPID {
			t.Errorf("hang %+v of pid %d: want rank 2 (global 9) of cycle 5, heartbeat, SIGUSR1, pid %d", h, pid, noSuchPID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no hang reported to the host")
	}
	host.mu.Lock()
	defer host.mu.Unlock()
	if len(host.recs) != 1 {
		t.Fatalf("records %v, want the first heartbeat only", host.recs)
	}
	hb, ok := host.recs[0].(eventlog.RankFirstHeartbeatEvent)
	if !ok || hb.Round != 5 || hb.LocalRank != 2 || hb.Rank != 9 || hb.At.Before(host.epoch) {
		t.Errorf("record %#v: want the first heartbeat of rank 2 (global 9) in round 5", host.recs[0])
	}
}
