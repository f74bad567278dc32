package stacks

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ftlauncher/ft-launcher/pytrace"
)

// Phases a rank may wait in for long without being hung, besides
// pytrace's (data loading, a save, a load, a compilation).
const (
	PhaseIO    = "I/O"           // a socket, select or subprocess wait of the standard library
	PhaseWait  = "a thread wait" // threading's Event, Condition, Queue: another thread's work
	PhaseSleep = "a timed sleep" // time.sleep and the like (the kernel's wait channel)
)

// Summary is what one rank was doing when a hang was declared: all that
// is needed to judge the job's hang, small enough to share between nodes.
type Summary struct {
	Rank      int    `json:"rank"` // global
	LocalRank int    `json:"local_rank"`
	Node      string `json:"node,omitempty"`
	State     State  `json:"state"`
	// Activity of the main thread (pytrace.Classify) when State is
	// StateDumped: "collective", "user", "lock", "io", "library".
	Activity pytrace.Activity `json:"activity,omitempty"`
	// Place is the deepest frame in the user's code ("train.py:88 in
	// step"); the innermost frame when none is the user's.
	Place string `json:"place,omitempty"`
	// Collective is the torch.distributed call it waits in ("all_reduce").
	Collective string `json:"collective,omitempty"`
	// Expired: this rank's own clock ran out (the rank monitor declared
	// it hung); Silent orders the ranks by their last heartbeat, oldest
	// first (0: unknown).
	Expired bool  `json:"expired,omitempty"`
	Silent  int64 `json:"silent_since_unix_ms,omitempty"`
	// Phase is the phase of training its main thread is in, when its
	// library frames say (pytrace.Phase: "data loading", "a save", ...).
	Phase string `json:"phase,omitempty"`
	// Busy: its processes used CPU or moved data over the activity
	// window, or were in uninterruptible I/O (only measured for a
	// default clock's expiry).
	Busy bool `json:"busy,omitempty"`
	// At is when the stacks were taken (Unix ms): summaries of an older
	// judgement are left out of this one.
	At int64 `json:"at,omitempty"`
	// MarginMS is how much later than another rank's its last heartbeat
	// must be to show that it progressed after that one stopped: its
	// longest heartbeat interval, at least a tenth of its timeout.
	MarginMS int64 `json:"margin_ms,omitempty"`
	// FR: its flight recorder (NCCL) was read and holds a collective.
	// FRPending: one is not completed, the oldest FRName (nccl:all_reduce)
	// number FRSeq in process group FRGroup. FRLastSeq and FRLastGroup:
	// the newest collective it issued.
	FR          bool   `json:"fr,omitempty"`
	FRPending   bool   `json:"fr_pending,omitempty"`
	FRName      string `json:"fr_name,omitempty"`
	FRSeq       int64  `json:"fr_seq,omitempty"`
	FRGroup     string `json:"fr_group,omitempty"`
	FRLastSeq   int64  `json:"fr_last_seq,omitempty"`
	FRLastGroup string `json:"fr_last_group,omitempty"`
	// FRText is the record in one line (FlightRecord.Text, or why it was
	// not read), for this node's files and events; not shared.
	FRText string `json:"-"`
}

// Summarize reads what r's dump says (the newest dump in it).
func Summarize(r Rank, globalRank int) Summary {
	s := Summary{Rank: globalRank, LocalRank: r.LocalRank, State: r.State}
	if r.FRState == FRTaken && len(r.FR) > 0 {
		s.summarizeFR(r.FR)
	}
	if r.State != StateDumped {
		return s
	}
	dumps := pytrace.ParseDumps(r.Dump)
	if len(dumps) == 0 {
		s.State = StateNoAnswer // it wrote, but nothing that reads as a dump
		return s
	}
	main, ok := dumps[len(dumps)-1].MainThread()
	if !ok || len(main.Frames) == 0 {
		s.State = StateNoAnswer
		return s
	}
	s.Activity = pytrace.Classify(main)
	s.Phase = pytrace.Phase(main)
	switch {
	case s.Phase != "":
	case s.Activity == pytrace.ActIO:
		s.Phase = PhaseIO
	case s.Activity == pytrace.ActLock:
		s.Phase = PhaseWait
	case strings.Contains(r.WChan, "nanosleep"):
		// time.sleep is C: the dump shows the user's line, the kernel a
		// timed sleep (a poll for a file, a back-off), which ends by itself.
		s.Phase = PhaseSleep
	}
	if s.Activity == pytrace.ActCollective {
		s.Collective = pytrace.Collective(main)
	}
	if f, ok := pytrace.UserFrame(main.Frames); ok {
		s.Place = f.String()
	} else {
		s.Place = main.Frames[len(main.Frames)-1].String()
	}
	return s
}

// summarizeFR reads a rank's flight recorder (a pickle) into s.
func (s *Summary) summarizeFR(b []byte) {
	fr, err := ParseFlightRecord(b)
	if err != nil {
		s.FRText = "not read: " + err.Error()
		return
	}
	s.FRText = fr.Text()
	if fr.Last != nil {
		s.FR, s.FRLastSeq, s.FRLastGroup = true, fr.Last.Seq, fr.Last.Group
	}
	if p := fr.Pending; p != nil {
		s.FRPending, s.FRName, s.FRSeq, s.FRGroup = true, p.Name, p.Seq, p.Group
	}
}

// waiting reports a rank that waits on its peers.
func (s Summary) waiting() bool {
	return s.State == StateDumped && s.Activity == pytrace.ActCollective
}

// shown is what, with the collective its flight recorder waits in: how
// the groups of a finding read.
func (s Summary) shown() string {
	w := s.what()
	switch {
	case !s.waiting():
	case s.FRPending:
		w += fmt.Sprintf(" (%s #%d)", s.FRName, s.FRSeq)
	case s.FR:
		w += fmt.Sprintf(" (none pending, the last #%d)", s.FRLastSeq)
	}
	return w
}

// what says what s was doing, without its rank.
func (s Summary) what() string {
	switch {
	case s.State == StateStopped:
		return "stopped by a signal (SIGSTOP)"
	case s.State == StateNoAnswer:
		return "did not answer the stack request"
	case s.State == StateNoHook:
		return "no stack (not a Python rank, or --ft-rank-stacks off)"
	case s.State == StateGone:
		return "exited"
	case s.waiting():
		return fmt.Sprintf("in %s at %s", s.Collective, s.Place)
	case s.Activity == pytrace.ActUser:
		return fmt.Sprintf("in %s, not in a collective", s.Place)
	}
	return fmt.Sprintf("in %s (%s), not in a collective", s.Place, s.Activity)
}

// Dismiss says why a default clock's expiry judged as f is no hang, ""
// when it is one: a rank f names (a culprit, or the first silent) is busy
// (it computes, reads or writes, or waits in uninterruptible I/O: an
// evaluation, a save, a compilation nobody announced), or waits in a
// phase that may take long without being stuck (phase: data loading, a
// save, a load, a compilation), which then gets a longer clock. A default
// clock is the launcher's guess; configured ones mean what they say and
// are never dismissed.
func Dismiss(f Finding, ranks []Summary) (why string, phase bool) {
	for _, s := range ranks {
		if !slices.Contains(f.Culprits, s.Rank) {
			continue
		}
		switch {
		case s.Busy:
			return fmt.Sprintf("%s is busy (%s): not hung", RankList([]int{s.Rank}), s.what()), false
		case s.Phase != "":
			return fmt.Sprintf("%s waits in %s (%s): not hung yet", RankList([]int{s.Rank}), s.Phase, s.what()), true
		}
	}
	return "", false
}

// Finding is the judgement of one hang over the ranks whose stacks were
// taken.
type Finding struct {
	// Known: the evidence singles the culprits out. When false, Culprits
	// holds the first silent rank, named as such and not as the one that
	// hung.
	Known    bool    `json:"known"`
	Culprits []int   `json:"culprits"` // global ranks
	Why      string  `json:"why"`      // the rule that named them
	Groups   []Group `json:"groups"`   // every rank, culprits first, the others grouped by what they did
	Text     string  `json:"text"`     // one line for a restart reason
}

// Group is ranks that were doing the same thing.
type Group struct {
	Ranks   []int  `json:"ranks"`
	Culprit bool   `json:"culprit,omitempty"`
	What    string `json:"what"`
}

// Judge names the rank that hung from what every rank was doing. The rule
// (docs/timeouts.md, "Which rank hung"):
//
//  1. A rank stopped by a signal, or one not waiting in a collective while
//     others wait in one, is what the others wait for: the culprit.
//  2. When every rank that answered waits in a collective, a strict
//     minority waiting somewhere the majority is not (a collective its
//     peers never joined) is the culprit, provided the majority has two
//     ranks or more.
//  3. When every answering rank waits in the same collective and exactly
//     one rank did not answer, that one is the culprit.
//  4. When every rank waits in a collective and the stacks do not single
//     one out, the flight recorders (NCCL) may: the newest collective any
//     rank waits in (its oldest not completed), #N of a process group, and
//     every rank either waits in #N or never issued it (its newest
//     collective of that group is older): those that never issued it are
//     the culprits. Any rank without a record, or in another state, and
//     the rule names nobody.
//  5. When the ranks whose clocks expired are the only silent ones,
//     every other rank having exited or heartbeated clearly after them
//     (by its MarginMS), they are the culprits.
//  6. Otherwise nothing singles one out: the first rank to fall silent
//     (the oldest last heartbeat, else the first whose clock expired) is
//     named, as "first silent".
//
// A rank stopped by a signal counts under rule 1 even when no rank waits
// in a collective, unless every rank is stopped.
func Judge(ranks []Summary) Finding {
	rs := slices.Clone(ranks)
	slices.SortFunc(rs, func(a, b Summary) int { return a.Rank - b.Rank })
	var culprits, stopped, elsewhere, waiting, unanswered []Summary
	why := ""
	for _, s := range rs {
		switch {
		case s.State == StateStopped:
			stopped = append(stopped, s)
		case s.State == StateDumped && !s.waiting():
			elsewhere = append(elsewhere, s)
		case s.waiting():
			waiting = append(waiting, s)
		default:
			unanswered = append(unanswered, s)
		}
	}
	switch {
	case len(stopped) > 0 && len(stopped) < len(rs) || len(stopped) == 1 && len(rs) == 1:
		culprits = stopped
		why = "stopped by a signal"
		if len(waiting) > 0 && len(elsewhere) > 0 {
			culprits = append(culprits, elsewhere...)
			why += "; or not waiting in a collective while the others wait in one"
		}
	case len(elsewhere) > 0 && (len(waiting) > 0 || len(rs) == 1):
		culprits, why = elsewhere, "not waiting in a collective while the others wait in one"
	case len(waiting) > 0 && len(elsewhere) == 0:
		places := map[string][]Summary{}
		for _, s := range waiting {
			places[s.what()] = append(places[s.what()], s)
		}
		if len(places) > 1 {
			smallest, largest, unique := len(rs), 0, true
			for _, g := range places {
				switch {
				case len(g) < smallest:
					smallest, unique = len(g), true
				case len(g) == smallest:
					unique = false
				}
				largest = max(largest, len(g))
			}
			if unique && largest >= 2 && smallest < largest {
				for _, g := range places {
					if len(g) == smallest {
						culprits = g
					}
				}
				why = "waiting in a collective its peers never joined"
			}
		} else if len(unanswered) == 1 {
			culprits, why = unanswered, "the only rank that did not answer, while all others wait in one collective"
		}
	}
	if len(culprits) == 0 && len(waiting) == len(rs) {
		if c, ahead := behindInRecorder(waiting); len(c) > 0 {
			culprits = c
			why = fmt.Sprintf("never issued collective #%d of group %s, which the others wait in (flight recorder)", ahead, c[0].FRLastGroup)
		}
	}
	if len(culprits) == 0 {
		if c := aloneSilent(rs); len(c) > 0 {
			culprits, why = c, "the only ranks silent: every other rank exited or heartbeated after them"
		}
	}
	slices.SortFunc(culprits, func(a, b Summary) int { return a.Rank - b.Rank })
	f := Finding{Known: len(culprits) > 0, Why: why}
	if !f.Known {
		if s, ok := firstSilent(rs); ok {
			culprits = []Summary{s}
		}
		f.Why = "nothing singles one rank out: the first rank to fall silent is named"
	}
	in := map[int]bool{}
	for _, s := range culprits {
		f.Culprits = append(f.Culprits, s.Rank)
		in[s.Rank] = true
	}
	f.Groups = groups(rs, in)
	f.Text = text(f)
	return f
}

// behindInRecorder returns the ranks of ws (every one waiting in a
// collective) that never issued the collective the others wait in, by
// their flight recorders (rule 4), and that collective's number; nil when
// any rank has no record or is in another state.
func behindInRecorder(ws []Summary) ([]Summary, int64) {
	if len(ws) < 2 {
		return nil, 0
	}
	n, group := int64(-1), ""
	for _, s := range ws {
		if !s.FR {
			return nil, 0
		}
		if s.FRPending && s.FRSeq > n {
			n, group = s.FRSeq, s.FRGroup
		}
	}
	if n < 0 {
		return nil, 0
	}
	var behind []Summary
	waiting := 0
	for _, s := range ws {
		switch {
		case s.FRPending && s.FRSeq == n && s.FRGroup == group:
			waiting++
		case s.FRLastSeq < n && s.FRLastGroup == group:
			behind = append(behind, s) // never issued #n
		default:
			return nil, 0
		}
	}
	if waiting == 0 || len(behind) == 0 {
		return nil, 0
	}
	return behind, n
}

// aloneSilent returns the ranks whose clocks expired when every other
// rank exited, or heartbeated more than its margin after the latest of
// theirs (rule 5); nil otherwise.
func aloneSilent(rs []Summary) []Summary {
	var expired []Summary
	var last int64
	for _, s := range rs {
		if s.Expired {
			expired = append(expired, s)
			last = max(last, s.Silent)
		}
	}
	if len(expired) == 0 || len(expired) == len(rs) {
		return nil
	}
	for _, s := range rs {
		switch {
		case s.Expired, s.State == StateGone:
		case last == 0 || s.Silent == 0 || s.Silent-last <= s.MarginMS:
			return nil
		}
	}
	return expired
}

// firstSilent is the rank whose last heartbeat is the oldest, else the
// first (lowest) whose clock expired, else the lowest rank.
func firstSilent(rs []Summary) (Summary, bool) {
	if len(rs) == 0 {
		return Summary{}, false
	}
	best, found := Summary{}, false
	for _, s := range rs {
		if s.Silent != 0 && (!found || s.Silent < best.Silent) {
			best, found = s, true
		}
	}
	if found {
		return best, true
	}
	for _, s := range rs {
		if s.Expired {
			return s, true
		}
	}
	return rs[0], true
}

func groups(rs []Summary, culprit map[int]bool) []Group {
	var out []Group
	idx := map[string]int{}
	for _, s := range rs {
		key := s.shown()
		if culprit[s.Rank] {
			out = append(out, Group{Ranks: []int{s.Rank}, Culprit: true, What: key})
			continue
		}
		i, ok := idx[key]
		if !ok {
			i = len(out)
			idx[key] = i
			out = append(out, Group{What: key})
		}
		out[i].Ranks = append(out[i].Ranks, s.Rank)
	}
	slices.SortStableFunc(out, func(a, b Group) int {
		switch {
		case a.Culprit && !b.Culprit:
			return -1
		case b.Culprit && !a.Culprit:
			return 1
		}
		return 0
	})
	return out
}

func text(f Finding) string {
	var parts []string
	for _, g := range f.Groups {
		switch {
		case g.Culprit && f.Known:
			parts = append(parts, fmt.Sprintf("%s hung: %s", RankList(g.Ranks), g.What))
		case g.Culprit:
			parts = append(parts, fmt.Sprintf("%s first silent: %s", RankList(g.Ranks), g.What))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s", RankList(g.Ranks), g.What))
		}
	}
	return strings.Join(parts, "; ")
}

// RankList writes ranks as "rank 3" or "ranks 0-2, 5".
func RankList(ranks []int) string {
	rs := slices.Clone(ranks)
	slices.Sort(rs)
	rs = slices.Compact(rs)
	var parts []string
	for i := 0; i < len(rs); {
		j := i
		for j+1 < len(rs) && rs[j+1] == rs[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, strconv.Itoa(rs[i])+"-"+strconv.Itoa(rs[j]))
		} else {
			parts = append(parts, strconv.Itoa(rs[i]))
		}
		i = j + 1
	}
	if len(rs) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}
