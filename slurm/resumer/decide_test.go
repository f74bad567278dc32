package resumer

import (
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/verdict"
)

func TestJudge(t *testing.T) {
	rc := func(n int) *int { return &n }
	ended := func(state string, code, sig int) Job { return Job{ID: "7", State: state, ExitCode: code, Signal: sig} }
	v := func(k verdict.Kind) []verdict.Verdict {
		return []verdict.Verdict{{Kind: k, Hostname: "gpu1", Reason: "why"}}
	}
	progressed := Evidence{Known: true, Advanced: true, Detail: "12 steps"}
	tests := []struct {
		name   string
		f      Facts
		want   Outcome
		defers bool
	}{
		{"flag wins over a failed teardown", Facts{Began: true, FlagPresent: true, ScriptRC: rc(1)}, Finished, false},
		{"flag with COMPLETED", Facts{Began: true, FlagPresent: true, Slurm: ended("COMPLETED", 0, 0)}, Finished, false},
		{"no_restart verdict although srun said 143", Facts{Began: true, ScriptRC: rc(143), Verdicts: v(verdict.NoRestart)}, NoRestart, false},
		{"no_restart verdict although the script said 1", Facts{Began: true, Slurm: ended("FAILED", 1, 0), Verdicts: v(verdict.NoRestart)}, NoRestart, false},
		{"script exit 93", Facts{Began: true, ScriptRC: rc(93)}, NoRestart, false},
		{"custom no-restart code", Facts{Began: true, ScriptRC: rc(42), NoRestartCode: 42}, NoRestart, false},
		{"Slurm exit 93", Facts{Began: true, Slurm: ended("FAILED", 93, 0)}, NoRestart, false},
		{"end step: script exit 0 without flag or evidence", Facts{Began: true, ScriptRC: rc(0)}, NoProgress, false},
		{"end step: script exit 0, verdicts show no progress", Facts{Began: true, ScriptRC: rc(0), Progress: Evidence{Known: true, Detail: "0 steps"}}, NoProgress, false},
		{"end step: script exit 0 with progress", Facts{Began: true, ScriptRC: rc(0), Progress: progressed}, Success, false},
		{"end step: USR1 to the batch shell", Facts{Began: true, ScriptRC: rc(138), Warning: "USR1"}, Walltime, false},
		{"end step: USR2 to the batch shell, script exit 0", Facts{Began: true, ScriptRC: rc(0), Warning: "USR2"}, Walltime, false},
		{"end step: TERM to the batch shell defers", Facts{Began: true, ScriptRC: rc(0), Warning: "TERM"}, "", true},
		{"end step: walltime verdict", Facts{Began: true, ScriptRC: rc(1), Verdicts: v(verdict.Walltime)}, Walltime, false},
		{"B:TERM then FAILED before the limit", Facts{Began: true, ScriptRC: rc(143), Warning: "TERM", Slurm: ended("FAILED", 143, 0)}, Walltime, false},
		{"TERM then CANCELLED by hand", Facts{Began: true, ScriptRC: rc(143), Warning: "TERM", Slurm: ended("CANCELLED", 0, 15)}, Failure, false},
		{"TERM then NODE_FAIL", Facts{Began: true, ScriptRC: rc(143), Warning: "TERM", Slurm: ended("NODE_FAIL", 0, 0)}, Failure, false},
		{"USR1 then OUT_OF_MEMORY", Facts{Began: true, Warning: "USR1", Slurm: ended("OUT_OF_MEMORY", 0, 125)}, Failure, false},
		{"B:TERM then COMPLETED", Facts{Began: true, Warning: "TERM", Slurm: ended("COMPLETED", 0, 0)}, Walltime, false},
		{"cancelled by ft-resumer cancel", Facts{Began: true, CancelledByChain: true, Slurm: ended("CANCELLED", 0, 15)}, Cancelled, false},
		{"end step: script failed", Facts{Began: true, ScriptRC: rc(1), Verdicts: v(verdict.RestartBudgetExhausted)}, Failure, false},
		{"end step: killed by a signal defers", Facts{Began: true, ScriptRC: rc(143)}, "", true},
		{"end step: signaled verdict defers", Facts{Began: true, ScriptRC: rc(1), Verdicts: v(verdict.Signaled)}, "", true},
		{"end step: no status defers", Facts{Began: true}, "", true},
		{"TIMEOUT", Facts{Began: true, Slurm: ended("TIMEOUT", 0, 15)}, Walltime, false},
		{"DEADLINE", Facts{Began: true, Slurm: ended("DEADLINE", 0, 0)}, Walltime, false},
		{"PREEMPTED", Facts{Began: true, Slurm: ended("PREEMPTED", 0, 15)}, Preempted, false},
		{"NODE_FAIL", Facts{Began: true, Slurm: ended("NODE_FAIL", 0, 0)}, Failure, false},
		{"OUT_OF_MEMORY", Facts{Began: true, Slurm: ended("OUT_OF_MEMORY", 0, 125)}, Failure, false},
		{"FAILED", Facts{Began: true, Slurm: ended("FAILED", 1, 0)}, Failure, false},
		{"CANCELLED while running", Facts{Began: true, Slurm: ended("CANCELLED", 0, 15)}, Failure, false},
		{"CANCELLED before it began", Facts{Slurm: ended("CANCELLED", 0, 0), FlagPresent: true}, NeverRan, false},
		{"unknown to Slurm before it began", Facts{Slurm: ended(Unknown, 0, 0)}, NeverRan, false},
		{"unknown to Slurm after it began", Facts{Began: true, Slurm: ended(Unknown, 0, 0)}, Failure, false},
		{"NODE_FAIL before it began still counts", Facts{Slurm: ended("NODE_FAIL", 0, 0)}, Failure, false},
		{"FAILED 75 after a script exit 0", Facts{Began: true, ScriptRC: rc(0), Slurm: ended("FAILED", 75, 0), Progress: progressed}, Success, false},
		{"FAILED 75 after a script exit 0, no evidence", Facts{Began: true, ScriptRC: rc(0), Slurm: ended("FAILED", 75, 0)}, NoProgress, false},
		{"COMPLETED without flag", Facts{Began: true, Slurm: ended("COMPLETED", 0, 0), Progress: progressed}, Success, false},
		{"COMPLETED without flag or evidence", Facts{Began: true, Slurm: ended("COMPLETED", 0, 0)}, NoProgress, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Judge(tt.f)
			if got.Outcome != tt.want || got.Defer != tt.defers || got.Reason == "" {
				t.Errorf("Judge = %+v, want outcome %q defer %v and a reason", got, tt.want, tt.defers)
			}
		})
	}
}

// TestCompleteWithoutFlag: a job that exits 0 without progress where the
// training looks complete is told apart from one that never trained: the
// reason names the missing flag, not instrumentation, and Complete stops
// the chain.
func TestCompleteWithoutFlag(t *testing.T) {
	rc0 := 0
	it := int64(960)
	tests := []struct {
		name     string
		f        Facts
		complete bool
		says     []string
		notSays  string
	}{
		{"previous job stopped by itself after training",
			Facts{Began: true, ScriptRC: &rc0, PrevSuccess: "job 5: 960 steps", FinishedFlag: "/c/flag",
				Progress: Evidence{Known: true, Reported: true, Detail: "0 steps, 0 checkpoints, 0 heartbeats reported on 1 node(s)"}},
			true, []string{"seems complete but wrote no finished flag", "job 5: 960 steps", "FAULT_TOL_FINISHED_FLAG_FILE (/c/flag)", "the chain stops"}, "instrument"},
		{"ranks resumed at an iteration and made no step",
			Facts{Began: true, Slurm: Job{State: "COMPLETED"}, Progress: Evidence{Known: true, Reported: true, LastIteration: &it, Detail: "0 steps"}},
			true, []string{"resumed at iteration 960 and made no step"}, "instrument"},
		{"instrumented ranks, no step, nothing says complete",
			Facts{Began: true, ScriptRC: &rc0, Progress: Evidence{Known: true, Reported: true, Detail: "0 steps"}},
			false, []string{"the ranks report to their monitors but made no step"}, "instrument"},
		{"uninstrumented script",
			Facts{Began: true, ScriptRC: &rc0},
			false, []string{"instrument the ranks or pass --progress-path"}, "seems complete"},
	}
	for _, tt := range tests {
		j := Judge(tt.f)
		if j.Outcome != NoProgress || j.Complete != tt.complete {
			t.Errorf("%s: %s complete %v, want no_progress complete %v", tt.name, j.Outcome, j.Complete, tt.complete)
		}
		for _, w := range tt.says {
			if !strings.Contains(j.Reason, w) {
				t.Errorf("%s: reason %q lacks %q", tt.name, j.Reason, w)
			}
		}
		if strings.Contains(j.Reason, tt.notSays) {
			t.Errorf("%s: reason %q says %q", tt.name, j.Reason, tt.notSays)
		}
	}
}

func TestOutcomeCounting(t *testing.T) {
	tests := []struct {
		o                   Outcome
		counts, resets, ran bool
	}{
		{Finished, false, false, true},
		{NoRestart, false, false, true},
		{Success, false, true, true},
		{NoProgress, true, false, true},
		{Cancelled, false, false, true},
		{Walltime, false, true, true},
		{Preempted, false, true, true},
		{Failure, true, false, true},
		{Relocated, false, false, false},
		{Skipped, false, false, false},
		{NeverRan, false, false, false},
		{Refused, false, false, false},
	}
	for _, tt := range tests {
		if tt.o.Counts() != tt.counts || tt.o.Resets() != tt.resets || tt.o.Ran() != tt.ran {
			t.Errorf("%s: counts %v resets %v ran %v; want %v %v %v", tt.o, tt.o.Counts(), tt.o.Resets(), tt.o.Ran(), tt.counts, tt.resets, tt.ran)
		}
	}
}

func TestWalltimeResetsOnlyWithoutEvidenceOfNoProgress(t *testing.T) {
	timeout := Job{ID: "7", State: "TIMEOUT", Signal: 15}
	tests := []struct {
		name string
		e    Evidence
		want bool
	}{
		{"nothing could tell (an uninstrumented script)", Evidence{}, true},
		{"steps reported", Evidence{Known: true, Advanced: true, Detail: "5 steps"}, true},
		{"instrumented, no step", Evidence{Known: true, Detail: "0 steps"}, false},
	}
	for _, tt := range tests {
		j := Judge(Facts{Began: true, Slurm: timeout, Progress: tt.e})
		if j.Outcome != Walltime || j.Progressed != tt.want {
			t.Errorf("%s: %s progressed %v, want walltime %v", tt.name, j.Outcome, j.Progressed, tt.want)
		}
	}
}
