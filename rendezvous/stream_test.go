package rendezvous

import (
	"fmt"
	"testing"
)

// TestRingWatch: each active watches the next two actives with a stream
// listener (wrapping), never itself, so each is watched by two others.
func TestRingWatch(t *testing.T) {
	mk := func(n int, noStream ...int) []*memberInfo {
		out := make([]*memberInfo, n)
		for i := range out {
			out[i] = &memberInfo{NodeID: fmt.Sprint("n", i), StreamAddr: fmt.Sprint("a", i)}
		}
		for _, i := range noStream {
			out[i].StreamAddr = ""
		}
		return out
	}
	ids := func(ps []streamPeer) string {
		s := ""
		for _, p := range ps {
			s += p.ID + " "
		}
		return s
	}
	tests := []struct {
		actives []*memberInfo
		i       int
		want    string
	}{
		{mk(1), 0, ""},
		{mk(2), 0, "n1 "},
		{mk(2), 1, "n0 "},
		{mk(3), 2, "n0 n1 "},
		{mk(5), 3, "n4 n0 "},
		{mk(5, 4), 3, "n0 n1 "}, // an older launcher without a listener is skipped
	}
	for _, tc := range tests {
		if got := ids(newRings(tc.actives).watch(tc.i)); got != tc.want {
			t.Errorf("rings.watch(%d actives, %d) = %q, want %q", len(tc.actives), tc.i, got, tc.want)
		}
	}
	// Each of 6 actives is watched by exactly two others.
	acts := mk(6)
	watched := map[string]int{}
	for i := range acts {
		for _, p := range newRings(acts).watch(i) {
			watched[p.ID]++
		}
	}
	for _, m := range acts {
		if watched[m.NodeID] != 2 {
			t.Errorf("%s watched by %d nodes, want 2", m.NodeID, watched[m.NodeID])
		}
	}
}
