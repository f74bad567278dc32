package rendezvous

import (
	"testing"
	"time"
)

// TestLossDetectorEvidence: the first evidence of a loss is kept until the
// loss is reported or dropped, an earlier one wins over a later one, and a
// lease expiry that confirms a gossip death says so.
func TestLossDetectorEvidence(t *testing.T) {
	t0 := time.Now()
	cases := []struct {
		name      string
		kept      time.Time // noted first (zero: none)
		how       string
		evidence  time.Time
		wantHow   string
		wantFirst time.Time
	}{
		{"nothing kept", time.Time{}, "lease expired", time.Time{}, "lease expired", time.Time{}},
		{"gossip first, lease confirms", t0, "lease expired", time.Time{}, "gossip, lease expired", t0},
		{"kept is earlier", t0, "stream port refused", t0.Add(time.Second), "stream port refused", t0},
		{"new is earlier", t0.Add(time.Second), "stream port refused", t0, "stream port refused", t0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newLossDetector("self", DefaultGossipTimings, testLogger(t), nil, nil)
			d.noteEvidence("n", tc.kept)
			if !tc.kept.IsZero() {
				d.noteEvidence("n", t0.Add(time.Hour)) // a later note never replaces the first
			}
			how, first := d.firstEvidence("n", tc.how, tc.evidence)
			if how != tc.wantHow || !first.Equal(tc.wantFirst) {
				t.Fatalf("firstEvidence = %q %v, want %q %v", how, first, tc.wantHow, tc.wantFirst)
			}
			d.dropEvidence("n")
			if how, first := d.firstEvidence("n", "lease expired", time.Time{}); how != "lease expired" || !first.IsZero() {
				t.Fatalf("after drop: %q %v, want nothing kept", how, first)
			}
		})
	}
	d := newLossDetector("self", DefaultGossipTimings, testLogger(t), nil, nil)
	d.acked("n")
	if a := d.takeAck("n"); a.IsZero() || time.Since(a) > time.Minute {
		t.Fatalf("takeAck after an ack = %v, want about now", a)
	}
	if a := d.takeAck("n"); !a.IsZero() {
		t.Fatalf("second takeAck = %v, want zero (taken)", a)
	}
	if d.bound() != DefaultGossipTimings.Suspicion(1)+2*DefaultGossipTimings.ProbeInterval+DefaultGossipTimings.StreamCheck() {
		t.Fatalf("bound without gossip = %v", d.bound())
	}
}
