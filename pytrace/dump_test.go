package pytrace

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestParseDumpsGolden checks every real (and hand-written) dump in testdata.
func TestParseDumpsGolden(t *testing.T) {
	type want struct {
		dumps     int
		fatal     string
		timeout   string
		threads   []int // frames per thread of the last dump, in print order
		current   int   // index of the Current thread in the last dump, -1 for none
		truncated bool  // last dump
		main      string
		mainAct   Activity
		user      string // UserFrame of the main thread
	}
	tests := []struct {
		file string
		want want
	}{
		{"blocked_lock_py311.txt", want{2, "", "", []int{6, 3}, 1, false, "blocked.py:30 in block_lock", ActUser, "blocked.py:30 in block_lock"}},
		{"blocked_lock_py312.txt", want{1, "", "", []int{6, 3}, 1, false, "blocked.py:30 in block_lock", ActUser, "blocked.py:30 in block_lock"}},
		{"blocked_lock_py313.txt", want{1, "", "", []int{6, 3}, 1, false, "blocked.py:30 in block_lock", ActUser, "blocked.py:30 in block_lock"}},
		{"blocked_fifo_py311.txt", want{1, "", "", []int{6, 3}, 1, false, "blocked.py:37 in block_fifo", ActUser, "blocked.py:37 in block_fifo"}},
		{"blocked_gloo_py311_rank0.txt", want{1, "", "", []int{6, 4}, 1, false, "distributed_c10d.py:1541 in all_reduce", ActCollective, "blocked.py:60 in block_gloo"}},
		{"blocked_gloo_py311_rank1.txt", want{1, "", "", []int{6, 3}, 1, false, "blocked.py:68 in block_gloo_peer", ActUser, "blocked.py:68 in block_gloo_peer"}},
		{"blocked_deep_py311.txt", want{1, "", "", []int{6, 100}, 1, false, "blocked.py:75 in recurse", ActUser, "blocked.py:75 in recurse"}},
		{"fatal_segv_oneliner_py311.txt", want{1, "Segmentation fault", "", []int{2}, 0, false, "__init__.py:519 in string_at", ActLibrary, "<string>:1 in <module>"}},
		{"fatal_segv_torch_py311.txt", want{1, "Segmentation fault", "", []int{6, 4}, 1, false, "__init__.py:519 in string_at", ActLibrary, "fatal.py:19 in crash"}},
		{"fatal_segv_py312.txt", want{1, "Segmentation fault", "", []int{6, 4}, 1, false, "__init__.py:525 in string_at", ActLibrary, "fatal.py:19 in crash"}},
		{"fatal_abort_py311.txt", want{1, "Aborted", "", []int{6, 3}, 1, false, "fatal.py:21 in crash", ActUser, "fatal.py:21 in crash"}},
		{"fatal_abort_py313.txt", want{1, "Aborted", "", []int{6, 3}, 1, false, "fatal.py:21 in crash", ActUser, "fatal.py:21 in crash"}},
		{"fatal_fpe_py311.txt", want{1, "Floating point exception", "", []int{6, 3}, 1, false, "fatal.py:23 in crash", ActUser, "fatal.py:23 in crash"}},
		{"fatal_bus_py311.txt", want{1, "Bus error", "", []int{6, 3}, 1, false, "fatal.py:25 in crash", ActUser, "fatal.py:25 in crash"}},
		{"fatal_pyfatalerror_py311.txt", want{1, "checkpoint writer: inconsistent state", "", []int{6, 3}, 1, false, "misc_dumps.py:27 in leaf", ActUser, "misc_dumps.py:27 in leaf"}},
		{"fatal_pyfatalerror_py313.txt", want{1, "checkpoint writer: inconsistent state", "", []int{6, 3}, 1, false, "misc_dumps.py:27 in leaf", ActUser, "misc_dumps.py:27 in leaf"}},
		{"dump_stack_py311.txt", want{1, "", "", []int{3}, 0, false, "misc_dumps.py:22 in leaf", ActUser, "misc_dumps.py:22 in leaf"}},
		{"dump_stack_py313.txt", want{1, "", "", []int{3}, 0, false, "misc_dumps.py:22 in leaf", ActUser, "misc_dumps.py:22 in leaf"}},
		{"dump_later_py311.txt", want{1, "", "0:00:00.500000", []int{6, 3}, -1, false, "misc_dumps.py:25 in leaf", ActUser, "misc_dumps.py:25 in leaf"}},
		{"handwritten_fatal_py314.txt", want{1, "Segmentation fault", "", []int{0, 6, 3}, 2, false, "__init__.py:590 in string_at", ActLibrary, "train.py:41 in step"}},
		{"handwritten_fatal_freethreaded_py314t.txt", want{1, "Segmentation fault", "", []int{3}, 0, false, "__init__.py:590 in string_at", ActLibrary, "train.py:9 in step"}},
		{"handwritten_windows_access_violation.txt", want{1, "access violation", "", []int{2, 2}, 1, false, "train.py:12 in step", ActUser, "train.py:12 in step"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			ds := ParseDumps(readTestdata(t, tc.file))
			if len(ds) != tc.want.dumps {
				t.Fatalf("got %d dumps, want %d: %+v", len(ds), tc.want.dumps, ds)
			}
			d := ds[len(ds)-1]
			if d.Fatal != tc.want.fatal || d.Timeout != tc.want.timeout || d.Truncated != tc.want.truncated {
				t.Errorf("Fatal=%q Timeout=%q Truncated=%v, want %q %q %v", d.Fatal, d.Timeout, d.Truncated, tc.want.fatal, tc.want.timeout, tc.want.truncated)
			}
			var n []int
			cur := -1
			for i, th := range d.Threads {
				n = append(n, len(th.Frames))
				if th.Current {
					cur = i
				}
			}
			if !reflect.DeepEqual(n, tc.want.threads) || cur != tc.want.current {
				t.Errorf("frames per thread %v current %d, want %v %d", n, cur, tc.want.threads, tc.want.current)
			}
			m, ok := d.MainThread()
			if !ok {
				t.Fatal("no main thread")
			}
			in, _ := m.Innermost()
			if in.String() != tc.want.main {
				t.Errorf("main thread innermost %q, want %q", in, tc.want.main)
			}
			if a := Classify(m); a != tc.want.mainAct {
				t.Errorf("Classify(main) = %s, want %s", a, tc.want.mainAct)
			}
			u, _ := UserFrame(m.Frames)
			if u.String() != tc.want.user {
				t.Errorf("UserFrame(main) = %q, want %q", u, tc.want.user)
			}
		})
	}
}

// TestBlockedRanks is the hung-job use: one dump per rank, taken from outside
// with SIGRTMIN+3, find what each rank's main thread is blocked in.
func TestBlockedRanks(t *testing.T) {
	tests := []struct {
		name, file string
		act        Activity
		collective string
		code       string // the source line UserFrame must point at
	}{
		{"a/deadlocked lock.acquire", "blocked_lock_py311.txt", ActUser, "", "lock.acquire()  # deadlock"},
		{"b/os.read on a FIFO", "blocked_fifo_py311.txt", ActUser, "", "data = os.read(fd, 1)  # nobody ever writes"},
		{"c/gloo all_reduce, peer never joins", "blocked_gloo_py311_rank0.txt", ActCollective, "all_reduce", "dist.all_reduce(t)  # the peer never joins"},
		{"c/the peer", "blocked_gloo_py311_rank1.txt", ActUser, "", "time.sleep(1)  # stuck in user code, never calls all_reduce"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ds := ParseDumps(readTestdata(t, tc.file))
			if len(ds) == 0 {
				t.Fatal("no dump")
			}
			m, ok := ds[0].MainThread()
			if !ok || !m.Current || m.Frames[0].Func != "<module>" {
				t.Fatalf("main thread %+v", m)
			}
			if a := Classify(m); a != tc.act {
				t.Errorf("Classify = %s, want %s", a, tc.act)
			}
			if c := Collective(m); c != tc.collective {
				t.Errorf("Collective = %q, want %q", c, tc.collective)
			}
			u, ok := UserFrame(m.Frames)
			if !ok || !strings.HasSuffix(u.File, "/blocked.py") {
				t.Fatalf("UserFrame = %v", u)
			}
			if got := sourceLine(t, "blocked.py", u.Line); got != tc.code {
				t.Errorf("UserFrame %v is at %q, want %q", u, got, tc.code)
			}
			// The other thread is the heartbeat, waiting on an Event.
			for _, th := range ds[0].Threads {
				if th.ID == m.ID {
					continue
				}
				if a := Classify(th); a != ActLock {
					t.Errorf("heartbeat thread: Classify = %s, want lock", a)
				}
				if u, _ := UserFrame(th.Frames); u.Func != "heartbeat" {
					t.Errorf("heartbeat thread: UserFrame = %v", u)
				}
			}
		})
	}

	// Rank 0 waits in a collective, rank 1 does not: rank 1 is the culprit.
	var culprits []int
	for rank, f := range []string{"blocked_gloo_py311_rank0.txt", "blocked_gloo_py311_rank1.txt"} {
		d := ParseDumps(readTestdata(t, f))[0]
		m, _ := d.MainThread()
		if Classify(m) != ActCollective {
			culprits = append(culprits, rank)
		}
	}
	if !reflect.DeepEqual(culprits, []int{1}) {
		t.Errorf("culprits %v, want [1]", culprits)
	}
}

func TestDumpFrameOrder(t *testing.T) {
	d := ParseDumps(readTestdata(t, "blocked_gloo_py311_rank0.txt"))[0]
	got := frameStrings(d.Threads[1].Frames)
	want := []string{"blocked.py:97 in <module>", "blocked.py:89 in main", "blocked.py:60 in block_gloo", "distributed_c10d.py:1541 in all_reduce"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frames %q, want %q", got, want)
	}
	th := d.Threads[0]
	if th.Current || !strings.HasPrefix(th.ID, "0x") || len(th.ID) != 18 {
		t.Errorf("thread 0: %+v", th)
	}
	if f := th.Frames[0]; f.Func != "_bootstrap" || !strings.HasPrefix(f.File, "/usr/lib/python3.11/") {
		t.Errorf("outermost frame of heartbeat thread %+v", f)
	}
}

func TestDumpTruncation(t *testing.T) {
	d := ParseDumps(readTestdata(t, "blocked_deep_py311.txt"))[0]
	m, _ := d.MainThread()
	if !m.Truncated || len(m.Frames) != 100 {
		t.Errorf("deep thread: Truncated=%v frames=%d, want true 100", m.Truncated, len(m.Frames))
	}
	// Without its outermost frames the main thread is found as the Current one.
	if !m.Current {
		t.Error("main thread should be the current thread")
	}

	d = ParseDumps([]byte("Current thread 0x00007f0000000002 (most recent call first):\n  File \"x.py\", line 3 in f\n  <truncated>\n"))[0]
	if !d.Threads[0].Truncated {
		t.Error("<truncated> marker not seen")
	}

	ds := ParseDumps(readTestdata(t, "dump_many_threads_py311.txt"))
	if len(ds) != 1 || len(ds[0].Threads) != 100 || !ds[0].Truncated {
		t.Fatalf("many threads: %d dumps", len(ds))
	}
	// The main thread (printed last) was cut off: MainThread falls back to the first.
	m, _ = ds[0].MainThread()
	if m.ID != ds[0].Threads[0].ID {
		t.Errorf("MainThread = %s, want the first thread", m.ID)
	}
}

func TestHandwrittenPy314(t *testing.T) {
	d := ParseDumps(readTestdata(t, "handwritten_fatal_py314.txt"))[0]
	names := []string{d.Threads[0].Name, d.Threads[1].Name, d.Threads[2].Name}
	if !reflect.DeepEqual(names, []string{"pt_autograd_0", "heartbeat", "python3"}) {
		t.Errorf("names %q", names)
	}
	if a := Classify(d.Threads[0]); a != ActNone {
		t.Errorf("thread without Python frame: %s", a)
	}
	if !strings.HasPrefix(d.Threads[1].String(), "Thread 0x00007f2a5e1fe6c0 [heartbeat] (most recent call first):\n  threading.py:373 in wait\n") {
		t.Errorf("Thread.String:\n%s", d.Threads[1])
	}
}

func TestParseDumpsSynthetic(t *testing.T) {
	const th1 = "Thread 0x00007f0000000001 (most recent call first):\n" +
		"  File \"/usr/lib/python3.11/threading.py\", line 324 in wait\n" +
		"  File \"/home/u/train.py\", line 5 in loader\n"
	const main = "Current thread 0x00007f0000000002 (most recent call first):\n" +
		"  File \"/home/u/train.py\", line 30 in step\n" +
		"  File \"/home/u/train.py\", line 97 in <module>\n"
	one := th1 + "\n" + main

	type dumpSummary struct {
		Fatal   string
		Threads string // "ID:frames,..."
	}
	summarize := func(ds []Dump) []dumpSummary {
		var out []dumpSummary
		for _, d := range ds {
			var parts []string
			for _, th := range d.Threads {
				id := th.ID
				if len(id) > 4 {
					id = id[len(id)-1:]
				}
				parts = append(parts, fmt.Sprintf("%s:%d", id, len(th.Frames)))
			}
			out = append(out, dumpSummary{d.Fatal, strings.Join(parts, ",")})
		}
		return out
	}
	prefixed := func(p, s string) string {
		ls := strings.SplitAfter(s, "\n")
		var b strings.Builder
		for _, l := range ls {
			if l != "" {
				b.WriteString(p + l)
			}
		}
		return b.String()
	}
	tests := []struct {
		name string
		in   string
		want []dumpSummary
	}{
		{"one", one, []dumpSummary{{"", "1:2,2:2"}}},
		{"appended without separator", one + one, []dumpSummary{{"", "1:2,2:2"}, {"", "1:2,2:2"}}},
		{"appended with blank line", one + "\n" + one, []dumpSummary{{"", "1:2,2:2"}, {"", "1:2,2:2"}}},
		{"separated by other output", "epoch 1\n" + one + "epoch 2 loss=0.1\nsaving\n" + one + "done\n", []dumpSummary{{"", "1:2,2:2"}, {"", "1:2,2:2"}}},
		{"CRLF", strings.ReplaceAll(one, "\n", "\r\n"), []dumpSummary{{"", "1:2,2:2"}}},
		{"torchrun prefix", prefixed("[default3]:", one), []dumpSummary{{"", "1:2,2:2"}}},
		{"rank prefix", prefixed("[rank3]: ", "Fatal Python error: Aborted\n\n"+one), []dumpSummary{{"Aborted", "1:2,2:2"}}},
		{"after a progress bar", "\r 10%|#   |\r 20%|##  |Fatal Python error: Segmentation fault\n\n" + one, []dumpSummary{{"Segmentation fault", "1:2,2:2"}}},
		{"fatal without threads", "Fatal Python error: Segmentation fault\n\n", []dumpSummary{{"Segmentation fault", ""}}},
		{"fatal with preamble", "Fatal Python error: _enter_buffered_busy: could not acquire lock\nPython runtime state: finalizing (tstate=0x0000555d)\n\n" + one, []dumpSummary{{"_enter_buffered_busy: could not acquire lock", "1:2,2:2"}}},
		{"fatal then unrelated output", "Fatal Python error: Bus error\n\n" + strings.Repeat("log line\n", maxPreamble+1) + one, []dumpSummary{{"Bus error", ""}, {"", "1:2,2:2"}}},
		{"second fatal", "Fatal Python error: Aborted\n\n" + one + "Fatal Python error: Segmentation fault\n\n" + main, []dumpSummary{{"Aborted", "1:2,2:2"}, {"Segmentation fault", "2:2"}}},
		{"unknown file and line", "Current thread 0x00007f0000000002 (most recent call first):\n  File ???, line ??? in <module>\n  File \"x.py\", line ??? in f\n", []dumpSummary{{"", "2:2"}}},
		{"not a dump", "Thread 0x12 started\nFile \"x.py\", line 3 in f\nTraceback (most recent call last):\n", nil},
		{"thread header without frames", "Thread 0x00007f0000000001 (most recent call first):\n", []dumpSummary{{"", "1:0"}}},
		{"frame line of the traceback format is also accepted", "Current thread 0x00007f0000000002 (most recent call first):\n  File \"x.py\", line 3, in f\n", []dumpSummary{{"", "2:1"}}},
		{"ids with uppercase and short", "Thread 0x1A (most recent call first):\n  File \"x.py\", line 3 in f\n", []dumpSummary{{"", "0x1A:1"}}},
		{"truncated marker", "Current thread 0x00007f0000000002 (most recent call first):\n  File \"x.py\", line 3 in f\n  <truncated>\n", []dumpSummary{{"", "2:1"}}},
		{"invalid id", "Thread 0xZZ (most recent call first):\n  File \"x.py\", line 3 in f\n", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := summarize(ParseDumps([]byte(tc.in)))
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestParseDumpsCaps(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("Current thread 0x00007f0000000002 (most recent call first):\n")
	for i := 1500; i >= 1; i-- {
		fmt.Fprintf(&b, "  File \"/home/u/x.py\", line %d in f%d\n", i, i)
	}
	ds := ParseDumps(b.Bytes())
	if len(ds) != 1 || len(ds[0].Threads) != 1 {
		t.Fatalf("%d dumps", len(ds))
	}
	th := ds[0].Threads[0]
	if len(th.Frames) != maxFrames || !th.Truncated {
		t.Fatalf("frames %d truncated %v", len(th.Frames), th.Truncated)
	}
	// The innermost frames are kept (printed first by faulthandler).
	if in, _ := th.Innermost(); in.Line != 1500 {
		t.Errorf("innermost %v", in)
	}

	b.Reset()
	for i := 0; i < 300; i++ {
		fmt.Fprintf(&b, "Thread 0x%016x (most recent call first):\n  File \"/home/u/x.py\", line 1 in f\n\n", i)
	}
	ds = ParseDumps(b.Bytes())
	if len(ds) != 1 || len(ds[0].Threads) != maxThreads || !ds[0].Truncated {
		t.Fatalf("got %d dumps, %d threads", len(ds), len(ds[0].Threads))
	}

	b.Reset()
	for i := 0; i < 2*maxDumps+10; i++ {
		fmt.Fprintf(&b, "Fatal Python error: dump %d\n\n", i)
	}
	ds = ParseDumps(b.Bytes())
	if len(ds) != maxDumps || ds[len(ds)-1].Fatal != fmt.Sprintf("dump %d", 2*maxDumps+9) {
		t.Fatalf("got %d dumps, last %q", len(ds), ds[len(ds)-1].Fatal)
	}
}

func TestMainThread(t *testing.T) {
	fr := func(file string, line int, fn string) Frame { return Frame{file, line, fn} }
	runpy := []Frame{
		fr("<frozen runpy>", 198, "_run_module_as_main"),
		fr("<frozen runpy>", 88, "_run_code"),
		fr("/home/u/pkg/train.py", 40, "<module>"),
		fr("/home/u/pkg/train.py", 12, "main"),
	}
	worker := []Frame{
		fr("/usr/lib/python3.11/threading.py", 995, "_bootstrap"),
		fr("/usr/lib/python3.11/threading.py", 1038, "_bootstrap_inner"),
		fr("/usr/lib/python3.11/threading.py", 975, "run"),
		fr("/home/u/pkg/train.py", 5, "worker"),
	}
	tests := []struct {
		name string
		d    Dump
		want string
		ok   bool
	}{
		{"python -m (runpy frames first)", Dump{Threads: []Thread{{ID: "0x1", Current: true, Frames: worker}, {ID: "0x2", Frames: runpy}}}, "0x2", true},
		{"current", Dump{Threads: []Thread{{ID: "0x1", Frames: worker}, {ID: "0x2", Current: true, Frames: worker}}}, "0x2", true},
		{"first", Dump{Threads: []Thread{{ID: "0x1", Frames: worker}, {ID: "0x2", Frames: worker}}}, "0x1", true},
		{"module in site-packages only", Dump{Threads: []Thread{{ID: "0x1", Frames: []Frame{fr("/x/site-packages/a.py", 1, "<module>")}}, {ID: "0x2", Current: true}}}, "0x2", true},
		{"none", Dump{}, "", false},
	}
	for _, tc := range tests {
		got, ok := tc.d.MainThread()
		if got.ID != tc.want || ok != tc.ok {
			t.Errorf("%s: got %q %v, want %q %v", tc.name, got.ID, ok, tc.want, tc.ok)
		}
	}
}

func TestParseThreadHeader(t *testing.T) {
	tests := []struct {
		in   string
		want Thread
		ok   bool
	}{
		{"Thread 0x00007f1c2b5fe6c0 (most recent call first):", Thread{ID: "0x00007f1c2b5fe6c0"}, true},
		{"Current thread 0x00007f1c2c0a1740 (most recent call first):", Thread{ID: "0x00007f1c2c0a1740", Current: true}, true},
		{"Current thread 0x000022ac (most recent call first):  ", Thread{ID: "0x000022ac", Current: true}, true},
		{"Thread 0x00007f2a5e1fe6c0 [pt_main_thread] (most recent call first):", Thread{ID: "0x00007f2a5e1fe6c0", Name: "pt_main_thread"}, true},
		{"Current thread's C stack trace (most recent call first):", Thread{}, false},
		{"Thread 0x00007f1c2b5fe6c0:", Thread{}, false},
		{"Thread  (most recent call first):", Thread{}, false},
		{"Thread 0x (most recent call first):", Thread{}, false},
		{"Stack (most recent call first):", Thread{}, false},
	}
	for _, tc := range tests {
		got, ok := parseThreadHeader([]byte(tc.in))
		if ok != tc.ok || (ok && !reflect.DeepEqual(got, tc.want)) {
			t.Errorf("%q: got %+v %v, want %+v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}
