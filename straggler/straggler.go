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
// work). A node's speed compares its busiest rank with the other nodes'
// busiest ranks, averaged over a window (Judge).
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
	// Window: speeds are averaged over the latest Window, and a node slow
	// for half of it is a straggler.
	Window time.Duration
	// MinBusy: the other nodes' busy share below which nothing is judged
	// (ranks that hardly work say nothing about their speed).
	MinBusy float64
	// MaxAge: samples older than this (a node that stopped publishing)
	// are left out.
	MaxAge time.Duration
}

// DefaultMinBusy is Options.MinBusy when none is set.
const DefaultMinBusy = 0.05

// Judge applies the straggler rule job-wide, interval after interval. It
// keeps each node's samples of the latest window, and since when each
// node has been slow.
type Judge struct {
	o         Options
	history   map[string][]NodeSample // by node, oldest first
	slowSince map[string]time.Time
}

// NewJudge returns a Judge with o.
func NewJudge(o Options) *Judge {
	if o.MinBusy <= 0 {
		o.MinBusy = DefaultMinBusy
	}
	return &Judge{o: o, history: map[string][]NodeSample{}, slowSince: map[string]time.Time{}}
}

// RankSpeed is one rank's speed relative to the other nodes' ranks.
type RankSpeed struct {
	Rank  int     `json:"rank"`
	Node  string  `json:"node"`
	Busy  float64 `json:"busy"` // averaged over the window
	Speed float64 `json:"speed"`
}

// NodeSpeed is one node's speed and its standing.
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
	// Why is set when nothing could be judged (one node, idle ranks, too
	// little history).
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

// smoothed is one node's ranks' busy shares averaged over its samples of
// the window (weighted by each sample's span), and the span covered.
type smoothed struct {
	node, host string
	ranks      []RankBusy // Busy averaged
	covered    time.Duration
	max        float64 // its busiest rank's share: the rank the node's pace waits for
}

// Judge adds the latest samples and judges every node at now.
//
// A node's speed compares its busiest rank with the other nodes' busiest
// ranks (the median of theirs over its own): in a synchronous step each
// node's pace is set by the rank that works longest, and comparing like
// with like leaves out what differs between a node's own ranks (a rank
// that waits more by its place in a ring all-reduce). A rank's own speed
// (for the metric and the report) is the other nodes' ranks' median busy
// share over its own.
func (j *Judge) Judge(now time.Time, samples []NodeSample) Result {
	res := Result{At: now.UnixMilli()}
	for _, s := range samples {
		if len(s.Ranks) == 0 {
			continue
		}
		h := j.history[s.Node]
		if n := len(h); n > 0 && h[n-1].At >= s.At {
			continue // the same sample again (published once per interval, read by every judgement)
		}
		j.history[s.Node] = append(h, s)
	}
	var nodes []smoothed
	for node, h := range j.history {
		// Keep the samples that end within the window; a node whose
		// latest sample is older than MaxAge stopped publishing.
		keep := h[:0]
		for _, s := range h {
			if now.Sub(time.UnixMilli(s.At)) <= j.o.Window {
				keep = append(keep, s)
			}
		}
		if len(keep) == 0 || (j.o.MaxAge > 0 && now.Sub(time.UnixMilli(keep[len(keep)-1].At)) > j.o.MaxAge) {
			delete(j.history, node)
			delete(j.slowSince, node)
			continue
		}
		j.history[node] = keep
		nodes = append(nodes, smooth(keep))
	}
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].node < nodes[b].node })
	if len(nodes) < 2 {
		res.Why = "fewer than 2 nodes with fresh samples"
		return res
	}
	for i, n := range nodes {
		var otherMax, otherRanks []float64
		for k, o := range nodes {
			if k == i {
				continue
			}
			otherMax = append(otherMax, o.max)
			for _, r := range o.ranks {
				otherRanks = append(otherRanks, r.Busy)
			}
		}
		ref, refRanks := median(otherMax), median(otherRanks)
		if ref < j.o.MinBusy || n.max <= 0 {
			continue
		}
		for _, r := range n.ranks {
			sp := 1.0
			if r.Busy > 0 {
				sp = refRanks / r.Busy
			}
			res.Ranks = append(res.Ranks, RankSpeed{Rank: r.Rank, Node: n.node, Busy: r.Busy, Speed: sp})
		}
		ns := NodeSpeed{Node: n.node, Host: n.host, Speed: ref / n.max}
		// Judged only on half a window of history: a node that just
		// started (or a new round) has too few samples to be fair.
		if n.covered >= j.o.Window/2 && ns.Speed < 1-j.o.Threshold {
			since, ok := j.slowSince[n.node]
			if !ok {
				since = now
				j.slowSince[n.node] = since
			}
			ns.SlowForS = max(now.Sub(since).Seconds(), 0.001)
			ns.Straggler = now.Sub(since) >= j.o.Window/2
		} else {
			delete(j.slowSince, n.node)
		}
		res.Nodes = append(res.Nodes, ns)
	}
	if len(res.Nodes) == 0 {
		res.Why = "the ranks hardly work (busy below " + ftoa(j.o.MinBusy) + ")"
	}
	sort.Slice(res.Ranks, func(a, b int) bool {
		x, y := res.Ranks[a], res.Ranks[b]
		return x.Rank < y.Rank || (x.Rank == y.Rank && x.Node < y.Node)
	})
	return res
}

// smooth averages a node's samples, each weighted by its span.
func smooth(h []NodeSample) smoothed {
	last := h[len(h)-1]
	out := smoothed{node: last.Node, host: last.Host}
	sum, wsum := map[int]float64{}, map[int]float64{}
	local := map[int]int{}
	var covered float64
	for _, s := range h {
		w := max(s.WindowS, 1e-3)
		covered += w
		for _, r := range s.Ranks {
			sum[r.Rank] += r.Busy * w
			wsum[r.Rank] += w
			local[r.Rank] = r.LocalRank
		}
	}
	for _, r := range last.Ranks { // the node's ranks now
		b := sum[r.Rank] / wsum[r.Rank]
		out.ranks = append(out.ranks, RankBusy{Rank: r.Rank, LocalRank: local[r.Rank], Busy: b})
		out.max = max(out.max, b)
	}
	out.covered = time.Duration(covered * float64(time.Second))
	return out
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
