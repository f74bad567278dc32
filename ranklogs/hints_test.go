package ranklogs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The real stderr of rank 1 of examples/ddp_train.py (2 ranks) under
// Debian trixie's torch 2.6.0 (built without libuv, unpatched) in
// bench/trixie.sh's chroot, with the agent store (the default: torch's
// rendezvous builds the client without use_libuv) and with --agent-store
// off (it passes use_libuv=True); docs/benchmarks-history.md, "torch 2.6
// memory and early crash".
const (
	torch26LibuvAgentStore = "testdata/torch26_libuv_agentstore.log"
	torch26LibuvRank0Store = "testdata/torch26_libuv_rank0store.log"
)

func readFixture(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestFailureHint: the libuv failure is recognised in an error file's
// record and in the tail of a long stderr log, with the workaround that
// fits the agent store setting; other failures get no hint.
func TestFailureHint(t *testing.T) {
	dir := t.TempDir()
	agentStore := readFixture(t, torch26LibuvAgentStore)
	long := filepath.Join(dir, "long.log")
	if err := os.WriteFile(long, []byte(strings.Repeat("noise\n", 40000)+agentStore), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(dir, "plain.log")
	if err := os.WriteFile(plain, []byte("Traceback (most recent call last):\nValueError: bad shard\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	last := strings.TrimSpace(agentStore[strings.LastIndex(strings.TrimSpace(agentStore), "\n")+1:])
	rec := &ErrorRecord{Message: last, Traceback: agentStore}
	for _, tc := range []struct {
		name       string
		f          Failure
		stderr     string
		agentStore bool
		want       []string // in the hint; nil: no hint
	}{
		{"stderr log, agent store", Failure{}, long, true, []string{"--agent-store off", "USE_LIBUV=0", "docs/agentstore.md"}},
		{"error file, agent store", Failure{Record: rec}, "", true, []string{"--agent-store off", "USE_LIBUV=0"}},
		{"stderr log, rank-0 store", Failure{}, torch26LibuvRank0Store, false, []string{"USE_LIBUV=0", "docs/agentstore.md"}},
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
