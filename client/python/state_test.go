package clientpython

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
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

// TestStateWriteOutUnderContinuousSaves: a real torch rank saves 32 MiB
// of tensors every 0.1 s into a real store (--state-persist-every 1s)
// while 4 busy loops keep this machine's cores busy, so the launcher's
// writer, at nice 19, gets a sliver of a core. Write-outs keep
// completing: the first within 10 × persist-every of the first save, and
// no gap between two longer than that. Before, every write-out was
// overtaken by the rank's next two saves (the slot it copied reused),
// started again up to 8 times and gave up: no file for as long as the
// rank kept saving. Now the writer pins the save it copies (the rank
// writes around it), and a periodic write-out still not done one
// persist-every after it became due runs at the launcher's priority
// (reason "overdue").
func TestStateWriteOutUnderContinuousSaves(t *testing.T) {
	testenv.SkipShort(t, "runs a torch rank and CPU burners for 25 s")
	testenv.Require(t, testenv.Torch)
	const every, bound, run = time.Second, 10 * time.Second, 25 * time.Second
	type at struct {
		t time.Time
		r eventlog.Record
	}
	var mu sync.Mutex
	var recs []at
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := state.Open(state.Options{NLocal: 1, Dir: dir, ShmRoot: t.TempDir(), Every: state.Every{Interval: every},
		Emit: func(r eventlog.Record) { mu.Lock(); recs = append(recs, at{time.Now(), r}); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command(testenv.DebianPython, args...)
		cmd.Env = append(os.Environ(), append(s.Env(), "LOCAL_RANK=0", "RANK=0", "LOCAL_WORLD_SIZE=1")...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	for i := 0; i < 4; i++ {
		start("-c", "while True: pass")
	}
	start("-c", "import time, torch\nfrom ft_launcher_client import state\n"+
		"st = {'w': torch.randn(6 << 20), 'm': torch.randn(2 << 20)}\nstep = 0\n"+
		"while True:\n    step += 1\n    state.save(step, st)\n    time.sleep(0.1)\n")
	deadline := time.Now().Add(run + 90*time.Second) // torch's import on a loaded machine
	var first time.Time
	for time.Now().Before(deadline) {
		mu.Lock()
		for _, a := range recs {
			if _, ok := a.r.(eventlog.StateSaveEvent); ok && first.IsZero() {
				first = a.t
			}
		}
		mu.Unlock()
		if !first.IsZero() && time.Since(first) > run {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if first.IsZero() {
		t.Fatal("the rank's first save was not seen in 115 s")
	}
	mu.Lock()
	defer mu.Unlock()
	var writes []time.Time
	// The rank's saves, from its segment: the store records them only
	// between write-outs.
	seg, err := os.Open(s.SegmentPath(0))
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	d, err := state.Newest(seg)
	if err != nil {
		t.Fatal(err)
	}
	saves := d.Seq
	var failed, kinds []string
	for _, a := range recs {
		switch r := a.r.(type) {
		case eventlog.StatePersistedEvent:
			if r.Reason == "periodic" || r.Reason == state.ReasonOverdue {
				writes = append(writes, a.t)
				kinds = append(kinds, fmt.Sprintf("%s %.0f ms", r.Reason, r.WriteMS))
			}
		case eventlog.StatePersistFailedEvent:
			failed = append(failed, r.Error)
		}
	}
	end := first.Add(run)
	prev := first
	var gaps []string
	for _, w := range append(writes, end) {
		if w.After(end) {
			w = end
		}
		gaps = append(gaps, w.Sub(prev).Round(10*time.Millisecond).String())
		if w.Sub(prev) > bound {
			t.Errorf("no write-out completed for %v (from %v to %v after the first save); want one at least every %v", w.Sub(prev).Round(time.Millisecond),
				prev.Sub(first).Round(time.Millisecond), w.Sub(first).Round(time.Millisecond), bound)
		}
		prev = w
	}
	t.Logf("%d saves, %d periodic write-outs in %v (%s); gaps from the first save: %s; failed write-outs: %d %q",
		saves, len(writes), run, strings.Join(kinds, ", "), strings.Join(gaps, " "), len(failed), failed)
	if saves < 20 {
		t.Fatalf("only %d saves in %v: the rank did not save continuously", saves, run)
	}
}
