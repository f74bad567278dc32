package ranklogs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReadErrorFile(t *testing.T) {
	dir := t.TempDir()
	code := 139
	tests := []struct {
		name    string
		content string
		want    ErrorRecord
		wantErr bool
	}{
		{
			name:    "new schema, string timestamp",
			content: `{"message": {"message": "ValueError: boom", "extraInfo": {"py_callstack": "Traceback:\n  line 1\nValueError: boom", "timestamp": "1700000000"}}}`,
			want:    ErrorRecord{Message: "ValueError: boom", Traceback: "Traceback:\n  line 1\nValueError: boom", Timestamp: time.Unix(1700000000, 0)},
		},
		{
			name:    "new schema re-dumped with errorCode, numeric timestamp",
			content: `{"message": {"message": "RuntimeError: x", "errorCode": 139, "extraInfo": {"py_callstack": "tb", "timestamp": 1700000001}}}`,
			want:    ErrorRecord{Message: "RuntimeError: x", Traceback: "tb", Timestamp: time.Unix(1700000001, 0), ErrorCode: &code},
		},
		{
			name:    "old schema",
			content: `{"message": "something failed", "timestamp": 1700000002}`,
			want:    ErrorRecord{Message: "something failed", Timestamp: time.Unix(1700000002, 0)},
		},
		{
			name:    "old schema, string timestamp",
			content: `{"message": "m", "timestamp": "1700000003"}`,
			want:    ErrorRecord{Message: "m", Timestamp: time.Unix(1700000003, 0)},
		},
		{
			name:    "no timestamp",
			content: `{"message": {"message": "m"}}`,
			want:    ErrorRecord{Message: "m"},
		},
		{name: "not json", content: `{"message":`, wantErr: true},
		{name: "no message", content: `{"timestamp": 1}`, wantErr: true},
		{name: "bad timestamp", content: `{"message": "m", "timestamp": "soon"}`, wantErr: true},
		{name: "message of wrong type", content: `{"message": 5}`, wantErr: true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, dir, "e"+string(rune('a'+i))+".json", tc.content)
			got, err := ReadErrorFile(p)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if tc.wantErr {
				if !strings.Contains(err.Error(), p) {
					t.Errorf("error %q does not name the file", err)
				}
				return
			}
			if got.Message != tc.want.Message || got.Traceback != tc.want.Traceback || !got.Timestamp.Equal(tc.want.Timestamp) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if (got.ErrorCode == nil) != (tc.want.ErrorCode == nil) || (got.ErrorCode != nil && *got.ErrorCode != *tc.want.ErrorCode) {
				t.Errorf("ErrorCode %v, want %v", got.ErrorCode, tc.want.ErrorCode)
			}
		})
	}
	if _, err := ReadErrorFile(filepath.Join(dir, "missing.json")); err == nil {
		t.Error("missing file: want error")
	}
}

func stamp(t time.Time) string { return t.Local().Format("2006-01-02_15:04:05") }

func TestSummarySingleFailureExact(t *testing.T) {
	at := time.Unix(1700000000, 0)
	got := Summary("train.py", "node1", []Failure{{LocalRank: 1, GlobalRank: 3, PID: 1234, ExitCode: -15, Time: at}})
	// The widest line is the traceback line (54 characters).
	want := strings.Repeat("=", 54) + "\n" +
		"train.py FAILED\n" +
		strings.Repeat("-", 54) + "\n" +
		"Failures:\n" +
		"  <NO_OTHER_FAILURES>\n" +
		strings.Repeat("-", 54) + "\n" +
		"Root Cause (first observed failure):\n" +
		"[0]:\n" +
		"  time      : " + stamp(at) + "\n" +
		"  host      : node1\n" +
		"  rank      : 3 (local_rank: 1)\n" +
		"  exitcode  : -15 (pid: 1234)\n" +
		"  error_file: <N/A>\n" +
		"  traceback : Signal 15 (SIGTERM) received by PID 1234\n" +
		strings.Repeat("=", 54)
	if got != want {
		t.Errorf("Summary:\n%s\nwant:\n%s", got, want)
	}
	if Summary("x", "h", nil) != "" {
		t.Error("no failures: want empty summary")
	}
}

func TestSummaryRootCause(t *testing.T) {
	dir := t.TempDir()
	t0 := time.Unix(1700000000, 0)
	ef := writeFile(t, dir, "error.json",
		`{"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "Traceback (most recent call last):\n  File \"train.py\", line 3\nValueError: bad", "timestamp": "1700000000"}}}`)
	// Rank 2 wrote its error file at t0 but was reaped last; its error-file
	// timestamp makes it the root cause over ranks that exited earlier.
	failures := []Failure{
		NewFailure(2, 10, 300, 1, t0.Add(3*time.Second), ef),
		NewFailure(0, 8, 100, -9, t0.Add(1*time.Second), filepath.Join(dir, "absent.json")),
		NewFailure(1, 9, 200, 3, t0.Add(2*time.Second), ""),
	}
	if failures[0].Record == nil || failures[1].Record != nil {
		t.Fatalf("NewFailure records: %+v / %+v", failures[0].Record, failures[1].Record)
	}
	if root := RootCause(failures); root != 0 {
		t.Errorf("RootCause = %d, want 0 (local rank 2)", root)
	}
	s := Summary("train.py", "host-a", failures)
	rootPart := s[strings.Index(s, "Root Cause"):]
	failPart := s[:strings.Index(s, "Root Cause")]
	for _, want := range []string{
		"[2]:", "rank      : 10 (local_rank: 2)", "exitcode  : 1 (pid: 300)", "error_file: " + ef,
		"traceback : Traceback (most recent call last):\n    File \"train.py\", line 3\n  ValueError: bad",
		"time      : " + stamp(t0),
	} {
		if !strings.Contains(rootPart, want) {
			t.Errorf("root cause lacks %q:\n%s", want, rootPart)
		}
	}
	for _, want := range []string{
		"[0]:\n", "rank      : 8 (local_rank: 0)", "Signal 9 (SIGKILL) received by PID 100", "error_file: <N/A>",
		"[1]:\n", "exitcode  : 3 (pid: 200)", noTracebackHint,
	} {
		if !strings.Contains(failPart, want) {
			t.Errorf("failures lack %q:\n%s", want, failPart)
		}
	}
	lines := strings.Split(s, "\n")
	if lines[0] != strings.Repeat("=", 60) || lines[len(lines)-1] != strings.Repeat("=", 60) {
		t.Errorf("border not capped at 60: %q", lines[0])
	}

	// Equal timestamps: the lowest local rank is the root cause.
	tie := []Failure{
		{LocalRank: 3, GlobalRank: 3, ExitCode: 1, Time: t0},
		{LocalRank: 1, GlobalRank: 1, ExitCode: 1, Time: t0},
		{LocalRank: 2, GlobalRank: 2, ExitCode: 1, Time: t0.Add(-time.Second)},
	}
	if root := RootCause(tie); tie[root].LocalRank != 2 {
		t.Errorf("earliest: root local rank %d, want 2", tie[root].LocalRank)
	}
	tie[2].Time = t0
	if root := RootCause(tie); tie[root].LocalRank != 1 {
		t.Errorf("tie: root local rank %d, want 1", tie[root].LocalRank)
	}
}

func TestWriteLauncherErrorFile(t *testing.T) {
	dir := t.TempDir()
	child := writeFile(t, dir, "child.json",
		`{"message": {"message": "ValueError: bad", "extraInfo": {"py_callstack": "tb", "timestamp": "1700000000"}, "custom": 1}}`)
	old := writeFile(t, dir, "old.json", `{"message": "old style", "timestamp": 1700000005}`)
	at := time.Unix(1700000010, 0)
	tests := []struct {
		name      string
		failure   Failure
		message   string
		callstack string
		timestamp string
		extra     string // a key that must survive
	}{
		{"child error file copied", NewFailure(0, 0, 10, -11, at, child), "ValueError: bad", "tb", "1700000000", "custom"},
		{"old schema converted", NewFailure(0, 0, 10, 2, at, old), "old style", "old style", "1700000005", ""},
		{"no error file", NewFailure(1, 5, 11, -9, at, ""),
			"ChildFailedError: local rank 1 (rank 5, pid 11) failed with exit code -9: Signal 9 (SIGKILL) received by PID 11",
			"Signal 9 (SIGKILL) received by PID 11", "1700000010", ""},
	}
	out := filepath.Join(dir, "sub", "launcher_error.json")
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, []byte("stale"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := WriteLauncherErrorFile(out, tc.failure); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			var doc struct {
				Message map[string]json.RawMessage `json:"message"`
			}
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("%s: %v", b, err)
			}
			var code int
			if err := json.Unmarshal(doc.Message["errorCode"], &code); err != nil || code != tc.failure.ExitCode {
				t.Errorf("errorCode %s, want %d", doc.Message["errorCode"], tc.failure.ExitCode)
			}
			if tc.extra != "" && doc.Message[tc.extra] == nil {
				t.Errorf("field %q dropped: %s", tc.extra, b)
			}
			// Our own reader must understand what we wrote, as torch would.
			rec, err := ReadErrorFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Message != tc.message || rec.Traceback != tc.callstack || rec.ErrorCode == nil || *rec.ErrorCode != tc.failure.ExitCode {
				t.Errorf("re-read %+v", rec)
			}
			if got := rec.Timestamp.Unix(); strings.TrimSpace(tc.timestamp) != "" && got != mustAtoi(t, tc.timestamp) {
				t.Errorf("timestamp %d, want %s", got, tc.timestamp)
			}
			st, err := os.Stat(out)
			if err != nil || st.Mode().Perm() != 0o644 {
				t.Errorf("mode %v %v", st.Mode(), err)
			}
			entries, _ := os.ReadDir(filepath.Dir(out))
			if len(entries) != 1 {
				t.Errorf("temp files left behind: %v", entries)
			}
		})
	}
	if err := WriteLauncherErrorFile("", Failure{}); err != nil {
		t.Errorf("empty path: %v", err)
	}
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
