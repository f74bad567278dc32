package rendezvous

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// callResult is what one rendezvous call returned and when.
type callResult struct {
	name string
	err  error
	took time.Duration // since etcd was killed
}

// TestRealEtcdLostMidRound kills the etcd server while ranks "run" (every
// node has its assignment; the standby waits in Next and, unless the node
// hosting etcd dies with it, one active waits in Succeed) and then reports
// a failure and a shutdown with contexts that never end, as the agent did.
// Every call, Ended and Close must be over within the loss bound plus a
// margin, with errors that say the rendezvous was lost and name the
// endpoints and the bound.
func TestRealEtcdLostMidRound(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	tests := []struct {
		name     string
		hostDies bool // an active node dies with etcd (it hosted the embedded server)
	}{
		{"etcd server killed", false},
		{"etcd server killed with the node hosting it", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { testEtcdLostMidRound(t, tc.hostDies) })
	}
}

func testEtcdLostMidRound(t *testing.T, hostDies bool) {
	p := startEtcdProc(t)
	const bound = 2 * time.Second
	const ttl, probe = 10 * time.Second, 250 * time.Millisecond
	// While the own lease's renewals answer, the probe skips its read
	// (session.heardWindowLocked: a probe interval + TTL/3 + 500 ms, 4.1 s
	// here), so the outage is counted from up to that long after the last
	// renewal before etcd died; then the bound, detection (a probe interval
	// + its 1s timeout) and scheduling. (7 s, without the window, was met
	// only when etcd died well after a renewal.)
	limit := bound + probe + ttl/3 + 500*time.Millisecond + 5*time.Second
	c := &cluster{t: t, ep: p.clientURL, run: strings.ReplaceAll(t.Name(), "/", "_")}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 2, 3, 3)
		o.EtcdLossBound = bound
		o.LeaseTTL = ttl // the bound, not the fence (fence_test.go), acts first
		o.ProbeInterval = probe
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	var act []*Etcd
	var standby *Etcd
	for i, a := range as {
		if a.Standby {
			standby = c.nodes[i]
		} else {
			act = append(act, c.nodes[i])
		}
	}
	if standby == nil || len(act) != 2 {
		t.Fatalf("want 2 actives and a standby: %+v", as)
	}
	live := []*Etcd{act[0], standby}
	if !hostDies {
		live = append(live, act[1])
	}
	ends := make([]<-chan RoundEnd, len(live))
	for i, n := range live {
		ends[i] = n.Ended(0)
	}

	var mu sync.Mutex
	var results []callResult
	var killed time.Time
	var wg sync.WaitGroup
	call := func(name string, f func(ctx context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := f(context.Background()) // the agent's context never ends
			mu.Lock()
			results = append(results, callResult{name, err, time.Since(killed)})
			mu.Unlock()
		}()
	}
	mu.Lock() // killed is set before any result is recorded
	if !hostDies {
		call("Succeed (waiting for the other nodes)", func(ctx context.Context) error {
			_, err := act[1].Succeed(ctx, 0)
			return err
		})
	}
	call("Next (standby waiting for a round)", func(ctx context.Context) error {
		_, err := standby.Next(ctx)
		return err
	})
	// They are waiting now, in etcd, and the actives know each other by
	// gossip (a crash of act[1] is then gossip's to report).
	waitRegistered(t, standby, 1)
	if !hostDies {
		waitDone(t, act[1], 0)
	}
	waitGossip(t, act...)
	p.stop()
	if hostDies {
		crash(act[1]) // its peer's gossip reports it: that loss cannot reach etcd either
	}
	killed = time.Now()
	mu.Unlock()
	call("Fail", func(ctx context.Context) error {
		_, err := act[0].Fail(ctx, 0, policy.RankCrash, "rank 0 exited 1")
		return err
	})
	call("Shutdown", func(ctx context.Context) error {
		return act[0].Shutdown(ctx, verdict.FatalError, 1, "ranks could not start")
	})

	for i, ch := range ends {
		e := waitEnd(t, ch, limit)
		if e.Kind != EndJobClosed || e.Close != verdict.RendezvousLost || e.Code != 1 || !strings.Contains(e.Reason, p.clientURL) {
			t.Errorf("node %d end: %+v, want closed %s naming %s", i, e, verdict.RendezvousLost, p.clientURL)
		}
	}
	if d := time.Since(killed); d < bound {
		t.Errorf("closed %v after etcd died, before the %v bound", d, bound)
	}
	waitGroup(t, &wg, limit)

	// Once lost, every call returns at once with the same error.
	for _, n := range live {
		call("Fail after the loss", func(ctx context.Context) error {
			_, err := n.Fail(ctx, 0, policy.RankCrash, "late")
			return err
		})
		call("Succeed after the loss", func(ctx context.Context) error { _, err := n.Succeed(ctx, 0); return err })
		call("Shutdown after the loss", func(ctx context.Context) error { return n.Shutdown(ctx, verdict.Signaled, 143, "SIGTERM") })
		call("Next after the loss", func(ctx context.Context) error { _, err := n.Next(ctx); return err })
		call("Leave after the loss", func(ctx context.Context) error { return n.Leave(ctx, "ExcludeThisNode") })
		call("Close", func(context.Context) error { return n.Close() })
	}
	waitGroup(t, &wg, limit)
	for _, r := range results {
		if !errors.Is(r.err, ErrRendezvousLost) || !strings.Contains(r.err.Error(), p.clientURL) || !strings.Contains(r.err.Error(), bound.String()) {
			t.Errorf("%s: %v, want ErrRendezvousLost naming %s and %v", r.name, r.err, p.clientURL, bound)
		}
		if r.took > 2*limit {
			t.Errorf("%s returned %v after etcd died", r.name, r.took)
		}
		t.Logf("%s returned %v after etcd died: %v", r.name, r.took.Round(time.Millisecond), r.err)
	}
}

// waitGroup waits for wg, failing the test (and leaving the goroutines)
// when it takes longer than d.
func waitGroup(t *testing.T, wg *sync.WaitGroup, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("rendezvous calls still blocked %v after the loss bound", d)
	}
}

// TestRealEtcdCloseWithEtcdGone: Close returns within seconds when etcd
// died moments ago, long before the loss bound (a SIGTERM right after the
// etcd host went away): gossip leave, the lease revoke and the watchers
// are all bounded.
func TestRealEtcdCloseWithEtcdGone(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	for i := 0; i < 2; i++ {
		c.add(c.opts(i, 1, 2, 2, 3)) // default loss bound: 60s
	}
	nextAll(t, c.nodes)
	p.stop()
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := n.Close()
			t.Logf("Close returned after %v: %v", time.Since(start).Round(time.Millisecond), err)
		}()
	}
	waitGroup(t, &wg, 15*time.Second)
}
