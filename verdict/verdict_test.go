package verdict

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestWriteReadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "logs", "verdict.json")
	at := time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)
	in := Verdict{Kind: RestartBudgetExhausted, ExitCode: 1, Reason: "restart budget exhausted (3 of 3)",
		RunID: "job", Node: "10.0.0.1/42", Hostname: "n1", RestartsUsed: 3, MaxRestarts: 3, LastRound: 3,
		Quarantined: []Quarantine{{Node: "10.0.0.2/7", Evidence: EvidenceLost, Detail: "gossip", Round: 1, At: at}},
		Cycles:      []Cycle{{Round: 0, End: "rank_failure", RunMS: 12.5, StartedAt: at}},
		StartedAt:   at, EndedAt: at.Add(time.Minute)}
	if err := Write(path, in); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("stat %v %v", st, err)
	}
	out, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if out.Schema != Schema || out.Kind != in.Kind || out.RestartsUsed != 3 || len(out.Quarantined) != 1 ||
		out.Quarantined[0].Evidence != EvidenceLost || !out.EndedAt.Equal(in.EndedAt) {
		t.Fatalf("round trip: %+v", out)
	}
	// The file is plain JSON with the documented field names.
	b, _ := os.ReadFile(path)
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"schema", "kind", "exit_code", "reason", "finished", "finished_flag", "run_id", "node",
		"hostname", "pid", "restarts_used", "max_restarts", "last_round", "quarantined", "cycles", "started_at", "ended_at"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("field %q missing from %s", k, b)
		}
	}
}

func TestWriteRefusesUnknownKindAndKeepsOldFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verdict.json")
	if err := Write(path, Verdict{Kind: Succeeded}); err != nil {
		t.Fatal(err)
	}
	if err := Write(path, Verdict{Kind: "exploded"}); err == nil || !strings.Contains(err.Error(), "exploded") {
		t.Fatalf("want an error naming the kind, got %v", err)
	}
	v, err := Read(path)
	if err != nil || v.Kind != Succeeded {
		t.Fatalf("old verdict lost: %+v %v", v, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temporary files left: %v", ents)
	}
}

func TestParseSchema(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"current", `{"schema":"ft-launcher.verdict/v1","kind":"succeeded"}`, true},
		{"unknown fields ignored", `{"schema":"ft-launcher.verdict/v1","kind":"no_restart","future":1}`, true},
		{"other major", `{"schema":"ft-launcher.verdict/v2","kind":"succeeded"}`, false},
		{"no schema", `{"kind":"succeeded"}`, false},
		{"not json", `exit 93`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.in))
			if (err == nil) != tc.ok {
				t.Fatalf("Parse: %v", err)
			}
			if tc.name == "other major" && !errors.Is(err, ErrSchema) {
				t.Fatalf("want ErrSchema, got %v", err)
			}
		})
	}
}

func TestKindsValid(t *testing.T) {
	for _, k := range Kinds {
		if !k.Valid() {
			t.Errorf("%s not valid", k)
		}
	}
	if Kind("").Valid() {
		t.Error("empty kind valid")
	}
}

// TestNodeEvidence: which rank failures count against the node they ran
// on (docs/spares.md, "A node that keeps failing").
func TestNodeEvidence(t *testing.T) {
	exc := func(typ, msg string) *FailureCause {
		return &FailureCause{Exception: typ, Message: msg, Where: "train.py:88 in step", Source: "output"}
	}
	tests := []struct {
		name string
		f    RankFailure
		want bool
	}{
		{"hang", RankFailure{Kind: FailureHang}, true},
		{"bystander of a hang", RankFailure{Kind: FailureCrash, ExitCode: 1, Bystander: true}, false},
		{"exit 1, no explanation", RankFailure{Kind: FailureCrash, ExitCode: 1}, true},
		{"SIGSEGV", RankFailure{Kind: FailureCrash, Signal: "SIGSEGV"}, true},
		{"SIGKILL (the OOM killer, an operator: not the node)", RankFailure{Kind: FailureCrash, Signal: "SIGKILL"}, false},
		{"SIGBUS in faulthandler's stack", RankFailure{Kind: FailureCrash, Cause: &FailureCause{Signal: "SIGBUS", Where: "x.py:1"}}, true},
		{"SIGTERM: a request", RankFailure{Kind: FailureCrash, Signal: "SIGTERM"}, false},
		{"SIGINT: a request", RankFailure{Kind: FailureCrash, Signal: "SIGINT"}, false},
		{"a ValueError: the code's", RankFailure{Kind: FailureCrash, ExitCode: 1, Cause: exc("ValueError", "bad shape")}, false},
		{"a gloo peer closed: the code's (a consequence)", RankFailure{Kind: FailureCrash, ExitCode: 1,
			Cause: exc("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:1234")}, false},
		{"CUDA error", RankFailure{Kind: FailureCrash, ExitCode: 1, Cause: exc("RuntimeError", "CUDA error: an illegal memory access was encountered")}, true},
		{"uncorrectable ECC", RankFailure{Kind: FailureCrash, ExitCode: 1, Cause: exc("RuntimeError", "CUDA error: uncorrectable ECC error encountered")}, true},
		{"NCCL", RankFailure{Kind: FailureCrash, ExitCode: 1, Cause: exc("torch.distributed.DistBackendError", "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error")}, true},
		{"EIO", RankFailure{Kind: FailureCrash, ExitCode: 1, Cause: exc("OSError", "[Errno 5] Input/output error: '/data/shard-3'")}, true},
		{"exit 0 is no failure", RankFailure{Kind: FailureCrash}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.f.NodeEvidence(); got != tc.want {
				t.Errorf("NodeEvidence(%+v) = %v, want %v", tc.f, got, tc.want)
			}
		})
	}
}
