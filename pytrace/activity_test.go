package pytrace

import "testing"

func TestIsLibrary(t *testing.T) {
	tests := []struct {
		file string
		want bool
	}{
		{"/usr/lib/python3.11/threading.py", true},
		{"/usr/lib/python3.11/concurrent/futures/_base.py", true},
		{"/root/.pyenv/versions/3.12.1/lib/python3.12/threading.py", true},
		{"/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", true},
		{"/usr/lib/python3/dist-packages/torch/nn/modules/module.py", true},
		{"/home/u/.local/lib/python3.11/site-packages/numpy/core/numeric.py", true},
		{"/usr/local/lib/python3.13t/threading.py", true},
		{"/usr/lib/python311.zip/threading.py", true},
		{"/usr/lib64/python3.9/lib-dynload/x.so", true},
		{`C:\Python311\Lib\threading.py`, true},
		{`C:\Users\u\venv\Lib\site-packages\torch\cuda\__init__.py`, true},
		{"/home/u/pytorch/torch/distributed/distributed_c10d.py", true}, // source checkout
		{"/home/u/pytorch/torch/_tensor.py", true},
		{"<frozen importlib._bootstrap>", true},
		{"<frozen runpy>", true},
		{"<__array_function__ internals>", true},
		{"<string>", false},
		{"<stdin>", false},
		{"/home/u/train.py", false},
		{"/home/u/torch/train.py", false},
		{"/home/u/python3.11/train.py", true}, // indistinguishable from a stdlib directory
		{"/home/u/python3/train.py", false},
		{"/usr/bin/torchrun", false},
		{"train.py", false},
		{`C:\Users\u\train.py`, false},
		{"", false},
		{"???", false},
	}
	for _, tc := range tests {
		if got := IsLibrary(tc.file); got != tc.want {
			t.Errorf("IsLibrary(%q) = %v, want %v", tc.file, got, tc.want)
		}
	}
}

func TestFrameString(t *testing.T) {
	tests := []struct {
		f    Frame
		want string
	}{
		{Frame{"/home/u/train.py", 88, "step"}, "train.py:88 in step"},
		{Frame{"/tmp/badmod.py", 2, ""}, "badmod.py:2"},
		{Frame{"<frozen importlib._bootstrap>", 241, "_load"}, "<frozen importlib._bootstrap>:241 in _load"},
		{Frame{`C:\Users\u\train.py`, 1, "<module>"}, "train.py:1 in <module>"},
		{Frame{"x.py", 0, "f"}, "x.py:??? in f"},
		{Frame{"/dir/", 3, "f"}, "/dir/:3 in f"},
	}
	for _, tc := range tests {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("%+v: got %q, want %q", tc.f, got, tc.want)
		}
	}
}

func TestUserFrame(t *testing.T) {
	fs := []Frame{
		{"/home/u/train.py", 97, "<module>"},
		{"/home/u/train.py", 30, "step"},
		{"/usr/lib/python3/dist-packages/torch/nn/modules/module.py", 1194, "_call_impl"},
		{"/home/u/model.py", 12, "forward"},
		{"/usr/lib/python3/dist-packages/torch/nn/functional.py", 2000, "linear"},
	}
	if f, ok := UserFrame(fs); !ok || f.Func != "forward" {
		t.Errorf("UserFrame = %v %v", f, ok)
	}
	if _, ok := UserFrame(fs[2:3]); ok {
		t.Error("UserFrame of library frames only")
	}
	if _, ok := UserFrame(nil); ok {
		t.Error("UserFrame(nil)")
	}
}

func TestClassify(t *testing.T) {
	const (
		user    = "/home/u/train.py"
		stdlib  = "/usr/lib/python3.11/"
		torch   = "/usr/lib/python3/dist-packages/torch/"
		sitepkg = "/opt/conda/lib/python3.10/site-packages/"
	)
	fr := func(file string, fn string) Frame { return Frame{file, 1, fn} }
	main := fr(user, "<module>")
	tests := []struct {
		name       string
		frames     []Frame // outermost first
		act        Activity
		collective string
	}{
		{"all_reduce (torch 1.13)", []Frame{main, fr(user, "step"), fr(torch+"distributed/distributed_c10d.py", "all_reduce")}, ActCollective, "all_reduce"},
		{"all_reduce (torch 2.x decorator)", []Frame{main, fr(torch+"distributed/c10d_logger.py", "wrapper"), fr(torch+"distributed/distributed_c10d.py", "all_reduce")}, ActCollective, "all_reduce"},
		{"barrier inside a wrapper, innermost wrapper", []Frame{main, fr(torch+"distributed/distributed_c10d.py", "barrier"), fr(torch+"distributed/c10d_logger.py", "wrapper")}, ActCollective, "barrier"},
		{"init_process_group store barrier", []Frame{main, fr(torch+"distributed/distributed_c10d.py", "init_process_group"), fr(torch+"distributed/distributed_c10d.py", "_store_based_barrier")}, ActCollective, "init_process_group"},
		{"fsdp all_gather", []Frame{main, fr(torch+"nn/modules/module.py", "_call_impl"), fr(torch+"distributed/fsdp/fully_sharded_data_parallel.py", "forward"), fr(torch+"distributed/fsdp/_runtime_utils.py", "_unshard"), fr(torch+"distributed/distributed_c10d.py", "all_gather_into_tensor")}, ActCollective, "all_gather_into_tensor"},
		{"elastic store barrier", []Frame{main, fr(torch+"distributed/elastic/utils/store.py", "barrier"), fr(torch+"distributed/elastic/utils/store.py", "get_all")}, ActCollective, "get_all"},
		{"cuda synchronize", []Frame{main, fr(user, "step"), fr(torch+"cuda/__init__.py", "synchronize")}, ActCollective, "synchronize"},
		{"torch elsewhere", []Frame{main, fr(torch+"nn/modules/module.py", "_call_impl")}, ActLibrary, ""},
		{"collective deeper than the innermost user frame does not count", []Frame{main, fr(torch+"distributed/distributed_c10d.py", "all_reduce"), fr(user, "hook")}, ActUser, ""},
		{"elastic timer watchdog", []Frame{fr(stdlib+"threading.py", "_bootstrap"), fr(torch+"distributed/elastic/timer/api.py", "_reap_worker_loop"), fr(stdlib+"threading.py", "wait")}, ActLock, ""},
		{"event wait", []Frame{fr(stdlib+"threading.py", "_bootstrap"), fr(user, "heartbeat"), fr(stdlib+"threading.py", "wait"), fr(stdlib+"threading.py", "wait")}, ActLock, ""},
		{"thread join", []Frame{main, fr(stdlib+"threading.py", "join"), fr(stdlib+"threading.py", "_wait_for_tstate_lock")}, ActLock, ""},
		{"queue get", []Frame{main, fr(stdlib+"queue.py", "get"), fr(stdlib+"threading.py", "wait")}, ActLock, ""},
		{"queue get innermost", []Frame{main, fr(stdlib+"queue.py", "get")}, ActLock, ""},
		{"multiprocessing lock", []Frame{main, fr(stdlib+"multiprocessing/synchronize.py", "__enter__")}, ActLock, ""},
		{"future result", []Frame{main, fr(stdlib+"concurrent/futures/_base.py", "result")}, ActLock, ""},
		{"selectors", []Frame{main, fr(stdlib+"socketserver.py", "serve_forever"), fr(stdlib+"selectors.py", "select")}, ActIO, ""},
		{"dataloader poll", []Frame{main, fr(torch+"utils/data/dataloader.py", "_try_get_data"), fr(stdlib+"multiprocessing/queues.py", "get"), fr(stdlib+"multiprocessing/connection.py", "poll")}, ActIO, ""},
		{"subprocess", []Frame{main, fr(stdlib+"subprocess.py", "wait"), fr(stdlib+"subprocess.py", "_wait")}, ActIO, ""},
		{"socket", []Frame{main, fr(stdlib+"socket.py", "readinto")}, ActIO, ""},
		{"asyncio sleep", []Frame{main, fr(stdlib+"asyncio/tasks.py", "sleep")}, ActSleep, ""},
		{"threading run (C target)", []Frame{fr(stdlib+"threading.py", "_bootstrap"), fr(stdlib+"threading.py", "run")}, ActLibrary, ""},
		{"other stdlib", []Frame{main, fr(stdlib+"json/decoder.py", "decode")}, ActLibrary, ""},
		{"numpy", []Frame{main, fr(sitepkg+"numpy/core/numeric.py", "ones")}, ActLibrary, ""},
		{"user", []Frame{main, fr(user, "step")}, ActUser, ""},
		{"frozen import", []Frame{main, fr("<frozen importlib._bootstrap>", "_find_and_load")}, ActLibrary, ""},
		{"no frames", nil, ActNone, ""},
	}
	for _, tc := range tests {
		th := Thread{ID: "0x1", Frames: tc.frames}
		if a := Classify(th); a != tc.act {
			t.Errorf("%s: Classify = %s, want %s", tc.name, a, tc.act)
		}
		if c := Collective(th); c != tc.collective {
			t.Errorf("%s: Collective = %q, want %q", tc.name, c, tc.collective)
		}
	}
}

func TestStdlibModule(t *testing.T) {
	tests := map[string]string{
		"/usr/lib/python3.11/threading.py":                          "threading",
		"/usr/lib/python3.11/multiprocessing/connection.py":         "multiprocessing/connection",
		`C:\Python311\Lib\queue.py`:                                 "queue",
		"/usr/lib/python3.11/site-packages/x/threading.py":          "",
		"/home/u/threading.py":                                      "",
		"/root/.pyenv/versions/3.13.0/lib/python3.13/selectors.py":  "selectors",
		"/usr/lib/python3/dist-packages/torch/distributed/store.py": "",
	}
	for in, want := range tests {
		if got := stdlibModule(in); got != want {
			t.Errorf("stdlibModule(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestClassifyBackward: a rank blocked in backward() under DDP waits for
// its peers' gradients (the reducer's all-reduce is C++).
func TestClassifyBackward(t *testing.T) {
	th := Thread{Frames: []Frame{
		{File: "/w/train.py", Line: 90, Func: "<module>"},
		{File: "/w/train.py", Line: 60, Func: "step"},
		{File: "/usr/lib/python3/dist-packages/torch/_tensor.py", Line: 487, Func: "backward"},
		{File: "/usr/lib/python3/dist-packages/torch/autograd/__init__.py", Line: 197, Func: "backward"},
	}}
	if a := Classify(th); a != ActCollective {
		t.Fatalf("Classify = %s, want collective", a)
	}
	if c := Collective(th); c != "backward" {
		t.Errorf("Collective = %q, want backward", c)
	}
	if f, _ := UserFrame(th.Frames); f.String() != "train.py:60 in step" {
		t.Errorf("UserFrame = %s", f)
	}
	// A user's backward function is the user's own code.
	th = Thread{Frames: []Frame{{File: "/w/train.py", Line: 9, Func: "backward"}}}
	if a := Classify(th); a != ActUser {
		t.Errorf("user backward: %s", a)
	}
}

func TestPhase(t *testing.T) {
	user := Frame{File: "/w/train.py", Line: 9, Func: "step"}
	lib := func(path, fn string) Frame {
		return Frame{File: "/usr/lib/python3/dist-packages/" + path, Line: 1, Func: fn}
	}
	for _, tc := range []struct {
		frames []Frame
		want   string
	}{
		{[]Frame{user, lib("torch/utils/data/dataloader.py", "__next__"), {File: "/usr/lib/python3.11/queue.py", Line: 180, Func: "get"}}, PhaseData},
		{[]Frame{user, lib("torch/serialization.py", "save"), lib("torch/serialization.py", "_save")}, PhaseSave},
		{[]Frame{user, lib("torch/serialization.py", "load")}, PhaseLoad},
		{[]Frame{user, lib("torch/_dynamo/eval_frame.py", "_fn")}, PhaseCompile},
		{[]Frame{user}, ""},
		// A save further out, with the user's code inside it, is not where the thread is.
		{[]Frame{lib("torch/serialization.py", "save"), user}, ""},
	} {
		if got := Phase(Thread{Frames: tc.frames}); got != tc.want {
			t.Errorf("%v: Phase = %q, want %q", tc.frames, got, tc.want)
		}
	}
}
