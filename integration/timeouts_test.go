package integration

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

type persistedTimeouts struct {
	CurrentTimeouts struct {
		Heartbeat *struct {
			Subsequent     *float64 `json:"subsequent"`
			WereCalculated bool     `json:"were_calculated"`
		} `json:"heartbeat"`
	} `json:"current_timeouts"`
	FTLauncher struct {
		Observed struct {
			HeartbeatIntervalMax float64 `json:"heartbeat_interval_max_s"`
			HeartbeatIntervals   int     `json:"heartbeat_intervals"`
		} `json:"observed"`
	} `json:"ft_launcher"`
}

// TestComputedTimeoutsPersistAndLoad: a run that heartbeats every 100 ms
// persists heartbeat timeout = safety_factor × the longest interval seen; a
// second run loads it and kills a rank that stops heartbeating after it.
func TestComputedTimeoutsPersistAndLoad(t *testing.T) {
	worker, _ := filepath.Abs("testdata/monitored_worker.py")
	state := filepath.Join(t.TempDir(), "ft_state.json")
	env := []string{"PYTHON_EXEC=" + debianPython}

	j1 := newJob(t)
	if code := j1.run(2*time.Minute, env, "--standalone", "--nproc-per-node", "1",
		"--ft-timeouts-state-file", state, "--ft-safety-factor", "60",
		worker, "fine", "--beats", "30", "--interval", "0.1"); code != 0 {
		t.Fatalf("first run exited %d\n%s", code, j1.stderr.String())
	}
	b, err := os.ReadFile(state)
	if err != nil {
		t.Fatalf("no persisted timeouts: %v\n%s", err, j1.stderr.String())
	}
	var st persistedTimeouts
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("state file %s: %v", b, err)
	}
	hb := st.CurrentTimeouts.Heartbeat
	obs := st.FTLauncher.Observed
	if hb == nil || hb.Subsequent == nil || !hb.WereCalculated {
		t.Fatalf("no computed heartbeat timeout in %s", b)
	}
	if obs.HeartbeatIntervals != 29 || obs.HeartbeatIntervalMax < 0.1 || obs.HeartbeatIntervalMax > 1 {
		t.Fatalf("observed %d intervals, max %.3fs; want 29 intervals of about 0.1s", obs.HeartbeatIntervals, obs.HeartbeatIntervalMax)
	}
	want := math.Max(60*obs.HeartbeatIntervalMax, 5)
	if math.Abs(*hb.Subsequent-want) > 1e-6 {
		t.Fatalf("persisted heartbeat timeout %.6fs, want 60 × %.6fs = %.6fs", *hb.Subsequent, obs.HeartbeatIntervalMax, want)
	}

	// Second job: no heartbeat timeout configured; the loaded one applies.
	j2 := newJob(t)
	if code := j2.run(2*time.Minute, env, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
		"--ft-timeouts-state-file", state, worker, "heartbeat-stops", "--rank", "0"); code != 0 {
		t.Fatalf("second run exited %d\n%s", code, j2.stderr.String())
	}
	hangs := j2.eventsOf("rank_hang")
	if len(hangs) != 1 || hangs[0]["timeout_kind"] != "heartbeat" {
		t.Fatalf("rank_hang events %v, want one heartbeat timeout", hangs)
	}
	if got := hangs[0]["timeout_s"].(float64); math.Abs(got-*hb.Subsequent) > 1e-3 {
		t.Fatalf("the second run enforced %.3fs, want the persisted %.3fs", got, *hb.Subsequent)
	}
}
