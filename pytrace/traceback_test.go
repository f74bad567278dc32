package pytrace

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// TestLastTracebackGolden checks the last traceback of every real sample.
func TestLastTracebackGolden(t *testing.T) {
	tests := []struct {
		file    string
		typ     string
		msg     string
		frames  int
		chained int
		prefix  string
		all     int    // len(Tracebacks)
		user    string // UserFrame
		script  string // generator script UserFrame must point into ("" for none)
		code    string // the source line UserFrame must point at
	}{
		{"tb_forward_py311.txt", "RuntimeError", "loss is NaN at step 3 (rank 0)", 5, 0, "", 1,
			"tracebacks.py:32 in forward", "tracebacks.py", `raise RuntimeError("loss is NaN at step 3 (rank 0)")`},
		{"tb_gloo_peer_exit_rank0_py311.txt", "RuntimeError", "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:", 4, 0, "", 1,
			"gloo_exit.py:16 in sync_grads", "gloo_exit.py", "dist.all_reduce(t)"},
		{"tee_gloo_peer_exit_console_py311.txt", "RuntimeError", "[./gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:", 4, 0, "[default0]:", 1,
			"gloo_exit.py:16 in sync_grads", "gloo_exit.py", "dist.all_reduce(t)"},
		{"tb_progress_py311.txt", "ValueError", "bad batch shape (2, 3)", 2, 0, "", 1,
			"tracebacks.py:47 in progress_mode", "tracebacks.py", `raise ValueError("bad batch shape (2, 3)")`},
		{"tb_context_py311.txt", "RuntimeError", "config is missing batch_size", 2, 1, "", 2,
			"tracebacks.py:59 in context_mode", "tracebacks.py", `raise RuntimeError("config is missing batch_size")`},
		{"tb_cause_py311.txt", "RuntimeError", "resume failed", 2, 2, "", 3,
			"tracebacks.py:73 in cause_mode", "tracebacks.py", `raise RuntimeError("resume failed") from e`},
		{"tb_cause_py313.txt", "RuntimeError", "resume failed", 2, 2, "", 3,
			"tracebacks.py:73 in cause_mode", "tracebacks.py", `raise RuntimeError("resume failed") from e`},
		{"tb_untraced_py311.txt", "RuntimeError", "rendezvous failed", 2, 1, "", 1,
			"tracebacks.py:113 in untraced_mode", "tracebacks.py", `raise RuntimeError("rendezvous failed") from TimeoutError("store timed out after 300s")`},
		{"tb_group_py311.txt", "ExceptionGroup", "2 ranks failed (2 sub-exceptions)", 2, 0, "", 1,
			"tracebacks.py:83 in group_mode", "tracebacks.py", `raise ExceptionGroup("2 ranks failed", errors)`},
		{"tb_group_py313.txt", "ExceptionGroup", "2 ranks failed (2 sub-exceptions)", 2, 0, "", 1,
			"tracebacks.py:83 in group_mode", "tracebacks.py", `raise ExceptionGroup("2 ranks failed", errors)`},
		{"tb_syntax_py311.txt", "SyntaxError", "invalid syntax", 3, 0, "", 1,
			"badmod.py:2", "", ""},
		{"tb_multiline_py311.txt", "RuntimeError", "NCCL communicator was aborted on rank 2.\nLast error:\n  socket timeout after 1800000 ms", 2, 0, "", 1,
			"tracebacks.py:95 in multiline_mode", "tracebacks.py", `raise RuntimeError("NCCL communicator was aborted on rank 2.\n"`},
		{"tb_keyboard_py311.txt", "KeyboardInterrupt", "", 2, 0, "", 1,
			"tracebacks.py:101 in keyboard_mode", "tracebacks.py", "raise KeyboardInterrupt"},
		{"tb_recursion_py311.txt", "RecursionError", "maximum recursion depth exceeded", 5, 0, "", 1,
			"tracebacks.py:105 in rec", "tracebacks.py", "return rec(n + 1)"},
		// The worker's traceback, printed inside the re-raised exception's
		// message, is the last one in the text.
		{"tb_dataloader_py311.txt", "IndexError", "sample 5 is corrupt", 4, 0, "", 2,
			"tracebacks.py:122 in __getitem__", "tracebacks.py", `raise IndexError("sample 5 is corrupt")`},
		{"tb_torchrun_internal_py311.txt", "AttributeError", "'NoneType' object has no attribute 'get'", 15, 0, "", 1,
			"torchrun:33 in <module>", "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			text := readTestdata(t, tc.file)
			tb, ok := LastTraceback(text)
			if !ok {
				t.Fatal("no traceback")
			}
			if tb.Type != tc.typ || !strings.HasPrefix(tb.Message, tc.msg) {
				t.Errorf("got %s: %q, want %s: %q", tb.Type, tb.Message, tc.typ, tc.msg)
			}
			if len(tb.Frames) != tc.frames || tb.Chained != tc.chained || tb.Prefix != tc.prefix || tb.Truncated {
				t.Errorf("frames=%d chained=%d prefix=%q truncated=%v, want %d %d %q false",
					len(tb.Frames), tb.Chained, tb.Prefix, tb.Truncated, tc.frames, tc.chained, tc.prefix)
			}
			if n := len(Tracebacks(text)); n != tc.all {
				t.Errorf("Tracebacks: %d, want %d", n, tc.all)
			}
			u, ok := tb.UserFrame()
			if !ok || u.String() != tc.user {
				t.Errorf("UserFrame = %q, want %q", u, tc.user)
			}
			if tc.script != "" {
				if got := sourceLine(t, tc.script, u.Line); got != tc.code {
					t.Errorf("UserFrame %v is at %q, want %q", u, got, tc.code)
				}
			}
		})
	}
}

func TestTracebackFrames(t *testing.T) {
	tb, _ := LastTraceback(readTestdata(t, "tb_forward_py311.txt"))
	got := frameStrings(tb.Frames)
	want := []string{
		"tracebacks.py:135 in <module>",
		"tracebacks.py:40 in forward_mode",
		"tracebacks.py:36 in train_step",
		"module.py:1194 in _call_impl",
		"tracebacks.py:32 in forward",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frames\n%q\nwant\n%q", got, want)
	}
	if tb.Frames[3].File != "/usr/lib/python3/dist-packages/torch/nn/modules/module.py" {
		t.Errorf("file %q", tb.Frames[3].File)
	}

	all := Tracebacks(readTestdata(t, "tb_cause_py311.txt"))
	var types []string
	var chained []int
	for _, tb := range all {
		types = append(types, tb.Type)
		chained = append(chained, tb.Chained)
	}
	if !reflect.DeepEqual(types, []string{"FileNotFoundError", "ValueError", "RuntimeError"}) || !reflect.DeepEqual(chained, []int{0, 1, 2}) {
		t.Errorf("chain %v %v", types, chained)
	}

	// The exception inside the DataLoader message ends at the "Original
	// Traceback" line, which starts the worker's traceback.
	all = Tracebacks(readTestdata(t, "tb_dataloader_py311.txt"))
	if len(all) != 2 || all[0].Message != "Caught IndexError in DataLoader worker process 0." {
		t.Errorf("dataloader: %+v", all)
	}
}

func prefixLines(p, s string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(s, "\n") {
		if l != "" {
			b.WriteString(p + l)
		}
	}
	return b.String()
}

func TestLastTracebackSynthetic(t *testing.T) {
	const tb1 = "Traceback (most recent call last):\n" +
		"  File \"/home/u/train.py\", line 97, in <module>\n" +
		"    main()\n" +
		"  File \"/home/u/train.py\", line 30, in step\n" +
		"    loss = model(x)\n" +
		"           ^^^^^^^^\n" +
		"RuntimeError: CUDA out of memory\n"
	const tb2 = "Traceback (most recent call last):\n" +
		"  File \"/home/u/eval.py\", line 7, in <module>\n" +
		"    run()\n" +
		"ValueError: bad\n"
	type res struct {
		Type, Message, Prefix string
		Frames, Chained       int
	}
	tests := []struct {
		name string
		in   string
		want res
		ok   bool
	}{
		{"plain", tb1, res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"last of two", tb1 + "more output\n" + tb2, res{"ValueError", "bad", "", 1, 0}, true},
		{"last incomplete", tb1 + tb2[:60], res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"starts mid-traceback", tb1[40:] + "step 3\n" + tb2, res{"ValueError", "bad", "", 1, 0}, true},
		{"rank prefix", prefixLines("[rank3]: ", tb1), res{"RuntimeError", "CUDA out of memory", "[rank3]: ", 2, 0}, true},
		{"torchrun prefix", prefixLines("[default0]:", tb1), res{"RuntimeError", "CUDA out of memory", "[default0]:", 2, 0}, true},
		{"CRLF", strings.ReplaceAll(tb1, "\n", "\r\n"), res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"ANSI colours", "\x1b[1;35mTraceback\x1b[0m (most recent call last):\n  File \x1b[35m\"/home/u/eval.py\"\x1b[0m, line \x1b[35m7\x1b[0m, in \x1b[35m<module>\x1b[0m\n    run()\n\x1b[1;35mValueError\x1b[0m: \x1b[35mbad\x1b[0m\n",
			res{"ValueError", "bad", "", 1, 0}, true},
		{"progress bar", "\r 10%|#   | 1/10\r 20%|##  | 2/10" + tb2, res{"ValueError", "bad", "", 1, 0}, true},
		{"message ends at a torch log line", tb1 + "[W socket.cpp:601] [c10d] The client socket has failed to connect.\n", res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"message ends at a python log line", tb1 + "WARNING:torch.distributed.elastic.agent:stopping\n", res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"message ends at a glog line", tb1 + "E0115 10:00:00.123456 1234 ProcessGroupNCCL.cpp:100] watchdog\n", res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"message continues", tb1 + "Tried to allocate 2.00 GiB\n", res{"RuntimeError", "CUDA out of memory\nTried to allocate 2.00 GiB", "", 2, 0}, true},
		{"no message: next line is not part of it", strings.Replace(tb2, "ValueError: bad", "KeyboardInterrupt", 1) + "unrelated\n", res{"KeyboardInterrupt", "", "", 1, 0}, true},
		{"type with colon only", strings.Replace(tb2, "ValueError: bad", "ValueError:", 1), res{"ValueError", "", "", 1, 0}, true},
		{"qualified type", strings.Replace(tb2, "ValueError: bad", "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275", 1),
			res{"torch.distributed.DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1275", "", 1, 0}, true},
		{"recursion summary", strings.Replace(tb1, "           ^^^^^^^^\n", "           ^^^^^^^^\n  [Previous line repeated 996 more times]\n", 1), res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"interleaved other output", strings.Replace(tb1, "    main()\n", "    main()\nINFO step 3\n", 1), res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"no frames after header", "Traceback (most recent call last):\nRuntimeError: x\n", res{}, false},
		{"header only", "Traceback (most recent call last):\n", res{}, false},
		{"nothing", "loss=0.1\nloss=0.2\n", res{}, false},
		{"empty", "", res{}, false},
		{"chained with prefix", prefixLines("[rank1]: ", tb2+"\nDuring handling of the above exception, another exception occurred:\n\n"+tb1),
			res{"RuntimeError", "CUDA out of memory", "[rank1]: ", 2, 1}, true},
		{"unchained after a chain", tb2 + "\nThe above exception was the direct cause of the following exception:\n\n" + tb2 + "later\n" + tb1,
			res{"RuntimeError", "CUDA out of memory", "", 2, 0}, true},
		{"line None", "Traceback (most recent call last):\n  File \"x.py\", line None, in f\nOSError: x\n", res{"OSError", "x", "", 1, 0}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tb, ok := LastTraceback([]byte(tc.in))
			got := res{tb.Type, tb.Message, tb.Prefix, len(tb.Frames), tb.Chained}
			if ok != tc.ok || got != tc.want {
				t.Errorf("got %+v %v\nwant %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// TestInterleavedRanks: two ranks' tracebacks interleaved line by line in one
// console, each with its own prefix, are both found.
func TestInterleavedRanks(t *testing.T) {
	rank0 := string(readTestdata(t, "tb_forward_py311.txt"))
	rank1 := string(readTestdata(t, "tb_gloo_peer_exit_rank0_py311.txt"))
	l0 := strings.SplitAfter(prefixLines("[default0]:", rank0), "\n")
	l1 := strings.SplitAfter(prefixLines("[default1]:", rank1), "\n")
	var b strings.Builder
	for i := 0; i < len(l0) || i < len(l1); i++ {
		if i < len(l0) {
			b.WriteString(l0[i])
		}
		if i < len(l1) {
			b.WriteString(l1[i])
		}
	}
	all := Tracebacks([]byte(b.String()))
	if len(all) != 2 {
		t.Fatalf("got %d tracebacks: %+v", len(all), all)
	}
	byPrefix := map[string]Traceback{}
	for _, tb := range all {
		byPrefix[tb.Prefix] = tb
	}
	if tb := byPrefix["[default0]:"]; tb.Type != "RuntimeError" || len(tb.Frames) != 5 || !strings.HasPrefix(tb.Message, "loss is NaN") {
		t.Errorf("rank 0: %+v", tb)
	}
	if tb := byPrefix["[default1]:"]; len(tb.Frames) != 4 || !strings.Contains(tb.Message, "Connection closed by peer") {
		t.Errorf("rank 1: %+v", tb)
	}
}

func TestTracebackCaps(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("Traceback (most recent call last):\n")
	for i := 1; i <= 2500; i++ {
		fmt.Fprintf(&b, "  File \"/home/u/x.py\", line %d, in f\n    f()\n", i)
	}
	b.WriteString("RuntimeError: " + strings.Repeat("x", 3000) + "\n" + strings.Repeat("more message\n", 500))
	tb, ok := LastTraceback(b.Bytes())
	if !ok {
		t.Fatal("no traceback")
	}
	if len(tb.Frames) != maxFrames || !tb.Truncated || tb.Frames[len(tb.Frames)-1].Line != 2500 {
		t.Errorf("frames %d truncated %v", len(tb.Frames), tb.Truncated)
	}
	if len(tb.Message) > maxMessageBytes {
		t.Errorf("message is %d bytes", len(tb.Message))
	}

	// A rune split by the message cap is dropped.
	msg := strings.Repeat("a", maxMessageBytes-1) + "é"
	tb, _ = LastTraceback([]byte("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nE: " + msg + "\n"))
	if tb.Message != strings.Repeat("a", maxMessageBytes-1) {
		t.Errorf("message ends with %q", tb.Message[len(tb.Message)-3:])
	}
}

func TestParseFrameLine(t *testing.T) {
	tests := []struct {
		in   string
		want Frame
		ok   bool
	}{
		{`  File "/home/u/train.py", line 88 in step`, Frame{"/home/u/train.py", 88, "step"}, true},
		{`  File "/home/u/train.py", line 88, in step`, Frame{"/home/u/train.py", 88, "step"}, true},
		{`  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed`, Frame{"<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"}, true},
		{`  File "/tmp/badmod.py", line 2`, Frame{"/tmp/badmod.py", 2, ""}, true},
		{`  File ???, line ??? in ???`, Frame{"???", 0, "???"}, true},
		{`  File "x.py", line ??? in f`, Frame{"x.py", 0, "f"}, true},
		{`  File "x.py", line None, in f`, Frame{"x.py", 0, "f"}, true},
		{`  File "a", line 1, in f", line 2 in g`, Frame{`a", line 1, in f`, 2, "g"}, true},
		{`  File "x.py", line 99999999999999999999 in f`, Frame{"x.py", 0, "f"}, true},
		{`  File "x.py", line 3 in <module>  `, Frame{"x.py", 3, "<module>"}, true},
		{`  File "x.py", line x in f`, Frame{}, false},
		{`  File "x.py", line 3 at f`, Frame{}, false},
		{`    File "x.py", line 3 in f`, Frame{}, false},
		{`  File x.py, line 3 in f`, Frame{}, false},
		{`  File "", line 3 in f`, Frame{"", 3, "f"}, true}, // compile(src, "", "exec")
		{`  File "x.py"`, Frame{}, false},
		{``, Frame{}, false},
	}
	for _, tc := range tests {
		got, ok := parseFrameLine([]byte(tc.in))
		if ok != tc.ok || got != tc.want {
			t.Errorf("%q: got %+v %v, want %+v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestParseExceptionLine(t *testing.T) {
	tests := []struct {
		in, typ, msg string
		ok           bool
	}{
		{"RuntimeError: boom", "RuntimeError", "boom", true},
		{"KeyboardInterrupt", "KeyboardInterrupt", "", true},
		{"ValueError:", "ValueError", "", true},
		{"torch.distributed.DistBackendError: NCCL error", "torch.distributed.DistBackendError", "NCCL error", true},
		{"mod.f.<locals>.Err: x: y", "mod.f.<locals>.Err", "x: y", true},
		{"_Private: ", "_Private", "", true},
		{"WARNING:root:hello", "", "", false},
		{"step 3 loss 0.1", "", "", false},
		{"3Error: x", "", "", false},
		{"a..b: x", "", "", false},
		{"a.: x", "", "", false},
		{": x", "", "", false},
	}
	for _, tc := range tests {
		typ, msg, ok := parseExceptionLine([]byte(tc.in))
		if ok != tc.ok || string(typ) != tc.typ || string(msg) != tc.msg {
			t.Errorf("%q: got %q %q %v", tc.in, typ, msg, ok)
		}
	}
}

func TestClean(t *testing.T) {
	tests := []struct{ in, want string }{
		{"abc", "abc"},
		{"abc\r", "abc"},
		{"a\rb\rc", "c"},
		{"\x1b[31mred\x1b[0m", "red"},
		{"x\x1b", "x"},
		{"x\x1b[", "x"},
		{"\x1b(Bx", "Bx"},
	}
	for _, tc := range tests {
		if got := string(clean([]byte(tc.in))); got != tc.want {
			t.Errorf("clean(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPathological runs inputs built to defeat a naive parser; they must
// finish in time linear in their size (a quadratic parser would take minutes).
func TestPathological(t *testing.T) {
	const n = 200000
	inputs := map[string]string{
		"headers":       strings.Repeat("Traceback (most recent call last):\n", n),
		"headers+frame": strings.Repeat("Traceback (most recent call last):\n  File \"x\", line 1, in f\n", n/2),
		"prefixes":      strings.Repeat("[r1]:Traceback (most recent call last):\n[r2]:  File \"x\", line 1, in f\n", n/2),
		"threads":       strings.Repeat("Thread 0x1 (most recent call first):\n", n),
		"fatal":         strings.Repeat("Fatal Python error: x\n", n),
		"group":         strings.Repeat("  + Exception Group Traceback (most recent call last):\n  |   File \"x\", line 1, in f\n  | E: x\n  +-+---\n", n/4),
		"long line":     strings.Repeat("Traceback (most recent call last):", n),
		"messages":      "Traceback (most recent call last):\n  File \"x\", line 1, in f\nE: x\n" + strings.Repeat("message line\n", n),
		"markers":       strings.Repeat("During handling of the above exception, another exception occurred:\n", n),
		"many prefixes": func() string {
			var b strings.Builder
			for i := 0; i < n/2; i++ {
				fmt.Fprintf(&b, "[%d]:Traceback (most recent call last):\n[%d]:  File \"x\", line 1, in f\n", i, i)
			}
			return b.String()
		}(),
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			ParseDumps([]byte(in))
			LastTraceback([]byte(in))
		})
	}
}
