package integration

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHangsAreDetectedRestartedAndRecorded runs ranks instrumented with the
// Python client; rank 1 misbehaves once in cycle 0 and only its rank monitor
// can end it. Each case asserts that the rank was killed, the job restarted
// and finished, and the event log names the timeout that fired.
func TestHangsAreDetectedRestartedAndRecorded(t *testing.T) {
	skipShort(t)
	worker, err := filepath.Abs("testdata/monitored_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		mode      string
		flags     []string
		kind      string
		section   string
		signal    string
		escalated bool
	}{
		{"no-first-heartbeat", []string{"--ft-initial-rank-heartbeat-timeout", "2", "--ft-rank-heartbeat-timeout", "60"},
			"initial_heartbeat", "", "SIGKILL", false},
		{"heartbeat-stops", []string{"--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "1.5"},
			"heartbeat", "", "SIGKILL", false},
		{"section", []string{"--ft-rank-section-timeouts", "step:1.5", "--ft-rank-out-of-section-timeout", "60"},
			"section", "step", "SIGKILL", false},
		{"out-of-section", []string{"--ft-rank-section-timeouts", "step:60", "--ft-rank-out-of-section-timeout", "1.5"},
			"out_of_section", "", "SIGKILL", false},
		{"sigstop", []string{"--ft-rank-heartbeat-timeout", "1.5"},
			"heartbeat", "", "SIGKILL", false},
		{"ignore-term", []string{"--ft-rank-heartbeat-timeout", "1.5", "--ft-rank-termination-signal", "SIGTERM",
			"--ft-termination-grace", "1"}, "heartbeat", "", "SIGTERM", true},
	}
	for _, tc := range cases {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			args := append([]string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1"}, tc.flags...)
			args = append(args, worker, tc.mode)
			code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, args...)
			if code != 0 {
				t.Fatalf("exit %d, want 0 after one restart\n%s", code, j.stderr.String())
			}
			hangs := j.eventsOf("rank_hang")
			if len(hangs) != 1 {
				t.Fatalf("rank_hang events %v, want 1", hangs)
			}
			h := hangs[0]
			if h["timeout_kind"] != tc.kind || h["rank"] != float64(1) || h["round"] != float64(0) {
				t.Fatalf("rank_hang %v, want kind %q for rank 1 in round 0", h, tc.kind)
			}
			if tc.section != "" && h["section"] != tc.section {
				t.Fatalf("rank_hang section %v, want %q", h["section"], tc.section)
			}
			if h["signal"] != tc.signal || h["escalated_to_sigkill"] != tc.escalated {
				t.Fatalf("rank_hang signal %v escalated %v, want %s %v", h["signal"], h["escalated_to_sigkill"], tc.signal, tc.escalated)
			}
			killed := false
			for _, e := range j.eventsOf("rank_exited") {
				if e["round"] == float64(0) && e["rank"] == float64(1) && e["signal"] != nil {
					killed = true
				}
			}
			if !killed {
				t.Fatalf("rank 1 was not killed by a signal in round 0: %v", j.eventsOf("rank_exited"))
			}
			restarts := j.eventsOf("restart")
			if len(restarts) != 1 || !strings.Contains(fmt.Sprint(restarts[0]["reason"]), "hung: "+tc.kind) {
				t.Fatalf("restart events %v, want one naming the %s timeout", restarts, tc.kind)
			}
			if len(j.eventsOf("job_succeeded")) != 1 {
				t.Fatalf("job did not finish after the restart")
			}
		})
	}
}
