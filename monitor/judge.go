package monitor

import (
	"context"
	"slices"
	"time"

	"github.com/ftlauncher/ft-launcher/pytrace"
	"github.com/ftlauncher/ft-launcher/stacks"
)

// StackCollector takes the stacks of a node's ranks (*stacks.Collector).
type StackCollector interface {
	Collect(ctx context.Context, pids map[int]int, bound time.Duration) []stacks.Rank
}

// Judgement is what the stacks said about the first hang of a cycle: the
// stacks of every local rank, taken before any was killed, and which
// rank hung (stacks.Judge).
type Judgement struct {
	Cycle   int
	Ranks   []stacks.Rank    // every local rank's stacks, by local rank
	Summary []stacks.Summary // the same, read
	Job     []stacks.Summary // every node's that came in time (Summary alone without an exchange)
	Finding stacks.Finding
	Took    time.Duration // from the first expiry to the finding
}

// judgement is a cycle's Judgement while it is made: the first expired
// clock of the cycle makes it, later ones in the same cycle wait for it.
type judgement struct {
	cycle int
	done  chan struct{}
	j     Judgement
	start int64 // mono time the judgement began: a heartbeat after it means progress
}

// StackExchange shares this node's summaries of a hang with the job's
// other nodes and returns every node's (this one's included), within
// wait: rendezvous.Etcd.ShareStacks, with JSON around it.
type StackExchange func(ctx context.Context, cycle int, mine []stacks.Summary, wait time.Duration) []stacks.Summary

// SetStackExchange makes the judgement of a hang job-wide: each node
// judges every node's stacks (set once the rendezvous is up; nil: this
// node's alone).
func (m *Manager) SetStackExchange(x StackExchange) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.exchange = x
}

// judging reports whether expired clocks are judged from the stacks.
func (m *Manager) judging() bool { return m.opts.Stacks != nil }

// expired is a rank's clock running out when stacks are collected: the
// stacks of every local rank are taken (once per cycle), the hang judged,
// and then the culprit is killed. The rank whose clock expired is killed
// too when the evidence does not single a culprit out (the first silent
// rank is then named) or it is the culprit; a rank that waits in a
// collective for a culprit found on this node is left alone: its clocks
// start again from now, and the culprit's death ends its wait (the crash
// path: an in-process restart keeps it).
func (m *Manager) expired(r *rankMon, h Hang, _ int) {
	m.goTracked(func() {
		j, first := m.judge(h)
		if first {
			m.killCulprits(j, r)
		}
		culprit := slices.Contains(j.Finding.Culprits, m.globalOf(r, j))
		if j.Finding.Known && !culprit && r.spare(h) {
			return
		}
		if hh, pid, ok := r.confirmHang(h, &j, false, m.judgeStart(h.Cycle)); ok {
			m.terminate(hh, pid)
		}
	})
}

// judge returns the cycle's judgement, making it when h is the first
// expiry of its cycle (first).
func (m *Manager) judge(h Hang) (Judgement, bool) {
	m.mu.Lock()
	if jd := m.judged; jd != nil && jd.cycle == h.Cycle {
		m.mu.Unlock()
		select {
		case <-jd.done:
		case <-m.ctx.Done():
		}
		return jd.j, false
	}
	jd := &judgement{cycle: h.Cycle, done: make(chan struct{}), start: m.mono()}
	m.judged = jd
	pids := make(map[int]int, len(m.pids))
	for lr, pid := range m.pids {
		if pid > 0 {
			pids[lr] = pid
		}
	}
	exchange := m.exchange
	m.mu.Unlock()
	defer close(jd.done)

	began := time.Now()
	bound := m.opts.StacksBound
	if bound <= 0 {
		bound = stacks.DefaultBound
	}
	ranks := m.opts.Stacks.Collect(m.ctx, pids, bound/2)
	base := m.rankBase()
	sums := make([]stacks.Summary, 0, len(ranks))
	for _, sr := range ranks {
		s := stacks.Summarize(sr, base+sr.LocalRank)
		if sr.LocalRank >= 0 && sr.LocalRank < len(m.ranks) {
			s.Expired, s.Silent, s.MarginMS = m.ranks[sr.LocalRank].silence()
		}
		sums = append(sums, s)
	}
	all := sums
	if exchange != nil {
		all = exchange(m.ctx, h.Cycle, sums, max(bound-time.Since(began), 0))
	}
	jd.j = Judgement{Cycle: h.Cycle, Ranks: ranks, Summary: sums, Job: all, Finding: stacks.Judge(all), Took: time.Since(began)}
	m.log.Warn("rank hang: stacks taken", "cycle", h.Cycle, "expired_local_rank", h.LocalRank,
		"finding", jd.j.Finding.Text, "known", jd.j.Finding.Known, "took", jd.j.Took)
	return jd.j, true
}

func (m *Manager) judgeStart(cycle int) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.judged != nil && m.judged.cycle == cycle {
		return m.judged.start
	}
	return 0
}

// rankBase is the global rank of local rank 0 as the ranks' sessions told
// it (global ranks are contiguous on a node); 0 when none told it.
func (m *Manager) rankBase() int {
	for i, r := range m.ranks {
		r.mu.Lock()
		g := r.globalRank
		r.mu.Unlock()
		if g >= 0 {
			return g - i
		}
	}
	return 0
}

func (m *Manager) globalOf(r *rankMon, j Judgement) int {
	for _, s := range j.Summary {
		if s.LocalRank == r.local {
			return s.Rank
		}
	}
	return -1
}

// Judged returns cycle's hang judgement once it is made.
func (m *Manager) Judged(cycle int) (*Judgement, bool) {
	m.mu.Lock()
	jd := m.judged
	m.mu.Unlock()
	if jd == nil || jd.cycle != cycle {
		return nil, false
	}
	select {
	case <-jd.done:
		j := jd.j
		return &j, true
	default:
		return nil, false
	}
}

// waiting reports whether local rank lr waits for the culprit of
// cycle's hang: the stacks found it in a collective and named another
// rank (Silence.Waiting).
func (m *Manager) waiting(cycle, lr int) bool {
	m.mu.Lock()
	jd := m.judged
	m.mu.Unlock()
	if jd == nil || jd.cycle != cycle {
		return false
	}
	select {
	case <-jd.done:
	default:
		return false
	}
	if !jd.j.Finding.Known {
		return false
	}
	for _, s := range jd.j.Summary {
		if s.LocalRank == lr {
			return s.State == stacks.StateDumped && s.Activity == pytrace.ActCollective && !slices.Contains(jd.j.Finding.Culprits, s.Rank)
		}
	}
	return false
}

// killCulprits kills the culprits found on this node other than expired
// (whose own expiry kills it): their clocks may not have run out yet.
func (m *Manager) killCulprits(j Judgement, expired *rankMon) {
	if !j.Finding.Known {
		return
	}
	for _, s := range j.Summary {
		if !slices.Contains(j.Finding.Culprits, s.Rank) || s.LocalRank == expired.local {
			continue
		}
		r := m.ranks[s.LocalRank]
		if h, pid, ok := r.confirmHang(r.hangNow(), &j, true, m.judgeStart(j.Cycle)); ok {
			m.goTracked(func() { m.terminate(h, pid) })
		}
	}
}
