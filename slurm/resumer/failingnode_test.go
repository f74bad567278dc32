package resumer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestFailingNodeExcluded: the chain excludes a node whose ranks failed in
// ways that point at it in 2 of the latest 3 jobs that ran on it (one
// failure per job, which no launcher counts as a pattern), and a node
// whose launcher said its ranks kept failing (failing_node); a failure
// of the code (a ValueError) counts against no node.
func TestFailingNodeExcluded(t *testing.T) {
	exit1 := []verdict.RankFailure{{Round: 0, Rank: 1, Kind: verdict.FailureCrash, ExitCode: 1}}
	bug := []verdict.RankFailure{{Round: 0, Rank: 1, Kind: verdict.FailureCrash, ExitCode: 1,
		Cause: &verdict.FailureCause{Exception: "ValueError", Message: "bad", Where: "train.py:3 in f", Source: "output"}}}
	type jobSpec struct {
		nodes    []string
		verdicts map[string]verdict.Verdict // by Slurm node name
	}
	v := func(addr string, fs []verdict.RankFailure, fn *verdict.FailingNode) verdict.Verdict {
		return verdict.Verdict{Kind: verdict.RestartBudgetExhausted, ExitCode: 1, Node: addr + "/100", Hostname: "vm",
			LastRound: 0, RankFailures: fs, FailingNode: fn, EndedAt: time.Now()}
	}
	tests := []struct {
		name     string
		jobs     []jobSpec
		excluded string // after the last job; "" for none
		after    int    // and not before job index after
		detail   string
	}{
		{name: "2 of 3 jobs", jobs: []jobSpec{
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", exit1, nil)}},
			{[]string{"n1", "n2"}, nil},
			{[]string{"n2", "n3"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", exit1, nil)}},
		}, excluded: "n2", after: 2, detail: "in 2 of the latest 3 jobs that ran on it"},
		{name: "1 of 3 jobs", jobs: []jobSpec{
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", exit1, nil)}},
			{[]string{"n1", "n2"}, nil},
			{[]string{"n2", "n3"}, nil},
		}},
		{name: "the evidence left the window", jobs: []jobSpec{
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", exit1, nil)}},
			{[]string{"n1", "n2"}, nil},
			{[]string{"n1", "n2"}, nil},
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", exit1, nil)}},
		}},
		{name: "the code's failure is no node's", jobs: []jobSpec{
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", bug, nil)}},
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n2": v("127.0.0.3", bug, nil)}},
		}},
		{name: "failing_node in one job", jobs: []jobSpec{
			{[]string{"n1", "n2"}, map[string]verdict.Verdict{"n1": v("127.0.0.2", exit1,
				&verdict.FailingNode{Rounds: []int{0, 2}, Window: 3, Detail: "this node's ranks failed in ways that point at the node in 2 of its latest 3 rounds"})}},
		}, excluded: "n1", detail: "2 of its latest 3 rounds"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			now := time.Now()
			st := &State{Dir: dir, Status: Active, Settings: Settings{ExclusionTTL: Duration(time.Hour)}}
			r := &Resumer{Dir: dir, Sched: Scheduler{Env: []string{"PATH=" + t.TempDir()}}, Now: func() time.Time { return now }}
			for i, js := range tc.jobs {
				job := &ChainJob{ID: string(rune('1' + i)), Nodes: js.nodes, Began: now, Outcome: Failure}
				st.Jobs = append(st.Jobs, job)
				jd := filepath.Join(dir, JobsDir, job.ID)
				if err := os.MkdirAll(jd, 0o755); err != nil {
					t.Fatal(err)
				}
				for node, vv := range js.verdicts {
					if err := verdict.Write(filepath.Join(jd, "verdict-"+node+".json"), vv); err != nil {
						t.Fatal(err)
					}
				}
				r.addExclusions(context.Background(), st, job, nil)
				if i < tc.after && len(st.Exclusions) != 0 {
					t.Fatalf("after job %d: exclusions %+v, want none yet", i, st.Exclusions)
				}
			}
			if tc.excluded == "" {
				if len(st.Exclusions) != 0 {
					t.Fatalf("exclusions %+v, want none", st.Exclusions)
				}
				return
			}
			if len(st.Exclusions) != 1 {
				t.Fatalf("exclusions %+v, want %s", st.Exclusions, tc.excluded)
			}
			e := st.Exclusions[0]
			if e.Node != tc.excluded || e.Evidence != string(verdict.EvidenceRankFailures) || !strings.Contains(e.Detail, tc.detail) {
				t.Errorf("exclusion %+v, want %s (rank_failures: %q)", e, tc.excluded, tc.detail)
			}
		})
	}
}
