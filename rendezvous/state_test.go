package rendezvous

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
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
		{"the replica ring changed (a neighbour's receiver moved)",
			map[string]rankInfo{"a": {GroupRank: 0, Replicas: []string{"h:1"}}},
			map[string]rankInfo{"a": {GroupRank: 0, Replicas: []string{"h:2"}}}, true, []string{"a"}},
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

// TestAssignReplicaRing: each active node's entry carries the replica
// receivers of the next active nodes (wrapping, never itself, at most
// replicaRingPeers, skipping nodes without one); standbys and jobs without
// --state-dir carry none (the field is then omitted from the JSON).
func TestAssignReplicaRing(t *testing.T) {
	mk := func(addrs ...string) []memberInfo {
		ms := make([]memberInfo, len(addrs))
		for i, a := range addrs {
			ms[i] = memberInfo{NodeID: fmt.Sprintf("n%d", i), NProc: 2, ReplicaAddr: a}
		}
		return ms
	}
	for _, tc := range []struct {
		name string
		ms   []memberInfo
		min  int
		want map[string][]string
	}{
		{"three nodes wrap around", mk("a:1", "b:1", "c:1"), 3,
			map[string][]string{"n0": {"b:1", "c:1"}, "n1": {"c:1", "a:1"}, "n2": {"a:1", "b:1"}}},
		{"a standby is no buddy and has none", mk("a:1", "b:1", "s:1"), 2,
			map[string][]string{"n0": {"b:1"}, "n1": {"a:1"}, "n2": nil}},
		{"nodes without a receiver are skipped", mk("a:1", "", "c:1"), 3,
			map[string][]string{"n0": {"c:1"}, "n1": {"c:1", "a:1"}, "n2": {"a:1"}}},
		{"no --state-dir anywhere: none", mk("", "", ""), 3,
			map[string][]string{"n0": nil, "n1": nil, "n2": nil}},
		{"at most replicaRingPeers", mk("a:1", "b:1", "c:1", "d:1", "e:1", "f:1"), 6,
			map[string][]string{"n0": {"b:1", "c:1", "d:1", "e:1"}, "n5": {"a:1", "b:1", "c:1", "d:1"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ranks, _, err := assign(tc.ms, tc.min, nil)
			if err != nil {
				t.Fatal(err)
			}
			for id, want := range tc.want {
				if got := ranks[id].Replicas; !slices.Equal(got, want) {
					t.Errorf("%s: replicas %v, want %v", id, got, want)
				}
			}
		})
	}
	b, err := json.Marshal(rankInfo{GroupRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := json.Marshal(memberInfo{NodeID: "n"})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "replicas") || strings.Contains(string(m), "replica_addr") {
		t.Errorf("empty replica fields are written: %s %s", b, m)
	}
}

// TestRingReplicaFromInvertsTheRing: the nodes listed in a node's
// ReplicaFrom are exactly those with a receiver (a node without one
// neither sends nor restores) whose ring holds its receiver.
func TestRingReplicaFromInvertsTheRing(t *testing.T) {
	for _, tc := range []struct {
		name string
		recv []bool // which actives have a receiver
	}{
		{"two", []bool{true, true}},
		{"six", []bool{true, true, true, true, true, true}},
		{"gaps", []bool{true, false, true, true, false, true, true, true, false}},
		{"one", []bool{true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var actives []*memberInfo
			for i, r := range tc.recv {
				m := &memberInfo{NodeID: fmt.Sprintf("10.0.0.%d/1", i)}
				if r {
					m.ReplicaAddr = fmt.Sprintf("10.0.0.%d:7000", i)
				}
				actives = append(actives, m)
			}
			for i, m := range actives {
				var want []string
				for j, o := range actives {
					if j != i && m.ReplicaAddr != "" && o.ReplicaAddr != "" && slices.Contains(newRings(actives).replicasOf(j), m.ReplicaAddr) {
						want = append(want, o.NodeID)
					}
				}
				got := newRings(actives).replicaFrom(i)
				slices.Sort(got)
				slices.Sort(want)
				if !slices.Equal(got, want) {
					t.Errorf("node %d: ReplicaFrom %v, want %v", i, got, want)
				}
			}
		})
	}
}

// TestRingsMatchTheWalk: the rings' binary-search walks give what walking
// the ring node by node gives, for any pattern of nodes with and without
// a replica receiver or stream listener (none, one, some, all).
func TestRingsMatchTheWalk(t *testing.T) {
	walk := func(actives []*memberInfo, i, step int, has func(*memberInfo) bool) []int {
		var out []int
		n := len(actives)
		for d := 1; d < n && len(out) < replicaRingPeers; d++ {
			if p := ((i+step*d)%n + n) % n; has(actives[p]) {
				out = append(out, p)
			}
		}
		return out
	}
	rnd := rand.New(rand.NewPCG(7, 11))
	for _, n := range []int{1, 2, 3, 5, 9, 40} {
		for _, density := range []float64{0, 0.05, 0.5, 1} {
			actives := make([]*memberInfo, n)
			for i := range actives {
				m := &memberInfo{NodeID: fmt.Sprintf("n%d", i)}
				if rnd.Float64() < density {
					m.ReplicaAddr = fmt.Sprintf("r%d", i)
				}
				if rnd.Float64() < density {
					m.StreamAddr = fmt.Sprintf("s%d", i)
				}
				actives[i] = m
			}
			rg := newRings(actives)
			hasReplica := func(m *memberInfo) bool { return m.ReplicaAddr != "" }
			hasStream := func(m *memberInfo) bool { return m.StreamAddr != "" }
			for i := range actives {
				var wantRep, wantFrom, wantWatch []string
				for _, p := range walk(actives, i, 1, hasReplica) {
					wantRep = append(wantRep, actives[p].ReplicaAddr)
				}
				if actives[i].ReplicaAddr != "" {
					for _, p := range walk(actives, i, -1, hasReplica) {
						wantFrom = append(wantFrom, actives[p].NodeID)
					}
				}
				for _, p := range walk(actives, i, 1, hasStream) {
					if len(wantWatch) < streamWatchPeers {
						wantWatch = append(wantWatch, actives[p].NodeID)
					}
				}
				var gotWatch []string
				for _, p := range rg.watch(i) {
					gotWatch = append(gotWatch, p.ID)
				}
				if got := rg.replicasOf(i); !slices.Equal(got, wantRep) {
					t.Errorf("n=%d density=%g node %d: replicas %v, want %v", n, density, i, got, wantRep)
				}
				if got := rg.replicaFrom(i); !slices.Equal(got, wantFrom) {
					t.Errorf("n=%d density=%g node %d: replicaFrom %v, want %v", n, density, i, got, wantFrom)
				}
				if !slices.Equal(gotWatch, wantWatch) {
					t.Errorf("n=%d density=%g node %d: watch %v, want %v", n, density, i, gotWatch, wantWatch)
				}
			}
		}
	}
}

// TestClaimDelay: in a job of up to 2 x claimCandidates nodes every node
// claims within the spread; in a larger one about claimCandidates do, the
// others only after the backstop.
func TestClaimDelay(t *testing.T) {
	for _, tc := range []struct {
		nodes  int
		spread time.Duration
		// bounds on how many nodes claim within the spread
		min, max int
	}{
		{nodes: 2, spread: 200 * time.Microsecond, min: 2, max: 2},
		{nodes: 31, spread: 3100 * time.Microsecond, min: 31, max: 31},
		{nodes: 1000, spread: 100 * time.Millisecond, min: 4, max: 40},
		{nodes: 16000, spread: 500 * time.Millisecond, min: 4, max: 40},
	} {
		early := 0
		for i := range tc.nodes {
			d := claimDelay(fmt.Sprintf("node-%05d/1", i), tc.nodes)
			if d <= tc.spread {
				early++
			} else if d < tc.spread+500*time.Millisecond || d > 3*tc.spread+500*time.Millisecond {
				t.Errorf("%d nodes: a backstop delay %v outside [%v, %v]", tc.nodes, d, tc.spread+500*time.Millisecond, 3*tc.spread+500*time.Millisecond)
			}
		}
		if early < tc.min || early > tc.max {
			t.Errorf("%d nodes: %d claim within the spread, want %d-%d", tc.nodes, early, tc.min, tc.max)
		}
	}
}
