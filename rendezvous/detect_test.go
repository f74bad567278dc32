package rendezvous

import (
	"testing"
	"time"
)

// TestGossipBound pins the detection bounds docs/rendezvous.md states for
// the default timings, and the defaults applied to zero fields.
func TestGossipBound(t *testing.T) {
	var g GossipTimings
	g.defaults()
	if g != DefaultGossipTimings {
		t.Fatalf("zero timings defaulted to %+v, want %+v", g, DefaultGossipTimings)
	}
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{
		{4, 1200 * time.Millisecond},
		{10, 1200 * time.Millisecond},
		{100, 1600 * time.Millisecond},
		{1000, 2000 * time.Millisecond},
		{4000, 2240 * time.Millisecond},
	} {
		if got := g.Bound(tc.n).Round(10 * time.Millisecond); got != tc.want {
			t.Errorf("Bound(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	none := GossipTimings{IndirectChecks: -1}
	none.defaults()
	if none.IndirectChecks != 0 {
		t.Errorf("IndirectChecks -1 (none) became %d", none.IndirectChecks)
	}
	short := GossipTimings{ProbeInterval: 50 * time.Millisecond}
	short.defaults()
	if short.ProbeTimeout != 25*time.Millisecond {
		t.Errorf("probe timeout for a 50ms interval = %v, want half the interval", short.ProbeTimeout)
	}
}
