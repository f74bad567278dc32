package filler

import (
	"context"
	"log/slog"
	"testing"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// TestRecords: a park and a reclaim hand OnEvent a filler_started record
// of the command's start and a filler_reclaimed record with the time the
// reclaim took (ft-resumer report decodes it for its reclaim marks).
func TestRecords(t *testing.T) {
	dir := t.TempDir()
	ev := &events{}
	f := New(newReaper(t), Options{Command: "exec sleep 300", Dir: dir, LogPath: LogPath(dir), Logger: slog.New(slog.DiscardHandler),
		OnEvent: ev.add})
	defer f.Close()
	f.Park()
	waitUntil(t, "a start", func() bool { return ev.count(EventStarted) == 1 })
	if _, err := f.Reclaim(context.Background()); err != nil {
		t.Fatal(err)
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var started []eventlog.FillerStartedEvent
	var reclaimed []eventlog.FillerReclaimedEvent
	for _, r := range ev.recs {
		switch r := r.(type) {
		case eventlog.FillerStartedEvent:
			started = append(started, r)
		case eventlog.FillerReclaimedEvent:
			reclaimed = append(reclaimed, r)
		}
	}
	if len(started) != 1 || started[0].PID <= 0 || started[0].Start != 1 || started[0].Command != "exec sleep 300" || started[0].Log != LogPath(dir) {
		t.Errorf("started records %+v, want one of the first start of the command", started)
	}
	if len(reclaimed) != 1 || reclaimed[0].TookMS <= 0 {
		t.Errorf("reclaimed records %+v, want one with the time it took (events %v)", reclaimed, ev.k)
	}
}
