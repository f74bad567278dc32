// Package clientpython tests the Python client's Lightning callback: its
// unit tests against the Lightning stand-in, and a stand-in training under
// a real ft-launcher (heartbeats reach the rank monitor, timeouts are
// computed and persisted, the finished flag is written).
package clientpython

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		testenv.Missing(t, testenv.SystemPython, err.Error())
	}
	return p
}

// TestLightningCallbackUnit runs every tests/test_*.py (unittest discover):
// the callback's tests, the in-process API's and the protocol check's.
func TestLightningCallbackUnit(t *testing.T) {
	testenv.SkipShort(t, "runs Python client processes")
	cmd := exec.Command(python(t), "-m", "unittest", "discover", "-s", "tests", "-v")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// TestLightningCallbackUnderTheLauncher runs the stand-in training three
// times under a real ft-launcher with a 3 s heartbeat timeout and 0.2 s
// batches: a first job that stops early (no flag), a second that resumes
// from the checkpoint, computes timeouts and finishes (flag,
// _ft_state.json), and a third whose batch hangs (the monitor kills it:
// only heartbeats kept the others alive).
func TestLightningCallbackUnderTheLauncher(t *testing.T) {
	testenv.SkipShort(t, "runs the real launcher with Python ranks")
	py := python(t)
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../../cmd/ft-launcher", "../../cmd/ft-launcher-etcd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build ft-launcher: %v\n%s", err, out)
	}
	here, _ := filepath.Abs(".")
	work := t.TempDir()
	exp, ckpt, flag := filepath.Join(work, "exp"), filepath.Join(work, "ckpt.json"), filepath.Join(work, "finished.flag")
	run := func(args ...string) (int, string) {
		t.Helper()
		full := append([]string{"--standalone", "--nproc-per-node", "1", "--max-restarts", "0",
			"--ft-initial-rank-heartbeat-timeout", "20", "--ft-rank-heartbeat-timeout", "3",
			"--log-dir", filepath.Join(work, "logs"), "--verdict-file", filepath.Join(work, "verdict.json"),
			filepath.Join(here, "tests", "train_standin.py"), exp, ckpt}, args...)
		cmd := exec.Command(filepath.Join(bin, "ft-launcher"), full...)
		cmd.Env = append(os.Environ(), "PYTHON_EXEC="+py, "PYTHONPATH="+here+":"+filepath.Join(here, "tests"),
			"FAULT_TOL_FINISHED_FLAG_FILE="+flag)
		cmd.Dir = work
		done := make(chan struct{})
		var out []byte
		var err error
		go func() { out, err = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			cmd.Process.Kill()
			<-done
			t.Fatalf("ft-launcher %v did not end in 3 minutes\n%s", args, out)
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, string(out)
	}
	stateFile := filepath.Join(exp, "_ft_state.json")

	// Job 1: 24 steps of 0.2 s (longer than the 3 s timeout) then a clean
	// early stop: no checkpoint was loaded, so no timeouts yet.
	if code, out := run("30", "24"); code != 0 {
		t.Fatalf("job 1: exit %d\n%s", code, out)
	}
	if _, err := os.Stat(flag); err == nil {
		t.Fatal("job 1 stopped at step 24 of 30 but the finished flag exists")
	}
	if _, err := os.Stat(stateFile); err == nil {
		t.Fatal("job 1 wrote _ft_state.json without having loaded a checkpoint")
	}
	// Job 2 resumes, saves a checkpoint, heartbeats after it: timeouts are
	// computed once and persisted; it reaches max_steps: the flag.
	if code, out := run("30"); code != 0 {
		t.Fatalf("job 2: exit %d\n%s", code, out)
	} else if !strings.Contains(out, "trained to step 30") {
		t.Fatalf("job 2 did not resume to step 30:\n%s", out)
	}
	if _, err := os.Stat(flag); err != nil {
		t.Fatalf("job 2 reached max_steps but: %v", err)
	}
	b, err := os.ReadFile(stateFile)
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Current struct {
			Heartbeat struct {
				Initial, Subsequent float64
				Calculated          bool `json:"were_calculated"`
			} `json:"heartbeat"`
		} `json:"current_timeouts"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatalf("_ft_state.json: %v\n%s", err, b)
	}
	t.Logf("_ft_state.json after job 2: %s", b)
	if hb := st.Current.Heartbeat; !hb.Calculated || hb.Subsequent <= 0 || hb.Initial <= 0 {
		t.Errorf("_ft_state.json %s: want calculated heartbeat timeouts", b)
	}
	// Job 3: a batch hangs for 300 s; without heartbeats the monitor kills
	// the rank long before.
	os.Remove(flag)
	os.Remove(ckpt)
	start := time.Now()
	code, out := run("30", "-", "5")
	if code == 0 {
		t.Fatalf("job 3 hung in a batch but the launcher succeeded:\n%s", out)
	}
	t.Logf("job 3 (hung batch): exit %d after %v; hang lines: %v", code, time.Since(start).Round(time.Millisecond), grep(out, "hang"))
	// The batch hangs 300 s: a job that ends within half of that was ended
	// by the monitor, whatever the machine's load.
	if took := time.Since(start); took > 150*time.Second {
		t.Errorf("the hang was not detected before the 300 s batch ended (%v)", took)
	}
	if _, err := os.Stat(flag); err == nil {
		t.Error("a hung job created the finished flag")
	}
}

func grep(s, sub string) []string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(strings.ToLower(l), sub) {
			out = append(out, l)
		}
	}
	return out
}
