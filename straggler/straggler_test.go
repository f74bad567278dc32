package straggler

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"
)

func TestSampler(t *testing.T) {
	demand := map[int]time.Duration{}
	compute := map[int]time.Duration{}
	read := func(lr, pg int) (time.Duration, string, bool) {
		if d, ok := compute[lr]; ok {
			return d, "compute", true
		}
		d, ok := demand[pg]
		return d, "cpu", ok
	}
	s := NewSampler(read)
	t0 := time.Unix(1000, 0)
	demand[10], demand[11] = time.Second, 2*time.Second
	if got := s.Sample(t0, map[int]int{0: 10, 1: 11}); len(got) != 0 {
		t.Fatalf("first sample %v, want none (no interval yet)", got)
	}
	demand[10], demand[11] = time.Second+9*time.Second, 2*time.Second+5*time.Second
	got := s.Sample(t0.Add(10*time.Second), map[int]int{0: 10, 1: 11})
	if math.Abs(got[0].Busy-0.9) > 1e-9 || math.Abs(got[1].Busy-0.5) > 1e-9 || got[0].Source != "cpu" {
		t.Fatalf("busy %v, want 0.9 and 0.5 from cpu", got)
	}
	// A restarted rank (a new process group) starts a new interval, and
	// so does a rank that began reporting compute sections.
	demand[12] = 0
	compute[1] = 3 * time.Second
	got = s.Sample(t0.Add(20*time.Second), map[int]int{0: 12, 1: 11})
	if len(got) != 0 {
		t.Fatalf("busy %v, want none (a new process, a new measure)", got)
	}
	demand[12], compute[1] = 2*time.Second, 7*time.Second
	got = s.Sample(t0.Add(30*time.Second), map[int]int{0: 12, 1: 11})
	if math.Abs(got[0].Busy-0.2) > 1e-9 || math.Abs(got[1].Busy-0.4) > 1e-9 || got[1].Source != "compute" {
		t.Fatalf("busy %v, want 0.2 (cpu) and 0.4 (compute)", got)
	}
}

func sample(node string, at time.Time, busy ...float64) NodeSample {
	s := NodeSample{Node: node, At: at.UnixMilli(), WindowS: 10}
	for i, b := range busy {
		s.Ranks = append(s.Ranks, RankBusy{Rank: i, LocalRank: i, Busy: b})
	}
	return s
}

// feed judges nodes' busy shares every 10 s for n intervals starting at
// t0, and returns the results.
func feed(j *Judge, t0 time.Time, n int, busy map[string][]float64) []Result {
	var out []Result
	for i := range n {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		var ss []NodeSample
		for node, b := range busy {
			ss = append(ss, sample(node, now, b...))
		}
		out = append(out, j.Judge(now, ss))
	}
	return out
}

func TestJudge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	o := Options{Threshold: 0.1, Window: 30 * time.Second, MaxAge: 25 * time.Second}
	slowAt := func(rs []Result, node string) (first, straggler int) {
		first, straggler = -1, -1
		for i, r := range rs {
			n, _ := r.Node(node)
			if n.SlowForS > 0 && first < 0 {
				first = i
			}
			if n.Straggler && straggler < 0 {
				straggler = i
			}
		}
		return first, straggler
	}
	t.Run("equal nodes: never slow", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 10, map[string][]float64{"a": {0.9, 0.88}, "b": {0.86, 0.9}})
		for _, n := range []string{"a", "b"} {
			if f, _ := slowAt(rs, n); f >= 0 {
				t.Fatalf("node %s slow at interval %d", n, f)
			}
		}
	})
	t.Run("a throttled node: slow once half a window is seen, a straggler half a window later", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 8, map[string][]float64{"a": {0.99, 1.0}, "b": {0.41, 0.45}})
		f, s := slowAt(rs, "a")
		if f != 1 || s != 3 { // 2 samples = 20 s >= 15 s; slow for 20 s >= 15 s
			t.Fatalf("slow at interval %d, straggler at %d; want 1 and 3 (%+v)", f, s, rs[3].Nodes)
		}
		if fb, _ := slowAt(rs, "b"); fb >= 0 {
			t.Fatalf("the fast node slow at %d", fb)
		}
	})
	t.Run("samples older than MaxAge still count while the node publishes", func(t *testing.T) {
		rs := feed(NewJudge(Options{Threshold: 0.1, Window: 30 * time.Second, MaxAge: 15 * time.Second}), t0, 8,
			map[string][]float64{"a": {0.99, 1.0}, "b": {0.41, 0.45}})
		if _, s := slowAt(rs, "a"); s != 3 {
			t.Fatalf("straggler at interval %d, want 3", s)
		}
	})
	t.Run("the busiest rank sets a node's pace", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 5, map[string][]float64{"a": {0.5, 0.95}, "b": {0.5, 0.6}, "c": {0.4, 0.6}})
		if f, _ := slowAt(rs, "a"); f < 0 {
			t.Fatalf("node a never slow: %+v", rs[len(rs)-1].Nodes)
		}
	})
	t.Run("a ring asymmetry inside each node is not slowness", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 10, map[string][]float64{"a": {0.8, 1.0}, "b": {0.7, 1.0}})
		for _, n := range []string{"a", "b"} {
			if f, _ := slowAt(rs, n); f >= 0 {
				t.Fatalf("node %s slow at interval %d", n, f)
			}
		}
	})
	t.Run("5% slower is within the threshold", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 10, map[string][]float64{"a": {0.95, 0.95}, "b": {0.9, 0.9}})
		if f, _ := slowAt(rs, "a"); f >= 0 {
			t.Fatalf("slow at %d", f)
		}
	})
	t.Run("idle ranks: nothing judged", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 3, map[string][]float64{"a": {0.04, 0.02}, "b": {0.01, 0.01}})
		if rs[2].Why == "" || len(rs[2].Nodes) != 0 {
			t.Fatalf("result %+v, want nothing judged", rs[2])
		}
	})
	t.Run("one node: nothing judged", func(t *testing.T) {
		rs := feed(NewJudge(o), t0, 3, map[string][]float64{"a": {0.9, 0.5}})
		if rs[2].Why == "" {
			t.Fatalf("result %+v, want a why", rs[2])
		}
	})
	t.Run("noise averages out over the window", func(t *testing.T) {
		// Per-interval speeds swing +-25% (as a loaded 2-core machine's
		// 1 s samples do); the window's average stays near 1.
		j := NewJudge(o)
		for i := range 30 {
			now := t0.Add(time.Duration(i) * 10 * time.Second)
			hi, lo := 1.0, 0.75
			if i%2 == 1 {
				hi, lo = lo, hi
			}
			r := j.Judge(now, []NodeSample{sample("a", now, hi, 0.8), sample("b", now, lo, 0.8)})
			for _, n := range r.Nodes {
				if n.SlowForS > 0 {
					t.Fatalf("interval %d: node %s slow (%+v)", i, n.Node, r.Nodes)
				}
			}
		}
	})
	t.Run("a node that stops publishing is dropped", func(t *testing.T) {
		j := NewJudge(o)
		feed(j, t0, 3, map[string][]float64{"a": {1, 1}, "b": {0.4, 0.4}})
		now := t0.Add(time.Minute)
		r := j.Judge(now, []NodeSample{sample("b", now, 0.4, 0.4)})
		if r.Why == "" {
			t.Fatalf("result %+v: a's stale samples were used", r)
		}
	})
	t.Run("a fast interval after slow ones does not reset a window's average at once", func(t *testing.T) {
		j := NewJudge(o)
		rs := feed(j, t0, 3, map[string][]float64{"a": {1, 1}, "b": {0.4, 0.4}})
		if n, _ := rs[2].Node("a"); n.SlowForS <= 0 {
			t.Fatalf("not slow after 3 intervals: %+v", rs[2].Nodes)
		}
		now := t0.Add(30 * time.Second)
		r := j.Judge(now, []NodeSample{sample("a", now, 0.6, 0.6), sample("b", now, 0.6, 0.6)})
		if n, _ := r.Node("a"); n.SlowForS <= 0 {
			t.Fatalf("one normal interval cleared a window of slowness: %+v", r.Nodes)
		}
	})
}

// TestJudgeSpeeds: the throttled node's speed is the others' busiest
// rank's share over its own (the measurement of the 70% cgroup in
// docs/stragglers.md); a rank's is the others' median over its own.
func TestJudgeSpeeds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	sa := sample("a", t0, 0.99, 1.0)
	r := NewJudge(Options{Threshold: 0.1, Window: time.Minute}).Judge(t0, []NodeSample{sa, sample("b", t0, 0.41, 0.45)})
	a, _ := r.Node("a")
	b, _ := r.Node("b")
	if math.Abs(a.Speed-0.45) > 1e-9 || b.Speed < 2 {
		t.Fatalf("speeds a %.3f b %.3f, want 0.45 and > 2", a.Speed, b.Speed)
	}
	own := NewSmoother(time.Minute)
	own.Add(sa)
	_, ranks, ok := r.For("a", own.At(t0))
	if !ok || len(ranks) != 2 || math.Abs(ranks[0]-0.43/0.99) > 1e-9 {
		t.Fatalf("rank speeds %+v", ranks)
	}
}

// TestPublishedAtScale: at 4,000 nodes the published result lists only
// the slow node and stays small; every other node reads its own standing
// from the job's medians and its own window (For).
func TestPublishedAtScale(t *testing.T) {
	t0 := time.Unix(1000, 0)
	j := NewJudge(Options{Threshold: 0.2, Window: 30 * time.Second})
	var r Result
	own := map[string]*Smoother{}
	for i := range 4 {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		var ss []NodeSample
		for n := range 4000 {
			b := 0.5
			if n == 1234 {
				b = 1.0
			}
			s := sample(fmt.Sprintf("node-%04d", n), now, b, b, b, b, b, b, b, b)
			ss = append(ss, s)
			if own[s.Node] == nil {
				own[s.Node] = NewSmoother(30 * time.Second)
			}
			own[s.Node].Add(s)
		}
		r = j.Judge(now, ss)
	}
	p := r.Published()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Nodes) != 1 || p.Nodes[0].Node != "node-1234" || !p.Nodes[0].Straggler || len(b) > 1024 {
		t.Fatalf("published %d nodes (%s), %d bytes; want only node-1234, a straggler, under 1 KiB", len(p.Nodes), b[:min(len(b), 200)], len(b))
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(30 * time.Second)
	ns, ranks, ok := back.For("node-0007", own["node-0007"].At(now))
	if !ok || math.Abs(ns.Speed-1) > 1e-9 || ns.Straggler || len(ranks) != 8 || math.Abs(ranks[3]-1) > 1e-9 {
		t.Fatalf("node-0007: %+v %v %v, want speed 1 and 8 ranks at 1", ns, ranks, ok)
	}
	ns, _, ok = back.For("node-1234", own["node-1234"].At(now))
	if !ok || !ns.Straggler || math.Abs(ns.Speed-0.5) > 1e-9 {
		t.Fatalf("node-1234: %+v, want the straggler at 0.5", ns)
	}
}

// TestJudgeClockSkew: a node whose clock is an hour off is judged like
// any other (its samples dated when the judge first sees them), and its
// history stays within the window.
func TestJudgeClockSkew(t *testing.T) {
	t0 := time.Unix(100000, 0)
	j := NewJudge(Options{Threshold: 0.2, Window: 30 * time.Second, MaxAge: 25 * time.Second})
	var r Result
	for i := range 10 {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		r = j.Judge(now, []NodeSample{sample("ahead", now.Add(time.Hour), 1, 1), sample("behind", now.Add(-time.Hour), 0.4, 0.4)})
	}
	a, _ := r.Node("ahead")
	if !a.Straggler || len(j.history["ahead"].samples) > 4 {
		t.Fatalf("ahead: %+v with %d samples kept; want a straggler and the window's samples only", a, len(j.history["ahead"].samples))
	}
	// The same sample read again is not counted twice.
	now := t0.Add(100 * time.Second)
	s := sample("ahead", now, 1, 1)
	j.Judge(now, []NodeSample{s})
	n := len(j.history["ahead"].samples)
	j.Judge(now.Add(time.Second), []NodeSample{s})
	if len(j.history["ahead"].samples) > n {
		t.Fatal("a sample read twice was added twice")
	}
}

// TestImplausibleSamples: a sample with a busy share no launcher
// measures (negative, not a number, beyond every thread of a process) is
// left out, so it cannot make a node look slow or fast.
func TestImplausibleSamples(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, b := range []float64{-1, math.NaN(), math.Inf(1), 1e9} {
		m := NewSmoother(time.Minute)
		m.Add(sample("a", t0, 0.5, b))
		if got := m.At(t0); len(got.Ranks) != 0 {
			t.Errorf("busy %v: kept %+v", b, got)
		}
	}
}
