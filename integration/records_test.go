package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// rankOutputScript writes lines x 101 bytes to stdout and as many to
// stderr, then leaves a mark outside the full file system (the rank ran to
// its end: a full disk does not block training).
const rankOutputScript = `i=0
while [ $i -lt 200 ]; do printf '%0100d\n' $i; printf '%0100d\n' $i >&2; i=$((i+1)); done
touch "$OUT/done-$LOCAL_RANK"
`

// rankOutputBytes is what rankOutputScript writes per rank, both streams.
const rankOutputBytes = 2 * 200 * 101

// TestFullFileSystemRecords: the event log, the rank logs (-r 3) and, in
// one case, the verdict sit on a small tmpfs that is full before the
// launcher starts. Two ranks run to their end all the same; the launcher
// logs each kind of loss once at error level, counts every lost byte into
// the verdict's records_lost, and when the verdict itself cannot be
// written it removes the previous run's verdict and exits 73 instead of 0
// (the termination message, on another file system, says the same).
func TestFullFileSystemRecords(t *testing.T) {
	skipShort(t)
	tests := []struct {
		name            string
		verdictOnTmpfs  bool
		wantCode        int
		wantVerdictLine string
	}{
		{"verdict elsewhere", false, 0, "verdict written"},
		{"verdict on the full file system", true, 73, "could not write the verdict file; no earlier verdict is left there"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := testenv.Tmpfs(t, "256k")
			j := newJob(t)
			j.events = filepath.Join(fs, "events.jsonl")
			vpath := filepath.Join(j.dir, "verdict.json")
			if tt.verdictOnTmpfs {
				vpath = filepath.Join(fs, "verdict.json")
				// The previous run's verdict, which must not outlive this one.
				if err := verdict.Write(vpath, verdict.Verdict{Kind: verdict.Succeeded, RunID: "previous-run"}); err != nil {
					t.Fatal(err)
				}
			}
			term := filepath.Join(j.dir, "termination-log")
			testenv.FillUp(t, fs)
			s := j.script("rank.sh", rankOutputScript)
			code := j.run(generous, []string{"OUT=" + j.dir}, "--nproc-per-node", "2", "-r", "3", "--rdzv-id", "full-fs",
				"--log-dir", filepath.Join(fs, "logs"), "--verdict-file", vpath, "--termination-log", term, "--no-python", s)
			stderr := j.stderr.String()
			t.Logf("launcher stderr:\n%s", stderr)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\n%s", code, tt.wantCode, stderr)
			}
			for r := 0; r < 2; r++ {
				if _, err := os.Stat(filepath.Join(j.dir, "done-"+string(rune('0'+r)))); err != nil {
					t.Errorf("rank %d did not run to its end: %v", r, err)
				}
			}
			// One loud line per kind of loss, with where and how much.
			for _, w := range []string{"rank output lost", "event log: write failed"} {
				var hits []string
				for _, line := range strings.Split(stderr, "\n") {
					if strings.Contains(line, w) {
						hits = append(hits, line)
					}
				}
				if len(hits) != 1 || !strings.Contains(hits[0], "level=ERROR") || !strings.Contains(hits[0], "bytes_lost=") ||
					!strings.Contains(hits[0], fs) || !strings.Contains(hits[0], "no space left on device") {
					t.Errorf("want one error line with %q naming the path, the error and the bytes lost; got %d:\n%s", w, len(hits), strings.Join(hits, "\n"))
				}
			}
			if !strings.Contains(stderr, tt.wantVerdictLine) {
				t.Errorf("stderr lacks %q:\n%s", tt.wantVerdictLine, stderr)
			}

			var v verdict.Verdict
			if tt.verdictOnTmpfs {
				if _, err := os.Lstat(vpath); !os.IsNotExist(err) {
					b, _ := os.ReadFile(vpath)
					t.Fatalf("the previous verdict is still there (%v):\n%s", err, b)
				}
				if left, _ := filepath.Glob(filepath.Join(fs, ".verdict.json.tmp*")); len(left) > 0 {
					t.Errorf("temporary files left: %v", left)
				}
				b, err := os.ReadFile(term)
				if err != nil {
					t.Fatal(err)
				}
				if v, err = verdict.Parse(b); err != nil {
					t.Fatalf("termination message: %v\n%s", err, b)
				}
			} else {
				var err error
				if v, err = verdict.Read(vpath); err != nil {
					t.Fatal(err)
				}
				// The campaign's symptom: nothing of the event log was written.
				if st, err := os.Stat(j.events); err != nil || st.Size() != 0 {
					t.Errorf("event log: %v, %v; want it there and empty (the file system was full)", st, err)
				}
			}
			if v.Kind != verdict.Succeeded || v.ExitCode != tt.wantCode || v.RunID != "full-fs" {
				t.Errorf("verdict kind %s exit_code %d run_id %q, want succeeded, %d, full-fs", v.Kind, v.ExitCode, v.RunID, tt.wantCode)
			}
			rl := v.RecordsLost
			if rl == nil || rl.RankOutputBytes != 2*rankOutputBytes || rl.EventLogEvents < 3 || rl.EventLogBytes < 100*rl.EventLogEvents {
				b, _ := json.Marshal(rl)
				t.Errorf("records_lost %s: want rank_output_bytes %d and the lost events counted", b, 2*rankOutputBytes)
			}
			if left := j.leftovers(); len(left) > 0 {
				t.Errorf("processes left behind: %v", left)
			}
		})
	}
}

// TestBadRunIDExitsTwoBeforeStarting: a run id that is empty, too long,
// or holds a character that is not allowed, and a verdict path that is a
// directory, are refused by the real binary with exit 2 and one line
// naming the problem and what is allowed (then the help hint), before
// anything is created or started.
func TestBadRunIDExitsTwoBeforeStarting(t *testing.T) {
	skipShort(t)
	const allowed = "allowed: 1 to 200 characters of ASCII letters, digits and . _ - + : @, without '..'"
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"empty", []string{"--rdzv-id", ""}, nil, "--rdzv-id: empty run id: 1 to 200 characters of ASCII letters"},
		{"300 characters", []string{"--rdzv-id", strings.Repeat("r", 300)}, nil, "--rdzv-id: run id of 300 bytes"},
		{"newline", []string{"--rdzv-id", "a\nb"}, nil, `--rdzv-id: run id "a\nb" holds a newline (U+000A) at byte 1; ` + allowed},
		{"right-to-left override", []string{"--rdzv-id", "x\u202egpj"}, nil, `holds a right-to-left override (U+202E) at byte 1; ` + allowed},
		{"slash", []string{"--rdzv-id", "team/exp"}, nil, `holds '/' (a path separator) at byte 4`},
		{"dot dot", []string{"--rdzv-id", ".."}, nil, `run id ".." holds '..'`},
		{"env", nil, []string{"PET_RDZV_ID=a b"}, `PET_RDZV_ID: run id "a b" holds a space`},
		{"verdict path is a directory", []string{"--verdict-file", "DIR"}, nil, `is a directory: must name a file`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newJob(t)
			tmp := filepath.Join(j.dir, "tmp")
			vdir := filepath.Join(j.dir, "vdir")
			for _, d := range []string{tmp, vdir} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			vpath := filepath.Join(j.dir, "verdict.json")
			logs := filepath.Join(j.dir, "logs")
			args := []string{"--verdict-file", vpath}
			for _, a := range tt.args {
				if a == "DIR" {
					a = vdir
				}
				args = append(args, a)
			}
			s := j.script("rank.sh", `touch "$OUT/started"`+"\n")
			args = append(args, "--log-dir", logs, "--no-python", s)
			code := j.run(generous, append([]string{"OUT=" + j.dir, "TMPDIR=" + tmp}, tt.env...), args...)
			wantUsageRefusal(t, j, code, tt.want, vpath, logs)
			emptyDir(t, tmp)
			emptyDir(t, vdir)
			if left := j.leftovers(); len(left) > 0 {
				t.Errorf("processes left behind: %v", left)
			}
		})
	}
}
