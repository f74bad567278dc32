package report

// What the stacks said of each hang (rank_stacks): which rank hung, or that
// nothing singled one out, and what every other rank was doing. The timeout
// that expired first is not the answer (a rank waiting in a collective for
// a hung peer falls silent with it), so this is what the page puts first
// (docs/report.md, "Hangs").

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// Hang is one round's hang as judged from the stacks of its ranks, taken
// before any was killed: every node's rank_stacks record of the round,
// merged.
type Hang struct {
	Job   string    `json:"job,omitempty"` // Slurm job of a chain
	Round int       `json:"round"`
	At    time.Time `json:"at"` // the first node's record
	// Known, Culprits, Why and Text are the finding (of the nodes that
	// disagree, the one chosen: see Findings). Known: the evidence singles
	// the culprits out; when false Culprits holds the first rank to fall
	// silent, which is not necessarily the one that hung.
	Known    bool    `json:"known"`
	Culprits []int   `json:"culprits"`
	Why      string  `json:"why"`
	Text     string  `json:"text"`
	TookMS   float64 `json:"took_ms"` // the slowest node: its first expiry to its finding
	// Agree: every node made the same finding. Findings has one entry per
	// distinct finding and the nodes that made it, the chosen one first: a
	// finding on evidence (known) over a first-silent guess, then the one
	// of more nodes, then the earlier. A node that judged alone (the
	// exchange of stacks did not complete in time) saw only its own ranks.
	Agree    bool          `json:"agree"`
	Findings []HangFinding `json:"findings"`
	// Groups: the culprits, one group each, then the other ranks grouped
	// by what they were doing ("ranks 0, 2-3: in all_reduce at ...").
	Groups []HangGroup `json:"groups"`
	Ranks  []HangRank  `json:"ranks"` // every rank whose stacks a node took, by global rank
	// Judged: ranks killed because the finding named them, before their
	// own clock ran out (rank_hang's judged).
	Judged []int `json:"judged,omitempty"`
}

// HangFinding is one finding of a round's hang and the nodes that made it.
type HangFinding struct {
	Nodes    []string `json:"nodes"`
	Known    bool     `json:"known"`
	Culprits []int    `json:"culprits"`
	Why      string   `json:"why"`
	Text     string   `json:"text"`
	TookMS   float64  `json:"took_ms"`
}

// HangGroup is ranks that were doing the same thing.
type HangGroup struct {
	Ranks   []int  `json:"ranks"`
	Culprit bool   `json:"culprit,omitempty"`
	What    string `json:"what"`
}

// HangRank is one rank's stacks at a hang: the launcher's record of it
// (rank_stacks), with its node and whether it is a culprit.
type HangRank struct {
	Node string `json:"node"`
	eventlog.RankStacksRank
	Culprit bool `json:"culprit,omitempty"`
	// Stacks is the culprit's stacks file as read here, for the page only:
	// the JSON names the file, which holds the same.
	Stacks *StacksText `json:"-"`
	at     time.Time   // its node's record
}

// StacksText is what this machine could read of a rank's stacks file.
type StacksText struct {
	Text      string // empty when not read (Note says why)
	Truncated bool   // only the first maxStacksBytes are in Text
	Size      int64
	Note      string
}

const (
	// stacksName is the launcher's name for a rank's stacks file
	// (attempt_<n>/<local_rank>/stacks.txt): the only name read.
	stacksName = "stacks.txt"
	// stacksHeader begins every stacks file the launcher writes, naming
	// its rank (agent.stacksText): a file that does not, or names another
	// rank, is not put on the page.
	stacksHeader = "# ft-launcher: stacks of "
	// maxStacksBytes is the most of one stacks file put on the page.
	maxStacksBytes = 64 << 10
	// maxStacksFiles bounds the files read per hang: a minority of ranks
	// in a stray collective can all be culprits.
	maxStacksFiles = 8
)

// what says what a rank was doing, in the words of the launcher's finding
// (stacks.Summary's, which the report does not import: that package
// signals processes), and where its NCCL flight recorder was taken, what
// that says.
func (h HangRank) what() string {
	if h.FlightRecorderText != "" {
		return h.stacksWhat() + "; NCCL flight recorder: " + h.FlightRecorderText
	}
	return h.stacksWhat()
}

func (h HangRank) stacksWhat() string {
	switch {
	case h.State == "stopped":
		return "stopped by a signal (SIGSTOP)"
	case h.State == "no_answer":
		return "did not answer the stack request"
	case h.State == "no_hook":
		return "no stack (not a Python rank, or --ft-rank-stacks off)"
	case h.State == "gone":
		return "exited"
	case h.State != "dumped":
		return "state " + h.State
	case h.Activity == "collective":
		return fmt.Sprintf("in %s at %s", h.Collective, h.Place)
	case h.Activity == "user":
		return fmt.Sprintf("in %s, not in a collective", h.Place)
	}
	return fmt.Sprintf("in %s (%s), not in a collective", h.Place, h.Activity)
}

// hangKey names a round of a job.
type hangKey struct {
	job   string
	round int
}

// jobOf is the job an event belongs to: its Slurm job in a chain, else
// the one job (as groupByJob).
func (rec *records) jobOf(e Event) string {
	if rec.chain == nil {
		return ""
	}
	return e.Job
}

// hangs merges the rank_stacks records of each round into its Hang and
// makes a hung round's reason the finding (the first expired timeout it
// named before is often a bystander's).
func hangs(rec *records, r *Report) []Hang {
	type nodeRec struct {
		node string
		at   time.Time
		ev   eventlog.RankStacksEvent
	}
	byRound := map[hangKey][]nodeRec{}
	var order []hangKey
	judged := map[hangKey][]eventlog.RankHangEvent{}
	judgedNode := map[hangKey][]string{}
	finding := map[hangKey]string{} // the first rank_hang's finding: the reason when no rank_stacks was given
	for _, e := range rec.events {
		switch ev := e.Rec.(type) {
		case eventlog.RankStacksEvent:
			k := hangKey{rec.jobOf(e), ev.Round}
			if _, ok := byRound[k]; !ok {
				order = append(order, k)
			}
			byRound[k] = append(byRound[k], nodeRec{e.Node, e.TS, ev})
		case eventlog.RankHangEvent:
			k := hangKey{rec.jobOf(e), ev.Round}
			if ev.Judged {
				judged[k] = append(judged[k], ev)
				judgedNode[k] = append(judgedNode[k], e.Node)
			}
			if _, ok := finding[k]; !ok && ev.Finding != "" {
				finding[k] = ev.Finding
			}
		}
	}
	var out []Hang
	for _, k := range order {
		recs := byRound[k]
		h := Hang{Job: k.job, Round: k.round, At: recs[0].at, Culprits: []int{}, Groups: []HangGroup{}, Ranks: []HangRank{}}
		// One finding per distinct judgement, with its nodes.
		for _, nr := range recs {
			ev := nr.ev
			culprits := slices.Clone(ev.Culprits)
			slices.Sort(culprits)
			if culprits == nil {
				culprits = []int{}
			}
			h.TookMS = max(h.TookMS, ev.TookMS)
			i := slices.IndexFunc(h.Findings, func(f HangFinding) bool {
				return f.Known == ev.Known && slices.Equal(f.Culprits, culprits) && f.Why == ev.Why && f.Text == ev.Text
			})
			if i < 0 {
				h.Findings = append(h.Findings, HangFinding{Known: ev.Known, Culprits: culprits, Why: ev.Why, Text: ev.Text})
				i = len(h.Findings) - 1
			}
			f := &h.Findings[i]
			if !slices.Contains(f.Nodes, nr.node) {
				f.Nodes = append(f.Nodes, nr.node)
			}
			f.TookMS = max(f.TookMS, ev.TookMS)
		}
		// Stable: among equals the earlier finding stays first.
		slices.SortStableFunc(h.Findings, func(a, b HangFinding) int {
			if a.Known != b.Known {
				if a.Known {
					return -1
				}
				return 1
			}
			return len(b.Nodes) - len(a.Nodes)
		})
		best := h.Findings[0]
		h.Known, h.Culprits, h.Why, h.Text, h.Agree = best.Known, best.Culprits, best.Why, best.Text, len(h.Findings) == 1
		// Every node lists its own ranks: merged by node and local rank
		// (the global rank is only as good as what the ranks told their
		// launcher).
		type rankKey struct {
			node  string
			local int
		}
		seen := map[rankKey]bool{}
		for _, nr := range recs {
			for _, rr := range nr.ev.Ranks {
				rk := rankKey{nr.node, rr.LocalRank}
				if seen[rk] {
					continue
				}
				seen[rk] = true
				h.Ranks = append(h.Ranks, HangRank{Node: nr.node, RankStacksRank: rr,
					Culprit: slices.Contains(h.Culprits, rr.Rank), at: nr.at})
			}
		}
		slices.SortStableFunc(h.Ranks, func(a, b HangRank) int {
			if a.Rank != b.Rank {
				return a.Rank - b.Rank
			}
			if c := strings.Compare(a.Node, b.Node); c != 0 {
				return c
			}
			return a.LocalRank - b.LocalRank
		})
		h.Groups = hangGroups(h.Ranks, h.Culprits)
		for i, ev := range judged[k] {
			g := ev.Rank
			if g < 0 { // the rank did not tell its global rank: its stacks record may have
				for _, hr := range h.Ranks {
					if hr.Node == judgedNode[k][i] && hr.LocalRank == ev.LocalRank {
						g = hr.Rank
					}
				}
			}
			if g >= 0 && !slices.Contains(h.Judged, g) {
				h.Judged = append(h.Judged, g)
			}
		}
		slices.Sort(h.Judged)
		attachStacks(rec, &h)
		out = append(out, h)
	}
	// A hung round reads as the finding: the culprit, not the first clock
	// to expire.
	idx := map[hangKey]int{}
	for i, h := range out {
		idx[hangKey{h.Job, h.Round}] = i
	}
	for i := range r.Rounds {
		rd := &r.Rounds[i]
		if rd.End != "hang" {
			continue
		}
		k := hangKey{rd.Job, rd.Round}
		if hi, ok := idx[k]; ok && out[hi].Text != "" {
			rd.Reason = out[hi].Text
			if !out[hi].Agree {
				rd.Reason += fmt.Sprintf(" (the nodes' findings differ: %d findings, see Hangs)", len(out[hi].Findings))
			}
		} else if f := finding[k]; f != "" {
			rd.Reason = f
		}
	}
	return out
}

// hangGroups are the culprits, one group each (they are what the others
// wait for, each in its own place), then the other ranks grouped by what
// they were doing, in the order of their lowest rank. A culprit whose
// node's record is missing still has its group.
func hangGroups(ranks []HangRank, culprits []int) []HangGroup {
	var out []HangGroup
	for _, c := range culprits {
		g := HangGroup{Ranks: []int{c}, Culprit: true, What: "not in the event logs given (its node's rank_stacks record is missing)"}
		if i := slices.IndexFunc(ranks, func(r HangRank) bool { return r.Rank == c }); i >= 0 {
			g.What = ranks[i].what()
		}
		out = append(out, g)
	}
	idx := map[string]int{}
	for _, r := range ranks {
		if r.Culprit {
			continue
		}
		w := r.what()
		i, ok := idx[w]
		if !ok {
			i = len(out)
			idx[w] = i
			out = append(out, HangGroup{What: w})
		}
		if !slices.Contains(out[i].Ranks, r.Rank) {
			out[i].Ranks = append(out[i].Ranks, r.Rank)
		}
	}
	if out == nil {
		out = []HangGroup{}
	}
	return out
}

// attachStacks gives the culprits of every finding of h the stacks files
// load read.
func attachStacks(rec *records, h *Hang) {
	for i := range h.Ranks {
		hr := &h.Ranks[i]
		if st, ok := rec.stacks[stacksKey{hr.Node, hr.File}]; ok {
			hr.Stacks = &st
		}
	}
}

// readStacksFiles reads the stacks files of the ranks any node named a
// culprit (at most maxStacksFiles per round), for the page. The paths are
// the launchers' own, so a report made on another machine finds none;
// that is said beside the path, not as a warning. Only a regular file
// named stacks.txt that begins as the launcher writes it is read, and only
// as text: the page escapes it, nothing in it is run.
func (rec *records) readStacksFiles() {
	culprits := map[hangKey]map[int]bool{}
	for _, e := range rec.events {
		if ev, ok := e.Rec.(eventlog.RankStacksEvent); ok {
			k := hangKey{rec.jobOf(e), ev.Round}
			if culprits[k] == nil {
				culprits[k] = map[int]bool{}
			}
			for _, c := range ev.Culprits {
				culprits[k][c] = true
			}
		}
	}
	read := map[hangKey]int{}
	for _, e := range rec.events {
		ev, ok := e.Rec.(eventlog.RankStacksEvent)
		if !ok {
			continue
		}
		k := hangKey{rec.jobOf(e), ev.Round}
		for _, rr := range ev.Ranks {
			if rr.File == "" || !culprits[k][rr.Rank] || read[k] >= maxStacksFiles {
				continue
			}
			sk := stacksKey{e.Node, rr.File}
			if _, done := rec.stacks[sk]; done {
				continue
			}
			if rec.stacks == nil {
				rec.stacks = map[stacksKey]StacksText{}
			}
			rec.stacks[sk] = readStacks(rr)
			read[k]++
		}
	}
}

// stacksKey is a stacks file of a node: the same path on two nodes (logs
// under the same local directory) is two files.
type stacksKey struct{ node, file string }

// readStacks reads rr's stacks file; what went wrong is its Note. The file
// must name rr (local rank, rank and pid) in its first line: where every
// node writes its logs under the same local path, the file found here at
// another node's path is this machine's rank's, not rr's.
func readStacks(rr eventlog.RankStacksRank) StacksText {
	path := rr.File
	if filepath.Base(path) != stacksName {
		return StacksText{Note: "not read: not named " + stacksName}
	}
	st, err := readStacksText(path, fmt.Sprintf("%slocal rank %d (rank %d, pid %d)", stacksHeader, rr.LocalRank, rr.Rank, rr.PID))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return StacksText{Note: "not on this machine (open it on the rank's node)"}
	case err != nil:
		return StacksText{Note: "not read: " + err.Error()}
	}
	return st
}

func readStacksText(path, header string) (StacksText, error) {
	before, err := os.Lstat(path)
	if err != nil {
		return StacksText{}, fmt.Errorf("stacks file: %w", err)
	}
	if !before.Mode().IsRegular() {
		return StacksText{}, fmt.Errorf("stacks file %s: not a regular file (%s)", path, before.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return StacksText{}, fmt.Errorf("stacks file: %w", err)
	}
	defer f.Close()
	// The file opened must be the one checked (not a link swapped in).
	if now, err := f.Stat(); err != nil || !os.SameFile(before, now) {
		return StacksText{}, fmt.Errorf("stacks file %s: changed while it was opened", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxStacksBytes+1))
	if err != nil {
		return StacksText{}, fmt.Errorf("stacks file %s: %w", path, err)
	}
	if !strings.HasPrefix(string(b), stacksHeader) {
		return StacksText{}, fmt.Errorf("stacks file %s: not a stacks file of ft-launcher (no %q header)", path, strings.TrimSpace(stacksHeader))
	}
	if !strings.HasPrefix(string(b), header) {
		return StacksText{}, fmt.Errorf("stacks file %s: another rank's (not %q: a file of this machine, not of the rank's node?)", path, strings.TrimPrefix(header, stacksHeader))
	}
	st := StacksText{Size: before.Size()}
	if len(b) > maxStacksBytes {
		b = b[:maxStacksBytes]
		if i := strings.LastIndexByte(string(b), '\n'); i > 0 {
			b = b[:i+1]
		}
		st.Truncated = true
	}
	st.Text = strings.ToValidUTF8(string(b), "\uFFFD")
	return st, nil
}
