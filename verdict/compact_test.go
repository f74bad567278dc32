package verdict

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ftlauncher/ft-launcher/ledger"
)

var at = time.Date(2026, 11, 23, 1, 2, 3, 0, time.UTC)

// small is a verdict that fits a termination message as it is.
func small() Verdict {
	return Verdict{Kind: NoRestart, ExitCode: 93, Reason: "local rank 0 (rank 0) exited with code 93: no restart",
		FinishedFlag: FinishedFlag{Path: "/ckpt/finished.flag"}, RunID: "llama-r2", Node: "10.0.2.0/42", Hostname: "train-0",
		PID: 42, MaxRestarts: 3, LastRound: 0, CyclesTotal: 1,
		Quarantined: []Quarantine{{Node: "10.0.2.1/7", Host: "gpu-1", Evidence: EvidenceLost, Detail: "gossip", Round: 0, At: at}},
		Cycles:      []Cycle{{Round: 0, End: "rank_failure", RunMS: 12.5, StartedAt: at}},
		StartedAt:   at, EndedAt: at.Add(time.Minute)}
}

// big has the history, reason and quarantine list of a long, unlucky job:
// nodes hosts, each quarantined twice.
func big(nodes int, reason string) Verdict {
	v := small()
	v.Reason = reason
	v.Quarantined = nil
	for i := range 2 * nodes {
		h := i % nodes
		v.Quarantined = append(v.Quarantined, Quarantine{Node: fmt.Sprintf("10.1.%d.%d/%d", h/256, h%256, 1000+i),
			Host: fmt.Sprintf("gpu-node-%04d.rack-%02d.cluster.example.com", h, h/32), Evidence: EvidenceHealthCheck,
			Detail: strings.Repeat("nvidia-smi -L failed: <no devices> ", 40), Round: i, At: at})
	}
	for i := range 64 {
		v.Cycles = append(v.Cycles, Cycle{Round: i, End: "rank_failure", Reason: strings.Repeat("x", 200), StartedAt: at})
		v.Ledger = append(v.Ledger, ledger.Record{Job: "llama-r2", Node: "10.0.2.0/42", Role: "active", Cycle: i, Start: at, Seq: i + 1})
	}
	v.CyclesTotal = 500
	return v
}

// TestCompactSmallUnchanged: a verdict that fits is the whole verdict.
func TestCompactSmallUnchanged(t *testing.T) {
	in := small()
	b, err := Compact(in, TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, b)
	}
	want := in
	want.Schema, want.Ledger = Schema, []ledger.Record{}
	if !reflect.DeepEqual(out, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", out, want)
	}
	if strings.Contains(string(b), "\n") || strings.Contains(string(b), "quarantined_omitted") {
		t.Errorf("want one line without quarantined_omitted: %s", b)
	}
}

// TestCompactBound: whatever the verdict holds, the message fits the limit,
// Parse reads it, and it keeps what an outer loop decides from.
func TestCompactBound(t *testing.T) {
	huge := strings.Repeat("rank 7 raised RuntimeError: CUDA error: an illegal memory access was encountered <trace> ", 2000)
	tests := []struct {
		name  string
		in    Verdict
		limit int
		// the stage it stops at: history dropped, texts cut, list capped
		history, cut, capped bool
	}{
		{"history only", func() Verdict { v := big(1, "short"); v.Quarantined = v.Quarantined[:1]; return v }(), 4096, true, false, false},
		{"a huge reason", func() Verdict { v := big(1, huge); v.Quarantined = v.Quarantined[:1]; return v }(), 4096, true, true, false},
		{"three bad hosts: details cut", big(3, "three nodes failed their health check"), 4096, true, false, false},
		{"a thousand bad hosts and a huge reason", big(1000, huge), 4096, true, true, true},
		{"a thousand bad hosts in 1 KiB", big(1000, huge), 1024, true, true, true},
		{"a thousand bad hosts in 512 bytes", big(1000, huge), 512, true, true, true},
		{"multi-byte characters cut whole", big(2, strings.Repeat("ошибка ранга 😱 ", 1000)), 4096, true, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			orig := fmt.Sprintf("%+v", tt.in)
			b, err := Compact(tt.in, tt.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) > tt.limit {
				t.Fatalf("%d bytes, limit %d", len(b), tt.limit)
			}
			if fmt.Sprintf("%+v", tt.in) != orig {
				t.Errorf("Compact changed its argument")
			}
			out, err := Parse(b)
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, b)
			}
			if out.Kind != tt.in.Kind || out.ExitCode != tt.in.ExitCode || out.RunID != tt.in.RunID || out.CyclesTotal != tt.in.CyclesTotal ||
				out.Hostname != tt.in.Hostname || !out.EndedAt.Equal(tt.in.EndedAt) {
				t.Errorf("lost a decisive field: %s", b)
			}
			if tt.history != (len(out.Cycles) == 0 && len(out.Ledger) == 0) {
				t.Errorf("cycles %d ledger %d: history dropped should be %v", len(out.Cycles), len(out.Ledger), tt.history)
			}
			if !utf8.ValidString(out.Reason) || tt.cut != (out.Reason != tt.in.Reason) || tt.cut && !strings.HasSuffix(out.Reason, "…") {
				t.Errorf("reason %q: cut should be %v, valid UTF-8 and marked", out.Reason, tt.cut)
			}
			// The hosts kept are the first distinct ones, with node and
			// evidence; quarantined_omitted counts the rest.
			if out.QuarantinedOmitted+len(out.Quarantined) != len(tt.in.Quarantined) {
				t.Errorf("%d kept + %d omitted, want %d", len(out.Quarantined), out.QuarantinedOmitted, len(tt.in.Quarantined))
			}
			if tt.capped && (out.QuarantinedOmitted == 0 || len(out.Quarantined) > 0 && out.Quarantined[0].Detail != "") {
				t.Errorf("list not capped: %d kept, %d omitted", len(out.Quarantined), out.QuarantinedOmitted)
			}
			for i, q := range out.Quarantined {
				in := tt.in.Quarantined[i]
				if q.Node != in.Node || q.Host != in.Host || q.Evidence != in.Evidence {
					t.Errorf("entry %d = %+v, want node %s host %s evidence %s", i, q, in.Node, in.Host, in.Evidence)
				}
				if !tt.capped && (q.Round != in.Round || !q.At.Equal(in.At) || q.Detail != in.Detail &&
					(len(q.Detail) > tt.limit/32 || !strings.HasPrefix(in.Detail, strings.TrimSuffix(q.Detail, "…")))) {
					t.Errorf("entry %d = %+v: want its round, time and its detail whole or cut to %d bytes", i, q, tt.limit/32)
				}
			}
			if tt.limit == TerminationMessageLimit && tt.capped && len(out.Quarantined) < 3 {
				t.Errorf("only %d hosts in 4 KiB", len(out.Quarantined))
			}
		})
	}
}

func TestCompactErrors(t *testing.T) {
	if _, err := Compact(Verdict{Kind: "exploded"}, 4096); err == nil || !strings.Contains(err.Error(), "exploded") {
		t.Errorf("unknown kind: %v", err)
	}
	_, err := Compact(big(10, "r"), 100)
	if err == nil || !strings.Contains(err.Error(), "cannot compact to 100 bytes") {
		t.Errorf("limit 100: %v", err)
	}
}

// TestWriteTerminationMessage writes over an existing, longer message (the
// file is the kubelet's; it is truncated in place) and the result parses.
func TestWriteTerminationMessage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "termination-log")
	if err := os.WriteFile(path, []byte(strings.Repeat("old message ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteTerminationMessage(path, big(1000, "huge")); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > TerminationMessageLimit || !json.Valid(b) {
		t.Fatalf("%d bytes, valid JSON %v", len(b), json.Valid(b))
	}
	if v, err := Parse(b); err != nil || v.Kind != NoRestart || len(v.Quarantined) == 0 {
		t.Errorf("Parse = %+v, %v", v, err)
	}
	if err := WriteTerminationMessage(filepath.Join(t.TempDir(), "no", "such", "dir"), small()); err == nil || !strings.Contains(err.Error(), "termination message") {
		t.Errorf("unwritable path: %v", err)
	}
}

// TestCompactFenceWatchdog: a verdict too big sheds the fence watchdog's
// list of deaths with the history, and keeps its restarts and gave_up.
func TestCompactFenceWatchdog(t *testing.T) {
	in := big(4, "r")
	fw := &FenceWatchdog{Restarts: 16, GaveUp: "it died 3 times in a row, each within 10s of its start"}
	for i := range MaxFenceWatchdogDeaths {
		fw.Deaths = append(fw.Deaths, FenceWatchdogDeath{PID: 100 + i, Exit: "killed by SIGKILL", At: at, NewPID: 101 + i, RestartMS: 3.5})
	}
	in.FenceWatchdog = fw
	b, err := Compact(in, TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Parse(b)
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, b)
	}
	if out.FenceWatchdog == nil || out.FenceWatchdog.Restarts != 16 || out.FenceWatchdog.GaveUp != fw.GaveUp || len(out.FenceWatchdog.Deaths) != 0 {
		t.Errorf("compacted fence_watchdog %+v, want the restarts and gave_up without the deaths", out.FenceWatchdog)
	}
	if len(in.FenceWatchdog.Deaths) != MaxFenceWatchdogDeaths {
		t.Error("Compact changed its input")
	}
}
