// Package eventlog writes the JSON-lines event log: one JSON object per line
// for every cycle, rank exit, hang, restart, escalation and outcome, so that
// every fault leaves a record a tool can read.
package eventlog

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"sync"
	"time"
)

// Event kinds written by the launcher.
const (
	LauncherStarted  = "launcher_started"
	CycleStarted     = "cycle_started"
	RankExited       = "rank_exited"
	RankFailureHint  = "rank_failure_hint"  // a known cause in a failed rank's output: local_rank, rank, cause, hint
	RankFailureCause = "rank_failure_cause" // why a rank failed, from its error file, traceback or fatal-signal stack
	NodeFailing      = "node_failing"       // this node's ranks keep failing in ways that point at it
	RankSpeed        = "rank_speed"         // this node's ranks' measured speed over the latest interval
	Straggler        = "straggler"          // this node is slower than the others, and what was done
	RankHang         = "rank_hang"
	RankStacks       = "rank_stacks"    // every local rank's stacks, taken at a hang before the kill, and which rank hung
	HangDismissed    = "hang_dismissed" // a default clock expired, but the stacks and the ranks' activity said no hang
	StopEscalated    = "stop_escalated" // SIGTERM grace ran out, SIGKILL sent
	Restart          = "restart"
	RoundEnded       = "round_ended"
	SignalReceived   = "signal_received"
	TrainingFinished = "training_finished"
	JobSucceeded     = "job_succeeded"
	JobFailed        = "job_failed"
	WorkloadRequest  = "workload_request"
	Standby          = "standby"          // this node parked beyond --nnodes MIN for a round
	Verdict          = "verdict"          // the outcome, as written to the verdict file
	VerdictLost      = "verdict_lost"     // the verdict file could not be written; the old one was removed
	WalltimeWarning  = "walltime_warning" // the scheduler's pre-walltime signal, forwarded to the ranks
	Ledger           = "ledger"           // a lease of this node began, ended or counted a restart (or a peer's, ended here)
	SpareSwap        = "spare_swap"       // this spare was promoted: the phases of the swap
	Fenced           = "fenced"           // this node's lease could not be renewed: its ranks were killed before peers could replace it
)

// FencedByWatchdog: the fence watchdog killed this node's ranks because the
// launcher could not renew its lease in time (frozen, or cut off from etcd);
// written when the launcher runs again (docs/rendezvous.md).
const FencedByWatchdog = "fenced_by_watchdog"

// FenceWatchdogRestarted: the fence watchdog process died and the launcher
// started a new one, given the guarded groups and the deadline again;
// FenceWatchdogGaveUp: it could not be restarted (RestartPolicy), so the
// launcher killed this node's ranks itself and ends (docs/rendezvous.md).
const (
	FenceWatchdogRestarted = "fence_watchdog_restarted"
	FenceWatchdogGaveUp    = "fence_watchdog_gave_up"
)

// Log appends events to a file. A nil *Log discards events.
//
// A write that fails (a full file system) never blocks or stops the
// caller: the event is dropped and counted (Lost), and the first failure
// is logged once at error level with the path and what was lost so far.
type Log struct {
	mu     sync.Mutex
	f      *os.File
	base   map[string]any
	logger *slog.Logger // where the first lost event is reported; nil: nowhere

	lostEvents, lostBytes int64
	reported              bool
	torn                  bool // the last write stopped mid-line
}

// Open opens (creating or appending) the event log at path. An empty path
// returns a nil *Log, which discards events.
func Open(path string, base map[string]any) (*Log, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open event log: %w", err)
	}
	return &Log{f: f, base: base}, nil
}

// Record is one event: a typed record of records.go or components.go
// (Unknown only comes from Decode). Kind is the line's "event".
type Record interface{ Kind() string }

// Emit writes one event. Each line is written with a single write(2) so
// concurrent writers (several launchers on one file) never interleave.
//
// The line is one JSON object with the keys sorted: the log's base fields,
// the record's fields (which win over a base field of the same name: a
// round_ended's node), "ts" and "event".
func (l *Log) Emit(r Record) {
	if l == nil {
		return
	}
	kind := r.Kind()
	ts := time.Now().UTC().Format(time.RFC3339Nano)
	b, err := encode(l.base, r, ts)
	if err != nil {
		b, _ = json.Marshal(map[string]any{"ts": ts, "event": kind, "marshal_error": err.Error()})
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.torn {
		// End the torn line first, so this event stays a line of its own
		// and a reader loses only the torn one.
		b = append([]byte{'\n'}, b...)
	}
	n, err := l.f.Write(b)
	if n > 0 {
		l.torn = b[n-1] != '\n'
	}
	if err == nil {
		return
	}
	// A line written in part is not an event a reader can use: all of it
	// counts as lost.
	l.lostEvents++
	l.lostBytes += int64(len(b))
	if !l.reported && l.logger != nil {
		l.reported = true
		l.logger.Error("event log: write failed, events are being lost (further failures only counted; the totals go into the verdict's records_lost)",
			"path", l.f.Name(), "err", err, "event", kind, "events_lost", l.lostEvents, "bytes_lost", l.lostBytes)
	}
}

// encode renders a record as its line (without the newline): the log's
// base fields, the record's fields, ts and event in one map, marshalled
// with its keys sorted, as the launcher wrote lines before records were
// typed, so logs stay byte for byte what they were.
func encode(base map[string]any, r Record, ts string) ([]byte, error) {
	fields := fieldsOf(r)
	rec := make(map[string]any, len(base)+len(fields)+2)
	for k, v := range base {
		rec[k] = v
	}
	for k, v := range fields {
		rec[k] = v
	}
	rec["ts"], rec["event"] = ts, r.Kind()
	return json.Marshal(rec)
}

// fieldsOf is a typed record's fields by JSON name, as encoding/json would
// write them: an omitempty field with an empty value (a nil pointer, a zero
// scalar, an empty string or slice) is left out, a pointer is written as
// its value.
func fieldsOf(r Record) map[string]any {
	v := reflect.ValueOf(r)
	t := v.Type()
	out := make(map[string]any, t.NumField())
	for _, f := range jsonFields(t) {
		fv := v.Field(f.index)
		if f.omitempty && isEmpty(fv) {
			continue
		}
		if fv.Kind() == reflect.Pointer {
			if fv.IsNil() {
				out[f.name] = nil
				continue
			}
			fv = fv.Elem()
		}
		out[f.name] = fv.Interface()
	}
	return out
}

// isEmpty is encoding/json's "empty value" of omitempty (structs, times
// included, never are).
func isEmpty(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Array, reflect.Map, reflect.Slice, reflect.String:
		return v.Len() == 0
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64, reflect.Interface, reflect.Pointer:
		return v.IsZero()
	}
	return false
}

// ReportTo sets the logger that hears of the first lost event (nil: none).
func (l *Log) ReportTo(logger *slog.Logger) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.logger = logger
}

// Lost returns how many events, and how many bytes of them, could not be
// written.
func (l *Log) Lost() (events, bytes int64) {
	if l == nil {
		return 0, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostEvents, l.lostBytes
}

// Close closes the file.
func (l *Log) Close() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// Read parses an event log file into maps, for tests that look at the raw
// fields; tools read typed records with Decode (report does).
func Read(path string) ([]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			return out, fmt.Errorf("event log %s: %w", path, err)
		}
		out = append(out, m)
	}
	return out, nil
}
