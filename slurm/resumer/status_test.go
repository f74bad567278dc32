package resumer

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestStatusView(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)
	rc := 1
	st := &State{Dir: "/c", Status: Done, Failures: 0, Total: 1, Settings: Settings{MaxSubsequentFailures: 2},
		Jobs: []*ChainJob{
			{ID: "1", SubmittedBy: "start", Began: t0, Nodes: []string{"n1"}, ScriptRC: &rc, ScriptEnded: t0.Add(10 * time.Second),
				Outcome: Failure, Counted: true, Decision: "continue", Decided: t0.Add(10*time.Second + 5*time.Millisecond), DecidedBy: "end step",
				Slurm: &Job{State: "FAILED", ExitCode: 1, End: t0.Add(10 * time.Second)}},
			{ID: "2", SubmittedBy: "begin of 1", Began: t0.Add(11 * time.Second), Outcome: Walltime, Decision: "continue",
				Decided: t0.Add(72 * time.Second), DecidedBy: "resumer", Slurm: &Job{State: "TIMEOUT", Signal: 15, End: t0.Add(71 * time.Second), NodeList: []string{"n2"}}},
			{ID: "3", SubmittedBy: "begin of 2", Outcome: NeverRan, Decision: "done", Slurm: &Job{State: "CANCELLED"},
				Quarantined: []QuarantineSummary{{Host: "n3", Evidence: "lost", Detail: "gossip"}},
				Swaps:       []SwapSummary{{Spare: "n4", Replaced: "n3", GroupRank: 2, At: t0}}},
		},
		Exclusions: []Exclusion{{Node: "n3", Evidence: "lost", Job: "1", Expires: t0.Add(time.Hour)}},
	}
	v := st.View(t0.Add(2 * time.Minute))
	if len(v.Jobs) != 3 || !v.Jobs[0].Counted || v.Jobs[1].Counted {
		t.Fatalf("jobs %+v", v.Jobs)
	}
	if d := *v.Jobs[0].DecisionAfterEndS; d < 0.004 || d > 0.006 {
		t.Errorf("job 1 decided %.3fs after its end step, want 0.005", d)
	}
	if d := *v.Jobs[0].SuccessorStartS; d < 0.99 || d > 1.01 {
		t.Errorf("job 2 began %.3fs after job 1's end, want 1", d)
	}
	if d := *v.Jobs[1].DecisionAfterEndS; d != 1 {
		t.Errorf("job 2 (killed) decided %.3fs after Slurm's end, want 1", d)
	}
	if v.Jobs[1].SuccessorStartS != nil || v.Jobs[2].DecisionAfterEndS != nil {
		t.Errorf("times for jobs that did not begin or decide: %+v %+v", v.Jobs[1], v.Jobs[2])
	}
	if v.Jobs[1].Nodes[0] != "n2" || !v.Exclusions[0].Active {
		t.Errorf("nodes from Slurm's record, active exclusion: %+v %+v", v.Jobs[1], v.Exclusions)
	}
	var table, js bytes.Buffer
	if err := v.WriteTable(&table); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"chain /c: done", "consecutive", "walltime", "never_ran", "0.005s", "exclusions:", "n3",
		"job 3: node n3 quarantined (lost: gossip)", "job 3: spare n4 took n3's place (group rank 2)"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := v.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back StatusView
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || len(back.Jobs) != 3 || back.Jobs[1].Outcome != Walltime {
		t.Errorf("JSON round trip: %v %+v", err, back)
	}
}
