package monitor

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"
)

// TestFootprint measures what in-process monitors cost (goroutines, heap) for
// 8 connected ranks and checks that Close leaves no goroutine behind.
func TestFootprint(t *testing.T) {
	const n = 8
	settle := func() (int, uint64) {
		runtime.GC()
		time.Sleep(50 * time.Millisecond)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.HeapAlloc
	}
	g0, h0 := settle()
	m, err := New(Options{NLocal: n, FT: configs.DefaultFaultTolerance()})
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]int{}
	for i := 0; i < n; i++ {
		pids[i] = os.Getpid()
	}
	m.BeginCycle(0, pids)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var clients []*ftclient.Client
	for i := 0; i < n; i++ {
		c, err := ftclient.ConnectPath(ctx, m.RankSocket(i), ftclient.Options{GlobalRank: i})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
		if err := c.SendHeartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 10*time.Second, "all ranks connected", func() bool {
		for i := 0; i < n; i++ {
			if s := m.RankStatus(i); !s.Connected || s.Heartbeats != 1 {
				return false
			}
		}
		return true
	})
	g1, h1 := settle()
	t.Logf("%d connected rank monitors: +%d goroutines, +%d KiB heap", n, g1-g0, (int64(h1)-int64(h0))/1024)
	// Per rank: its accept loop and its session; per manager: the control
	// accept loop, the poller and the stall detector (stall.go).
	if g1-g0 > 2*n+3 {
		t.Errorf("%d goroutines for %d ranks, want at most %d", g1-g0, n, 2*n+3)
	}
	for _, c := range clients {
		c.Close()
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "goroutines released", func() bool { return runtime.NumGoroutine() <= g0 })
}
