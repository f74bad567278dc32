package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// catTime is sec seconds after the synthetic logs' origin.
func catTime(sec float64) time.Time {
	return time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(sec * float64(time.Second)))
}

// evLine is one event-log line at catTime(sec) on node n1 of run r1 (fields
// may override both).
func evLine(sec float64, kind string, fields map[string]any) string {
	m := map[string]any{"event": kind, "ts": catAt(sec), "node": "n1", "run_id": "r1"}
	for k, v := range fields {
		m[k] = v
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err) // the test's own literal fields
	}
	return string(b)
}

// catAt is catTime(sec) in the records' time format.
func catAt(sec float64) string { return catTime(sec).Format(time.RFC3339Nano) }

// crashWithSaveAndRestore: two ranks; each round restores (state_restore)
// and saves (rank_checkpoint); round 0 crashes 7.5 s after its last
// checkpoint, round 1 succeeds. Phases: rendezvous 1+1, startup 3+3,
// productive 8.5+14, recompute 7.5, stop 2, shutdown 1 (wall 41).
func crashWithSaveAndRestore() []string {
	ckpt := func(sec, opened float64, rank, round int) string {
		f := map[string]any{"local_rank": rank, "rank": rank, "round": round, "at": catAt(sec), "steps": 10}
		if opened >= 0 {
			f["opened_at"] = catAt(opened)
		} else {
			f["duration_ms"] = -opened * 1000 // only the duration: opened = at - duration
		}
		return evLine(sec, "rank_checkpoint", f)
	}
	restore := func(sec, loadMS float64, rank, round int, source string) string {
		f := map[string]any{"local_rank": rank, "rank": rank, "round": round, "at": catAt(sec), "load_ms": loadMS}
		if source != "" {
			f["source"], f["step"] = source, 10
		}
		return evLine(sec+0.1, "state_restore", f)
	}
	hb := func(sec float64, rank, round int) string {
		return evLine(sec, "rank_first_heartbeat", map[string]any{"local_rank": rank, "rank": rank, "round": round, "at": catAt(sec)})
	}
	return []string{
		evLine(0, "launcher_started", map[string]any{"nproc_per_node": 2}),
		evLine(1, "cycle_started", map[string]any{"group_rank": 0, "pids": []int{10, 11}, "round": 0, "world_size": 2}),
		restore(2.5, 500, 0, 0, ""), // empty loads: [2, 2.5] and [1.8, 2.8]
		restore(2.8, 1000, 1, 0, ""),
		hb(3, 0, 0), hb(4, 1, 0),
		ckpt(12, 10, 0, 0), ckpt(12.5, 10.5, 1, 0), // saves [10, 12.5]
		evLine(20, "rank_exited", map[string]any{"exit_code": 1, "local_rank": 1, "rank": 1, "round": 0}),
		evLine(21, "rank_exited", map[string]any{"exit_code": -15, "signal": "SIGTERM", "local_rank": 0, "rank": 0, "round": 0}),
		evLine(21, "rank_steps", map[string]any{"local_rank": 0, "rank": 0, "round": 0, "steps": 15, "steps_since_checkpoint": 5}),
		evLine(21, "rank_steps", map[string]any{"local_rank": 1, "rank": 1, "round": 0, "steps": 15, "steps_since_checkpoint": 5}),
		evLine(22, "restart", map[string]any{"after_round": 0, "reason": "rank 1 exited with code 1"}),
		evLine(23, "cycle_started", map[string]any{"group_rank": 0, "pids": []int{12, 13}, "round": 1, "world_size": 2}),
		restore(25, 2000, 0, 1, "memory"), // [23, 25] and [23.5, 24.5]
		restore(24.5, 1000, 1, 1, "memory"),
		hb(26, 0, 1), hb(26, 1, 1),
		ckpt(31, -1, 0, 1), ckpt(30.8, 30.2, 1, 1), // saves [30, 31]
		evLine(40, "rank_exited", map[string]any{"exit_code": 0, "local_rank": 0, "rank": 0, "round": 1}),
		evLine(40, "rank_exited", map[string]any{"exit_code": 0, "local_rank": 1, "rank": 1, "round": 1}),
		evLine(40, "job_succeeded", map[string]any{"round": 1}),
		evLine(41, "verdict", map[string]any{"kind": "succeeded"}),
	}
}

// chainWithQueue: a Slurm chain created 5 s before its first job; job 101
// is stopped by Slurm's SIGTERM 6 s after its last checkpoint, job 102
// begins 30 s after 101 ended and finishes. Neither records a restore.
func chainWithQueue(t *testing.T) Inputs {
	t.Helper()
	dir := t.TempDir()
	job := func(id string, lines ...string) []string {
		for i, l := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatal(err)
			}
			m["slurm_job_id"], m["run_id"] = id, "run-"+id
			b, _ := json.Marshal(m)
			lines[i] = string(b)
		}
		return lines
	}
	rank := map[string]any{"local_rank": 0, "rank": 0, "round": 0}
	with := func(extra map[string]any) map[string]any {
		m := map[string]any{}
		for k, v := range rank {
			m[k] = v
		}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	lines := job("101",
		evLine(0, "launcher_started", map[string]any{"nproc_per_node": 1}),
		evLine(1, "cycle_started", map[string]any{"group_rank": 0, "pids": []int{10}, "round": 0, "world_size": 1}),
		evLine(3, "rank_first_heartbeat", with(map[string]any{"at": catAt(3)})),
		evLine(9, "rank_checkpoint", with(map[string]any{"opened_at": catAt(8), "at": catAt(9), "duration_ms": 1000})),
		evLine(15, "signal_received", map[string]any{"round": 0, "signal": "SIGTERM"}),
		evLine(16, "rank_exited", with(map[string]any{"exit_code": -15, "signal": "SIGTERM"})),
		evLine(16, "rank_steps", with(map[string]any{"steps": 12, "steps_since_checkpoint": 4})),
		evLine(17, "job_failed", map[string]any{"round": 0, "reason": "signal SIGTERM"}),
	)
	lines = append(lines, job("102",
		evLine(50, "launcher_started", map[string]any{"nproc_per_node": 1}),
		evLine(52, "cycle_started", map[string]any{"group_rank": 0, "pids": []int{20}, "round": 0, "world_size": 1}),
		evLine(54, "rank_first_heartbeat", with(map[string]any{"at": catAt(54)})),
		evLine(61, "rank_checkpoint", with(map[string]any{"opened_at": catAt(60), "at": catAt(61), "duration_ms": 1000})),
		evLine(68, "rank_exited", with(map[string]any{"exit_code": 0})),
		evLine(68, "job_succeeded", map[string]any{"round": 0}),
	)...)
	events := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(events, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := &resumer.State{Dir: dir, Status: resumer.Done, Created: catTime(-5), Jobs: []*resumer.ChainJob{
		{ID: "101", Began: catTime(0), ScriptEnded: catTime(20), Outcome: "walltime"},
		{ID: "102", Began: catTime(50), ScriptEnded: catTime(70), Outcome: "finished"},
	}}
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	return Inputs{ChainDir: dir, EventLogs: []string{events}}
}

// TestBadputCategories: the phases split into ml-goodput-measurement's
// categories by the rule of docs/report.md ("Badput in the field's
// categories"): checked to the millisecond on hand-made logs, and on the
// real in-process fixture for what the rule guarantees. A category not
// named in cats must be null (unknown); the categories and productive add
// up to the wall time.
func TestBadputCategories(t *testing.T) {
	tests := []struct {
		name       string
		in         func(t *testing.T) Inputs
		wall       float64
		productive float64
		cats       map[string]float64 // measured categories; the others must be null
		countedIn  map[string]string  // besides data_loading
		notes      []string           // in the categories' notes
	}{
		{
			// Restores [1.8, 2.8] and [23, 25] come out of startup, saves
			// [10, 12.5] and [30, 31] out of productive; the 7.5 s after
			// the last checkpoint are wasted; stop and round 1's
			// rendezvous are the recovery; the launcher's start and
			// shutdown are idle.
			name:       "a checkpoint save and a restore in each round, a crash with recompute",
			in:         linesInput(crashWithSaveAndRestore()),
			wall:       41,
			productive: 19,
			cats: map[string]float64{CatStartup: 3, CatRestore: 3, CatSave: 3.5, CatWasted: 7.5,
				CatDisruption: 3, CatIdle: 2},
		},
		{
			// Queue: 5 s before job 101 (idle), 30 s between the jobs
			// (recovery), as is job 102's rendezvous (2 s) and job 101's
			// stop after Slurm's signal (2 s); job 101's rendezvous (1 s)
			// and both shutdowns (3 + 2 s) are idle.
			name:       "a Slurm chain with queue time",
			in:         chainWithQueue,
			wall:       75,
			productive: 18,
			cats: map[string]float64{CatStartup: 4, CatSave: 2, CatWasted: 6,
				CatDisruption: 34, CatIdle: 11},
			countedIn: map[string]string{CatRestore: CatStartup},
			notes:     []string{"checkpoint_restore: round(s) 0 (job 101), 0 (job 102): not every rank's restore was recorded"},
		},
		{
			// testdata/crash.jsonl: its checkpoint has no opened_at or
			// duration_ms (an older launcher) and no restore is recorded.
			name:       "a crash whose checkpoint has no duration",
			in:         fileInput("testdata/crash.jsonl"),
			wall:       52,
			productive: 35,
			cats:       map[string]float64{CatStartup: 7, CatWasted: 5, CatDisruption: 3, CatIdle: 2},
			countedIn:  map[string]string{CatRestore: CatStartup, CatSave: "productive"},
			notes: []string{"checkpoint_save: round(s) 0: no 'checkpointing' sections with their duration",
				"checkpoint_restore: round(s) 0, 1: not every rank's restore was recorded"},
		},
		{
			name:       "no rank-monitor client: start-up, saves and lost steps unknown",
			in:         fileInput("testdata/nosections.jsonl"),
			wall:       20,
			productive: 18,
			cats:       map[string]float64{CatDisruption: 1, CatIdle: 1},
			countedIn: map[string]string{CatStartup: "productive", CatRestore: CatStartup, CatSave: "productive",
				CatWasted: "productive"},
			notes: []string{"startup: round(s) 0, 1: no rank reported a heartbeat", "wasted_progress: round(s) 0: no 'step'/'checkpointing' sections"},
		},
		{
			// Only rank 0 of two noted its load(): its second counts, the
			// rest of the restore is unknown and stays in startup.
			name: "a restore noted by one rank of two",
			in: linesInput([]string{
				evLine(0, "launcher_started", map[string]any{"nproc_per_node": 2}),
				evLine(1, "cycle_started", map[string]any{"group_rank": 0, "pids": []int{10, 11}, "round": 0, "world_size": 2}),
				evLine(2.2, "state_restore", map[string]any{"local_rank": 0, "rank": 0, "round": 0, "at": catAt(2), "load_ms": 1000}),
				evLine(3, "rank_first_heartbeat", map[string]any{"local_rank": 0, "rank": 0, "round": 0, "at": catAt(3)}),
				evLine(3, "rank_first_heartbeat", map[string]any{"local_rank": 1, "rank": 1, "round": 0, "at": catAt(3)}),
				evLine(3, "rank_first_step", map[string]any{"local_rank": 1, "rank": 1, "round": 0, "at": catAt(3)}),
				evLine(10, "rank_exited", map[string]any{"exit_code": 0, "local_rank": 0, "rank": 0, "round": 0}),
				evLine(10, "rank_exited", map[string]any{"exit_code": 0, "local_rank": 1, "rank": 1, "round": 0}),
				evLine(10, "job_succeeded", map[string]any{"round": 0}),
			}),
			wall:       10,
			productive: 7,
			cats:       map[string]float64{CatStartup: 1, CatRestore: 1, CatSave: 0, CatWasted: 0, CatDisruption: 0, CatIdle: 1},
			countedIn:  map[string]string{CatRestore: CatStartup},
			notes:      []string{"checkpoint_restore: round(s) 0: not every rank's restore was recorded (state_restore"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Build(tt.in(t))
			if err != nil {
				t.Fatal(err)
			}
			checkSum(t, r)
			checkCategories(t, r)
			c := r.Categories
			if math.Abs(r.WallS-tt.wall) > 1e-6 || math.Abs(c.ProductiveS-tt.productive) > 1e-6 {
				t.Errorf("wall %.6f s, productive %.6f s; want %v, %v (phases %v)", r.WallS, c.ProductiveS, tt.wall, tt.productive, r.PhasesS)
			}
			if math.Abs(c.Goodput-tt.productive/tt.wall) > 1e-9 {
				t.Errorf("goodput %v, want %v", c.Goodput, tt.productive/tt.wall)
			}
			for _, cat := range CategoryOrder {
				want, measured := tt.cats[cat]
				got := c.BadputS[cat]
				switch {
				case !measured && got != nil:
					t.Errorf("%s = %.6f s, want null (unknown)", cat, *got)
				case measured && got == nil:
					t.Errorf("%s is null, want %v s", cat, want)
				case measured && math.Abs(*got-want) > 1e-6:
					t.Errorf("%s = %.6f s, want %v", cat, *got, want)
				}
			}
			wantIn := map[string]string{CatDataLoading: "productive"}
			for k, v := range tt.countedIn {
				wantIn[k] = v
			}
			if fmt.Sprint(c.CountedIn) != fmt.Sprint(wantIn) {
				t.Errorf("counted_in %v, want %v", c.CountedIn, wantIn)
			}
			all := strings.Join(c.Notes, "\n")
			for _, n := range tt.notes {
				if !strings.Contains(all, n) {
					t.Errorf("notes %q lack %q", c.Notes, n)
				}
			}
			if len(tt.notes) == 0 && len(c.Notes) > 0 {
				t.Errorf("unexpected notes %q", c.Notes)
			}

			var j, h bytes.Buffer
			if err := r.WriteJSON(&j); err != nil {
				t.Fatal(err)
			}
			var back struct {
				C struct {
					ProductiveS float64             `json:"productive_s"`
					BadputS     map[string]*float64 `json:"badput_s"`
				} `json:"badput_categories"`
			}
			if err := json.Unmarshal(j.Bytes(), &back); err != nil {
				t.Fatal(err)
			}
			for _, cat := range CategoryOrder {
				v, ok := back.C.BadputS[cat]
				if !ok || (v == nil) != (c.BadputS[cat] == nil) {
					t.Errorf("JSON badput_categories.badput_s[%q] = %v (present %v), want %v", cat, v, ok, c.BadputS[cat])
				}
			}
			if back.C.ProductiveS != c.ProductiveS {
				t.Errorf("JSON productive_s %v, want %v", back.C.ProductiveS, c.ProductiveS)
			}
			if err := r.WriteHTML(&h); err != nil {
				t.Fatal(err)
			}
			page := h.String()
			for _, w := range []string{"Badput in ml-goodput-measurement's categories", `class="categories"`,
				"WASTED_PROGRESS_FROM_DISRUPTION", "INFRASTRUCTURE_RECOVERY_FROM_DISRUPTION", "UNPRODUCTIVE_CHECKPOINT_SAVE_TIME"} {
				if !strings.Contains(page, w) {
					t.Errorf("HTML lacks %q", w)
				}
			}
			if unknown := strings.Count(page, `<td class="num">unknown</td>`); unknown != len(CategoryOrder)-len(tt.cats) {
				t.Errorf("HTML shows %d categories unknown, want %d", unknown, len(CategoryOrder)-len(tt.cats))
			}
		})
	}
}

// TestBadputCategoriesOfRealRuns: on the real fixtures the rule moves
// only recorded restore and save time out of startup and productive,
// wasted progress is recompute, and with --state-dir and the Python
// client every category but data loading is measured.
func TestBadputCategoriesOfRealRuns(t *testing.T) {
	for _, file := range []string{"testdata/inprocess_state.jsonl", "testdata/inprocess_nosteps.jsonl", "testdata/inprocess_peerheal.jsonl", "testdata/state_fullrestart.jsonl"} {
		t.Run(file, func(t *testing.T) {
			r, err := Build(Inputs{EventLogs: []string{file}})
			if err != nil {
				t.Fatal(err)
			}
			checkSum(t, r)
			checkCategories(t, r)
			c, p := r.Categories, r.PhasesS
			if fmt.Sprint(c.CountedIn) != fmt.Sprint(map[string]string{CatDataLoading: "productive"}) || len(c.Notes) > 0 {
				t.Errorf("counted_in %v, notes %q: want every category but data loading measured", c.CountedIn, c.Notes)
			}
			v := func(cat string) float64 { return deref(c.BadputS[cat]) }
			if v(CatRestore) <= 0 || v(CatSave) <= 0 {
				t.Errorf("restore %v s, save %v s: want both recorded", v(CatRestore), v(CatSave))
			}
			moved := v(CatStartup) + v(CatRestore) + v(CatSave) + c.ProductiveS
			if math.Abs(moved-(p[Startup]+p[Productive])) > 1e-6 || v(CatStartup) > p[Startup] || c.ProductiveS > p[Productive] {
				t.Errorf("startup %v + restore %v + save %v + productive %v != startup %v + productive %v phases",
					v(CatStartup), v(CatRestore), v(CatSave), c.ProductiveS, p[Startup], p[Productive])
			}
			if math.Abs(v(CatWasted)-p[Recompute]) > 1e-9 {
				t.Errorf("wasted progress %v s, recompute %v s", v(CatWasted), p[Recompute])
			}
			if math.Abs(v(CatDisruption)+v(CatIdle)-(p[Rendezvous]+p[Detection]+p[Stop]+p[Queue]+p[Shutdown])) > 1e-6 {
				t.Errorf("disruption %v + idle %v s != rendezvous, detection, stop, queue and shutdown %v", v(CatDisruption), v(CatIdle), p)
			}
		})
	}
}

// TestSpans: the interval arithmetic the categories rest on.
func TestSpans(t *testing.T) {
	at := catTime
	s := func(a, b float64) span { return span{at(a), at(b)} }
	u := union([]span{s(5, 7), s(1, 3), s(2, 4), s(9, 12), s(7, 8)}, at(0), at(10))
	if got := overlap(u, at(0), at(10)); math.Abs(got-7) > 1e-9 { // [1,4] [5,8] [9,10]
		t.Errorf("union covers %v s, want 7 (%v)", got, u)
	}
	if got := overlap(u, at(3), at(6)); math.Abs(got-2) > 1e-9 {
		t.Errorf("union inside [3, 6): %v s, want 2", got)
	}
	d := subtract(u, union([]span{s(2, 6), s(9.5, 20)}, at(0), at(10)))
	if got := overlap(d, at(0), at(10)); math.Abs(got-3.5) > 1e-9 { // [1,2] [6,8] [9,9.5]
		t.Errorf("difference covers %v s, want 3.5 (%v)", got, d)
	}
	if len(union(nil, at(0), at(1))) != 0 || len(union([]span{s(2, 3)}, at(0), at(1))) != 0 {
		t.Error("a span outside the bounds is kept")
	}
}

// checkCategories: ProductiveS and the measured categories add up to the
// wall time; none is negative; a null category says where its time is.
func checkCategories(t *testing.T, r *Report) {
	t.Helper()
	c := r.Categories
	sum := c.ProductiveS
	var keys []string
	for k, v := range c.BadputS {
		keys = append(keys, k)
		if v == nil {
			if c.CountedIn[k] == "" {
				t.Errorf("category %s is null and not counted elsewhere", k)
			}
			continue
		}
		if *v < -1e-9 {
			t.Errorf("category %s is negative: %v", k, *v)
		}
		sum += *v
	}
	sort.Strings(keys)
	want := slices.Clone(CategoryOrder)
	sort.Strings(want)
	if !slices.Equal(keys, want) {
		t.Errorf("categories %v, want %v", keys, want)
	}
	if c.ProductiveS < -1e-9 || math.Abs(sum-r.WallS) > 1e-6 {
		t.Errorf("productive %.6f s and the categories add up to %.6f s, wall is %.6f s (%+v)", c.ProductiveS, sum, r.WallS, c)
	}
}

func linesInput(lines []string) func(t *testing.T) Inputs {
	return func(t *testing.T) Inputs {
		path := filepath.Join(t.TempDir(), "events.jsonl")
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return Inputs{EventLogs: []string{path}}
	}
}

func fileInput(path string) func(t *testing.T) Inputs {
	return func(*testing.T) Inputs { return Inputs{EventLogs: []string{path}} }
}
