// Package report turns a run's records (the launchers' event logs, their
// verdicts, the ledger, a Slurm chain or an AppWrapper's status) into a
// goodput account and a timeline: where the wall time of a job went, split
// into productive training and the badput of each fault (detection, stop,
// rendezvous, start-up, steps recomputed since the last checkpoint). The
// phases partition the wall time, so they add up to it. At a hang it says
// which rank hung, from the stacks the launchers took (hangs.go).
// ft-resumer report renders it as self-contained HTML (html.go) or JSON;
// docs/report.md explains every number.
package report

import (
	"fmt"
	"sort"
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
)

// Schema is the value of the JSON form's schema field.
const Schema = "ft-resumer.report/v1"

// Phase names, in the order they are shown.
const (
	Productive = "productive"
	Recompute  = "recompute"  // steps done after the last checkpoint of a failed round: lost
	Detection  = "detection"  // from the fault to the launcher knowing it
	Stop       = "stop"       // stopping what still ran
	Rendezvous = "rendezvous" // waiting for a round (the launcher's start included)
	Startup    = "startup"    // ranks started until every rank's first heartbeat (restore included)
	Queue      = "queue"      // a Slurm chain: between one job's end and the next one's start
	Shutdown   = "shutdown"   // after the last round's ranks exited, until the launchers exited
)

// PhaseOrder lists the phases.
var PhaseOrder = []string{Productive, Recompute, Detection, Stop, Rendezvous, Startup, Queue, Shutdown}

// Report is the account of one run (or of every job of a Slurm chain).
type Report struct {
	Schema  string    `json:"schema"`
	RunIDs  []string  `json:"run_ids"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	WallS   float64   `json:"wall_s"`
	Goodput float64   `json:"goodput"` // productive / wall, 0..1
	// PhasesS holds every phase's seconds; they add up to WallS.
	PhasesS  map[string]float64 `json:"phases_s"`
	Jobs     []Job              `json:"jobs"`
	Rounds   []Round            `json:"rounds"`
	Restarts []Restart          `json:"restarts"`
	Nodes    []Lane             `json:"nodes"`
	Ranks    []Lane             `json:"ranks"`
	Ledger   []ledger.Record    `json:"ledger"`
	Workload *Workload          `json:"workload,omitempty"`
	State    *State             `json:"state,omitempty"` // the launcher-held state's saves, write-outs, restores
	Hangs    []Hang             `json:"hangs,omitempty"` // each hang's culprit and stacks (hangs.go); additive to v1
	// Speeds are the nodes' measured speed and straggler findings
	// (speed.go; docs/stragglers.md); additive to v1.
	Speeds   []NodeSpeeds `json:"speeds,omitempty"`
	Notes    []string     `json:"notes"`
	Warnings []string     `json:"warnings"`
	// Categories is the same wall time in the badput categories of
	// Google's ml-goodput-measurement (categories.go); additive to v1.
	Categories Categories `json:"badput_categories"`
}

// Job is one launch of the run: the only one, or a Slurm job of a chain.
type Job struct {
	ID      string             `json:"id,omitempty"` // Slurm job id
	RunID   string             `json:"run_id,omitempty"`
	Start   time.Time          `json:"start"`
	End     time.Time          `json:"end"`
	Outcome string             `json:"outcome,omitempty"` // the verdicts' kind, or the chain's outcome
	PhasesS map[string]float64 `json:"phases_s"`
	// leadInS is its first round's rendezvous (from the launcher's start):
	// idle for a run's first job, recovery for a chain's later ones.
	leadInS float64
}

// Round is one restart round of a job.
type Round struct {
	Job   string `json:"job,omitempty"`
	Round int    `json:"round"`
	// Start: the first rank of the round started; Ready: every rank had
	// sent its first heartbeat; Fault: the failure began; Detected: the
	// launcher knew; Stopped: every rank of the round was gone.
	Start     time.Time  `json:"start"`
	Ready     *time.Time `json:"ready,omitempty"`
	FirstStep *time.Time `json:"first_step,omitempty"`
	LastCkpt  *time.Time `json:"last_checkpoint,omitempty"`
	Fault     time.Time  `json:"fault"`
	Detected  time.Time  `json:"detected"`
	Stopped   time.Time  `json:"stopped"`
	End       string     `json:"end"` // success, crash, hang, node_loss, round_ended, signal, unknown
	Reason    string     `json:"reason,omitempty"`
	StepsLost *int       `json:"steps_lost,omitempty"` // steps since the last checkpoint, when the sections show it
	// Restores: where each rank of this round restored its state from
	// (state_restore; the round after a fault restores).
	Restores  []Restore          `json:"restores,omitempty"`
	Nodes     []string           `json:"nodes"`
	WorldSize int                `json:"world_size"`
	PhasesS   map[string]float64 `json:"phases_s"`
}

// Restart is one restart decision (deduplicated across nodes).
type Restart struct {
	Job        string    `json:"job,omitempty"`
	AfterRound int       `json:"after_round"`
	At         time.Time `json:"at"`
	Action     string    `json:"action,omitempty"`
	Reason     string    `json:"reason"`
}

// Lane is one node's or one rank's row of the timeline.
type Lane struct {
	Name  string `json:"name"`
	Spans []Span `json:"spans"`
	Marks []Mark `json:"marks"`
}

// Span is an interval on a lane.
type Span struct {
	Kind  string    `json:"kind"` // running, startup, standby, spare, filler, stopping
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Label string    `json:"label,omitempty"`
}

// Mark is an instant on a lane.
type Mark struct {
	Kind  string    `json:"kind"` // crash, hang, node_loss, swap, filler_reclaim, restart, checkpoint, first_step, exit, signal, stacks, culprit
	At    time.Time `json:"at"`
	Label string    `json:"label,omitempty"`
}

// Workload is an AppWrapper's status.
type Workload struct {
	Name       string `json:"name"`
	Phase      string `json:"phase"`
	Resets     int32  `json:"resets"`
	Conditions []Mark `json:"conditions"`
}

// Build loads the inputs and computes the report.
func Build(in Inputs) (*Report, error) {
	rec, err := load(in)
	if err != nil {
		return nil, err
	}
	return compute(rec)
}

// compute builds the report from loaded records.
func compute(rec *records) (*Report, error) {
	r := &Report{Schema: Schema, PhasesS: zeroPhases(), Notes: []string{}, Warnings: append([]string{}, rec.warnings...),
		Jobs: []Job{}, Rounds: []Round{}, Restarts: []Restart{}, Ledger: rec.ledger}
	groups := groupByJob(rec)
	if len(groups) == 0 {
		return nil, fmt.Errorf("the records hold no launcher activity (no events and no verdict cycles)")
	}
	acc := newCategoryAcc()
	for _, g := range groups {
		j, err := computeJob(g, r, acc)
		if err != nil {
			return nil, err
		}
		r.Jobs = append(r.Jobs, j)
	}
	sort.SliceStable(r.Jobs, func(a, b int) bool { return r.Jobs[a].Start.Before(r.Jobs[b].Start) })
	r.Start, r.End = r.Jobs[0].Start, r.Jobs[0].End
	for _, j := range r.Jobs {
		r.End = later(r.End, j.End)
		addPhases(r.PhasesS, j.PhasesS)
	}
	if rec.chain != nil {
		// The chain's wall time runs from its creation; the gaps
		// between jobs are the scheduler's (queue, requeue).
		if !rec.chain.Created.IsZero() && rec.chain.Created.Before(r.Start) {
			r.Start = rec.chain.Created
		}
		cursor := r.Start
		for i, j := range r.Jobs {
			if j.Start.After(cursor) {
				d := j.Start.Sub(cursor).Seconds()
				r.PhasesS[Queue] += d
				acc.s[resumed(i)] += d
			}
			cursor = later(cursor, j.End)
		}
	}
	for i, j := range r.Jobs {
		acc.s[resumed(i)] += j.leadInS
	}
	r.WallS = r.End.Sub(r.Start).Seconds()
	if r.WallS > 0 {
		r.Goodput = r.PhasesS[Productive] / r.WallS
	}
	r.Categories = acc.categories(r.WallS)
	runs := map[string]bool{}
	for _, j := range r.Jobs {
		if j.RunID != "" && !runs[j.RunID] {
			runs[j.RunID] = true
			r.RunIDs = append(r.RunIDs, j.RunID)
		}
	}
	if r.RunIDs == nil {
		r.RunIDs = []string{}
	}
	r.Hangs = hangs(rec, r) // before the lanes: they mark each hang's ranks
	r.Speeds = speeds(rec)
	r.Nodes, r.Ranks = lanes(rec, r)
	r.State = stateAccount(rec, r)
	if rec.aw != nil {
		r.Workload = workload(rec)
	}
	return r, nil
}

// resumed is the category of the time before the i-th job of a run ran
// ranks (the queue, the launcher's start): idle before the first, the
// recovery from a disruption before a later one (a chain resubmits a job
// only when the one before it did not finish).
func resumed(i int) string {
	if i == 0 {
		return CatIdle
	}
	return CatDisruption
}

func zeroPhases() map[string]float64 {
	m := make(map[string]float64, len(PhaseOrder))
	for _, p := range PhaseOrder {
		m[p] = 0
	}
	return m
}

func addPhases(dst, src map[string]float64) {
	for k, v := range src {
		dst[k] += v
	}
}

func deref[T any](p *T) T {
	var v T
	if p != nil {
		v = *p
	}
	return v
}

// orTS is t, or def where the record had no time.
func orTS(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}

func earlier(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func clamp(t, lo, hi time.Time) time.Time {
	if t.Before(lo) {
		return lo
	}
	if t.After(hi) {
		return hi
	}
	return t
}

func timePtr(t time.Time) *time.Time { return &t }

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
