package monitor

import (
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// progressTotals is the training the ranks reported over every cycle that
// has ended (folded), for the verdict's progress (docs/verdict.md): the
// outer loop's evidence that a job advanced.
type progressTotals struct {
	connected   bool // a rank connected to its monitor at least once
	steps       int64
	checkpoints int64
	heartbeats  int64
	iterSeen    bool
	iterMin     int64
	iterMax     int64
	lastStepAt  time.Time
}

// add folds one rank's cycle record (and its heartbeat count) in.
func (p *progressTotals) add(rec *cycleRecord, heartbeats int64, wall func(int64) time.Time) {
	p.connected = p.connected || rec.connected
	p.steps += rec.steps + rec.iterSteps
	p.checkpoints += rec.checkpoints
	p.heartbeats += heartbeats
	if rec.iterSeen {
		if !p.iterSeen || rec.iterMin < p.iterMin {
			p.iterMin = rec.iterMin
		}
		if !p.iterSeen || rec.iterMax > p.iterMax {
			p.iterMax = rec.iterMax
		}
		p.iterSeen = true
	}
	if rec.lastStepAt != 0 {
		if at := wall(rec.lastStepAt); at.After(p.lastStepAt) {
			p.lastStepAt = at
		}
	}
}

// verdict converts the totals; nil when no rank ever connected.
func (p *progressTotals) verdict() *verdict.Progress {
	if !p.connected {
		return nil
	}
	v := &verdict.Progress{Steps: p.steps, Checkpoints: p.checkpoints, Heartbeats: p.heartbeats}
	if p.iterSeen {
		first, last := p.iterMin, p.iterMax
		v.FirstIteration, v.LastIteration = &first, &last
	}
	if !p.lastStepAt.IsZero() {
		v.LastStepAt = p.lastStepAt.UTC()
	}
	return v
}

// noteIterLocked records an iteration the rank reported. A section opened
// with an iteration beyond the last one reported counts as a step when it
// is not a "step" section (nvrx clients name their sections freely and
// carry the iteration; a "step" section is counted when opened).
func (r *rankMon) noteIterLocked(section string, iter *int64) {
	if iter == nil {
		return
	}
	rec := &r.rec
	if section != "" && section != "step" && (!rec.iterSeen || *iter > rec.lastIter) {
		rec.iterSteps++
		rec.lastStepAt = r.host.mono()
	}
	if !rec.iterSeen {
		rec.iterMin, rec.iterMax = *iter, *iter
	}
	rec.iterMin, rec.iterMax = min(rec.iterMin, *iter), max(rec.iterMax, *iter)
	rec.iterSeen, rec.lastIter = true, *iter
}

// foldLocked adds the rank's cycle record to the manager's totals once.
// Caller holds m.mu.
func (m *Manager) foldLocked(r *rankMon) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec.folded {
		return
	}
	r.rec.folded = true
	m.progress.add(&r.rec, r.heartbeats.Load(), m.wall)
}

// Progress is what the ranks reported over every cycle of this manager so
// far (the running one included), summed over cycles and local ranks; nil
// when no rank ever connected to its monitor.
func (m *Manager) Progress() *verdict.Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.progress
	for _, r := range m.ranks {
		r.mu.Lock()
		if !r.rec.folded {
			p.add(&r.rec, r.heartbeats.Load(), m.wall)
		}
		r.mu.Unlock()
	}
	return p.verdict()
}

// RankCycle is how far local rank local came in the current (or, once it
// ended, the last) cycle: the steps it opened and the last iteration it
// reported (nil when none). The agent records it with a rank failure.
func (m *Manager) RankCycle(local int) (steps int64, iteration *int64) {
	if local < 0 || local >= len(m.ranks) {
		return 0, nil
	}
	r := m.ranks[local]
	r.drain() // what a rank that just died left in its session's buffers
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rec.iterSeen {
		it := r.rec.lastIter
		iteration = &it
	}
	return r.rec.steps + r.rec.iterSteps, iteration
}
