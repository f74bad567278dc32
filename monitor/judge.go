package monitor

import (
	"context"
	"slices"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
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
	// Dismissed: a default clock expired, but the rank the finding names
	// is busy or in a slow phase (Phase): no hang (stacks.Dismiss).
	Dismissed string
	Phase     bool
	// Partial: some nodes' stacks did not come within the bound (their
	// clocks had not run out yet, or they are cut off).
	Partial bool
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
// other nodes and returns every node's of this judgement (this one's
// included; those left from an earlier judgement of the round are not),
// within wait: rendezvous.Etcd.ShareStacks, with JSON around it.
// complete: every node's came in time.
type StackExchange func(ctx context.Context, cycle int, mine []stacks.Summary, wait time.Duration) (all []stacks.Summary, complete bool)

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
		if j.Dismissed != "" {
			if first {
				m.dismiss(j, h)
			}
			r.judged()
			return
		}
		if first {
			m.killCulprits(j, r)
		}
		culprit := slices.Contains(j.Finding.Culprits, m.globalOf(r, j))
		if j.Finding.Known && !culprit && r.spare(h) {
			return
		}
		// Every rank here waits in a collective and some node's stacks are
		// missing: the rank they wait for is most likely there, found when
		// that node's clocks run out. Left alone once; if the wait goes
		// on, the first silent rank is killed as without stacks.
		if !j.Finding.Known && j.Partial && allWaiting(j.Summary) && r.spare(h) {
			return
		}
		if hh, pid, ok := r.confirmHang(h, &j, false, m.judgeStart(h.Cycle)); ok {
			m.terminate(hh, pid)
		}
	})
}

// stacksBound bounds the taking and sharing of the stacks of one judgement.
func (m *Manager) stacksBound() time.Duration {
	if m.opts.StacksBound > 0 {
		return m.opts.StacksBound
	}
	return stacks.DefaultBound
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
	bound := m.stacksBound()
	// A default clock is only the launcher's guess: the ranks' activity
	// over a short window decides with the stacks (Dismiss).
	var base0 map[int]activity
	if h.DefaultTimeout {
		base0 = groupActivity(pids)
	}
	ranks := m.opts.Stacks.Collect(m.ctx, pids, bound/2)
	busy := map[int]bool{}
	if h.DefaultTimeout {
		select {
		case <-time.After(time.Until(began.Add(judgedActivityWindow))):
		case <-m.ctx.Done():
		}
		window := time.Since(began)
		for lr, a := range groupActivity(pids) {
			b, ok := base0[lr]
			busy[lr] = ok && (a.demand-b.demand >= window/10 || a.IOBytes-b.IOBytes >= judgedActivityIO)
		}
	}
	rankBase := m.rankBase()
	at := time.Now().UnixMilli()
	sums := make([]stacks.Summary, 0, len(ranks))
	for _, sr := range ranks {
		s := stacks.Summarize(sr, rankBase+sr.LocalRank)
		s.At = at
		// A process in uninterruptible sleep is in I/O (a write throttled
		// by the page cache, a slow file system): not idle.
		s.Busy = busy[sr.LocalRank] || sr.Proc == 'D'
		if sr.LocalRank >= 0 && sr.LocalRank < len(m.ranks) {
			s.Expired, s.Silent, s.MarginMS = m.ranks[sr.LocalRank].silence()
		}
		sums = append(sums, s)
	}
	all, complete := sums, true
	if exchange != nil {
		all, complete = exchange(m.ctx, h.Cycle, sums, max(bound-time.Since(began), 0))
	}
	j := Judgement{Cycle: h.Cycle, Ranks: ranks, Summary: sums, Job: all, Finding: stacks.Judge(all), Took: time.Since(began),
		Partial: !complete}
	if h.DefaultTimeout {
		j.Dismissed, j.Phase = stacks.Dismiss(j.Finding, all)
		if j.Phase && h.Elapsed >= m.defaults.LearnedFloor {
			// A slow phase gets the floor of a run without stacks, not
			// more: a rank stuck in it that long is hung.
			j.Dismissed, j.Phase = "", false
		}
	}
	jd.j = j
	if j.Dismissed != "" {
		m.log.Info("rank silent past the default clock, but not hung", "cycle", h.Cycle, "expired_local_rank", h.LocalRank,
			"why", j.Dismissed, "took", j.Took)
	} else {
		m.log.Warn("rank hang: stacks taken", "cycle", h.Cycle, "expired_local_rank", h.LocalRank,
			"finding", j.Finding.Text, "known", j.Finding.Known, "took", j.Took)
	}
	return j, true
}

// The activity window of a default clock's judgement: a demand for a CPU
// (running or runnable) of at least a tenth of it, or judgedActivityIO
// bytes read or written, make a rank busy (the rates of the activity
// check of defaults.go, over a window short enough for a hang to cost
// about a second).
const (
	judgedActivityWindow = 300 * time.Millisecond
	judgedActivityIO     = 128 << 10
)

// activity is what a rank's processes did: their demand for a CPU
// (on one, or runnable and waiting: procfs.GroupDemand, so that a rank
// computing on an oversubscribed machine is not taken for an idle one)
// and the bytes they read and wrote.
type activity struct {
	demand  time.Duration
	IOBytes uint64
}

func groupActivity(pids map[int]int) map[int]activity {
	out := make(map[int]activity, len(pids))
	for lr, pid := range pids {
		a, ok := procfs.GroupActivity(pid)
		if !ok {
			continue
		}
		d, ok := procfs.GroupDemand(pid)
		if !ok {
			d = a.CPU // no schedstat: CPU time alone
		}
		out[lr] = activity{demand: d, IOBytes: a.IOBytes}
	}
	return out
}

// dismiss ends a judgement that found no hang (Judgement.Dismissed): no
// rank is killed, every rank's default clocks wait longer (the silence so
// far again, at least the clock's own length, and for a rank in a slow
// phase the learned floor of a run without stacks), and the next expiry
// is judged afresh.
func (m *Manager) dismiss(j Judgement, h Hang) {
	m.mu.Lock()
	if m.judged != nil && m.judged.cycle == j.Cycle {
		m.judged = nil
	}
	m.mu.Unlock()
	wait := max(h.Timeout, h.Elapsed)
	if j.Phase {
		wait = max(wait, m.defaults.LearnedFloor)
	}
	for _, r := range m.ranks {
		r.wait(j.Cycle, wait)
	}
	m.emit(eventlog.HangDismissedEvent{Round: j.Cycle, LocalRank: h.LocalRank, Why: j.Dismissed,
		SilentS: h.Elapsed.Seconds(), WaitS: wait.Seconds(), TookMS: float64(j.Took.Microseconds()) / 1000})
}

func (m *Manager) judgeStart(cycle int) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.judged != nil && m.judged.cycle == cycle {
		return m.judged.start
	}
	return 0
}

// allWaiting reports whether every rank of sums waits in a collective.
func allWaiting(sums []stacks.Summary) bool {
	for _, s := range sums {
		if s.State != stacks.StateDumped || s.Activity != pytrace.ActCollective {
			return false
		}
	}
	return len(sums) > 0
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

// Judged returns cycle's hang judgement (none when no clock expired in
// cycle, or the stacks found no hang), waiting for one still being made:
// a node whose round another node ended while its own stacks were being
// taken or shared still records them. The wait is bounded by what a
// judgement takes (the stacks bound, the activity window), with a
// second's slack for a loaded machine.
func (m *Manager) Judged(ctx context.Context, cycle int) (*Judgement, bool) {
	m.mu.Lock()
	jd := m.judged
	m.mu.Unlock()
	if jd == nil || jd.cycle != cycle {
		return nil, false
	}
	t := time.NewTimer(m.stacksBound() + judgedActivityWindow + time.Second)
	defer t.Stop()
	select {
	case <-jd.done:
	case <-t.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	case <-m.ctx.Done():
		return nil, false
	}
	if jd.j.Dismissed != "" {
		return nil, false // no hang: nothing to record
	}
	j := jd.j
	return &j, true
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
