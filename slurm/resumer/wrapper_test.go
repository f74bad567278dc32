package resumer

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/verdict"
)

func TestSbatchDirectives(t *testing.T) {
	script := "#!/bin/bash\n#SBATCH -N2\n\n# a comment\n#SBATCH --time=10 # walltime\nsrun x\n#SBATCH -p ignored\n"
	want := []string{"#SBATCH -N2", "#SBATCH --time=10 # walltime"}
	if got := SbatchDirectives(script); !reflect.DeepEqual(got, want) {
		t.Errorf("SbatchDirectives = %q, want %q", got, want)
	}
}

func TestWrapper(t *testing.T) {
	w := Wrapper("#!/bin/sh\n#SBATCH -N3\necho hi\n", "/c/it's", Settings{FinishedFlag: "/c/flag", Resumer: "/bin/ft-resumer"})
	for _, want := range []string{"#!/bin/bash\n#SBATCH -N3\n", `export FT_RESUMER_CHAIN='/c/it'\''s'`, "export FAULT_TOL_FINISHED_FLAG_FILE='/c/flag'",
		"'/bin/ft-resumer' step run --begin --end --chain-dir", "'/c/it'\\''s/job.sh' \"$@\"", `exec '/bin/ft-resumer' step end --chain-dir '/c/it'\''s' --rc "$rc" --script-ended "${EPOCHREALTIME:-}"`} {
		if !strings.Contains(w, want) {
			t.Errorf("wrapper lacks %q:\n%s", want, w)
		}
	}
}

func TestWriteJobResults(t *testing.T) {
	began := time.Now()
	jobs := []*ChainJob{
		{ID: "1", Began: began, Outcome: Failure},
		{ID: "2", Began: began, Outcome: Walltime},
		{ID: "3", Began: began, Outcome: Relocated},
		{ID: "4", Outcome: NeverRan},
		{ID: "5", Began: began, Outcome: NoRestart},
		{ID: "6", Began: began, Outcome: Finished},
		{ID: "7", Began: began},
		{ID: "8"},
	}
	for _, tt := range []struct{ format, want string }{
		{"nfl", "1 F\n2 S\n5 F\n6 S\n7 X\n"},
		{"nemo-run", "1 0 F\n2 0 S\n5 0 F\n6 0 S\n7 0 X\n"},
	} {
		st := &State{Dir: t.TempDir(), Jobs: jobs, Settings: Settings{JobResultsFormat: tt.format}}
		if err := writeJobResults(st); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(filepath.Join(st.Dir, JobResultsFile))
		if string(b) != tt.want {
			t.Errorf("%s: _job_results %q, want %q", tt.format, b, tt.want)
		}
	}
}

func TestNodeResolver(t *testing.T) {
	nodes := []slurm.NodeInfo{{Name: "n1", Addr: "127.0.0.2", Hostname: "vm"}, {Name: "n2", Addr: "127.0.0.3", Hostname: "vm"},
		{Name: "gpu7", Addr: "10.0.0.7", Hostname: "gpu7.cluster"}}
	nvs := []nodeVerdict{{node: "n9", v: verdict.Verdict{Node: "10.9.9.9/123"}}}
	resolve := nodeResolver(nodes, nvs)
	for key, want := range map[string]string{"n1": "n1", "127.0.0.3": "n2", "vm": "", "gpu7.cluster": "gpu7", "10.9.9.9": "n9", "": "", "x": ""} {
		if got := resolve(key); got != want {
			t.Errorf("resolve(%q) = %q, want %q", key, got, want)
		}
	}
}

func TestStateRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st := &State{Dir: dir, Status: Active, Settings: Settings{ExclusionTTL: Duration(90 * time.Minute), MaxSubsequentFailures: 2},
		Exclusions: []Exclusion{{Node: "n2", Expires: time.Now().Add(time.Hour)}, {Node: "n3", Expires: time.Now().Add(-time.Second)}}}
	if err := st.Save(); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Settings.ExclusionTTL != Duration(90*time.Minute) || got.Schema != ChainSchema {
		t.Errorf("loaded %+v", got)
	}
	if ex := got.ActiveExclusions(time.Now()); !reflect.DeepEqual(ex, []string{"n2"}) {
		t.Errorf("active exclusions %v, want [n2] (n3 expired)", ex)
	}
	if _, err := LoadState(t.TempDir()); err == nil {
		t.Error("LoadState of an empty dir succeeded")
	}
}

// TestWrapperEndStatus runs the generated wrapper's shell with a stand-in
// for the ft-resumer binary (the shell's logic is what is tested; the real
// binary runs it on the real cluster in slurmtest): the job exits with the
// status `step run --end` wrote, and runs `step end` itself when step run
// was killed, also when a status from an earlier run of the job is there.
func TestWrapperEndStatus(t *testing.T) {
	for _, tt := range []struct {
		name, run string
		want      int
		endRC     string // the --rc of a `step end` run by the wrapper, "" for none
	}{
		{"step run decided", `echo 75 > "$FT_RESUMER_JOB_DIR/end-status"; exit 75`, 75, ""},
		{"step run killed", `kill -KILL $$`, 9, "137"},
		{"step run failed before deciding", `exit 2`, 9, "2"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			log := filepath.Join(dir, "log")
			stand := filepath.Join(dir, "ft-resumer")
			body := "#!/bin/bash\ncase \"$2\" in\nrun) " + tt.run + " ;;\nend) echo \"$*\" >> " + log + "; exit 9 ;;\nesac\n"
			if err := os.WriteFile(stand, []byte(body), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, JobScriptFile), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			// A status left by an earlier run of this job (a requeue).
			jobDir := filepath.Join(dir, JobsDir, "7")
			if err := os.MkdirAll(jobDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(jobDir, EndStatusFile), []byte("0\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			w := filepath.Join(dir, WrapperFile)
			if err := os.WriteFile(w, []byte(Wrapper("#!/bin/sh\n", dir, Settings{FinishedFlag: filepath.Join(dir, "flag"), Resumer: stand})), 0o755); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command("/bin/bash", w)
			cmd.Env = append(os.Environ(), "SLURM_JOB_ID=7")
			out, err := cmd.CombinedOutput()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.want {
				t.Errorf("wrapper exited %d, want %d\n%s", code, tt.want, out)
			}
			ends, _ := os.ReadFile(log)
			switch {
			case tt.endRC == "" && len(ends) > 0:
				t.Errorf("the wrapper ran the end step although step run decided: %s", ends)
			case tt.endRC != "" && !strings.Contains(string(ends), "--rc "+tt.endRC+" "):
				t.Errorf("end step runs: %q, want one with --rc %s", ends, tt.endRC)
			}
		})
	}
}
