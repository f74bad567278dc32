package ranklogs

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/verdict"
)

const tbText = `epoch 3 loss 0.25
Traceback (most recent call last):
  File "/w/train.py", line 90, in <module>
    main()
  File "/w/train.py", line 60, in step
    loss = model(x)
  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1190, in _call_impl
    return forward_call(*input, **kwargs)
RuntimeError: shape mismatch
second line of the message
`

func TestExplain(t *testing.T) {
	segv, err := os.ReadFile("../pytrace/testdata/fatal_segv_torch_py311.txt")
	if err != nil {
		t.Fatal(err)
	}
	prefixed := ""
	for _, l := range strings.Split(strings.TrimSuffix(tbText, "\n"), "\n") {
		prefixed += "[default1]:" + l + "\n"
	}
	long := strings.Repeat("é", verdict.MaxCauseMessage) // 2 bytes each: cut mid-character
	for _, tc := range []struct {
		name string
		ev   Evidence
		want verdict.FailureCause
		ok   bool
	}{
		{"output", Evidence{Output: []byte(tbText)},
			verdict.FailureCause{Exception: "RuntimeError", Message: "shape mismatch", Where: "train.py:60 in step", Source: "output"}, true},
		{"teed output with a prefix", Evidence{Output: []byte(prefixed)},
			verdict.FailureCause{Exception: "RuntimeError", Message: "shape mismatch", Where: "train.py:60 in step", Source: "output"}, true},
		{"the hook's traceback comes before the output", Evidence{Exception: []byte(strings.Replace(tbText, "shape mismatch", "from the hook", 1)), Output: []byte(tbText)},
			verdict.FailureCause{Exception: "RuntimeError", Message: "from the hook", Where: "train.py:60 in step", Source: "excepthook"}, true},
		{"the error file comes first", Evidence{Record: &ErrorRecord{Message: "ValueError: bad", Traceback: "Traceback (most recent call last):\n  File \"/w/t.py\", line 3, in f\n    g()\n"}, Output: []byte(tbText)},
			verdict.FailureCause{Exception: "ValueError", Message: "bad", Where: "t.py:3 in f", Source: "error_file"}, true},
		{"an error file without a traceback", Evidence{Record: &ErrorRecord{Message: "KeyError: 'x'"}},
			verdict.FailureCause{Exception: "KeyError", Message: "'x'", Source: "error_file"}, true},
		{"a fatal signal", Evidence{Signal: syscall.SIGSEGV, Fatal: segv, Output: []byte(tbText)},
			verdict.FailureCause{Signal: "SIGSEGV", Where: "fatal.py:19 in crash", Source: "faulthandler"}, true},
		{"SIGKILL says nothing", Evidence{Signal: syscall.SIGKILL}, verdict.FailureCause{}, false},
		{"no traceback", Evidence{Output: []byte("loss 0.1\nKilled\n")}, verdict.FailureCause{}, false},
		{"a long message is cut on a character", Evidence{Output: []byte("Traceback (most recent call last):\n  File \"/w/a.py\", line 1, in <module>\nValueError: " + long + "\n")},
			verdict.FailureCause{Exception: "ValueError", Message: strings.Repeat("é", verdict.MaxCauseMessage/2), Where: "a.py:1 in <module>", Source: "output"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Explain(tc.ev)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("got %+v %v, want %+v %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestFailureCauseSame(t *testing.T) {
	a := verdict.FailureCause{Exception: "RuntimeError", Message: "port 123", Where: "t.py:3 in f"}
	b := a
	b.Message = "port 456"
	if !a.Same(b) {
		t.Error("messages differ only: want the same failure")
	}
	c := a
	c.Where = "t.py:4 in f"
	if a.Same(c) {
		t.Error("another place: want different")
	}
	if (verdict.FailureCause{Exception: "X"}).Same(verdict.FailureCause{Exception: "X"}) {
		t.Error("no place known: never the same")
	}
	if got := a.String(); got != "RuntimeError: port 123 at t.py:3 in f" {
		t.Errorf("String = %q", got)
	}
}
