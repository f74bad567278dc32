package monitor

import (
	"fmt"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// openSection returns an error text when the section was already open.
func (r *rankMon) openSection(gen uint64, name string, iter *int64, now int64) string {
	r.mu.Lock()
	defer r.unlockAndRecord()
	if r.gen.Load() != gen || !r.loadPhase().inSession() {
		return ""
	}
	// A ring event carries the client's time, converted late; it cannot
	// precede the session.
	now = max(now, r.initAt)
	if _, ok := r.open[name]; ok {
		return fmt.Sprintf("Section '%s' is already open", name)
	}
	if err := r.sectionAllowedLocked(name); err != nil {
		r.host.refuse(r, "section", err)
		return sectionLimitCause
	}
	if len(r.open) == 0 && !r.cfg.stalls.overlaps(r.oosStart, now, r.host.mono()) {
		r.obs.OutOfSectionMax = max(r.obs.OutOfSectionMax, time.Duration(now-r.oosStart))
		r.obs.OutOfSections++
	}
	r.open[name] = now
	if name == ComputeSection {
		r.rec.computeSeen = true
	}
	r.noteIterLocked(name, iter)
	if name == "step" {
		r.stepSeen = true
		r.stepOpens++
		r.rec.steps++
		r.rec.lastStepAt = now
		if !r.rec.firstStep {
			r.rec.firstStep = true
			rec := eventlog.RankFirstStepEvent{Round: r.cycle, LocalRank: r.local, Rank: r.globalRank, At: r.host.wall(now)}
			if iter != nil {
				rec.Iteration = eventlog.Opt(*iter)
			}
			r.recordLocked(rec)
		}
		if iter != nil {
			if !r.iterKnown {
				r.iterKnown, r.initialIter = true, *iter
			} else if *iter < r.currentIter {
				r.cfg.log.Warn("rank monitor: iteration went backwards", "local_rank", r.local, "from", r.currentIter, "to", *iter)
			}
			r.currentIter = *iter
		}
	}
	r.rearmLocked(r.host.mono()) // now may be a client time in the past
	return ""
}

// sectionLimitCause is the error a rank gets for a section beyond the
// limits; callers do not log it (refuse did, once).
const sectionLimitCause = "too many section names (limit reached)"

// sectionAllowedLocked bounds the section names a rank can make the
// monitor remember: configured names always; others up to MaxSectionNames
// per cycle, each at most MaxSectionNameLen bytes.
func (r *rankMon) sectionAllowedLocked(name string) error {
	if _, ok := r.to.Sections[name]; ok {
		return nil
	}
	if _, ok := r.obs.SectionMax[name]; ok {
		return nil
	}
	if len(name) > MaxSectionNameLen {
		return fmt.Errorf("section name of %d bytes, more than %d", len(name), MaxSectionNameLen)
	}
	if len(r.obs.SectionMax)+len(r.open) >= MaxSectionNames {
		return fmt.Errorf("more than %d distinct section names this cycle", MaxSectionNames)
	}
	return nil
}

// closeSection returns an error text when the section was not open.
func (r *rankMon) closeSection(gen uint64, name string, now int64) string {
	r.mu.Lock()
	defer r.unlockAndRecord()
	if r.gen.Load() != gen || !r.loadPhase().inSession() {
		return ""
	}
	// A ring event carries the client's time, converted late; it cannot
	// precede the session.
	now = max(now, r.initAt)
	at, ok := r.open[name]
	if !ok {
		return fmt.Sprintf("Section '%s' is not open", name)
	}
	delete(r.open, name)
	r.closedLocked(name, at, now)
	if len(r.open) == 0 {
		r.oosStart = now
	}
	r.rearmLocked(r.host.mono()) // now may be a client time in the past
	return ""
}

// closedLocked observes a section that was open from at to now (unless
// the launcher stalled meanwhile); a closed checkpoint is recorded.
func (r *rankMon) closedLocked(name string, at, now int64) {
	if !r.cfg.stalls.overlaps(at, now, r.host.mono()) {
		r.obs.SectionMax[name] = max(r.obs.SectionMax[name], time.Duration(now-at))
		r.obs.SectionCloses[name]++
	}
	if name == ComputeSection {
		r.rec.computeNS += max(now-at, 0)
	}
	if name == checkpointSection {
		r.rec.checkpoints++
		r.rec.stepsAtCkpt = r.rec.steps
		r.recordLocked(eventlog.RankCheckpointEvent{Round: r.cycle, LocalRank: r.local, Rank: r.globalRank,
			OpenedAt: r.host.wall(at), At: r.host.wall(now),
			DurationMS: float64(time.Duration(now-at).Microseconds()) / 1000, Steps: r.rec.steps})
	}
}

func (r *rankMon) closeAll(gen uint64, now int64) {
	r.mu.Lock()
	defer r.unlockAndRecord()
	if r.gen.Load() != gen || !r.loadPhase().inSession() {
		return
	}
	// A ring event carries the client's time, converted late; it cannot
	// precede the session.
	now = max(now, r.initAt)
	for name, at := range r.open {
		r.closedLocked(name, at, now)
	}
	if len(r.open) > 0 {
		r.oosStart = now
	}
	clear(r.open)
	r.rearmLocked(r.host.mono()) // now may be a client time in the past
}

// ComputeSection is the section a rank may open around its own work of a
// step (forward, backward, optimizer; not the collectives): the
// straggler measurement then uses the time inside it instead of the CPU
// the rank demanded (docs/stragglers.md).
const ComputeSection = "compute"

// ComputeTime is the time local rank local has spent in "compute"
// sections this cycle, an open one counted up to now; ok is false until
// the rank opened one.
func (m *Manager) ComputeTime(local int) (d time.Duration, ok bool) {
	if local < 0 || local >= len(m.ranks) {
		return 0, false
	}
	r := m.ranks[local]
	r.mu.Lock()
	defer r.mu.Unlock()
	ns := r.rec.computeNS
	at, open := r.open[ComputeSection]
	if open {
		ns += max(r.host.mono()-at, 0)
	}
	return time.Duration(ns), r.rec.computeSeen || open
}
