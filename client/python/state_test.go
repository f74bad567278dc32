package clientpython

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/state"
)

// TestStateAPI runs tests/state_check.py with Debian's python3 and torch:
// bit-identical round trips through the launcher's segment, growth, a
// corrupt save refused, the file fallback without the launcher and when
// memory is short, the checkpoint section, a saver SIGKILLed in the
// middle of its saves, a reader racing a saver, load(into=...) (in
// place into a model and optimizer, mismatches refused before a write),
// the copy split across threads (payloads bit-identical to one thread's,
// a failing copy thread leaving the previous save, FT_STATE_COPY_THREADS
// checked) and save(overlap=True) (committed, refused after an in-place
// change, the stall recorded as call plus wait, finished before an
// in-process close or rejoin ends the rank's session).
func TestStateAPI(t *testing.T) {
	runTorchUnittest(t, "tests.state_check")
}

// runTorchUnittest runs a unittest module of tests/ with Debian's python3
// and torch and fails the test with its output when any case fails.
func runTorchUnittest(t *testing.T, module string) {
	t.Helper()
	testenv.SkipShort(t, "runs Python client processes")
	testenv.Require(t, testenv.Torch)
	out, err := exec.Command(testenv.DebianPython, "-m", "unittest", module, "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("python %s: %v\n%s", module, err, out)
	}
	t.Logf("%s", out)
}

// TestStateWrittenByLauncherLoads checks the two sides agree: a rank's
// save (with and without its checksum) read from the segment and written
// out by the launcher's writer (state.Persist) loads bit-identically with
// the documented ft_launcher_client.state.load_file call; and the file the
// client writes without a launcher passes the launcher's reader.
func TestStateWrittenByLauncherLoads(t *testing.T) {
	testenv.SkipShort(t, "runs Python client processes")
	testenv.Require(t, testenv.Torch)
	for _, checksum := range []string{"True", "False"} {
		t.Run("checksum="+checksum, func(t *testing.T) {
			shm, dir := t.TempDir(), t.TempDir()
			env := append(os.Environ(), "LOCAL_RANK=1", "RANK=6", state.EnvShmDir+"="+shm, state.EnvDir+"="+dir)
			py := func(code string) string {
				t.Helper()
				cmd := exec.Command(testenv.DebianPython, "-c", "import sys; sys.path.insert(0, 'tests')\n"+
					"from state_check import make_state, same, state\n"+code)
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("python: %v\n%s", err, out)
				}
				return strings.TrimSpace(string(out))
			}
			py("state.save(41, make_state(41))\nstate.save(42, make_state(42), checksum=" + checksum + ")")
			f, err := os.Open(filepath.Join(shm, "rank-1"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m, ok, err := state.Persist(f, dir, 0)
			if err != nil || !ok {
				t.Fatalf("write-out: %v %v", ok, err)
			}
			if m.Rank != 6 || m.Step != 42 || m.Seq != 2 {
				t.Fatalf("manifest %+v", m)
			}
			if got := py("import os; os.environ.pop('FT_STATE_SHM_DIR')\nstep, s = state.load_file(" + `"` + dir + `"` + ")\nprint(step, same(s, make_state(42)))"); got != "42 True" {
				t.Fatalf("load_file of the launcher's write-out: %q, want \"42 True\"", got)
			}
			// The client's own file (no launcher) passes the launcher's reader.
			fb := t.TempDir()
			py("import os; os.environ.pop('FT_STATE_SHM_DIR')\nstate.save(7, make_state(7), path=" + `"` + fb + `"` + ")")
			fm, err := state.ReadManifest(fb, 6)
			if err != nil {
				t.Fatal(err)
			}
			d, p, err := state.ReadFile(filepath.Join(fb, fm.File))
			if err != nil || d.Step != 7 || d.Rank != 6 || uint64(len(p)) != fm.Bytes {
				t.Fatalf("the client's file through the launcher's reader: %+v, %d bytes, %v", d, len(p), err)
			}
		})
	}
}
