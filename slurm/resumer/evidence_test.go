package resumer

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/verdict"
)

func TestDeterministic(t *testing.T) {
	it := func(n int64) *int64 { return &n }
	crash := func(rank int, code int, steps int64) RankFailureSummary {
		return RankFailureSummary{Host: "n2", Rank: rank, ExitCode: code, Kind: verdict.FailureCrash, Steps: steps}
	}
	job := func(id string, o Outcome, fs ...RankFailureSummary) *ChainJob {
		return &ChainJob{ID: id, Outcome: o, Failures: fs}
	}
	tests := []struct {
		name string
		jobs []*ChainJob
		want bool
	}{
		{"same crash in three jobs", []*ChainJob{job("1", Failure, crash(1, 3, 5)), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 3, 6))}, true},
		{"twice in one job, once in the next", []*ChainJob{job("1", Failure, crash(1, 3, 5), crash(1, 3, 5)), job("2", Failure, crash(1, 3, 4))}, true},
		{"three times in one job only", []*ChainJob{job("1", Failure, crash(1, 3, 5), crash(1, 3, 5), crash(1, 3, 5))}, false},
		{"two times in two jobs: below the threshold", []*ChainJob{job("1", Failure, crash(1, 3, 5)), job("2", Failure, crash(1, 3, 5))}, false},
		{"different rank", []*ChainJob{job("1", Failure, crash(0, 3, 5)), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 3, 5))}, false},
		{"different exit code", []*ChainJob{job("1", Failure, crash(1, 4, 5)), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 4, 5))}, false},
		{"steps too far apart", []*ChainJob{job("1", Failure, crash(1, 3, 50)), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 3, 20))}, false},
		{"no position (uninstrumented)", []*ChainJob{job("1", Failure, crash(1, 3, 0)), job("2", Failure, crash(1, 3, 0)), job("3", Failure, crash(1, 3, 0))}, false},
		{"a walltime job in between breaks the run", []*ChainJob{job("1", Failure, crash(1, 3, 5)), job("2", Failure, crash(1, 3, 5)), job("3", Walltime), job("4", Failure, crash(1, 3, 5))}, false},
		{"relocated jobs do not break the run", []*ChainJob{job("1", Failure, crash(1, 3, 5)), job("r", Relocated), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 3, 5))}, true},
		{"the same exception at the same place, steps far apart", []*ChainJob{
			job("1", Failure, withCause(crash(1, 1, 50), "ValueError", "t.py:3 in f")),
			job("2", Failure, withCause(crash(1, 1, 5), "ValueError", "t.py:3 in f")),
			job("3", Failure, withCause(crash(1, 1, 20), "ValueError", "t.py:3 in f"))}, true},
		{"the same step, another place", []*ChainJob{
			job("1", Failure, withCause(crash(1, 1, 5), "ValueError", "t.py:3 in f")),
			job("2", Failure, withCause(crash(1, 1, 5), "ValueError", "t.py:9 in g")),
			job("3", Failure, withCause(crash(1, 1, 5), "ValueError", "t.py:3 in f"))}, false},
		{"iterations win over steps", []*ChainJob{
			job("1", Failure, RankFailureSummary{Rank: 2, ExitCode: 1, Kind: "crash", Steps: 3, Iteration: it(1003)}),
			job("2", Failure, RankFailureSummary{Rank: 2, ExitCode: 1, Kind: "crash", Steps: 10, Iteration: it(1004)}),
			job("3", Failure, RankFailureSummary{Rank: 2, ExitCode: 1, Kind: "crash", Steps: 1, Iteration: it(1003)})}, true},
	}
	for _, tt := range tests {
		st := &State{Settings: Settings{DeterministicAfter: 3, DeterministicSteps: 2}, Jobs: tt.jobs}
		why, got := deterministic(st, tt.jobs[len(tt.jobs)-1])
		if got != tt.want {
			t.Errorf("%s: deterministic = %v (%s), want %v", tt.name, got, why, tt.want)
		}
		if got && !strings.Contains(why, "rank ") {
			t.Errorf("%s: the evidence %q does not name the rank", tt.name, why)
		}
	}
	st := &State{Settings: Settings{DeterministicAfter: 0}, Jobs: []*ChainJob{job("1", Failure, crash(1, 3, 5)), job("2", Failure, crash(1, 3, 5)), job("3", Failure, crash(1, 3, 5))}}
	if _, got := deterministic(st, st.Jobs[2]); got {
		t.Error("--deterministic-after 0 still stopped the chain")
	}
}

func withCause(f RankFailureSummary, exc, where string) RankFailureSummary {
	f.Cause = &verdict.FailureCause{Exception: exc, Message: "m", Where: where, Source: "excepthook"}
	return f
}

func TestSubmitRate(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	r := &Resumer{Now: func() time.Time { return now }}
	mk := func(ago ...time.Duration) *State {
		st := &State{Status: Active, Settings: Settings{MaxSubmits: 3, SubmitWindow: Duration(10 * time.Minute)}}
		for i, a := range ago {
			st.Jobs = append(st.Jobs, &ChainJob{ID: string(rune('a' + i)), Submitted: now.Add(-a), Outcome: NoProgress, Reason: "exit 0"})
		}
		return st
	}
	if err := r.checkRate(context.Background(), mk(time.Minute, 2*time.Minute)); err != nil {
		t.Errorf("2 jobs in the window: %v", err)
	}
	if err := r.checkRate(context.Background(), mk(time.Minute, 2*time.Minute, 11*time.Minute, 12*time.Minute)); err != nil {
		t.Errorf("2 jobs in the window, 2 before it: %v", err)
	}
	st := mk(time.Minute, 2*time.Minute, 3*time.Minute)
	if err := r.checkRate(context.Background(), st); err == nil || st.Status != Stopped || st.StopKind != StopSubmitRate ||
		!strings.Contains(st.StopReason, "--max-submit-rate") || !strings.Contains(st.StopReason, "last: job c: no_progress") {
		t.Errorf("3 jobs in the window: err %v, chain %s %s %q", err, st.Status, st.StopKind, st.StopReason)
	}
	st = mk(time.Minute, 2*time.Minute, 3*time.Minute)
	st.Settings.MaxSubmits = 0
	if err := r.checkRate(context.Background(), st); err != nil {
		t.Errorf("no limit: %v", err)
	}
}

func TestProgressEvidence(t *testing.T) {
	dir := t.TempDir()
	began := time.Now().Add(-time.Hour)
	ckpt := filepath.Join(dir, "ckpt", "step-10.pt")
	if err := os.MkdirAll(filepath.Dir(ckpt), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ckpt, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := filepath.Join(dir, "old.pt")
	if err := os.WriteFile(old, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(old, began.Add(-time.Hour), began.Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	zero, five := &verdict.Progress{}, &verdict.Progress{Steps: 5, Checkpoints: 1}
	tests := []struct {
		name          string
		paths         []string
		vs            []verdict.Verdict
		known, forwrd bool
	}{
		{"nothing to tell", nil, []verdict.Verdict{{Kind: verdict.Succeeded}}, false, false},
		{"verdict with steps", nil, []verdict.Verdict{{Progress: zero}, {Progress: five}}, true, true},
		{"verdict with none", nil, []verdict.Verdict{{Progress: zero}}, true, false},
		{"a checkpoint written during the job (directory)", []string{filepath.Join(dir, "ckpt")}, nil, true, true},
		{"a checkpoint written during the job (glob)", []string{filepath.Join(dir, "ckpt", "*.pt")}, nil, true, true},
		{"only an older file", []string{old}, nil, true, false},
		{"a path that does not exist", []string{filepath.Join(dir, "nope")}, nil, true, false},
	}
	for _, tt := range tests {
		job := &ChainJob{ID: "1", Began: began}
		st := &State{Settings: Settings{ProgressPaths: tt.paths}, Jobs: []*ChainJob{job}}
		e := progressEvidence(st, job, tt.vs)
		if e.Known != tt.known || e.Advanced != tt.forwrd || (e.Known && e.Detail == "") {
			t.Errorf("%s: %+v, want known %v advanced %v with a detail", tt.name, e, tt.known, tt.forwrd)
		}
	}
	// A file written after the next job began is that job's progress.
	job, next := &ChainJob{ID: "1", Began: began}, &ChainJob{ID: "2", Began: began.Add(time.Minute)}
	st := &State{Settings: Settings{ProgressPaths: []string{filepath.Join(dir, "ckpt")}}, Jobs: []*ChainJob{job, next}}
	if e := progressEvidence(st, job, nil); e.Advanced {
		t.Errorf("a file written during the next job counted for this one: %+v", e)
	}
}

func TestSummarizeSwapsAndQuarantines(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	at := func(s int) *time.Time { x := t0.Add(time.Duration(s) * time.Second); return &x }
	lost := ledger.Record{Node: "127.0.0.3/10", Host: "n2", Role: ledger.Active, GroupRank: 1, Seq: 1, End: at(10), Reason: ledger.NodeFailure}
	swap := ledger.Record{Node: "127.0.0.5/12", Host: "n4", Role: ledger.Spare, GroupRank: -1, Seq: 1, End: at(11), Reason: ledger.Swap}
	q := verdict.Quarantine{Node: "127.0.0.3/10", Host: "n2", Evidence: verdict.EvidenceLost, Detail: "gossip"}
	// Two nodes' verdicts record the same lease and quarantine.
	vs := []verdict.Verdict{
		{Hostname: "n1", Quarantined: []verdict.Quarantine{q}, Ledger: []ledger.Record{lost, swap}},
		{Hostname: "n4", Quarantined: []verdict.Quarantine{q}, Ledger: []ledger.Record{lost, swap},
			RankFailures: []verdict.RankFailure{{Rank: 3, ExitCode: 1, Kind: verdict.FailureCrash, Steps: 4}}},
	}
	job := &ChainJob{ID: "9"}
	summarize(job, vs)
	if len(job.Quarantined) != 1 || job.Quarantined[0].Host != "n2" || job.Quarantined[0].Evidence != "lost" {
		t.Errorf("quarantined %+v, want n2 (lost) once", job.Quarantined)
	}
	if len(job.Swaps) != 1 || job.Swaps[0].Spare != "n4" || job.Swaps[0].Replaced != "n2" || job.Swaps[0].GroupRank != 1 {
		t.Errorf("swaps %+v, want n4 taking n2's place (group rank 1) once", job.Swaps)
	}
	if len(job.Failures) != 1 || job.Failures[0].Host != "n4" || job.Failures[0].Rank != 3 {
		t.Errorf("failures %+v", job.Failures)
	}
}

func TestMaxJobsStopsAtTheLastJob(t *testing.T) {
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	r := &Resumer{Now: func() time.Time { return now }}
	st := &State{Dir: t.TempDir(), Status: Active, Settings: Settings{MaxJobs: 2, MaxSubsequentFailures: 5}}
	a := &ChainJob{ID: "1", Began: now, Outcome: Walltime}
	b := &ChainJob{ID: "2", Began: now}
	st.Jobs = []*ChainJob{a, b}
	r.apply(context.Background(), st, b, Judgement{Outcome: Failure, Reason: "exit 1"}, nil, "end step")
	if st.Status != Stopped || st.StopKind != StopMaxJobs || !strings.Contains(st.StopReason, "--max-jobs") {
		t.Errorf("after the second of at most 2 jobs: chain %s [%s] %q", st.Status, st.StopKind, st.StopReason)
	}
}
