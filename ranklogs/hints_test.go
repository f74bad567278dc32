package ranklogs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// torch26Libuv is how a rank of Debian's torch 2.6 (built without libuv)
// fails under the agent store: its traceback as torch prints it.
const torch26Libuv = `Traceback (most recent call last):
  File "/work/examples/ddp_train.py", line 60, in <module>
    dist.init_process_group("gloo")
  File "/usr/lib/python3/dist-packages/torch/distributed/c10d_logger.py", line 81, in wrapper
    return func(*args, **kwargs)
  File "/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py", line 1706, in init_process_group
    store, rank, world_size = next(rendezvous_iterator)
  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 274, in _env_rendezvous_handler
    store = _create_c10d_store(
  File "/usr/lib/python3/dist-packages/torch/distributed/rendezvous.py", line 194, in _create_c10d_store
    return TCPStore(
           ^^^^^^^^^
RuntimeError: use_libuv was requested but PyTorch was build without libuv support
`

// TestFailureHint: the libuv failure is recognised in an error file's
// record and in the tail of a long stderr log, with the workaround that
// fits the agent store setting; other failures get no hint.
func TestFailureHint(t *testing.T) {
	dir := t.TempDir()
	long := filepath.Join(dir, "long.log")
	if err := os.WriteFile(long, []byte(strings.Repeat("noise\n", 40000)+torch26Libuv), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain.log")
	if err := os.WriteFile(plain, []byte("Traceback (most recent call last):\nValueError: bad shard\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	rec := &ErrorRecord{Message: "RuntimeError: use_libuv was requested but PyTorch was build without libuv support", Traceback: torch26Libuv}
	for _, tc := range []struct {
		name       string
		f          Failure
		stderr     string
		agentStore bool
		want       []string // in the hint; nil: no hint
	}{
		{"stderr log, agent store", Failure{}, long, true, []string{"--agent-store off", "USE_LIBUV=0", "docs/agentstore.md"}},
		{"error file, agent store", Failure{Record: rec}, "", true, []string{"--agent-store off", "USE_LIBUV=0"}},
		{"stderr log, rank-0 store", Failure{}, long, false, []string{"USE_LIBUV=0", "docs/agentstore.md"}},
		{"another failure", Failure{}, plain, true, nil},
		{"no output", Failure{}, filepath.Join(dir, "missing.log"), true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, ok := FailureHint(FailureText(tc.f, tc.stderr), tc.agentStore)
			if ok != (tc.want != nil) {
				t.Fatalf("hint %v (%q), want one: %v", ok, h.Text, tc.want != nil)
			}
			if !ok {
				return
			}
			if h.Kind != HintKindNoLibuv {
				t.Errorf("kind %q", h.Kind)
			}
			for _, w := range tc.want {
				if !strings.Contains(h.Text, w) {
					t.Errorf("hint %q lacks %q", h.Text, w)
				}
			}
			if !tc.agentStore && strings.Contains(h.Text, "--agent-store off") {
				t.Errorf("hint %q says --agent-store off with the agent store off", h.Text)
			}
		})
	}
}
