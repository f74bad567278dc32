package eventlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// fill sets every field of v (a pointer) to a distinct non-zero value,
// pointers and slices included, so a field that does not survive Emit and
// Decode shows.
func fill(t *testing.T, v reflect.Value, n *int) {
	t.Helper()
	*n++
	switch v.Kind() {
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(t, v.Elem(), n)
	case reflect.Struct:
		if v.Type() == reflect.TypeOf(time.Time{}) {
			v.Set(reflect.ValueOf(time.Date(2026, 11, 28, 5, 0, 0, *n*1001, time.UTC)))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(t, v.Field(i), n)
			}
		}
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		fill(t, s.Index(0), n)
		fill(t, s.Index(1), n)
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
		fill(t, k, n)
		fill(t, e, n)
		m.SetMapIndex(k, e)
		v.Set(m)
	case reflect.String:
		v.SetString("s" + strings.Repeat("x", *n%7) + string(rune('a'+*n%26)))
	case reflect.Int, reflect.Int32, reflect.Int64:
		v.SetInt(int64(1000 + *n))
	case reflect.Uint64:
		v.SetUint(uint64(1000 + *n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	default:
		t.Fatalf("fill: no value for a %s field: extend the test", v.Type())
	}
}

// TestRecordsRoundTrip: every typed record, with every field set and with
// none set, comes back from Emit and Decode as it was, with the log's base
// fields in the header.
func TestRecordsRoundTrip(t *testing.T) {
	for _, filled := range []bool{true, false} {
		path := filepath.Join(t.TempDir(), "events.jsonl")
		base := map[string]any{"run_id": "run-1", "slurm_job_id": 4242}
		if filled {
			base["node"] = "node-a"
		}
		l, err := Open(path, base)
		if err != nil {
			t.Fatal(err)
		}
		var want []Record
		n := 0
		for _, r := range Typed() {
			p := reflect.New(reflect.TypeOf(r))
			if filled {
				fill(t, p.Elem(), &n)
			}
			rec := p.Elem().Interface().(Record)
			want = append(want, rec)
			l.Emit(rec)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		if len(lines) != len(want) {
			t.Fatalf("%d lines for %d records", len(lines), len(want))
		}
		for i, line := range lines {
			e, err := Decode([]byte(line))
			if err != nil {
				t.Fatalf("line %d (%s): %v", i+1, want[i].Kind(), err)
			}
			if !reflect.DeepEqual(e.Record, want[i]) {
				t.Errorf("%s (filled %v) came back as\n%#v\nwant\n%#v\nline %s", want[i].Kind(), filled, e.Record, want[i], line)
			}
			if e.Event != want[i].Kind() || e.RunID != "run-1" || e.SlurmJobID != "4242" || e.TS.IsZero() {
				t.Errorf("%s header %+v", want[i].Kind(), e)
			}
			wantNode := ""
			if filled {
				wantNode = "node-a"
				if re, ok := want[i].(RoundEndedEvent); ok {
					wantNode = *re.Node // the node that ended the round wins
				}
			}
			if e.Node != wantNode {
				t.Errorf("%s: node %q, want %q", want[i].Kind(), e.Node, wantNode)
			}
		}
	}
}

// TestTypedKinds: every typed record has a kind of its own, a struct type,
// and JSON names that are unique within it, so Decode picks one type per
// kind and no field hides another.
func TestTypedKinds(t *testing.T) {
	seen := map[string]string{}
	for _, r := range Typed() {
		rt := reflect.TypeOf(r)
		if rt.Kind() != reflect.Struct {
			t.Errorf("%s: record type %s is not a struct", r.Kind(), rt)
			continue
		}
		if r.Kind() == "" {
			t.Errorf("%s has an empty kind", rt.Name())
		}
		if other, ok := seen[r.Kind()]; ok {
			t.Errorf("kind %q is both %s and %s", r.Kind(), other, rt.Name())
		}
		seen[r.Kind()] = rt.Name()
		names := map[string]bool{}
		for _, f := range jsonFields(rt) {
			if names[f.name] || f.name == "ts" || f.name == "event" {
				t.Errorf("%s: JSON field %q twice, or a header field", rt.Name(), f.name)
			}
			names[f.name] = true
		}
	}
}

// oldEncode is how Emit rendered a line before records were typed: the
// base and the call site's map merged and marshalled.
func oldEncode(base map[string]any, kind string, fields map[string]any, ts string) []byte {
	rec := map[string]any{}
	for k, v := range base {
		rec[k] = v
	}
	for k, v := range fields {
		rec[k] = v
	}
	rec["ts"], rec["event"] = ts, kind
	b, _ := json.Marshal(rec)
	return b
}

// TestEmitBytesAsBefore: typed records render the same bytes as the maps
// the call sites built before, optional fields absent or present, values
// that need escaping and times included.
func TestEmitBytesAsBefore(t *testing.T) {
	at := time.Date(2026, 11, 28, 5, 1, 2, 345678901, time.UTC)
	base := map[string]any{"run_id": "r<1>", "node": "10.0.0.1", "slurm_job_id": "77"}
	tests := []struct {
		rec    Record
		fields map[string]any
	}{
		{CycleStartedEvent{Round: 2, GroupRank: 1, WorldSize: 8, PIDs: []int{10, 11}, MasterAddr: "h", MasterPort: 29500, RestartsUsed: 1},
			map[string]any{"round": 2, "group_rank": 1, "world_size": 8, "pids": []int{10, 11}, "master_addr": "h", "master_port": 29500, "restarts_used": 1}},
		{CycleStartedEvent{Round: 3, PIDs: []int{}, Mode: "inprocess", Survivors: []int{0}},
			map[string]any{"round": 3, "group_rank": 0, "world_size": 0, "pids": []int{}, "master_addr": "", "master_port": 0, "restarts_used": 0, "mode": "inprocess", "survivors": []int{0}}},
		{SignalReceivedEvent{Signal: "SIGTERM", State: "joining"}, map[string]any{"signal": "SIGTERM", "state": "joining"}},
		{SignalReceivedEvent{Round: Opt(0), Signal: "SIGINT"}, map[string]any{"round": 0, "signal": "SIGINT"}},
		{SignalReceivedEvent{Round: Opt(1), Signal: "SIGTERM", State: "stopping", Repeat: true, Escalated: Opt(false), WindowS: Opt(2.5)},
			map[string]any{"round": 1, "signal": "SIGTERM", "state": "stopping", "repeat": true, "escalated": false, "window_s": 2.5}},
		{RankHangEvent{Round: 1, LocalRank: 0, Rank: -1, TimeoutKind: "heartbeat", TimeoutS: 30, ElapsedS: 30.5, Signal: "SIGKILL",
			DetectLatencyMS: 0.125, SignalledAt: at},
			map[string]any{"round": 1, "local_rank": 0, "rank": -1, "timeout_kind": "heartbeat", "section": "", "timeout_s": 30.0,
				"elapsed_s": 30.5, "signal": "SIGKILL", "detect_latency_ms": 0.125, "signalled_at": at, "escalated_to_sigkill": false}},
		{RankExitedEvent{Round: 0, LocalRank: 1, Rank: 1, PID: 99, ExitCode: 137, Signal: "SIGKILL"},
			map[string]any{"round": 0, "local_rank": 1, "rank": 1, "pid": 99, "exit_code": 137, "signal": "SIGKILL"}},
		{RankExitedEvent{PID: 9}, map[string]any{"round": 0, "local_rank": 0, "rank": 0, "pid": 9, "exit_code": 0}},
		{RoundEndedEvent{JobClosed: true, CloseKind: Opt(verdict.Kind("")), Reason: "a & b", ExitCode: Opt(93)},
			map[string]any{"job_closed": true, "kind": "", "reason": "a & b", "exit_code": 93}},
		{RoundEndedEvent{Round: Opt(4), Reason: "node x lost", Node: Opt("10.0.0.2/7"), Cause: Opt(policy.NodeLost)},
			map[string]any{"round": 4, "reason": "node x lost", "node": "10.0.0.2/7", "cause": "node_lost", "job_closed": false}},
		{RoundEndedEvent{Round: Opt(4), Reason: "r", Node: Opt("n"), Fenced: true, JobClosed: true},
			map[string]any{"round": 4, "reason": "r", "node": "n", "fenced": true, "job_closed": true}},
		{JobFailedEvent{CloseKind: Opt(verdict.FatalError), Reason: "setup: x"}, map[string]any{"kind": "fatal_error", "reason": "setup: x"}},
		{JobFailedEvent{Round: Opt(2), ExitCode: Opt(93), Reason: "no"}, map[string]any{"round": 2, "exit_code": 93, "reason": "no"}},
		{JobFailedEvent{Round: Opt(2), CloseKind: Opt(verdict.Signaled), Reason: "signal terminated", RanksClean: Opt(false)},
			map[string]any{"round": 2, "kind": "signaled", "reason": "signal terminated", "ranks_clean": false}},
		{RestartEvent{AfterRound: 0, Reason: "another node failed the round"}, map[string]any{"after_round": 0, "reason": "another node failed the round"}},
		{RestartEvent{AfterRound: 1, Action: Opt(policy.Action("swap")), Reason: "r", RestartsUsed: Opt(2), Mode: Opt(policy.ModeFull)},
			map[string]any{"after_round": 1, "action": "swap", "reason": "r", "restarts_used": 2, "mode": "full"}},
		{SpareSwapEvent{Round: 1, GroupRank: 2, DetectionMS: 1.5, FillerReclaimMS: 0, SpawnMS: 3.25},
			map[string]any{"round": 1, "group_rank": 2, "filler_preempted": false, "detection_ms": 1.5, "filler_reclaim_ms": 0.0, "spawn_ms": 3.25}},
		{VerdictEvent{VerdictKind: verdict.Signaled, ExitCode: 143, Reason: "stopped", LastRound: -1},
			map[string]any{"kind": "signaled", "exit_code": 143, "reason": "stopped", "restarts_used": 0, "last_round": -1, "finished": false, "quarantined": 0}},
		{InProcessFallbackEvent{Round: 1, Why: "w", Reason: "r"}, map[string]any{"round": 1, "why": "w", "reason": "r"}},
		{InProcessFallbackEvent{Round: 1, Why: "w", Reason: "r", LocalRank: Opt(0)}, map[string]any{"round": 1, "why": "w", "reason": "r", "local_rank": 0}},
		{InProcessKeptEvent{Round: 1, Why: "w"}, map[string]any{"round": 1, "survivors": []int(nil), "failed": []int(nil), "why": "w"}},
		{FencedByWatchdogEvent{Reason: "deadline", LateMS: 1.5, ReadAfterS: 0.25}, map[string]any{"reason": "deadline", "pgids": []int(nil), "late_ms": 1.5, "read_after_s": 0.25}},
		{FenceWatchdogRestartedEvent{OldPID: 7, NewPID: 9, Exit: "killed by SIGKILL", ExitCode: -1, Signal: "SIGKILL", ServedS: 2.5,
			RestartMS: 1.25, Attempts: 1, Guarded: 2, Armed: true, Restarts: 1},
			map[string]any{"old_pid": 7, "new_pid": 9, "exit": "killed by SIGKILL", "exit_code": -1, "signal": "SIGKILL", "served_s": 2.5,
				"restart_ms": 1.25, "attempts": 1, "guarded": 2, "armed": true, "restarts": 1}},
		{FenceWatchdogGaveUpEvent{OldPID: 7, Exit: "exit code 2", Reason: "r", PGIDs: []int{5}},
			map[string]any{"old_pid": 7, "exit": "exit code 2", "reason": "r", "pgids": []int{5}}},
		// Typed enums are written as their strings.
		{StateReplicaRefusedEvent{Peer: "10.0.0.9:4", Reason: ReplicaRefusedAuth, Error: "e"},
			map[string]any{"peer": "10.0.0.9:4", "reason": "auth", "error": "e"}},
		{StateCorruptEvent{LocalRank: 0, Rank: 1, By: CorruptByWriteOut, Source: "memory", Error: "e"},
			map[string]any{"local_rank": 0, "rank": 1, "by": "write-out", "source": "memory", "error": "e"}},
	}
	ts := at.Format(time.RFC3339Nano)
	for _, tt := range tests {
		got, err := encode(base, tt.rec, ts)
		if err != nil {
			t.Fatalf("%s: %v", tt.rec.Kind(), err)
		}
		if want := oldEncode(base, tt.rec.Kind(), tt.fields, ts); !bytes.Equal(got, want) {
			t.Errorf("%s:\n got %s\nwant %s", tt.rec.Kind(), got, want)
		}
	}
}

// TestDecodeErrors: what is not an event says why; an unknown kind keeps
// all its fields.
func TestDecodeErrors(t *testing.T) {
	var syn *json.SyntaxError
	if _, err := Decode([]byte(`{"event":"restart",`)); !errors.As(err, &syn) {
		t.Errorf("a cut line: %v, want a JSON syntax error", err)
	}
	if _, err := Decode([]byte(`{"event":"restart"}`)); !errors.Is(err, ErrNotEvent) {
		t.Errorf("no ts: %v, want ErrNotEvent", err)
	}
	if _, err := Decode([]byte(`{"ts":"2026-11-28T05:00:00Z"}`)); !errors.Is(err, ErrNotEvent) {
		t.Errorf("no event: %v, want ErrNotEvent", err)
	}
	var rerr *RecordError
	e, err := Decode([]byte(`{"ts":"2026-11-28T05:00:00Z","event":"restart","after_round":"one","reason":"r"}`))
	if !errors.As(err, &rerr) || rerr.Kind != Restart || !strings.Contains(err.Error(), "restart record") {
		t.Errorf("a field of the wrong type: %v, want a *RecordError naming the kind", err)
	}
	if f, ok := e.Record.(Unknown); !ok || f.Fields["reason"] != "r" || e.Event != Restart {
		t.Errorf("a record that does not fit is returned as %#v, want its fields", e.Record)
	}
	e, err = Decode([]byte(`{"ts":"2026-11-28T05:00:00Z","event":"a_newer_kind","pid":7,"slurm_job_id":"12"}`))
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := e.Record.(Unknown); !ok || f.Event != "a_newer_kind" || f.Fields["pid"] != 7.0 || e.SlurmJobID != "12" {
		t.Errorf("unknown kind decoded as %#v (%+v)", e.Record, e)
	}
}

// BenchmarkEncode compares a typed record's line with the old map
// encoding of the same line (docs/benchmarks-history.md, "Typed event records").
func BenchmarkEncode(b *testing.B) {
	base := map[string]any{"run_id": "run-1", "node": "10.0.0.1", "slurm_job_id": "77"}
	ts := time.Now().UTC().Format(time.RFC3339Nano)
	rec := RankExitedEvent{Round: 3, LocalRank: 1, Rank: 9, PID: 12345, ExitCode: 137, Signal: "SIGKILL"}
	fields := map[string]any{"round": 3, "local_rank": 1, "rank": 9, "pid": 12345, "exit_code": 137, "signal": "SIGKILL"}
	b.Run("typed", func(b *testing.B) {
		for b.Loop() {
			if _, err := encode(base, rec, ts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("map (before)", func(b *testing.B) {
		for b.Loop() {
			oldEncode(base, RankExited, fields, ts)
		}
	})
}

// TestDecodeLenientHeader: a header field of another JSON type reads as
// absent, as readers always took it; an event kind that is not a string is
// not an event.
func TestDecodeLenientHeader(t *testing.T) {
	e, err := Decode([]byte(`{"ts":"2026-11-28T05:00:00Z","event":"standby","round":2,"node":7,"run_id":null,"slurm_job_id":123}`))
	if err != nil {
		t.Fatal(err)
	}
	if e.Node != "" || e.RunID != "" || e.SlurmJobID != "123" || e.Record != (StandbyEvent{Round: 2}) {
		t.Errorf("decoded %+v", e)
	}
	if _, err := Decode([]byte(`{"ts":"2026-11-28T05:00:00Z","event":5}`)); !errors.Is(err, ErrNotEvent) {
		t.Errorf("a numeric event kind: %v, want ErrNotEvent", err)
	}
}
