package straggler

import (
	"math"
	"testing"
	"time"
)

func TestSampler(t *testing.T) {
	demand := map[int]time.Duration{}
	s := NewSampler(func(pg int) (time.Duration, bool) { d, ok := demand[pg]; return d, ok })
	t0 := time.Unix(1000, 0)
	demand[10], demand[11] = time.Second, 2*time.Second
	if got := s.Sample(t0, map[int]int{0: 10, 1: 11}); len(got) != 0 {
		t.Fatalf("first sample %v, want none (no interval yet)", got)
	}
	demand[10], demand[11] = time.Second+9*time.Second, 2*time.Second+5*time.Second
	got := s.Sample(t0.Add(10*time.Second), map[int]int{0: 10, 1: 11})
	if math.Abs(got[0]-0.9) > 1e-9 || math.Abs(got[1]-0.5) > 1e-9 {
		t.Fatalf("busy %v, want 0.9 and 0.5", got)
	}
	// A restarted rank (a new process group) starts a new interval.
	demand[12] = 0
	got = s.Sample(t0.Add(20*time.Second), map[int]int{0: 12, 1: 11})
	if _, ok := got[0]; ok || len(got) != 1 {
		t.Fatalf("busy %v, want only local rank 1", got)
	}
}

func sample(node string, at time.Time, busy ...float64) NodeSample {
	s := NodeSample{Node: node, At: at.UnixMilli(), WindowS: 10}
	for i, b := range busy {
		s.Ranks = append(s.Ranks, RankBusy{Rank: i, LocalRank: i, Busy: b})
	}
	return s
}

func TestJudge(t *testing.T) {
	t0 := time.Unix(1000, 0)
	o := Options{Threshold: 0.1, Window: 30 * time.Second, MaxAge: 25 * time.Second}
	type step struct {
		samples   []NodeSample
		straggler string // "" none
		slow      []string
		why       bool
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{name: "equal nodes", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.9, 0.88), sample("b", t0, 0.86, 0.9)}},
		}},
		{name: "a throttled node: slow at once, a straggler after the window", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.99, 1.0), sample("b", t0, 0.41, 0.45)}, slow: []string{"a"}},
			{samples: []NodeSample{sample("a", t0.Add(10*time.Second), 0.99, 1.0), sample("b", t0.Add(10*time.Second), 0.41, 0.45)}, slow: []string{"a"}},
			{samples: []NodeSample{sample("a", t0.Add(20*time.Second), 0.99, 1.0), sample("b", t0.Add(20*time.Second), 0.41, 0.45)}, slow: []string{"a"}, straggler: "a"},
		}},
		{name: "one fast interval resets the count", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.99, 1.0), sample("b", t0, 0.41, 0.45)}, slow: []string{"a"}},
			{samples: []NodeSample{sample("a", t0.Add(10*time.Second), 0.9, 0.9), sample("b", t0.Add(10*time.Second), 0.9, 0.9)}},
			{samples: []NodeSample{sample("a", t0.Add(20*time.Second), 0.99, 1.0), sample("b", t0.Add(20*time.Second), 0.41, 0.45)}, slow: []string{"a"}},
		}},
		{name: "one slow rank makes its node slow", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.5, 0.95), sample("b", t0, 0.5, 0.5), sample("c", t0, 0.5, 0.5)}, slow: []string{"a"}},
		}},
		{name: "5% slower is within the threshold", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.95, 0.95), sample("b", t0, 0.9, 0.9)}},
		}},
		{name: "idle ranks: nothing judged", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.04, 0.02), sample("b", t0, 0.01, 0.01)}, why: true},
		}},
		{name: "one node: nothing judged", steps: []step{
			{samples: []NodeSample{sample("a", t0, 0.9, 0.5)}, why: true},
		}},
		{name: "a stale sample is left out", steps: []step{
			{samples: []NodeSample{sample("a", t0.Add(-time.Minute), 1, 1), sample("b", t0, 0.4, 0.4)}, why: true},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			j := NewJudge(o)
			for i, st := range tc.steps {
				now := t0.Add(time.Duration(i) * 10 * time.Second)
				r := j.Judge(now, st.samples)
				if (r.Why != "") != st.why {
					t.Fatalf("step %d: why %q, want set: %v", i, r.Why, st.why)
				}
				var slow []string
				straggler := ""
				for _, n := range r.Nodes {
					if n.SlowForS > 0 {
						slow = append(slow, n.Node)
					}
					if n.Straggler {
						straggler = n.Node
					}
				}
				if len(slow) != len(st.slow) || (len(slow) > 0 && slow[0] != st.slow[0]) || straggler != st.straggler {
					t.Fatalf("step %d: slow %v straggler %q, want %v %q (%+v)", i, slow, straggler, st.slow, st.straggler, r.Nodes)
				}
			}
		})
	}
}

// TestJudgeSpeeds: the throttled node's speed is the others' busy share
// over its own (the measurement of the 70% cgroup in docs/stragglers.md).
func TestJudgeSpeeds(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := NewJudge(Options{Threshold: 0.1, Window: time.Minute}).Judge(t0, []NodeSample{sample("a", t0, 0.99, 1.0), sample("b", t0, 0.41, 0.45)})
	a, _ := r.Node("a")
	b, _ := r.Node("b")
	if math.Abs(a.Speed-0.43/1.0) > 1e-9 || b.Speed < 2 {
		t.Fatalf("speeds a %.3f b %.3f, want 0.43 and > 2", a.Speed, b.Speed)
	}
	if len(r.Ranks) != 4 {
		t.Fatalf("rank speeds %+v", r.Ranks)
	}
}
