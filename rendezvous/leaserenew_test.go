package rendezvous

import (
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestOnLeaseRenewed: every renewal of the node's own lease reports a
// validity that is a lower bound (the request's send time plus the TTL, so
// never later than the call plus the TTL), each next renewal comes well
// before the previous validity minus the launcher's fence margin (a fifth of
// the TTL: a healthy launcher is never fenced), and nothing is reported after
// Close.
func TestOnLeaseRenewed(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	type call struct{ at, validUntil time.Time }
	var mu sync.Mutex
	var calls []call
	o := c.opts(0, 1, 1, 1, 0)
	o.LeaseTTL = 5 * time.Second
	o.OnLeaseRenewed = func(v time.Time) {
		mu.Lock()
		calls = append(calls, call{time.Now(), v})
		mu.Unlock()
	}
	e := c.add(o)
	time.Sleep(8 * time.Second)
	e.Close()
	mu.Lock()
	got := append([]call(nil), calls...)
	mu.Unlock()
	if len(got) < 3 {
		t.Fatalf("%d renewals reported in 8 s with a 5 s TTL, want at least 3 (one every TTL/3)", len(got))
	}
	margin := o.LeaseTTL / 5
	for i, c := range got {
		if c.validUntil.After(c.at.Add(o.LeaseTTL)) {
			t.Errorf("renewal %d: valid until %s after the call, more than the TTL", i, c.validUntil.Sub(c.at))
		}
		if !c.validUntil.After(c.at) {
			t.Errorf("renewal %d: reported already expired (%s)", i, c.validUntil.Sub(c.at))
		}
		if i > 0 && !got[i].at.Before(got[i-1].validUntil.Add(-margin)) {
			t.Errorf("renewal %d came %s after the previous validity minus the fence margin: a healthy launcher would be fenced",
				i, got[i].at.Sub(got[i-1].validUntil.Add(-margin)))
		}
		if i > 0 && got[i].validUntil.Before(got[i-1].validUntil) {
			t.Errorf("renewal %d: validity went backwards", i)
		}
	}
	time.Sleep(2 * time.Second)
	mu.Lock()
	after := len(calls)
	mu.Unlock()
	if after != len(got) {
		t.Errorf("%d renewals reported after Close", after-len(got))
	}
}
