package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

// The fixtures of these tests are real event logs (two local ranks, gloo,
// CPU), made by report/testdata/inprocess_state_train.py under
// --restart-mode in-process and by integration/testdata/state_train.py
// under a full restart (state_fullrestart.jsonl: --state-dir under a
// regular file, so every write-out fails), with the agent store's and the
// ledger's lines left out to keep them small.

// TestInProcessRounds: a survivor of an in-process restart is drawn
// running through the round it survived (no rank_exited ends it: it stays
// in its process), its next round's start-up is its rejoin, a first-step
// mark follows each rejoin, and the steps lost come from the ranks' step
// counts, never 0 for want of them.
func TestInProcessRounds(t *testing.T) {
	tests := []struct {
		file      string
		lost      []*int // per round
		firstStep string // a word of the survivors' first-step mark
		note      string
	}{
		{file: "testdata/inprocess_state.jsonl", lost: []*int{ptr(4), ptr(5), nil}, firstStep: "first step after the restart"},
		{file: "testdata/inprocess_nosteps.jsonl", lost: []*int{nil, nil, nil}, firstStep: "first step after the in-process rejoin",
			note: "failed round(s) 0, 1: checkpoints recorded but no 'step' sections: the number of steps lost is unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Build(Inputs{EventLogs: []string{tt.file}})
			if err != nil {
				t.Fatal(err)
			}
			checkSum(t, r)
			if len(r.Rounds) != 3 || len(r.Ranks) != 2 {
				t.Fatalf("%d rounds and %d rank lanes, want 3 and 2", len(r.Rounds), len(r.Ranks))
			}
			for i, rd := range r.Rounds {
				if (rd.StepsLost == nil) != (tt.lost[i] == nil) || rd.StepsLost != nil && *rd.StepsLost != *tt.lost[i] {
					t.Errorf("round %d: steps lost %v, want %v", rd.Round, deref(rd.StepsLost), deref(tt.lost[i]))
				}
				if rd.Round > 0 && rd.FirstStep == nil {
					t.Errorf("round %d has no first step", rd.Round)
				}
			}
			if tt.note != "" && !slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, tt.note) }) {
				t.Errorf("notes %q lack %q", r.Notes, tt.note)
			}
			// Round 0: rank 1 crashed, rank 0 survived; round 1: rank 0
			// crashed, rank 1 survived.
			for _, c := range []struct{ survivor, round int }{{0, 0}, {1, 1}} {
				lane := r.Ranks[c.survivor]
				restart := r.Restarts[c.round].At
				var run *Span
				for i, s := range lane.Spans {
					if s.Kind == "running" && strings.HasPrefix(s.Label, fmt.Sprintf("round %d on", c.round)) {
						run = &lane.Spans[i]
					}
				}
				if run == nil {
					t.Fatalf("%s: no running span in round %d, which it survived: %+v", lane.Name, c.round, lane.Spans)
				}
				if !run.End.Equal(restart) || !strings.Contains(run.Label, "kept in its process") {
					t.Errorf("%s round %d: running %s → %s (%q), want it to end at the restart %s and say it was kept",
						lane.Name, c.round, run.Start.Format(time.StampMilli), run.End.Format(time.StampMilli), run.Label, restart.Format(time.StampMilli))
				}
				rejoin := false
				for _, s := range lane.Spans {
					rejoin = rejoin || s.Kind == "startup" && strings.Contains(s.Label, fmt.Sprintf("round %d on vm: rejoin in process", c.round+1))
				}
				if !rejoin {
					t.Errorf("%s: round %d's start-up is not shown as its rejoin: %+v", lane.Name, c.round+1, lane.Spans)
				}
				marked := false
				for _, m := range lane.Marks {
					marked = marked || m.Kind == "first_step" && m.At.After(restart) && strings.Contains(m.Label, tt.firstStep) &&
						strings.Contains(m.Label, fmt.Sprintf("round %d", c.round+1))
				}
				if !marked {
					t.Errorf("%s: no first-step mark (%q) after its rejoin into round %d: %+v", lane.Name, tt.firstStep, c.round+1, lane.Marks)
				}
			}
			// Every rank runs in every round: no gap where it trained.
			for _, lane := range r.Ranks {
				for n := range 3 {
					if !slices.ContainsFunc(lane.Spans, func(s Span) bool {
						return s.Kind == "running" && strings.HasPrefix(s.Label, fmt.Sprintf("round %d on", n)) && s.End.After(s.Start)
					}) {
						t.Errorf("%s: not running in round %d: %+v", lane.Name, n, lane.Spans)
					}
				}
			}
		})
	}
}

// TestStateAccount: the state events (state_save, state_persisted,
// state_persist_failed, state_restore) become the report's state account
// and each round's restore sources, in the JSON and on the page; a run
// without them has no state account.
func TestStateAccount(t *testing.T) {
	type restore struct {
		rank   int
		source string
		step   int64
	}
	tests := []struct {
		file      string
		saves     int64
		written   int
		writtenBy map[string]int
		failed    int
		restores  map[string]int
		empty     int
		byRound   map[int][]restore
		html      []string
	}{
		{
			file: "testdata/inprocess_state.jsonl", saves: 12, written: 6, writtenBy: map[string]int{"periodic": 4, "end": 2},
			restores: map[string]int{"memory": 4}, empty: 2,
			byRound: map[int][]restore{1: {{0, "memory", 9}, {1, "memory", 9}}, 2: {{0, "memory", 19}, {1, "memory", 19}}},
			html:    []string{"Launcher-held state", "<td>memory ×2</td>", "end ×2 periodic ×4", "newest: step 29"},
		},
		{
			file: "testdata/state_fullrestart.jsonl", saves: 40, written: 0, writtenBy: map[string]int{}, failed: 7,
			restores: map[string]int{"memory": 2}, empty: 2,
			byRound: map[int][]restore{1: {{0, "memory", 13}, {1, "memory", 8}}},
			html:    []string{"Launcher-held state", "<td>memory ×2</td>", "the store (start): state directory: mkdir /ckpt/notadir: not a directory"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			r, err := Build(Inputs{EventLogs: []string{tt.file}})
			if err != nil {
				t.Fatal(err)
			}
			st := r.State
			if st == nil {
				t.Fatal("no state account")
			}
			if st.Saves != tt.saves || st.Written != tt.written || st.WriteFailed != tt.failed || st.EmptyLoads != tt.empty {
				t.Errorf("saves %d, written %d, failed %d, empty loads %d; want %d, %d, %d, %d",
					st.Saves, st.Written, st.WriteFailed, st.EmptyLoads, tt.saves, tt.written, tt.failed, tt.empty)
			}
			if fmt.Sprint(st.WrittenBy) != fmt.Sprint(tt.writtenBy) || fmt.Sprint(st.Restores) != fmt.Sprint(tt.restores) {
				t.Errorf("written by %v, restores %v; want %v, %v", st.WrittenBy, st.Restores, tt.writtenBy, tt.restores)
			}
			if st.SaveStallMedianMS <= 0 || st.SaveStallMaxMS < st.SaveStallMedianMS || st.SaveBytesMax <= 0 {
				t.Errorf("save stall median %v max %v, largest %d bytes", st.SaveStallMedianMS, st.SaveStallMaxMS, st.SaveBytesMax)
			}
			if tt.failed > 0 && len(st.WriteErrors) == 0 {
				t.Error("write-outs failed but no error is shown")
			}
			for _, rd := range r.Rounds {
				var got []restore
				for _, x := range rd.Restores {
					got = append(got, restore{x.Rank, x.Source, x.Step})
					if x.At.Before(rd.Start) || x.LoadMS <= 0 {
						t.Errorf("round %d: restore %+v before the round started (%s) or without its load time", rd.Round, x, rd.Start)
					}
				}
				if fmt.Sprint(got) != fmt.Sprint(tt.byRound[rd.Round]) {
					t.Errorf("round %d restores %v, want %v", rd.Round, got, tt.byRound[rd.Round])
				}
			}
			for _, lane := range r.Ranks {
				if !slices.ContainsFunc(lane.Marks, func(m Mark) bool { return m.Kind == "restore" && strings.Contains(m.Label, "from memory") }) {
					t.Errorf("%s has no restore mark", lane.Name)
				}
			}
			var h, j bytes.Buffer
			if err := r.WriteHTML(&h); err != nil {
				t.Fatal(err)
			}
			for _, want := range tt.html {
				if !strings.Contains(h.String(), want) {
					t.Errorf("HTML lacks %q", want)
				}
			}
			if err := r.WriteJSON(&j); err != nil {
				t.Fatal(err)
			}
			var back struct {
				State  *State `json:"state"`
				Rounds []struct {
					Restores []Restore `json:"restores"`
				} `json:"rounds"`
			}
			if err := json.Unmarshal(j.Bytes(), &back); err != nil || back.State == nil || back.State.Saves != tt.saves || back.State.Written != tt.written {
				t.Fatalf("JSON state does not read back: %v %+v", err, back.State)
			}
			n := 0
			for _, rd := range back.Rounds {
				n += len(rd.Restores)
			}
			if want := tt.restores["memory"]; n != want {
				t.Errorf("JSON holds %d restores, want %d", n, want)
			}
		})
	}
	r, err := Build(Inputs{EventLogs: []string{"testdata/crash.jsonl"}})
	if err != nil {
		t.Fatal(err)
	}
	var j bytes.Buffer
	if err := r.WriteJSON(&j); err != nil {
		t.Fatal(err)
	}
	if r.State != nil || strings.Contains(j.String(), `"state"`) {
		t.Errorf("a run without --state-dir has a state account: %+v", r.State)
	}
}

func ptr(n int) *int { return &n }

// TestRankWithoutExitEndsWithItsNode: a rank whose exit the log does not
// hold runs until its round was stopped, and no longer than its node: a
// lost node's ranks end with the loss (it wrote nothing after).
func TestRankWithoutExitEndsWithItsNode(t *testing.T) {
	lines := []string{
		`{"event":"launcher_started","nproc_per_node":1,"node":"n1","run_id":"r1","ts":"2026-01-01T00:00:00Z"}`,
		`{"event":"launcher_started","nproc_per_node":1,"node":"n2","run_id":"r1","ts":"2026-01-01T00:00:00Z"}`,
		`{"event":"cycle_started","group_rank":0,"node":"n1","pids":[10],"round":0,"run_id":"r1","ts":"2026-01-01T00:00:01Z","world_size":2}`,
		`{"event":"cycle_started","group_rank":1,"node":"n2","pids":[20],"round":0,"run_id":"r1","ts":"2026-01-01T00:00:01Z","world_size":2}`,
		`{"at":"2026-01-01T00:00:03Z","event":"rank_first_heartbeat","local_rank":0,"node":"n1","rank":0,"round":0,"run_id":"r1","ts":"2026-01-01T00:00:03Z"}`,
		`{"at":"2026-01-01T00:00:03Z","event":"rank_first_heartbeat","local_rank":0,"node":"n2","rank":1,"round":0,"run_id":"r1","ts":"2026-01-01T00:00:03Z"}`,
		`{"event":"ledger","node":"n1","record":{"job":"r1","node":"n2","role":"Active","group_rank":1,"start":"2026-01-01T00:00:00Z","end":"2026-01-01T00:00:10Z","reason":"NodeFailure","detail":"gossip"},"run_id":"r1","ts":"2026-01-01T00:00:12Z"}`,
		`{"event":"rank_exited","exit_code":1,"local_rank":0,"node":"n1","rank":0,"round":0,"run_id":"r1","ts":"2026-01-01T00:00:13Z"}`,
		`{"after_round":0,"event":"restart","node":"n1","reason":"node n2 lost","run_id":"r1","ts":"2026-01-01T00:00:14Z"}`,
		`{"event":"job_failed","node":"n1","reason":"out of restarts","round":0,"run_id":"r1","ts":"2026-01-01T00:00:20Z"}`,
	}
	r := buildFromLines(t, lines)
	checkSum(t, r)
	want := map[string]string{"rank 0": "00:00:13", "rank 1": "00:00:10"} // its exit; its node's loss
	for _, lane := range r.Ranks {
		var ends []string
		for _, s := range lane.Spans {
			if s.Kind == "running" {
				ends = append(ends, s.End.Format(time.TimeOnly))
			}
		}
		if len(ends) != 1 || ends[0] != want[lane.Name] {
			t.Errorf("%s: running spans end at %v, want [%s]", lane.Name, ends, want[lane.Name])
		}
	}
}

// buildFromLines builds the report of one event log made of lines.
func buildFromLines(t *testing.T, lines []string) *Report {
	t.Helper()
	path := t.TempDir() + "/events.jsonl"
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := Build(Inputs{EventLogs: []string{path}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}
