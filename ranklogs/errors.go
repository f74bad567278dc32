package ranklogs

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
)

// noTracebackHint is what torchrun prints for a failed rank that left no
// error file and was not killed by a signal.
const noTracebackHint = "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"

// ErrorRecord is the content of a torch error file (TORCHELASTIC_ERROR_FILE).
type ErrorRecord struct {
	Message   string    // "<ExcType>: <str>" or the old schema's plain message
	Traceback string    // extraInfo.py_callstack; "" in the old schema
	Timestamp time.Time // zero when the file has none
	ErrorCode *int      // set when a parent re-dumped it with "errorCode"
	// message is the raw "message" object of the new schema, kept so a
	// re-dump preserves fields this package does not know.
	message map[string]json.RawMessage
}

// ReadErrorFile reads an error file in either torch schema:
//
//	{"message": {"message": "...", "extraInfo": {"py_callstack": "...", "timestamp": "<secs>"}}}
//	{"message": "...", "timestamp": <secs>}
//
// Timestamps are accepted as JSON numbers or strings.
func ReadErrorFile(path string) (ErrorRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return ErrorRecord{}, fmt.Errorf("ranklogs: read error file: %w", err)
	}
	rec, err := parseErrorFile(b)
	if err != nil {
		return ErrorRecord{}, fmt.Errorf("ranklogs: error file %s: %w", path, err)
	}
	return rec, nil
}

func parseErrorFile(b []byte) (ErrorRecord, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return ErrorRecord{}, fmt.Errorf("not a JSON object: %w", err)
	}
	raw, ok := top["message"]
	if !ok {
		return ErrorRecord{}, errors.New(`no "message" field`)
	}
	var rec ErrorRecord
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		rec.Message = s
		ts, err := parseTimestamp(top["timestamp"])
		if err != nil {
			return ErrorRecord{}, err
		}
		rec.Timestamp = ts
		return rec, nil
	}
	if err := json.Unmarshal(raw, &rec.message); err != nil || rec.message == nil {
		return ErrorRecord{}, errors.New(`"message" is neither a string nor an object`)
	}
	if m, ok := rec.message["message"]; ok {
		if err := json.Unmarshal(m, &rec.Message); err != nil {
			return ErrorRecord{}, fmt.Errorf("message.message: %w", err)
		}
	}
	if c, ok := rec.message["errorCode"]; ok {
		var code int
		if err := json.Unmarshal(c, &code); err == nil {
			rec.ErrorCode = &code
		}
	}
	if x, ok := rec.message["extraInfo"]; ok {
		var extra map[string]json.RawMessage
		if err := json.Unmarshal(x, &extra); err != nil {
			return ErrorRecord{}, fmt.Errorf("message.extraInfo: %w", err)
		}
		if cs, ok := extra["py_callstack"]; ok {
			_ = json.Unmarshal(cs, &rec.Traceback)
		}
		ts, err := parseTimestamp(extra["timestamp"])
		if err != nil {
			return ErrorRecord{}, err
		}
		rec.Timestamp = ts
	}
	return rec, nil
}

// parseTimestamp reads unix seconds given as a JSON number or string.
func parseTimestamp(raw json.RawMessage) (time.Time, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return time.Time{}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		s = string(raw)
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("bad timestamp %s: %w", raw, err)
	}
	whole := int64(secs)
	return time.Unix(whole, int64((secs-float64(whole))*1e9)), nil
}

// Failure is one failed rank, as shown in the summary.
type Failure struct {
	LocalRank, GlobalRank, PID int
	ExitCode                   int       // torch convention: -signo when killed by a signal
	Time                       time.Time // when the failure was observed (exit time)
	ErrorFile                  string    // the rank's TORCHELASTIC_ERROR_FILE ("" when none)
	Record                     *ErrorRecord
}

// NewFailure builds a Failure and reads errorFile when the rank wrote it.
// A malformed error file is treated as absent.
func NewFailure(localRank, globalRank, pid, exitCode int, at time.Time, errorFile string) Failure {
	f := Failure{LocalRank: localRank, GlobalRank: globalRank, PID: pid, ExitCode: exitCode, Time: at, ErrorFile: errorFile}
	if errorFile != "" {
		if rec, err := ReadErrorFile(errorFile); err == nil {
			f.Record = &rec
		}
	}
	return f
}

// When is the failure's timestamp: the error file's, else the exit time.
func (f Failure) When() time.Time {
	if f.Record != nil && !f.Record.Timestamp.IsZero() {
		return f.Record.Timestamp
	}
	return f.Time
}

// description is the traceback line for a failure without an error file.
func (f Failure) description() string {
	if f.ExitCode < 0 {
		sig := syscall.Signal(-f.ExitCode)
		return fmt.Sprintf("Signal %d (%s) received by PID %d", -f.ExitCode, unix.SignalName(sig), f.PID)
	}
	return noTracebackHint
}

// RootCause returns the index in failures of the first observed failure:
// the earliest When(), ties broken by the lowest local rank. -1 when empty.
func RootCause(failures []Failure) int {
	root := -1
	for i, f := range failures {
		if root < 0 {
			root = i
			continue
		}
		r := failures[root]
		if f.When().Before(r.When()) || (f.When().Equal(r.When()) && f.LocalRank < r.LocalRank) {
			root = i
		}
	}
	return root
}

// Summary renders torchrun's failure block ("<script> FAILED", "Failures:",
// "Root Cause (first observed failure):"), without a trailing newline.
// Failures are listed by global rank; times are local, to the second.
func Summary(script string, host string, failures []Failure) string {
	if len(failures) == 0 {
		return ""
	}
	sorted := slices.Clone(failures)
	slices.SortStableFunc(sorted, func(a, b Failure) int {
		if a.GlobalRank != b.GlobalRank {
			return a.GlobalRank - b.GlobalRank
		}
		return a.LocalRank - b.LocalRank
	})
	root := RootCause(sorted)
	title := script + " FAILED"
	width := len(title)
	var rootText string
	var others []string
	for i, f := range sorted {
		text := formatFailure(i, host, f)
		for _, line := range strings.Split(text, "\n") {
			width = max(width, len(line))
		}
		if i == root {
			rootText = text
		} else {
			others = append(others, text)
		}
	}
	width = min(width, 60)
	if len(others) == 0 {
		others = []string{"  <NO_OTHER_FAILURES>"}
	}
	border, section := strings.Repeat("=", width), strings.Repeat("-", width)
	return strings.Join([]string{
		border,
		title,
		section,
		"Failures:",
		strings.Join(others, "\n"),
		section,
		"Root Cause (first observed failure):",
		rootText,
		border,
	}, "\n")
}

func formatFailure(idx int, host string, f Failure) string {
	errorFile, msg := "<N/A>", f.description()
	if f.Record != nil {
		errorFile = f.ErrorFile
		switch {
		case f.Record.Traceback != "":
			msg = f.Record.Traceback
		case f.Record.Message != "":
			msg = f.Record.Message
		default:
			msg = "<N/A>"
		}
	}
	msg = strings.ReplaceAll(msg, "\n", "\n  ")
	return fmt.Sprintf("[%d]:\n"+
		"  time      : %s\n"+
		"  host      : %s\n"+
		"  rank      : %d (local_rank: %d)\n"+
		"  exitcode  : %d (pid: %d)\n"+
		"  error_file: %s\n"+
		"  traceback : %s",
		idx, f.When().Local().Format("2006-01-02_15:04:05"), host,
		f.GlobalRank, f.LocalRank, f.ExitCode, f.PID, errorFile, msg)
}

// WriteLauncherErrorFile writes the launcher's own error file in torch's
// schema with "errorCode" set to the root cause's exit code. When the root
// cause has an error file its message is copied (as torch's parent re-dump
// does; an old-schema record is converted to the new schema so errorCode can
// be stored); otherwise a message describing the exit is written. The file is
// written atomically: a temp file in the same directory, fsynced, renamed.
// An empty path is a no-op.
func WriteLauncherErrorFile(path string, rootCause Failure) error {
	if path == "" {
		return nil
	}
	msg := map[string]any{}
	if rec := rootCause.Record; rec != nil && rec.message != nil {
		for k, v := range rec.message {
			msg[k] = v
		}
	} else {
		text := fmt.Sprintf("ChildFailedError: local rank %d (rank %d, pid %d) failed with exit code %d: %s",
			rootCause.LocalRank, rootCause.GlobalRank, rootCause.PID, rootCause.ExitCode, rootCause.description())
		callstack := rootCause.description()
		if rec != nil {
			text = rec.Message
			callstack = rec.Message
		}
		msg["message"] = text
		msg["extraInfo"] = map[string]string{
			"py_callstack": callstack,
			"timestamp":    strconv.FormatInt(rootCause.When().Unix(), 10),
		}
	}
	msg["errorCode"] = rootCause.ExitCode
	b, err := json.Marshal(map[string]any{"message": msg})
	if err != nil {
		return fmt.Errorf("ranklogs: encode launcher error file: %w", err)
	}
	// 0644: the launcher error file is read by whoever inspects the job, as
	// torch's own error files are.
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("ranklogs: launcher error file: %w", err)
	}
	return nil
}
