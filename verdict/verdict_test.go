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
