package rendezvous

import (
	"fmt"
	"slices"
	"testing"
)

func TestRankDelta(t *testing.T) {
	active := func(g int) rankInfo { return rankInfo{GroupRank: g, RankBase: 8 * g, Order: g} }
	spare := func(o int) rankInfo { return rankInfo{GroupRank: -1, Standby: true, Order: o} }
	many := map[string]rankInfo{}
	moved := map[string]rankInfo{}
	for i := range maxRankDelta + 1 {
		id := fmt.Sprintf("n%03d", i)
		many[id], moved[id] = active(i), active(i+1)
	}
	for _, tc := range []struct {
		name        string
		prev, ranks map[string]rankInfo
		delta       bool
		changed     []string
	}{
		{"round 0: nothing to compare with", nil, map[string]rankInfo{"a": active(0)}, false, nil},
		{"a restart keeps every rank", map[string]rankInfo{"a": active(0), "b": active(1), "s": spare(2)},
			map[string]rankInfo{"a": active(0), "b": active(1), "s": spare(2)}, true, nil},
		{"only the order moved: not a change for the node",
			map[string]rankInfo{"a": active(0), "s": spare(2)},
			map[string]rankInfo{"a": active(0), "s": spare(1)}, true, nil},
		{"a swap: the lost node and the promoted spare",
			map[string]rankInfo{"a": active(0), "b": active(1), "s": spare(2)},
			map[string]rankInfo{"a": active(0), "s": active(1)}, true, []string{"b", "s"}},
		{"a node that registered too late has no entry now",
			map[string]rankInfo{"a": active(0), "b": active(1)},
			map[string]rankInfo{"a": active(0), "x": active(1)}, true, []string{"b"}},
		{"the stream peers to watch changed",
			map[string]rankInfo{"a": {GroupRank: 0, Watch: []streamPeer{{ID: "b", Addr: "h:1"}}}},
			map[string]rankInfo{"a": {GroupRank: 0, Watch: []streamPeer{{ID: "b", Addr: "h:2"}}}}, true, []string{"a"}},
		{"more changes than the summary carries: every node reads", many, moved, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var sum roundSummary
			rankDelta(&sum, tc.prev, tc.ranks)
			if sum.Delta != tc.delta || !slices.Equal(sum.Changed, tc.changed) {
				t.Fatalf("delta %v changed %v, want %v %v", sum.Delta, sum.Changed, tc.delta, tc.changed)
			}
		})
	}
}
