package integration

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/report"
	"github.com/ftlauncher/ft-launcher/report/reporttest"
)

// runReport runs `ft-resumer report ARGS --json -o HTML` and returns the
// report and the HTML file's path.
func runReport(t *testing.T, dir string, args ...string) (report.Report, string) {
	t.Helper()
	html := filepath.Join(dir, "report.html")
	out := resumer(t, append(append([]string{"report"}, args...), "--json", "-o", html)...)
	var r report.Report
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("report JSON: %v\n%s", err, out)
	}
	return r, html
}

// lane returns the named lane.
func lane(t *testing.T, lanes []report.Lane, name string) report.Lane {
	t.Helper()
	for _, l := range lanes {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("no lane %q in the report", name)
	return report.Lane{}
}

func marks(l report.Lane, kind string) int {
	n := 0
	for _, m := range l.Marks {
		if m.Kind == kind {
			n++
		}
	}
	return n
}

// TestReportCrashAndResume: a real DDP training (two torch ranks, the
// Python client's heartbeats and sections) crashes at step 25, resumes from
// the checkpoint of step 20 and finishes; the report accounts for the time.
func TestReportCrashAndResume(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython, "FAULT_TOL_FINISHED_FLAG_FILE=" + filepath.Join(j.dir, "finished")},
		"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2", "--verdict-file", vpath,
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", filepath.Join(j.dir, "w.json"),
		"--crash-at-step", "25", "--crash-rank", "1", "--step-sleep", "0.02")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	r, html := runReport(t, j.dir, "--event-log", j.events, "--verdict", vpath)
	reporttest.CheckAccount(t, r, 1)
	if len(r.Rounds) != 2 || r.Rounds[0].End != "crash" || r.Rounds[1].End != "success" {
		t.Fatalf("rounds %+v, want a crash then a success", r.Rounds)
	}
	// Rank 1 crashed before step 25, the last checkpoint was after step
	// 20: 5 steps lost (6 for rank 0 if it had opened step 25 already).
	if l := r.Rounds[0].StepsLost; l == nil || *l < 5 || *l > 6 {
		t.Errorf("steps lost in round 0: %v, want 5 or 6", l)
	}
	for _, p := range []string{report.Startup, report.Recompute, report.Rendezvous} {
		if r.PhasesS[p] <= 0 {
			t.Errorf("phase %s is %.3fs, want > 0 (%v)", p, r.PhasesS[p], r.PhasesS)
		}
	}
	if r.Rounds[1].Ready == nil || r.Rounds[1].FirstStep == nil {
		t.Errorf("round 1 has no first heartbeat or first step: %+v", r.Rounds[1])
	}
	if len(r.Ranks) != 2 {
		t.Fatalf("%d rank lanes, want 2", len(r.Ranks))
	}
	r1 := lane(t, r.Ranks, "rank 1")
	if marks(r1, "crash") != 1 || marks(r1, "first_step") != 1 || marks(r1, "checkpoint") < 2 {
		t.Errorf("rank 1's lane: %d crash, %d first step after the restart, %d checkpoints; want 1, 1, >= 2",
			marks(r1, "crash"), marks(r1, "first_step"), marks(r1, "checkpoint"))
	}
	reporttest.CheckHTMLInChromium(t, html, 2)
}

// TestReportBadInputCLI: the command names the file and never prints a
// number from bad records.
func TestReportBadInputCLI(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	good := filepath.Join(dir, "good.jsonl")
	other := filepath.Join(dir, "other.jsonl")
	cut := filepath.Join(dir, "cut.jsonl")
	v2 := filepath.Join(dir, "v2.json")
	line := func(run, ts string) string {
		return `{"event":"cycle_started","round":0,"node":"n","run_id":"` + run + `","ts":"` + ts + `"}` + "\n"
	}
	for p, s := range map[string]string{
		good:  line("a", "2026-01-01T00:00:00Z") + line("a", "2026-01-01T00:00:05Z"),
		other: line("b", "2026-01-01T00:00:00Z"),
		cut:   line("a", "2026-01-01T00:00:00Z") + `{"event":"rank_exi`,
		v2:    `{"schema":"ft-launcher.verdict/v2","kind":"succeeded"}`,
	} {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"--event-log", filepath.Join(dir, "missing.jsonl")}, 1, []string{"missing.jsonl", "no such file"}},
		{[]string{"--event-log", cut}, 1, []string{"cut.jsonl", "line 2", "truncated"}},
		{[]string{"--event-log", good, "--verdict", v2}, 1, []string{"v2.json", "ft-launcher.verdict/v2"}},
		{[]string{"--event-log", good, "--event-log", other}, 1, []string{"two runs", "good.jsonl", "other.jsonl"}},
		{nil, 2, []string{"no records"}},
		{[]string{"--bogus"}, 2, []string{"unknown flag: --bogus"}},
		{[]string{"stray"}, 2, []string{`unexpected argument "stray"`}},
	}
	for _, tt := range tests {
		cmd := exec.Command(bins.resumer, append([]string{"report", "-o", filepath.Join(dir, "r.html")}, tt.args...)...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		for _, w := range tt.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("report %v: stderr %q does not say %q", tt.args, stderr.String(), w)
			}
		}
		if code != tt.code || stdout.Len() > 0 {
			t.Errorf("report %v: exit %d, stdout %q; want exit %d and nothing on stdout", tt.args, code, stdout.String(), tt.code)
		}
		if _, err := os.Stat(filepath.Join(dir, "r.html")); err == nil {
			t.Errorf("report %v wrote a report from bad input", tt.args)
		}
	}
}
