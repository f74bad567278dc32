package report

import (
	"fmt"
	"sort"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// State is what the launcher-held state did over the run (docs/state.md):
// the ranks' saves into launcher memory and how long each stalled the
// training loop, the background write-outs to the state directory, and
// where the restores came from. Nil when no state event was recorded
// (no --state-dir).
type State struct {
	// Saves counts the saves committed into launcher memory (the newest
	// sequence number of each segment); the stalls are of the saves the
	// store saw (it polls every 200 ms: faster saves are seen in part).
	Saves             int64   `json:"saves"`
	SaveStallMedianMS float64 `json:"save_stall_median_ms"`
	SaveStallMaxMS    float64 `json:"save_stall_max_ms"`
	SaveBytesMax      int64   `json:"save_bytes_max"`
	// Written counts the write-outs (state_persisted) by reason: periodic,
	// ranks stopped, end.
	Written      int            `json:"written"`
	WrittenBy    map[string]int `json:"written_by"`
	WriteMSMax   float64        `json:"write_ms_max"`
	LastWritten  *Written       `json:"last_written,omitempty"` // the newest step written out
	WriteFailed  int            `json:"write_failed"`
	WriteErrors  []string       `json:"write_errors"` // the distinct errors, at most maxStateErrors
	Restores     map[string]int `json:"restores"`     // source → count, every round
	EmptyLoads   int            `json:"empty_loads"`  // load() found no state
	savesStallMS []float64
}

// Restore is one rank's restore: where its state came from.
type Restore struct {
	Round  int       `json:"round"`
	Node   string    `json:"node"`
	Rank   int       `json:"rank"`
	Step   int64     `json:"step"`
	Source string    `json:"source"` // memory, file; peer, live (a peer heal)
	LoadMS float64   `json:"load_ms"`
	At     time.Time `json:"at"`
}

// Written is one write-out of a save to the state directory.
type Written struct {
	Node string    `json:"node"`
	Rank int       `json:"rank"`
	Step int64     `json:"step"`
	File string    `json:"file"`
	At   time.Time `json:"at"`
}

const maxStateErrors = 8

// stateAccount reads the state events of rec and adds each restore to
// the round that restored (its round field: the round after a fault).
func stateAccount(rec *records, r *Report) *State {
	st := &State{WrittenBy: map[string]int{}, WriteErrors: []string{}, Restores: map[string]int{}}
	seen := false
	// The saves of a segment are its newest sequence number (1, 2, ... one
	// per committed save, for the launcher's life): exact even when a poll
	// missed some, unlike the events' own count.
	type segKey struct {
		job, node string
		local     int
	}
	type seqs struct{ done, last int64 }
	segs := map[segKey]seqs{}
	roundIdx := map[string]int{}  // job/round → index in r.Rounds
	fellBack := map[string]bool{} // job/round whose peer heal fell back (one note each)
	for i, rd := range r.Rounds {
		roundIdx[fmt.Sprint(rd.Job, "/", rd.Round)] = i
	}
	for _, e := range rec.events {
		switch ev := e.Rec.(type) {
		case eventlog.StateSaveEvent:
			seen = true
			k := segKey{e.Job, e.Node, ev.LocalRank}
			sg := segs[k]
			if ev.Seq < sg.last { // a new segment: a new launcher on the node
				sg.done += sg.last
			}
			sg.last = ev.Seq
			segs[k] = sg
			st.savesStallMS = append(st.savesStallMS, ev.SaveMS)
			st.SaveStallMaxMS = max(st.SaveStallMaxMS, ev.SaveMS)
			st.SaveBytesMax = max(st.SaveBytesMax, ev.Bytes)
		case eventlog.StatePersistedEvent:
			seen = true
			st.Written++
			st.WrittenBy[string(ev.Reason)]++
			st.WriteMSMax = max(st.WriteMSMax, ev.WriteMS)
			if st.LastWritten == nil || ev.Step > st.LastWritten.Step {
				st.LastWritten = &Written{Node: e.Node, Rank: ev.Rank, Step: ev.Step, File: ev.File, At: e.TS}
			}
		case eventlog.StatePersistFailedEvent:
			seen = true
			st.WriteFailed++
			who := fmt.Sprintf("local rank %d", ev.LocalRank)
			if ev.LocalRank < 0 {
				who = "the store" // at its start: the state directory itself
			}
			msg := fmt.Sprintf("%s: %s (%s): %s", e.Node, who, ev.Reason, ev.Error)
			if len(st.WriteErrors) < maxStateErrors && !contains(st.WriteErrors, msg) {
				st.WriteErrors = append(st.WriteErrors, msg)
			}
		case eventlog.StateRestoreEvent:
			seen = true
			if ev.Heal == "fallback" {
				job := e.Job
				if rec.chain == nil {
					job = ""
				}
				if k := fmt.Sprint(job, "/", ev.Round); !fellBack[k] {
					fellBack[k] = true
					r.Notes = append(r.Notes, fmt.Sprintf("%sround %d: the peer heal fell back to the newest committed save: %s",
						jobPrefix(job), ev.Round, ev.Why))
				}
			}
			if ev.Source == nil || ev.Step == nil {
				st.EmptyLoads++
				continue
			}
			st.Restores[string(*ev.Source)]++
			job := e.Job
			if rec.chain == nil {
				job = ""
			}
			x := Restore{Round: ev.Round, Node: e.Node, Rank: ev.Rank, Step: *ev.Step, Source: string(*ev.Source), LoadMS: ev.LoadMS, At: orTS(ev.At, e.TS)}
			if i, ok := roundIdx[fmt.Sprint(job, "/", ev.Round)]; ok {
				r.Rounds[i].Restores = append(r.Rounds[i].Restores, x)
			}
			label := fmt.Sprintf("round %d: restored step %d from %s in %.1f ms", x.Round, x.Step, x.Source, x.LoadMS)
			switch {
			case x.Source == "live":
				label = fmt.Sprintf("round %d: kept its live step %d (peer heal, %.1f ms)", x.Round, x.Step, x.LoadMS)
			case x.Source == "peer" && ev.FromRank != nil:
				label = fmt.Sprintf("round %d: received step %d from rank %d (peer heal) in %.1f ms", x.Round, x.Step, *ev.FromRank, x.LoadMS)
			}
			for i := range r.Ranks {
				if r.Ranks[i].Name == fmt.Sprintf("rank %d", ev.Rank) {
					r.Ranks[i].Marks = append(r.Ranks[i].Marks, Mark{Kind: "restore", At: x.At, Label: label})
				}
			}
		}
	}
	if !seen {
		return nil
	}
	for _, sg := range segs {
		st.Saves += sg.done + sg.last
	}
	if n := len(st.savesStallMS); n > 0 {
		s := append([]float64(nil), st.savesStallMS...)
		sort.Float64s(s)
		st.SaveStallMedianMS = s[n/2]
		if n%2 == 0 {
			st.SaveStallMedianMS = (s[n/2-1] + s[n/2]) / 2
		}
	}
	for i := range r.Rounds {
		sort.SliceStable(r.Rounds[i].Restores, func(a, b int) bool { return r.Rounds[i].Restores[a].Rank < r.Rounds[i].Restores[b].Rank })
	}
	return st
}

// RestoreSources summarises a round's restores: "memory ×3, file ×1".
func (rd Round) RestoreSources() string {
	n := map[string]int{}
	var order []string
	for _, x := range rd.Restores {
		if n[x.Source] == 0 {
			order = append(order, x.Source)
		}
		n[x.Source]++
	}
	sort.Strings(order)
	out := ""
	for i, s := range order {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s ×%d", s, n[s])
	}
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
