package report

// The badput categories of Google's ml-goodput-measurement (its BadputType),
// computed beside the report's own phases so that a run under ft-launcher
// reads in the terms the field uses. Each category is a sum of (parts of)
// the phases, so the categories and the productive time still add up to the
// wall time exactly; docs/report.md, "Badput in the field's categories",
// states the rule.

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Category names: the keys of Categories.BadputS.
const (
	CatStartup     = "startup"            // accelerator initialization, training preparation, program startup
	CatRestore     = "checkpoint_restore" // unproductive checkpoint restore time
	CatSave        = "checkpoint_save"    // unproductive checkpoint save time
	CatDataLoading = "data_loading"       // synchronous data loading: not in the records
	CatWasted      = "wasted_progress"    // wasted progress from disruption
	CatDisruption  = "disruption"         // infrastructure recovery from disruption
	CatIdle        = "idle"               // other: time no category names
)

// CategoryOrder lists the categories in the order they are shown.
var CategoryOrder = []string{CatStartup, CatRestore, CatSave, CatDataLoading, CatWasted, CatDisruption, CatIdle}

// Categories is the run's account in ml-goodput-measurement's badput
// categories. ProductiveS and the non-null BadputS add up to the wall time.
type Categories struct {
	// ProductiveS is the productive phase less the checkpoint saves and
	// restores recorded inside it: the field's goodput time.
	ProductiveS float64 `json:"productive_s"`
	Goodput     float64 `json:"goodput"` // ProductiveS / wall, 0..1
	// BadputS holds each category's seconds: what the records measured.
	// Null where they measured none of it and cannot tell that it was
	// none (CountedIn says where its time is).
	BadputS map[string]*float64 `json:"badput_s"`
	// CountedIn names, for each category the records do not measure in
	// every round, where its unmeasured time is counted instead (another
	// category, or "productive"): that category's value is a lower bound.
	CountedIn map[string]string `json:"counted_in"`
	Notes     []string          `json:"notes"` // which rounds were not measured, and why
}

// span is an interval of wall time, [from, to).
type span struct{ from, to time.Time }

// roundWork is what the ranks of one round recorded doing inside their
// training time: restores (state_restore) and saves (rank_checkpoint).
type roundWork struct {
	restores     []span
	restoreRanks map[int]bool
	saves        []span
	untimedSaves bool // a rank_checkpoint without opened_at or duration_ms (an older launcher)
}

// categoryAcc accumulates the categories over the jobs and rounds of a run.
type categoryAcc struct {
	s          map[string]float64
	productive float64
	unmeasured map[string][]string // category → the rounds that did not measure it
}

func newCategoryAcc() *categoryAcc {
	return &categoryAcc{s: map[string]float64{}, unmeasured: map[string][]string{}}
}

// roundBounds are the instants a round's phases split at (after clamping):
// start → startup → ready → productive → keep → recompute → fault.
type roundBounds struct {
	start, ready, keep time.Time
}

// roundCase is what decides a round's split besides its phases.
type roundCase struct {
	name      string // "3", or "3 (job 12)" in a chain
	leadIn    bool   // the job's first round: its rendezvous is counted with the job's place in a chain (compute)
	failed    bool   // it ended otherwise than in success: its detection and stop are the disruption's
	heartbeat bool   // its ranks heartbeated, so its start-up is told from training
	lostKnown bool   // its recompute is measured (not a failed round without sections)
	sections  bool   // its ranks reported sections (steps, checkpoints)
	world     int    // its ranks (cycle_started's world_size)
}

// addRound splits one round's phases (rp) into the categories.
func (a *categoryAcc) addRound(rc roundCase, rp map[string]float64, b roundBounds, w *roundWork) {
	if !rc.leadIn {
		// A later round of a job follows a failed one: waiting for its
		// nodes is the recovery from that disruption.
		a.s[CatDisruption] += rp[Rendezvous]
	}
	if rc.failed {
		a.s[CatDisruption] += rp[Detection] + rp[Stop]
	} else {
		a.s[CatIdle] += rp[Detection] + rp[Stop]
	}
	a.s[CatWasted] += rp[Recompute]
	a.mark(CatWasted, rc.name, rc.lostKnown)
	a.mark(CatStartup, rc.name, rc.heartbeat)
	if w == nil {
		w = &roundWork{}
	}
	// Restores first, then saves outside them, each taken out of the
	// phase it fell in: startup or productive. A rank restoring or saving
	// holds the others at their next collective, so the time counts while
	// at least one rank of the round does it (the union over its ranks).
	restored := union(w.restores, b.start, b.keep)
	saved := subtract(union(w.saves, b.start, b.keep), restored)
	rS, rP := overlap(restored, b.start, b.ready), overlap(restored, b.ready, b.keep)
	sS, sP := overlap(saved, b.start, b.ready), overlap(saved, b.ready, b.keep)
	a.s[CatStartup] += rp[Startup] - rS - sS
	a.productive += rp[Productive] - rP - sP
	a.s[CatRestore] += rS + rP
	a.s[CatSave] += sS + sP
	// Restores are measured when every rank of the round noted its load()
	// (ft_launcher_client.state, an empty load included): a rank that
	// restored otherwise (torch.load) leaves nothing.
	a.mark(CatRestore, rc.name, len(w.restoreRanks) > 0 && len(w.restoreRanks) >= rc.world)
	// Saves are measured when the ranks reported sections (a save is a
	// "checkpointing" section), each with its duration; a round that
	// never trained saved nothing.
	a.mark(CatSave, rc.name, (rc.sections || rp[Productive] == 0) && !w.untimedSaves)
}

func (a *categoryAcc) mark(cat, name string, known bool) {
	if known {
		return
	}
	a.unmeasured[cat] = append(a.unmeasured[cat], name)
}

// countedIn is where a category's unmeasured time is counted, and why the
// records did not measure it in a round.
func countedIn(cat string) (in, why string) {
	switch cat {
	case CatStartup:
		return "productive", "no rank reported a heartbeat (no rank-monitor client): start-up cannot be told from training"
	case CatRestore:
		return CatStartup, "not every rank's restore was recorded (state_restore: ft_launcher_client.state.load() under --state-dir)"
	case CatSave:
		return "productive", "no 'checkpointing' sections with their duration (no rank-monitor client, or a launcher that did not record opened_at)"
	case CatWasted:
		return "productive", "no 'step'/'checkpointing' sections: the time since the last checkpoint is unknown"
	}
	return "productive", "" // data loading: never in the records, inside the steps
}

// categories finishes the account: every category's seconds, or null
// where nothing of it was measured.
func (a *categoryAcc) categories(wall float64) Categories {
	c := Categories{ProductiveS: a.productive, BadputS: map[string]*float64{}, CountedIn: map[string]string{}, Notes: []string{}}
	if wall > 0 {
		c.Goodput = a.productive / wall
	}
	for _, cat := range CategoryOrder {
		v := a.s[cat]
		rounds, incomplete := a.unmeasured[cat]
		if cat == CatDataLoading {
			incomplete = true // never in the records: no note, docs/report.md says so
		}
		if incomplete {
			in, why := countedIn(cat)
			c.CountedIn[cat] = in
			if len(rounds) > 0 {
				c.Notes = append(c.Notes, fmt.Sprintf("%s: round(s) %s: %s; counted as %s", cat, strings.Join(rounds, ", "), why, in))
			}
		}
		if incomplete && v == 0 {
			c.BadputS[cat] = nil // nothing measured: unknown, not zero
			continue
		}
		c.BadputS[cat] = &v
	}
	return c
}

// union is the spans merged, clipped to [lo, hi).
func union(spans []span, lo, hi time.Time) []span {
	var in []span
	for _, s := range spans {
		s.from, s.to = later(s.from, lo), earlier(s.to, hi)
		if s.to.After(s.from) {
			in = append(in, s)
		}
	}
	sort.Slice(in, func(i, j int) bool { return in[i].from.Before(in[j].from) })
	var out []span
	for _, s := range in {
		if n := len(out); n > 0 && !s.from.After(out[n-1].to) {
			out[n-1].to = later(out[n-1].to, s.to)
			continue
		}
		out = append(out, s)
	}
	return out
}

// subtract is a less b; both merged and sorted (union).
func subtract(a, b []span) []span {
	var out []span
	for _, s := range a {
		for _, x := range b {
			if !x.to.After(s.from) || !x.from.Before(s.to) {
				continue
			}
			if x.from.After(s.from) {
				out = append(out, span{s.from, x.from})
			}
			s.from = later(s.from, x.to)
		}
		if s.to.After(s.from) {
			out = append(out, s)
		}
	}
	return out
}

// overlap is the seconds of u inside [lo, hi).
func overlap(u []span, lo, hi time.Time) float64 {
	var d time.Duration
	for _, s := range u {
		from, to := later(s.from, lo), s.to
		if hi.Before(to) {
			to = hi
		}
		if to.After(from) {
			d += to.Sub(from)
		}
	}
	return d.Seconds()
}
