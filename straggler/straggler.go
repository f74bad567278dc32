// Package straggler measures how fast each rank works, from what the
// launcher can see without any change to the training script, and finds
// the node that holds a synchronous job back (docs/stragglers.md).
//
// A rank's busy share is the fraction of wall time its process group
// demanded a CPU: running, or runnable and waiting (the run queue, or a
// cgroup's CPU quota), read from each thread's schedstat. A rank waiting
// for its peers in a collective sleeps and demands nothing, so in
// data-parallel training, where every rank does the same work per step at
// the same pace, the slow rank is the one whose work fills its time while
// the others wait for it: its busy share is the highest. A rank's speed is
// the median busy share of the other nodes' ranks divided by its own (1:
// as fast as they are; 0.7: it needs 1/0.7 of their time for the same
// work); a node's speed is its slowest rank's.
package straggler

import (
	"slices"
	"sort"
	"strconv"
	"time"
)

// RankBusy is one rank's busy share over a node's latest sample.
type RankBusy struct {
	Rank      int     `json:"rank"`
	LocalRank int     `json:"local_rank"`
	Busy      float64 `json:"busy"`
}

// NodeSample is what a node publishes each interval: its ranks' busy
// shares over the interval that ended at At (Unix milliseconds).
type NodeSample struct {
	Node    string     `json:"node"`
	Host    string     `json:"host,omitempty"`
	At      int64      `json:"at"`
	WindowS float64    `json:"window_s"`
	Ranks   []RankBusy `json:"ranks"`
}

// Sampler turns a node's ranks' cumulative CPU demand into busy shares
// over the time between two samples.
type Sampler struct {
	demand func(pgid int) (time.Duration, bool)
	last   map[int]point // by local rank
}

type point struct {
	pgid   int
	at     time.Time
	demand time.Duration
}

// NewSampler reads demand with demand (procfs.GroupDemand on Linux).
func NewSampler(demand func(pgid int) (time.Duration, bool)) *Sampler {
	return &Sampler{demand: demand, last: map[int]point{}}
}

// Sample reads every rank's demand now and returns, for each rank seen at
// the previous sample with the same process group, its busy share since
// then. pgids maps local rank to its process group.
func (s *Sampler) Sample(now time.Time, pgids map[int]int) map[int]float64 {
	out := map[int]float64{}
	next := map[int]point{}
	for lr, pg := range pgids {
		d, ok := s.demand(pg)
		if !ok {
			continue
		}
		p := point{pgid: pg, at: now, demand: d}
		next[lr] = p
		prev, seen := s.last[lr]
		if !seen || prev.pgid != pg || !now.After(prev.at) || d < prev.demand {
			continue // a new process: no interval yet
		}
		out[lr] = float64(d-prev.demand) / float64(now.Sub(prev.at))
	}
	s.last = next
	return out
}

// Options are the straggler rule's parameters.
type Options struct {
	// Threshold: a node is slow while its speed is below 1 - Threshold.
	Threshold float64
	// Window: a node slow for at least this long is a straggler.
	Window time.Duration
	// MinBusy: the other nodes' median busy share below which nothing is
	// judged (ranks that hardly work say nothing about their speed).
	MinBusy float64
	// MaxAge: samples older than this (a node that stopped publishing)
	// are left out.
	MaxAge time.Duration
}

// DefaultMinBusy is Options.MinBusy when none is set.
const DefaultMinBusy = 0.05

// Judge applies the straggler rule job-wide, interval after interval;
// it remembers since when each node has been slow.
type Judge struct {
	o         Options
	slowSince map[string]time.Time
}

// NewJudge returns a Judge with o.
func NewJudge(o Options) *Judge {
	if o.MinBusy <= 0 {
		o.MinBusy = DefaultMinBusy
	}
	return &Judge{o: o, slowSince: map[string]time.Time{}}
}

// RankSpeed is one rank's speed relative to the other nodes' ranks.
type RankSpeed struct {
	Rank  int     `json:"rank"`
	Node  string  `json:"node"`
	Busy  float64 `json:"busy"`
	Speed float64 `json:"speed"`
}

// NodeSpeed is one node's speed (its slowest rank's) and its standing.
type NodeSpeed struct {
	Node  string  `json:"node"`
	Host  string  `json:"host,omitempty"`
	Speed float64 `json:"speed"`
	// SlowForS is how long the node has been slow (0: it is not).
	SlowForS  float64 `json:"slow_for_s,omitempty"`
	Straggler bool    `json:"straggler,omitempty"`
}

// Result is one interval's job-wide judgement.
type Result struct {
	At    int64       `json:"at"`
	Ranks []RankSpeed `json:"ranks"`
	Nodes []NodeSpeed `json:"nodes"`
	// Why is set when nothing could be judged (one node, idle ranks).
	Why string `json:"why,omitempty"`
}

// Stragglers are the nodes r names as stragglers.
func (r Result) Stragglers() []NodeSpeed {
	var out []NodeSpeed
	for _, n := range r.Nodes {
		if n.Straggler {
			out = append(out, n)
		}
	}
	return out
}

// Node returns node's entry, if r has one.
func (r Result) Node(node string) (NodeSpeed, bool) {
	for _, n := range r.Nodes {
		if n.Node == node {
			return n, true
		}
	}
	return NodeSpeed{}, false
}

// Judge judges the latest samples of every node at now.
func (j *Judge) Judge(now time.Time, samples []NodeSample) Result {
	res := Result{At: now.UnixMilli()}
	var fresh []NodeSample
	for _, s := range samples {
		if len(s.Ranks) == 0 || (j.o.MaxAge > 0 && now.Sub(time.UnixMilli(s.At)) > j.o.MaxAge) {
			continue
		}
		fresh = append(fresh, s)
	}
	sort.Slice(fresh, func(a, b int) bool { return fresh[a].Node < fresh[b].Node })
	if len(fresh) < 2 {
		res.Why = "fewer than 2 nodes with fresh samples"
		j.slowSince = map[string]time.Time{}
		return res
	}
	seen := map[string]bool{}
	for _, s := range fresh {
		others := make([]float64, 0, 8)
		for _, o := range fresh {
			if o.Node == s.Node {
				continue
			}
			for _, r := range o.Ranks {
				others = append(others, r.Busy)
			}
		}
		ref := median(others)
		if ref < j.o.MinBusy {
			continue
		}
		ns := NodeSpeed{Node: s.Node, Host: s.Host, Speed: -1}
		for _, r := range s.Ranks {
			sp := 1.0
			if r.Busy > 0 {
				sp = ref / r.Busy
			}
			res.Ranks = append(res.Ranks, RankSpeed{Rank: r.Rank, Node: s.Node, Busy: r.Busy, Speed: sp})
			if ns.Speed < 0 || sp < ns.Speed {
				ns.Speed = sp
			}
		}
		seen[s.Node] = true
		if ns.Speed < 1-j.o.Threshold {
			since, ok := j.slowSince[s.Node]
			if !ok {
				// Slow since the start of the interval that showed it.
				since = time.UnixMilli(s.At).Add(-time.Duration(s.WindowS * float64(time.Second)))
				j.slowSince[s.Node] = since
			}
			ns.SlowForS = now.Sub(since).Seconds()
			ns.Straggler = now.Sub(since) >= j.o.Window
		} else {
			delete(j.slowSince, s.Node)
		}
		res.Nodes = append(res.Nodes, ns)
	}
	for n := range j.slowSince {
		if !seen[n] {
			delete(j.slowSince, n)
		}
	}
	if len(res.Nodes) == 0 {
		res.Why = "the ranks hardly work (busy below " + ftoa(j.o.MinBusy) + ")"
	}
	sort.Slice(res.Ranks, func(a, b int) bool { return res.Ranks[a].Rank < res.Ranks[b].Rank })
	return res
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', 3, 64) }
