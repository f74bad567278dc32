package eventlog

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEmitOnFullFileSystem: on a file system that fills up, the events
// that fit are written, every later one is dropped and counted (the one
// cut mid-line too), the first loss is logged once at error level with the
// path and what was lost, and once there is room again the next event is a
// line of its own after the torn one.
func TestEmitOnFullFileSystem(t *testing.T) {
	dir := testenv.Tmpfs(t, "12k") // three pages
	ballast := filepath.Join(dir, "ballast")
	if err := os.WriteFile(ballast, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "events.jsonl")
	logs := &lockedbuf.Buffer{}
	l, err := Open(path, map[string]any{"run_id": "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l.ReportTo(slog.New(slog.NewTextHandler(logs, nil)))

	pad := strings.Repeat("x", 1000)
	const n = 20 // ~20 KB of events into the 8 KB left
	for i := 0; i < n; i++ {
		l.Emit(CycleStartedEvent{Round: i, MasterAddr: pad})
	}
	events, bytes := l.Lost()
	if events < n-8 || events == n || bytes < events*1000 {
		t.Fatalf("lost %d events, %d bytes: want the ~%d of over 1000 bytes that did not fit in 8 KB counted", events, bytes, n-7)
	}
	if c := strings.Count(logs.String(), "level=ERROR"); c != 1 {
		t.Errorf("%d error lines, want 1:\n%s", c, logs.String())
	}
	for _, w := range []string{"events are being lost", "path=" + path, "no space left on device", "events_lost=1", "bytes_lost="} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("the error line lacks %q:\n%s", w, logs.String())
		}
	}
	if err := os.Remove(ballast); err != nil { // room again
		t.Fatal(err)
	}
	l.Emit(RoundEndedEvent{Reason: "after"})
	if e2, _ := l.Lost(); e2 != events {
		t.Errorf("an event written with room counted as lost (%d, was %d)", e2, events)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "{") || !strings.Contains(last, `"event":"round_ended"`) {
		t.Errorf("the event written after the loss is not a line of its own: %.80q", last)
	}
	// Every event not counted lost is a whole line; the torn one (counted
	// lost) is the only other line.
	whole := 0
	for _, line := range lines {
		if strings.HasPrefix(line, "{") && strings.HasSuffix(line, "}") {
			whole++
		}
	}
	if want := n - int(events) + 1; whole != want {
		t.Errorf("%d whole lines, want %d (%d emitted, %d lost, 1 after)", whole, want, n, events)
	}
	t.Logf("%d events lost, %d lines, %d whole", events, len(lines), whole)
	if len(lines) > whole+1 {
		t.Errorf("%d lines, %d whole: more than one torn", len(lines), whole)
	}
}

// TestNilLog: a nil *Log discards events and has lost nothing.
func TestNilLog(t *testing.T) {
	var l *Log
	l.Emit(CycleStartedEvent{})
	l.ReportTo(nil)
	if e, b := l.Lost(); e != 0 || b != 0 {
		t.Errorf("Lost() = %d, %d", e, b)
	}
}
