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
	// Source is what Busy was measured from: "cpu" (the CPU its process
	// group demanded) or "compute" (the time in its "compute" sections).
	Source string `json:"source,omitempty"`
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

// Reader reads a rank's cumulative busy time: the time inside its
// "compute" sections where the client reports them (source "compute"),
// else the CPU its process group demanded (source "cpu").
type Reader func(localRank, pgid int) (d time.Duration, source string, ok bool)

// CPUReader is a Reader of CPU demand alone (demand: procfs.GroupDemand).
func CPUReader(demand func(pgid int) (time.Duration, bool)) Reader {
	return func(_, pgid int) (time.Duration, string, bool) {
		d, ok := demand(pgid)
		return d, "cpu", ok
	}
}

// Sampler turns a node's ranks' cumulative busy time into busy shares
// over the time between two samples.
type Sampler struct {
	read Reader
	last map[int]point // by local rank
}

type point struct {
	pgid   int
	source string
	at     time.Time
	busy   time.Duration
}

// NewSampler reads each rank's busy time with read.
func NewSampler(read Reader) *Sampler {
	return &Sampler{read: read, last: map[int]point{}}
}

// Sample reads every rank's busy time now and returns, for each rank
// seen at the previous sample with the same process group and source,
// its busy share since then. pgids maps local rank to its process group.
func (s *Sampler) Sample(now time.Time, pgids map[int]int) map[int]RankBusy {
	out := map[int]RankBusy{}
	next := map[int]point{}
	for lr, pg := range pgids {
		d, src, ok := s.read(lr, pg)
		if !ok {
			continue
		}
		p := point{pgid: pg, source: src, at: now, busy: d}
		next[lr] = p
		prev, seen := s.last[lr]
		if !seen || prev.pgid != pg || prev.source != src || !now.After(prev.at) || d < prev.busy {
			continue // a new process, or a new measure: no interval yet
		}
		out[lr] = RankBusy{LocalRank: lr, Busy: float64(d-prev.busy) / float64(now.Sub(prev.at)), Source: src}
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
	history   map[string]*Smoother
	seen      map[string]int64 // each node's latest sample, by its own clock
	slowSince map[string]time.Time
}

// NewJudge returns a Judge with o.
func NewJudge(o Options) *Judge {
	if o.MinBusy <= 0 {
		o.MinBusy = DefaultMinBusy
	}
	return &Judge{o: o, history: map[string]*Smoother{}, seen: map[string]int64{}, slowSince: map[string]time.Time{}}
}

// NodeSpeed is one node's speed and its standing.
type NodeSpeed struct {
	Node  string  `json:"node"`
	Host  string  `json:"host,omitempty"`
	Speed float64 `json:"speed"`
	// SlowForS is how long the node has been slow (0: it is not).
	SlowForS  float64 `json:"slow_for_s,omitempty"`
	Straggler bool    `json:"straggler,omitempty"`
	// RankRef is the other nodes' ranks' median busy share: the node's
	// ranks' speeds are it over their own.
	RankRef float64 `json:"rank_ref"`
}

// Result is one interval's job-wide judgement.
type Result struct {
	At int64 `json:"at"`
	// Nodes are the judged nodes; in a published result with more than
	// MaxPublishedNodes, only the slow ones (the others read their
	// standing from MaxRef and RankRef: For).
	Nodes []NodeSpeed `json:"nodes"`
	// Judged is how many nodes were judged; MaxRef the median of their
	// busiest ranks' shares and RankRef of all their ranks' shares.
	Judged  int     `json:"judged"`
	MaxRef  float64 `json:"max_ref"`
	RankRef float64 `json:"rank_ref"`
	// Why is set when nothing could be judged (one node, idle ranks, too
	// little history).
	Why string `json:"why,omitempty"`
}

// MaxPublishedNodes bounds the nodes a published result lists in full:
// every node reads the result each interval, so at 4,000 nodes it holds
// the slow ones only and stays a few hundred bytes.
const MaxPublishedNodes = 64

// Published is r as it goes to every node: with only the slow nodes when
// there are more than MaxPublishedNodes.
func (r Result) Published() Result {
	p := r
	if len(r.Nodes) > MaxPublishedNodes {
		p.Nodes = nil
		for _, n := range r.Nodes {
			if n.SlowForS > 0 {
				p.Nodes = append(p.Nodes, n)
			}
		}
	}
	return p
}

// For is node's standing in the published r, and its ranks' speeds by
// rank, from its own window-averaged ranks (own: the node's Smoother).
// A node the result does not list (a large job's node that is not slow)
// compares itself with the job's medians, which differ from the other
// nodes' by one node in thousands.
func (r Result) For(node string, own Smoothed) (NodeSpeed, map[int]float64, bool) {
	if r.Why != "" || r.Judged == 0 || len(own.Ranks) == 0 {
		return NodeSpeed{Node: node, Speed: -1}, nil, false
	}
	ns, ok := r.Node(node)
	if !ok {
		if own.Max <= 0 {
			return NodeSpeed{Node: node, Speed: -1}, nil, false
		}
		ns = NodeSpeed{Node: node, Speed: r.MaxRef / own.Max, RankRef: r.RankRef}
	}
	speeds := map[int]float64{}
	for _, rb := range own.Ranks {
		if rb.Busy > 0 {
			speeds[rb.Rank] = ns.RankRef / rb.Busy
		}
	}
	return ns, speeds, true
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

// Smoother keeps one node's samples of the latest window and averages
// them, each weighted by its span.
type Smoother struct {
	window  time.Duration
	samples []NodeSample // oldest first
}

// NewSmoother averages over window.
func NewSmoother(window time.Duration) *Smoother { return &Smoother{window: window} }

// Add adds s (a sample not newer than the latest is ignored: the same
// one read again).
func (m *Smoother) Add(s NodeSample) {
	if n := len(m.samples); len(s.Ranks) == 0 || (n > 0 && m.samples[n-1].At >= s.At) || !plausible(s) {
		return
	}
	m.samples = append(m.samples, s)
}

// maxBusy bounds a believable busy share: a rank's threads demanding the
// CPU together (a sample claiming more, or a negative or non-number one,
// is not one a launcher measured).
const maxBusy = 4096

// plausible reports whether every busy share and the span of s are
// numbers a launcher could have measured: samples come from etcd.
func plausible(s NodeSample) bool {
	if !(s.WindowS >= 0 && s.WindowS < 1e7) {
		return false
	}
	for _, r := range s.Ranks {
		if !(r.Busy >= 0 && r.Busy <= maxBusy) { // false for NaN too
			return false
		}
	}
	return true
}

// Smoothed is a node's ranks' busy shares averaged over the window.
type Smoothed struct {
	Node, Host string
	Ranks      []RankBusy // the node's ranks now, Busy averaged
	Covered    time.Duration
	Max        float64 // its busiest rank's share: the rank the node's pace waits for
	LatestAt   int64
}

// At drops the samples older than the window at now and averages the
// rest (an empty Smoothed when none is left).
func (m *Smoother) At(now time.Time) Smoothed {
	keep := m.samples[:0]
	for _, s := range m.samples {
		if now.Sub(time.UnixMilli(s.At)) <= m.window {
			keep = append(keep, s)
		}
	}
	m.samples = keep
	if len(keep) == 0 {
		return Smoothed{}
	}
	last := keep[len(keep)-1]
	out := Smoothed{Node: last.Node, Host: last.Host, LatestAt: last.At}
	sum, wsum := map[int]float64{}, map[int]float64{}
	var covered float64
	for _, s := range keep {
		w := max(s.WindowS, 1e-3)
		covered += w
		for _, r := range s.Ranks {
			sum[r.Rank] += r.Busy * w
			wsum[r.Rank] += w
		}
	}
	for _, r := range last.Ranks { // the node's ranks now
		b := sum[r.Rank] / wsum[r.Rank]
		out.Ranks = append(out.Ranks, RankBusy{Rank: r.Rank, LocalRank: r.LocalRank, Busy: b})
		out.Max = max(out.Max, b)
	}
	out.Covered = time.Duration(covered * float64(time.Second))
	return out
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
		m, ok := j.history[s.Node]
		if !ok {
			m = NewSmoother(j.o.Window)
			j.history[s.Node] = m
		}
		// A new sample is dated when the judge first sees it, by the
		// judge's clock: another node's clock may be off by more than a
		// window, which would keep its samples for ever or never.
		if s.At == j.seen[s.Node] {
			continue
		}
		j.seen[s.Node] = s.At
		s.At = now.UnixMilli()
		m.Add(s)
	}
	var nodes []Smoothed
	for node, m := range j.history {
		sm := m.At(now)
		// A node whose latest sample is older than MaxAge stopped
		// publishing (it left, or its launcher is stuck).
		if len(sm.Ranks) == 0 || (j.o.MaxAge > 0 && now.Sub(time.UnixMilli(sm.LatestAt)) > j.o.MaxAge) {
			delete(j.history, node)
			delete(j.seen, node)
			delete(j.slowSince, node)
			continue
		}
		nodes = append(nodes, sm)
	}
	sort.Slice(nodes, func(a, b int) bool { return nodes[a].Node < nodes[b].Node })
	if len(nodes) < 2 {
		res.Why = "fewer than 2 nodes with fresh samples"
		return res
	}
	// Medians over all nodes, and over all but each node (the node's own
	// reference): with many nodes, the median without one is the
	// median's neighbour in the sorted list.
	maxes := make([]float64, 0, len(nodes))
	var all []float64
	for _, n := range nodes {
		maxes = append(maxes, n.Max)
		for _, r := range n.Ranks {
			all = append(all, r.Busy)
		}
	}
	sortedMax, sortedAll := slices.Sorted(slices.Values(maxes)), slices.Sorted(slices.Values(all))
	res.MaxRef, res.RankRef = medianSorted(sortedMax), medianSorted(sortedAll)
	for _, n := range nodes {
		ref, refRanks := res.MaxRef, res.RankRef
		if len(nodes) <= MaxPublishedNodes {
			// Few nodes: the others' medians, exactly (with 2 nodes the
			// other node is the whole reference).
			own := make([]float64, 0, len(n.Ranks))
			for _, r := range n.Ranks {
				own = append(own, r.Busy)
			}
			ref, refRanks = medianWithout(sortedMax, []float64{n.Max}), medianWithout(sortedAll, own)
		}
		if ref < j.o.MinBusy || n.Max <= 0 {
			continue
		}
		res.Judged++
		ns := NodeSpeed{Node: n.Node, Host: n.Host, Speed: ref / n.Max, RankRef: refRanks}
		// Judged only on half a window of history: a node that just
		// started (or a new round) has too few samples to be fair.
		if n.Covered >= j.o.Window/2 && ns.Speed < 1-j.o.Threshold {
			since, ok := j.slowSince[n.Node]
			if !ok {
				since = now
				j.slowSince[n.Node] = since
			}
			ns.SlowForS = max(now.Sub(since).Seconds(), 0.001)
			ns.Straggler = now.Sub(since) >= j.o.Window/2
		} else {
			delete(j.slowSince, n.Node)
		}
		res.Nodes = append(res.Nodes, ns)
	}
	if len(res.Nodes) == 0 {
		res.Why = "the ranks hardly work (busy below " + ftoa(j.o.MinBusy) + ")"
	}
	return res
}

// medianSorted is the median of sorted xs (0 for none).
func medianSorted(xs []float64) float64 {
	n := len(xs)
	if n == 0 {
		return 0
	}
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// medianWithout is the median of sorted xs less one occurrence of each of
// drop: O(len(xs)), used for jobs of at most MaxPublishedNodes nodes
// (larger ones use the job's medians: one node in thousands moves them by
// at most one place).
func medianWithout(sorted, drop []float64) float64 {
	if len(drop) == 0 {
		return medianSorted(sorted)
	}
	d := slices.Sorted(slices.Values(drop))
	rest := make([]float64, 0, len(sorted))
	i := 0
	for _, x := range sorted {
		if i < len(d) && x == d[i] {
			i++
			continue
		}
		rest = append(rest, x)
	}
	return medianSorted(rest)
}

func ftoa(f float64) string { return strconv.FormatFloat(f, 'g', 3, 64) }
