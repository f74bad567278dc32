package rendezvous

import (
	"testing"
	"time"
)

// TestDecideClose is the table of the round-closing rule
// (docs/rendezvous.md, "When a round closes").
func TestDecideClose(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	const (
		lastCall    = 500 * time.Millisecond
		rejoinWait  = 30 * time.Second
		detectBound = 1200 * time.Millisecond
	)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	dead := func(id string) missingPeer { return missingPeer{ID: id, State: peerDead, PrevActive: true} }
	tests := []struct {
		name     string
		in       closeInput
		close    bool
		until    time.Time // zero: no deadline
		nWaiting int
	}{
		{name: "spare present: the lost node is dead, the spare and the survivors joined",
			in:    closeInput{Min: 3, Max: 4, Present: 3, Missing: []missingPeer{dead("a")}},
			close: true},
		{name: "no spare: survivors meet MIN, the lost node is dead",
			in:    closeInput{Min: 2, Max: 4, Present: 2, Missing: []missingPeer{dead("a")}},
			close: true},
		{name: "MIN not met: wait, with no deadline of this rule",
			in:    closeInput{Min: 3, Max: 4, Present: 2, Missing: []missingPeer{dead("a")}},
			close: false},
		{name: "MIN not met even with a live node on its way",
			in:    closeInput{Min: 3, Max: 4, Present: 1, Missing: []missingPeer{{ID: "b", State: peerAlive, PrevActive: true}}},
			close: false},
		{name: "a node coming back (new lease, not yet joined): last call",
			in: closeInput{Min: 3, Max: 4, Present: 3, Now: at(100 * time.Millisecond), MinMetAt: t0,
				Missing: []missingPeer{{ID: "back", State: peerAlive}}},
			until: at(lastCall), nWaiting: 1},
		{name: "a node coming back, last call over",
			in: closeInput{Min: 3, Max: 4, Present: 3, Now: at(lastCall), MinMetAt: t0,
				Missing: []missingPeer{{ID: "back", State: peerAlive}}},
			close: true},
		{name: "a previous active still stopping its ranks keeps its slot, even with MAX present",
			in: closeInput{Min: 2, Max: 2, Present: 2, Now: at(time.Second), Opened: t0,
				Missing: []missingPeer{{ID: "slow", State: peerAlive, PrevActive: true}}},
			until: at(rejoinWait), nWaiting: 1},
		{name: "a previous active not back within the rejoin wait",
			in: closeInput{Min: 2, Max: 2, Present: 2, Now: at(rejoinWait), Opened: t0,
				Missing: []missingPeer{{ID: "slow", State: peerAlive, PrevActive: true}}},
			close: true},
		{name: "two nodes lost at once, both confirmed, one spare",
			in:    closeInput{Min: 3, Max: 4, Present: 3, Missing: []missingPeer{dead("a"), dead("b")}},
			close: true},
		{name: "two nodes lost at once, one confirmed, one only suspected",
			in: closeInput{Min: 3, Max: 4, Present: 3, Now: at(200 * time.Millisecond), Opened: t0,
				Missing: []missingPeer{dead("a"), {ID: "b", State: peerSuspect, PrevActive: true, Since: t0}}},
			until: at(detectBound), nWaiting: 1},
		{name: "a suspected node is not waited for past the detection bound",
			in: closeInput{Min: 3, Max: 4, Present: 3, Now: at(detectBound), Opened: t0,
				Missing: []missingPeer{dead("a"), {ID: "b", State: peerSuspect, PrevActive: true, Since: t0}}},
			close: true},
		{name: "a suspected spare is waited for until the bound, not the rejoin wait",
			in: closeInput{Min: 3, Max: 4, Present: 3, Now: at(time.Second), MinMetAt: at(time.Second), Opened: t0,
				Missing: []missingPeer{{ID: "s", State: peerSuspect, Since: at(500 * time.Millisecond)}}},
			until: at(500*time.Millisecond + detectBound), nWaiting: 1},
		{name: "first round: nodes not seen yet get the last call",
			in:    closeInput{Min: 3, Max: 4, Present: 3, FirstRound: true, Now: at(time.Millisecond), MinMetAt: t0},
			until: at(lastCall), nWaiting: 1},
		{name: "first round: MAX present closes at once",
			in:    closeInput{Min: 3, Max: 4, Present: 4, FirstRound: true, Now: t0, MinMetAt: t0},
			close: true},
		{name: "earliest deadline first",
			in: closeInput{Min: 2, Max: 4, Present: 2, Now: at(100 * time.Millisecond), MinMetAt: t0, Opened: t0,
				Missing: []missingPeer{{ID: "n", State: peerAlive}, {ID: "s", State: peerSuspect, Since: t0}}},
			until: at(lastCall), nWaiting: 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.LastCall, in.RejoinWait, in.DetectBound = lastCall, rejoinWait, detectBound
			if in.Now.IsZero() {
				in.Now = t0
			}
			d := decideClose(in)
			if d.Close != tc.close || !d.Until.Equal(tc.until) || len(d.Waiting) != tc.nWaiting {
				t.Fatalf("decideClose = close %v until %v waiting %q (%s); want close %v until %v, %d waited for",
					d.Close, d.Until, d.Waiting, d.Why, tc.close, tc.until, tc.nWaiting)
			}
		})
	}
}
