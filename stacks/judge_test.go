package stacks

import (
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/pytrace"
)

func waitAt(rank int, place string) Summary {
	return Summary{Rank: rank, LocalRank: rank % 2, State: StateDumped, Activity: pytrace.ActCollective,
		Collective: "all_reduce", Place: place}
}

// frAt is a rank waiting in all_reduce at the same line as its peers, its
// flight recorder's oldest collective not completed (and newest) number
// seq.
func frAt(rank int, seq int64) Summary {
	s := waitAt(rank, "train.py:88 in step")
	s.FR, s.FRPending, s.FRName, s.FRSeq, s.FRGroup = true, true, "nccl:all_reduce", seq, "0 default_pg"
	s.FRLastSeq, s.FRLastGroup = seq, s.FRGroup
	return s
}

// frDone is a rank whose recorder completed every collective, up to seq.
func frDone(rank int, seq int64) Summary {
	s := frAt(rank, seq)
	s.FRPending, s.FRName, s.FRSeq, s.FRGroup = false, "", 0, ""
	return s
}

func frLast(s Summary, seq int64) Summary {
	s.FRLastSeq = seq
	return s
}

func frIn(s Summary, group string) Summary {
	s.FRGroup, s.FRLastGroup = group, group
	return s
}

func TestJudge(t *testing.T) {
	in := func(rank int, act pytrace.Activity, place string) Summary {
		return Summary{Rank: rank, State: StateDumped, Activity: act, Place: place}
	}
	for _, tc := range []struct {
		name     string
		ranks    []Summary
		known    bool
		culprits []int
		text     []string // substrings of Finding.Text
	}{
		{"a deadlocked lock", []Summary{waitAt(0, "train.py:88 in step"), in(1, pytrace.ActUser, "train.py:60 in step"),
			waitAt(2, "train.py:88 in step"), waitAt(3, "train.py:88 in step")},
			true, []int{1}, []string{"rank 1 hung: in train.py:60 in step, not in a collective", "ranks 0, 2-3: in all_reduce at train.py:88 in step"}},
		{"a read on a FIFO", []Summary{in(0, pytrace.ActUser, "data.py:12 in load"), waitAt(1, "train.py:88 in step")},
			true, []int{0}, []string{"rank 0 hung"}},
		{"SIGSTOP", []Summary{waitAt(0, "train.py:88 in step"), waitAt(1, "train.py:88 in step"), {Rank: 2, State: StateStopped}, waitAt(3, "train.py:88 in step")},
			true, []int{2}, []string{"rank 2 hung: stopped by a signal", "ranks 0-1, 3: in all_reduce"}},
		{"a collective its peers never joined", []Summary{waitAt(0, "train.py:88 in step"), waitAt(1, "train.py:95 in extra"),
			waitAt(2, "train.py:88 in step"), waitAt(3, "train.py:88 in step")},
			true, []int{1}, []string{"rank 1 hung: in all_reduce at train.py:95 in extra"}},
		{"one rank did not answer", []Summary{waitAt(0, "train.py:88 in step"), {Rank: 1, State: StateNoAnswer}, waitAt(2, "train.py:88 in step")},
			true, []int{1}, []string{"rank 1 hung: did not answer"}},
		{"two ranks, two collectives: no majority", []Summary{waitAt(0, "train.py:88 in step"), waitAt(1, "train.py:95 in extra")},
			false, []int{0}, []string{"rank 0 first silent"}},
		{"every rank waits in the same collective (the culprit is elsewhere)", []Summary{waitAt(0, "train.py:88 in step"),
			{Rank: 1, State: StateDumped, Activity: pytrace.ActCollective, Collective: "all_reduce", Place: "train.py:88 in step", Silent: 100},
		}, false, []int{1}, []string{"rank 1 first silent", "rank 0: in all_reduce"}},
		{"flight recorder: one rank never issued the collective", []Summary{frAt(0, 21), frAt(1, 21), frAt(2, 20), frAt(3, 21)},
			true, []int{2}, []string{"rank 2 hung: in all_reduce at train.py:88 in step (nccl:all_reduce #20)", "ranks 0-1, 3: in all_reduce at train.py:88 in step (nccl:all_reduce #21)"}},
		{"flight recorder: the culprit completed all it issued", []Summary{frAt(0, 21), frDone(1, 20), frAt(2, 21)},
			true, []int{1}, []string{"rank 1 hung: in all_reduce at train.py:88 in step (none pending, the last #20)"}},
		{"flight recorder: two ranks, one behind", []Summary{frAt(0, 7), frAt(1, 8)},
			true, []int{0}, []string{"rank 0 hung"}},
		{"flight recorder: every rank at the same collective", []Summary{frAt(0, 21), frAt(1, 21), frAt(2, 21)},
			false, []int{0}, []string{"first silent"}},
		{"flight recorder: a rank waits in an older one but issued #22", []Summary{frLast(frAt(0, 21), 22), frAt(1, 22), frAt(2, 20), frAt(3, 22)},
			false, []int{0}, []string{"first silent"}},
		{"flight recorder: another process group", []Summary{frAt(0, 21), frIn(frAt(1, 20), "1 tp"), frAt(2, 21)},
			false, []int{0}, []string{"first silent"}},
		{"flight recorder: one rank without a record", []Summary{frAt(0, 21), waitAt(1, "train.py:88 in step"), frAt(2, 20), frAt(3, 21)},
			false, []int{0}, []string{"first silent"}},
		{"every rank in user code", []Summary{in(0, pytrace.ActUser, "a.py:1"), in(1, pytrace.ActUser, "a.py:1")},
			false, []int{0}, []string{"first silent"}},
		{"first silent by expiry", []Summary{{Rank: 0, State: StateNoHook}, {Rank: 1, State: StateNoHook, Expired: true}},
			false, []int{1}, []string{"rank 1 first silent: no stack"}},
		{"a single rank", []Summary{in(0, pytrace.ActIO, "x.py:3 in f")}, true, []int{0}, []string{"rank 0 hung: in x.py:3 in f (io)"}},
		{"stopped while the others compute", []Summary{in(0, pytrace.ActUser, "a.py:1"), {Rank: 1, State: StateStopped}},
			true, []int{1}, []string{"rank 1 hung: stopped by a signal"}},
		{"every rank stopped", []Summary{{Rank: 0, State: StateStopped}, {Rank: 1, State: StateStopped}},
			false, []int{0}, []string{"first silent"}},
		{"alone silent: the other heartbeated later", []Summary{
			{Rank: 0, State: StateDumped, Activity: pytrace.ActUser, Place: "a.py:1", Silent: 5000, MarginMS: 100},
			{Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "a.py:2", Silent: 1000, Expired: true}},
			true, []int{1}, []string{"rank 1 hung: in a.py:2"}},
		{"alone silent: the other exited", []Summary{{Rank: 0, State: StateGone},
			{Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "a.py:2", Expired: true}},
			true, []int{1}, []string{"rank 1 hung"}},
		{"not alone: the other heartbeated within its margin", []Summary{
			{Rank: 0, State: StateDumped, Activity: pytrace.ActUser, Place: "a.py:1", Silent: 1050, MarginMS: 100},
			{Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "a.py:2", Silent: 1000, Expired: true}},
			false, []int{1}, []string{"rank 1 first silent"}},
		{"none", nil, false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := Judge(tc.ranks)
			if f.Known != tc.known || !equal(f.Culprits, tc.culprits) {
				t.Fatalf("known %v culprits %v (%s), want %v %v", f.Known, f.Culprits, f.Why, tc.known, tc.culprits)
			}
			for _, s := range tc.text {
				if !strings.Contains(f.Text, s) {
					t.Errorf("text %q lacks %q", f.Text, s)
				}
			}
			if !tc.known && strings.Contains(f.Text, " hung") {
				t.Errorf("text %q says hung though nothing singles a rank out", f.Text)
			}
			n := 0
			for _, g := range f.Groups {
				n += len(g.Ranks)
			}
			if n != len(tc.ranks) {
				t.Errorf("groups hold %d ranks, want %d", n, len(tc.ranks))
			}
		})
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDismiss(t *testing.T) {
	wait := waitAt(0, "train.py:88 in step")
	for _, tc := range []struct {
		name  string
		ranks []Summary
		why   string
		phase bool
	}{
		{"an idle culprit is hung", []Summary{wait, {Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "t.py:1"}}, "", false},
		{"a busy culprit is not", []Summary{wait, {Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "t.py:1", Busy: true}}, "rank 1 is busy", false},
		{"a culprit in the data loader waits", []Summary{wait, {Rank: 1, State: StateDumped, Activity: pytrace.ActLock, Place: "t.py:5 in step", Phase: pytrace.PhaseData}}, "rank 1 waits in data loading", true},
		{"a busy first-silent rank is not hung", []Summary{{Rank: 0, State: StateDumped, Activity: pytrace.ActUser, Place: "t.py:1", Busy: true, Expired: true}, {Rank: 1, State: StateDumped, Activity: pytrace.ActUser, Place: "t.py:1", Busy: true, Expired: true}}, "is busy", false},
		{"a bystander's business does not count", []Summary{{Rank: 0, State: StateDumped, Activity: pytrace.ActCollective, Collective: "all_reduce", Place: "t.py:8", Busy: true}, {Rank: 1, State: StateStopped}}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why, phase := Dismiss(Judge(tc.ranks), tc.ranks)
			if (tc.why == "") != (why == "") || !strings.Contains(why, tc.why) || phase != tc.phase {
				t.Fatalf("Dismiss = %q %v, want %q %v", why, phase, tc.why, tc.phase)
			}
		})
	}
}

func TestRankList(t *testing.T) {
	for _, tc := range []struct {
		in   []int
		want string
	}{
		{[]int{3}, "rank 3"},
		{[]int{0, 1, 2, 5}, "ranks 0-2, 5"},
		{[]int{5, 0, 2, 1, 2}, "ranks 0-2, 5"},
		{[]int{1, 3}, "ranks 1, 3"},
	} {
		if got := RankList(tc.in); got != tc.want {
			t.Errorf("RankList(%v) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
