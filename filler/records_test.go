package filler

import (
	"context"
	"log/slog"
	"sync"
	"testing"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// TestReclaimedRecordFitsEventlog: the filler_reclaimed record handed to
// OnEvent fits eventlog's typed record, which ft-resumer report decodes for
// its reclaim marks.
func TestReclaimedRecordFitsEventlog(t *testing.T) {
	if EventReclaimed != eventlog.FillerReclaimed {
		t.Fatalf("filler kind %q, eventlog's %q", EventReclaimed, eventlog.FillerReclaimed)
	}
	dir := t.TempDir()
	var mu sync.Mutex
	var reclaimed []map[string]any
	ev := &events{}
	f := New(newReaper(t), Options{Command: "exec sleep 300", Dir: dir, LogPath: LogPath(dir), Logger: slog.New(slog.DiscardHandler),
		OnEvent: func(kind string, fields map[string]any) {
			ev.add(kind, fields)
			if kind == EventReclaimed {
				mu.Lock()
				defer mu.Unlock()
				reclaimed = append(reclaimed, fields)
			}
		}})
	defer f.Close()
	f.Park()
	waitUntil(t, "a start", func() bool { return ev.count(EventStarted) == 1 })
	if _, err := f.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(reclaimed) != 1 {
		t.Fatalf("%d %s records, want 1 (events %v)", len(reclaimed), EventReclaimed, ev.k)
	}
	if err := eventlog.CheckFields(EventReclaimed, reclaimed[0]); err != nil {
		t.Error(err)
	}
}
