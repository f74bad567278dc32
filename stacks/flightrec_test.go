package stacks

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeFR is a rank with a flight recorder. This machine has no GPU and its
// torch no NCCL, so torch's _dump_nccl_trace is stood in for by a module
// of that name in sys.modules, as torch registers it, whose function
// returns a pickle shaped as torch 2.4-2.11's (version, pg_config,
// entries) and records how it was called. Everything else (the hook, its
// thread, the FIFO, the answer's files, Collect, the decoder) is the
// real thing. bench/gpu/fr_probe.py runs the real one on a GPU.
const fakeFR = `
import os, pickle, sys, threading, types
calls = sys.argv[1]
def _dump_nccl_trace(includeCollectives=None, includeStackTraces=None, onlyActive=None):
    with open(calls, "a") as f:
        f.write("%r %r %r\n" % (includeCollectives, includeStackTraces, onlyActive))
    e = lambda i, state: {"record_id": i, "pg_id": 0, "process_group": ("0", "default_pg"),
        "collective_seq_id": 55 + i, "p2p_seq_id": 0, "op_id": 55 + i, "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1000 + i, "input_sizes": [[1024]], "output_sizes": [[1024]], "state": state,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "retired": False,
        "timeout_ms": 600000, "is_p2p": False}
    return pickle.dumps({"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {}, "entries": [e(0, "completed"), e(1, "completed"), e(2, "started"), e(3, "scheduled")]})
c10d = types.ModuleType("torch._C._distributed_c10d")
c10d._dump_nccl_trace = _dump_nccl_trace
sys.modules["torch._C._distributed_c10d"] = c10d
if os.fork() == 0:  # a DataLoader worker: keeps no flight-recorder thread
    import time
    time.sleep(3600)
lock = threading.Lock()
lock.acquire()
print("ready", flush=True)
lock.acquire()
`

// TestFlightRecorder: a hung rank's flight recorder is asked for after its
// stacks and read by the restricted decoder; a rank without one answers
// at once that it has none; nothing is asked where it is off.
func TestFlightRecorder(t *testing.T) {
	dir := t.TempDir()
	script := write(t, dir, "fr.py", fakeFR)
	noTorch := write(t, dir, "plain.py", rankScripts["lock"])
	for _, tc := range []struct {
		name   string
		env    []string
		def    int
		script string
		want   FRState
	}{
		{"buffer set by the job", []string{"TORCH_NCCL_TRACE_BUFFER_SIZE=2000"}, 0, script, FRTaken},
		{"newer torch's variable", []string{"TORCH_FR_BUFFER_SIZE=100"}, 0, script, FRTaken},
		{"the launcher's default", nil, 2000, script, FRTaken},
		{"turned off by the job", []string{"TORCH_NCCL_TRACE_BUFFER_SIZE=0"}, 2000, script, ""},
		{"off: no buffer, no default", nil, 0, script, ""},
		{"a rank without torch", []string{"TORCH_NCCL_TRACE_BUFFER_SIZE=2000"}, 0, noTorch, FRNone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := New()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetFlightRecorderDefault(tc.def)
			calls := filepath.Join(t.TempDir(), "calls")
			env := c.Env(append(os.Environ(), tc.env...))
			if on := tc.want != ""; c.FlightRecorderOn() != on {
				t.Fatalf("flight recorder on %v, want %v", c.FlightRecorderOn(), on)
			}
			pid := start(t, []string{python, "-u", tc.script, calls}, env).Process.Pid
			time.Sleep(100 * time.Millisecond) // it blocks right after "ready"
			begin := time.Now()
			got := c.Collect(context.Background(), map[int]int{0: pid}, 0)
			took := time.Since(begin)
			r := got[0]
			if r.State != StateDumped || r.FRState != tc.want {
				t.Fatalf("state %s, flight recorder %q, want dumped and %q", r.State, r.FRState, tc.want)
			}
			t.Logf("collected in %s, flight recorder %s, %d bytes", took, r.FRState, len(r.FR))
			if tc.want != FRTaken {
				if len(r.FR) != 0 {
					t.Errorf("%d bytes of flight recorder, want none", len(r.FR))
				}
				if tc.want == "" {
					if _, err := os.Stat(filepath.Join(c.dumpDir, fmt.Sprint(pid)+".frq")); err == nil {
						t.Error("the hook made a flight-recorder FIFO with the recorder off")
					}
				}
				return
			}
			fr, err := ParseFlightRecord(r.FR)
			if err != nil {
				t.Fatal(err)
			}
			if fr.Entries != 4 || fr.Pending == nil || fr.Pending.Seq != 57 || fr.Pending.State != "started" ||
				fr.Pending.Name != "nccl:all_reduce" || fr.Pending.Group != "0 default_pg" || fr.Last.Seq != 58 {
				t.Fatalf("record %+v (pending %+v)", fr, fr.Pending)
			}
			if want := "in nccl:all_reduce #57 (group 0 default_pg) started"; fr.Text() != want {
				t.Errorf("text %q, want %q", fr.Text(), want)
			}
			b, _ := os.ReadFile(calls)
			if string(b) != "True False False\n" {
				t.Errorf("_dump_nccl_trace called as %q, want once without the collectives' stack traces", b)
			}
			// Asked again, it answers again (the FIFO stays open).
			again := c.Collect(context.Background(), map[int]int{0: pid}, 0)
			if again[0].FRState != FRTaken {
				t.Errorf("second request: %s", again[0].FRState)
			}
			c.Forget(pid)
			for _, ext := range []string{".frq", ".fr"} {
				if _, err := os.Stat(filepath.Join(c.dumpDir, fmt.Sprint(pid)+ext)); err == nil {
					t.Errorf("Forget left %s", ext)
				}
			}
		})
	}
}

// TestParseFlightRecord: the shapes torch has written (before 2.3: seq_id
// and pg_id; p2p entries; all completed), and pickles that are not a
// flight recorder, refused without running anything.
func TestParseFlightRecord(t *testing.T) {
	gen := func(expr string) []byte { return pickleOf(t, expr) }
	for _, tc := range []struct {
		name, expr, text, err string
	}{
		{"torch 2.2", `{"version": "1.1", "entries": [{"seq_id": 9, "pg_id": 3, "profiling_name": "nccl:broadcast", "state": "completed"}, {"seq_id": 10, "pg_id": 3, "profiling_name": "nccl:all_gather", "state": "scheduled"}]}`,
			"in nccl:all_gather #10 (group 3) scheduled", ""},
		{"p2p", `{"version": "2.4", "entries": [{"collective_seq_id": 4, "p2p_seq_id": 12, "is_p2p": True, "process_group": ("1", "pp"), "profiling_name": "nccl:send 0->1", "state": "started"}]}`,
			"in nccl:send 0->1 #12 (group 1 pp) started", ""},
		{"all completed", `{"version": "2.4", "entries": [{"collective_seq_id": 7, "process_group": ("0", ""), "profiling_name": "nccl:all_reduce", "state": "completed"}]}`,
			"none pending, the last nccl:all_reduce #7 (group 0) completed", ""},
		{"empty", `{"version": "2.4", "entries": []}`, "no collective recorded", ""},
		{"not a dict", `[1, 2]`, "", "want a dict"},
		{"entries not a list", `{"entries": 3}`, "", "want a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseFlightRecord(gen(tc.expr))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Text() != tc.text {
				t.Errorf("text %q, want %q", r.Text(), tc.text)
			}
		})
	}
	// A pickle that would run a command when unpickled by Python is refused.
	marker := filepath.Join(t.TempDir(), "ran")
	evil := []byte("cos\nsystem\n(S'touch " + marker + "'\ntR.")
	if _, err := ParseFlightRecord(evil); err == nil {
		t.Error("a pickle calling os.system was accepted")
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the pickle's command ran")
	}
}

// TestSummarizeFlightRecord: a rank's flight recorder reaches its summary
// (what the judgement and the other nodes read): the oldest collective not
// completed and the newest one issued; none when the record is not taken
// or does not parse.
func TestSummarizeFlightRecord(t *testing.T) {
	pk := func(expr string) []byte { return pickleOf(t, expr) }
	dump := []byte("Thread 0x00007f (most recent call first):\n  File \"/t/train.py\", line 88 in step\n  File \"/t/train.py\", line 99 in <module>\n")
	pending := pk(`{"version": "2.4", "entries": [{"collective_seq_id": 20, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce", "state": "completed"}, {"collective_seq_id": 21, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce", "state": "started"}, {"collective_seq_id": 22, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce", "state": "scheduled"}]}`)
	done := pk(`{"version": "2.4", "entries": [{"collective_seq_id": 20, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce", "state": "completed"}]}`)
	for _, tc := range []struct {
		name             string
		fr               []byte
		state            FRState
		want, pending    bool
		seq, last        int64
		group, lastGroup string
	}{
		{"pending", pending, FRTaken, true, true, 21, 22, "0 default_pg", "0 default_pg"},
		{"all completed", done, FRTaken, true, false, 0, 20, "", "0 default_pg"},
		{"not taken", pending, FRNoAnswer, false, false, 0, 0, "", ""},
		{"not a record", []byte("garbage"), FRTaken, false, false, 0, 0, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Summarize(Rank{LocalRank: 1, State: StateDumped, Dump: dump, FR: tc.fr, FRState: tc.state}, 3)
			if s.FR != tc.want || s.FRPending != tc.pending || s.FRSeq != tc.seq || s.FRLastSeq != tc.last ||
				s.FRGroup != tc.group || s.FRLastGroup != tc.lastGroup {
				t.Fatalf("summary %+v, want fr %v pending %v #%d (%q), last #%d (%q)", s, tc.want, tc.pending, tc.seq, tc.group, tc.last, tc.lastGroup)
			}
			if tc.pending && s.FRName != "nccl:all_reduce" {
				t.Errorf("pending collective %q, want nccl:all_reduce", s.FRName)
			}
		})
	}
}

// pickleOf is Python's pickle (protocol 2) of the Python expression expr.
func pickleOf(t *testing.T, expr string) []byte {
	t.Helper()
	out, err := exec.Command(python, "-c", "import pickle, sys\nsys.stdout.buffer.write(pickle.dumps("+expr+", protocol=2))").Output()
	if err != nil {
		t.Fatal(err)
	}
	return out
}
