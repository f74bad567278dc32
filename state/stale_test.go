package state

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestRemoveStale: a launcher at its start removes the segments'
// directory of a store whose owner lock nobody holds any more (its
// launcher died without Close: here the lock is released as a SIGKILL
// releases it, and the directory carries this very process's pid, alive,
// so a pid check would keep it), and an old staging directory; it keeps a
// live store's directory, a young staging directory (a launcher in its
// set-up), and directories without a lock file (not a store's of this
// version) or of another name.
func TestRemoveStale(t *testing.T) {
	root := t.TempDir()
	open := func(ev *events) *Store {
		t.Helper()
		s, err := Open(Options{NLocal: 1, Dir: filepath.Join(t.TempDir(), "ckpt"), ShmRoot: root, Emit: ev.record, Logger: quietLog()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	live := open(&events{})
	saveSeg(t, live.SegmentPath(0), 1, 4096)
	dead := open(&events{})
	saveSeg(t, dead.SegmentPath(0), 1, 64<<10)
	// dead's launcher dies: its writer stops, the kernel drops its lock.
	dead.cancel()
	<-dead.done
	if err := dead.lock.Close(); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, age time.Duration, lock bool) string {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if lock {
			if err := os.WriteFile(filepath.Join(p, OwnerLockName), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chtimes(p, time.Now().Add(-age), time.Now().Add(-age)); err != nil {
			t.Fatal(err)
		}
		return p
	}
	legacy := mk(ShmDirPrefix+"1-legacy", time.Hour, false)
	other := mk("other", time.Hour, true)
	oldStage := mk(stagePrefix+"2-old", 2*staleStageAge, false)
	youngStage := mk(stagePrefix+"3-young", 0, true)

	var ev events
	fresh := open(&ev)
	gone := []string{dead.ShmDir(), oldStage}
	kept := []string{live.ShmDir(), legacy, other, youngStage, fresh.ShmDir()}
	for _, p := range gone {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s: not removed (%v)", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: removed or unreadable: %v", p, err)
		}
	}
	ev.mu.Lock()
	var dirs []string
	for _, r := range ev.recs {
		if e, ok := r.(eventlog.StateStaleRemovedEvent); ok {
			dirs = append(dirs, e.Dir)
			if e.Dir == dead.ShmDir() && (e.PID != os.Getpid() || e.Files != 1 || e.Bytes < 64<<10) {
				t.Errorf("removal of the dead store's directory recorded as %+v, want pid %d, 1 file of at least 64 KiB", e, os.Getpid())
			}
		}
	}
	ev.mu.Unlock()
	slices.Sort(dirs)
	slices.Sort(gone)
	if !slices.Equal(dirs, gone) {
		t.Errorf("%s events for %v, want %v", EventStaleRemoved, dirs, gone)
	}
	// The live store still works, its lock still held: a sweep leaves it.
	saveSeg(t, live.SegmentPath(0), 2, 4096)
	if got := RemoveStale(root, func(eventlog.Record) {}, quietLog()); len(got) != 0 {
		t.Errorf("a second sweep removed %v", got)
	}
}

// TestStoreBuddyRestoreSource: the first load of a round from a segment
// that RestoreRanks filled with a buddy's copy is recorded with source
// "buddy"; another local rank's load, a later load of that round, and a
// note of an earlier round stay "memory"; BuddyRestores lists the restore.
func TestStoreBuddyRestoreSource(t *testing.T) {
	var ev events
	s, err := Open(Options{NLocal: 2, Dir: filepath.Join(t.TempDir(), "ckpt"), ShmRoot: t.TempDir(), Poll: 10 * time.Millisecond,
		Emit: ev.record, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	b := BuddyRestore{Round: 2, LocalRank: 0, Rank: 4, Step: 20, Sender: "127.0.0.3/99"}
	s.BuddyRestored(b)
	notes := []struct {
		body string
		want eventlog.StateSource
	}{
		{`{"local_rank":0,"rank":4,"round":1,"step":20,"source":"memory","load_ms":1,"at":"2026-11-28T06:00:00Z"}`, SourceMemory}, // a late note of round 1
		{`{"local_rank":1,"rank":5,"round":2,"step":20,"source":"memory","load_ms":1,"at":"2026-11-28T06:00:01Z"}`, SourceMemory},
		{`{"local_rank":0,"rank":4,"round":2,"step":20,"source":"memory","load_ms":1,"at":"2026-11-28T06:00:02Z"}`, SourceBuddy},
		{`{"local_rank":0,"rank":4,"round":2,"step":20,"source":"memory","load_ms":1,"at":"2026-11-28T06:00:03Z"}`, SourceMemory}, // loaded again
	}
	for i, n := range notes {
		tmp, p := filepath.Join(s.ShmDir(), ".note.tmp"), filepath.Join(s.ShmDir(), "restore-x-"+string(rune('0'+i))+".json")
		if err := os.WriteFile(tmp, []byte(n.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil { // as the client does: never read half-written
			t.Fatal(err)
		}
		waitFor(t, "the note to be read", func() bool { return ev.count(EventRestore) == i+1 })
		ev.mu.Lock()
		got := ev.recs[len(ev.recs)-1].(eventlog.StateRestoreEvent)
		ev.mu.Unlock()
		if got.Source == nil || *got.Source != n.want {
			t.Errorf("note %d: source %v, want %s", i, got.Source, n.want)
		}
	}
	if got := s.BuddyRestores(); !slices.Equal(got, []BuddyRestore{b}) {
		t.Errorf("BuddyRestores %+v, want %+v", got, b)
	}
}
