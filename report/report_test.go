package report

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm/resumer"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The testdata records are synthetic: they hold the events the launcher
// writes (eventlog, monitor) at round-number times, so every phase can be
// checked to the second. The integration tests run the same code on the
// records of real runs.

func TestBuildPhases(t *testing.T) {
	tests := []struct {
		name     string
		in       Inputs
		wall     float64
		phases   map[string]float64 // phases not named must be 0
		restarts []int              // after_round of each restart
		ends     []string           // each round's end
		lost     []int              // steps lost per failed round
		ranks    int
		notes    []string
		reasons  []string // each round's reason contains this ("" = not checked)
	}{
		{
			name: "crash after a checkpoint",
			in:   Inputs{EventLogs: []string{"testdata/crash.jsonl"}},
			wall: 52,
			phases: map[string]float64{Rendezvous: 2, Startup: 7, Productive: 35, Recompute: 5, Stop: 2,
				Shutdown: 1},
			restarts: []int{0}, ends: []string{"crash", "success"}, lost: []int{5}, ranks: 2,
		},
		{
			name:     "hang: detection from the last progress to the kill",
			in:       Inputs{EventLogs: []string{"testdata/hang.jsonl"}},
			wall:     40,
			phases:   map[string]float64{Rendezvous: 1, Startup: 4, Productive: 21, Recompute: 4, Detection: 6, Stop: 4},
			restarts: []int{0}, ends: []string{"hang", "success"}, lost: []int{4}, ranks: 1,
		},
		{
			// Rank 1 waited in a collective for rank 0 and fell silent with
			// it: the reason names both, in the order their timeouts expired.
			name:     "hang: every rank whose timeout expired is named",
			in:       Inputs{EventLogs: []string{"testdata/hang_peers.jsonl"}},
			wall:     30,
			phases:   map[string]float64{Rendezvous: 1, Startup: 4, Productive: 14, Recompute: 5, Detection: 5, Stop: 1},
			restarts: []int{0}, ends: []string{"hang", "success"}, lost: []int{4}, ranks: 2,
			reasons: []string{"rank 1 hung (heartbeat), then rank 0 (+20 ms)", ""},
		},
		{
			name:     "no rank-monitor client: start-up and lost steps unknown, said so",
			in:       Inputs{EventLogs: []string{"testdata/nosections.jsonl"}},
			wall:     20,
			phases:   map[string]float64{Rendezvous: 1, Productive: 18, Stop: 1},
			restarts: []int{0}, ends: []string{"crash", "success"}, ranks: 1,
			notes: []string{"no rank reported a heartbeat", "steps lost since the last checkpoint are unknown"},
		},
		{
			name: "a failed round in which no rank heartbeated is start-up, not training",
			in:   Inputs{EventLogs: []string{"testdata/silentround.jsonl"}},
			wall: 50,
			phases: map[string]float64{Rendezvous: 3, Startup: 10, Productive: 21, Recompute: 8, Detection: 4,
				Stop: 4},
			restarts: []int{0, 1}, ends: []string{"crash", "hang", "success"}, lost: []int{5}, ranks: 1,
			notes: []string{"failed round(s) 1: no rank heartbeated although the ranks of other rounds did"},
		},
		{
			name:     "verdict only: the cycles' phases",
			in:       Inputs{Verdicts: []string{"testdata/verdict-only.json"}},
			wall:     21,
			phases:   map[string]float64{Rendezvous: 2, Productive: 17, Stop: 1, Shutdown: 1},
			restarts: []int{0}, ends: []string{"crash", "success"},
			notes: []string{"no rank reported a heartbeat"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Build(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			checkSum(t, r)
			if math.Abs(r.WallS-tt.wall) > 1e-6 {
				t.Errorf("wall %.3fs, want %.3f", r.WallS, tt.wall)
			}
			for _, p := range PhaseOrder {
				if math.Abs(r.PhasesS[p]-tt.phases[p]) > 1e-6 {
					t.Errorf("phase %s = %.3fs, want %.3f (all: %v)", p, r.PhasesS[p], tt.phases[p], r.PhasesS)
				}
			}
			if got := len(r.Restarts); got != len(tt.restarts) {
				t.Errorf("%d restarts, want %d", got, len(tt.restarts))
			}
			for i, rs := range r.Restarts {
				if i < len(tt.restarts) && rs.AfterRound != tt.restarts[i] {
					t.Errorf("restart %d after round %d, want %d", i, rs.AfterRound, tt.restarts[i])
				}
			}
			var ends []string
			var lost []int
			for _, rd := range r.Rounds {
				ends = append(ends, rd.End)
				if rd.StepsLost != nil {
					lost = append(lost, *rd.StepsLost)
				}
			}
			if strings.Join(ends, ",") != strings.Join(tt.ends, ",") {
				t.Errorf("round ends %v, want %v", ends, tt.ends)
			}
			for i, want := range tt.reasons {
				if i >= len(r.Rounds) {
					t.Errorf("no round %d for reason %q", i, want)
				} else if !strings.Contains(r.Rounds[i].Reason, want) {
					t.Errorf("round %d's reason %q, want it to contain %q", i, r.Rounds[i].Reason, want)
				}
			}
			if len(lost) != len(tt.lost) || (len(lost) > 0 && lost[0] != tt.lost[0]) {
				t.Errorf("steps lost %v, want %v", lost, tt.lost)
			}
			if len(r.Ranks) != tt.ranks {
				t.Errorf("%d rank lanes, want %d", len(r.Ranks), tt.ranks)
			}
			for _, rd := range r.Rounds {
				if strings.HasSuffix(rd.Reason, " )") || strings.Contains(rd.Reason, "  ") {
					t.Errorf("round %d's reason %q has an empty part", rd.Round, rd.Reason)
				}
			}
			for _, lane := range r.Ranks {
				for _, m := range lane.Marks {
					if strings.Contains(m.Label, "  ") || strings.HasSuffix(m.Label, " ") {
						t.Errorf("rank lane %q: %s mark's label %q has an empty part", lane.Name, m.Kind, m.Label)
					}
				}
			}
			all := strings.Join(r.Notes, "\n")
			for _, n := range tt.notes {
				if !strings.Contains(all, n) {
					t.Errorf("notes %q lack %q", all, n)
				}
			}
			if len(tt.notes) == 0 && len(r.Notes) > 0 {
				t.Errorf("unexpected notes %q", r.Notes)
			}
			var h, j bytes.Buffer
			if err := r.WriteHTML(&h); err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(h.String(), `class="lane-rank"`); n != tt.ranks {
				t.Errorf("HTML has %d rank lanes, want %d", n, tt.ranks)
			}
			if strings.Contains(h.String(), "<script") || strings.Contains(h.String(), "http://") && !strings.Contains(h.String(), `xmlns="http://www.w3.org/2000/svg"`) {
				t.Error("HTML is not self-contained")
			}
			if err := r.WriteJSON(&j); err != nil {
				t.Fatal(err)
			}
			var back Report
			if err := json.Unmarshal(j.Bytes(), &back); err != nil || back.Schema != Schema || math.Abs(back.WallS-r.WallS) > 1e-9 {
				t.Errorf("JSON does not read back: %v", err)
			}
		})
	}
}

// checkSum asserts the phases partition the wall time.
func checkSum(t *testing.T, r *Report) {
	t.Helper()
	sum := 0.0
	for _, v := range r.PhasesS {
		if v < 0 {
			t.Errorf("negative phase in %v", r.PhasesS)
		}
		sum += v
	}
	if math.Abs(sum-r.WallS) > 1e-6 {
		t.Errorf("phases add up to %.6fs, wall is %.6fs", sum, r.WallS)
	}
}

func TestBuildSlurmChain(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	base, err := verdict.Read("testdata/verdict-only.json")
	if err != nil {
		t.Fatal(err)
	}
	st := &resumer.State{Dir: dir, Status: resumer.Done, Created: t0.Add(-10 * time.Second)}
	for i, id := range []string{"101", "102"} {
		shift := time.Duration(i) * time.Minute
		v := base
		v.StartedAt, v.EndedAt = v.StartedAt.Add(shift), v.EndedAt.Add(shift)
		v.Cycles = append([]verdict.Cycle(nil), base.Cycles...)
		for c := range v.Cycles {
			v.Cycles[c].StartedAt = v.Cycles[c].StartedAt.Add(shift)
		}
		v.RunID = "run-" + id
		if err := os.MkdirAll(filepath.Join(dir, resumer.JobsDir, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := verdict.Write(filepath.Join(dir, resumer.JobsDir, id, "verdict-n1.json"), v); err != nil {
			t.Fatal(err)
		}
		st.Jobs = append(st.Jobs, &resumer.ChainJob{ID: id, Began: t0.Add(shift), ScriptEnded: t0.Add(shift + 21*time.Second), Outcome: "walltime"})
	}
	// A job that never began: its time is the queue's.
	st.Jobs = append(st.Jobs, &resumer.ChainJob{ID: "103"})
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	r, err := Build(Inputs{ChainDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	checkSum(t, r)
	if math.Abs(r.WallS-91) > 1e-6 || math.Abs(r.PhasesS[Queue]-49) > 1e-6 || math.Abs(r.PhasesS[Productive]-34) > 1e-6 {
		t.Errorf("wall %.3f queue %.3f productive %.3f, want 91, 49, 34", r.WallS, r.PhasesS[Queue], r.PhasesS[Productive])
	}
	if len(r.Jobs) != 2 || r.Jobs[0].ID != "101" || r.Jobs[1].ID != "102" || len(r.RunIDs) != 2 {
		t.Errorf("jobs %+v, run ids %v; want 101 and 102 of two runs", r.Jobs, r.RunIDs)
	}
}

func TestBuildBadInput(t *testing.T) {
	tests := []struct {
		name string
		in   Inputs
		want []string // in the error
	}{
		{"missing event log", Inputs{EventLogs: []string{"testdata/nonexistent.jsonl"}}, []string{"testdata/nonexistent.jsonl", "no such file"}},
		{"truncated event log", Inputs{EventLogs: []string{"testdata/truncated.jsonl"}}, []string{"testdata/truncated.jsonl", "line 6", "truncated"}},
		{"not an event log", Inputs{EventLogs: []string{"testdata/verdict-only.json"}}, []string{"testdata/verdict-only.json", "line 1"}},
		{"verdict of another schema major", Inputs{Verdicts: []string{"testdata/verdict-v2.json"}}, []string{"testdata/verdict-v2.json", "ft-launcher.verdict/v2", "ft-launcher.verdict/v1"}},
		{"two runs mixed", Inputs{EventLogs: []string{"testdata/crash.jsonl", "testdata/otherrun.jsonl"}}, []string{"two runs", "testdata/crash.jsonl", "testdata/otherrun.jsonl", `"r1"`, `"other"`}},
		{"verdict of another run", Inputs{EventLogs: []string{"testdata/crash.jsonl"}, Verdicts: []string{"testdata/verdict-only.json"}}, []string{"two runs", "testdata/verdict-only.json", `"r4"`}},
		{"no chain", Inputs{ChainDir: "testdata"}, []string{"no chain"}},
		{"nothing", Inputs{}, []string{"no records"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Build(tt.in)
			if err == nil {
				t.Fatalf("no error; report %+v", r.PhasesS)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

func TestBuildAppWrapper(t *testing.T) {
	r, err := Build(Inputs{EventLogs: []string{"testdata/crash.jsonl"}, AppWrapper: "testdata/appwrapper.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	w := r.Workload
	if w == nil || w.Name != "team-a/train" || w.Phase != "Running" || w.Resets != 1 || len(w.Conditions) != 2 {
		t.Fatalf("workload %+v, want team-a/train Running with 1 reset and 2 conditions", w)
	}
	var h bytes.Buffer
	if err := r.WriteHTML(&h); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(h.String(), `class="lane-workload"`) || !strings.Contains(h.String(), "PodsReady=True") {
		t.Error("the AppWrapper's lane is not in the HTML")
	}
	if _, err := Build(Inputs{EventLogs: []string{"testdata/crash.jsonl"}, AppWrapper: "testdata/verdict-v2.json"}); err == nil ||
		!strings.Contains(err.Error(), "testdata/verdict-v2.json") || !strings.Contains(err.Error(), "want AppWrapper") {
		t.Errorf("a file that is no AppWrapper: %v", err)
	}
}
