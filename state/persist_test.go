package state

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// saveSeg saves step (a pattern payload of n bytes) into the segment at path.
func saveSeg(t *testing.T, path string, step int64, n int) {
	t.Helper()
	if _, err := (&Saver{Path: path, Rank: 5}).Save(step, pattern(step, n)); err != nil {
		t.Fatal(err)
	}
}

// loadWritten reads rank 5's written-out save through its manifest.
func loadWritten(t *testing.T, dir string) (Manifest, Desc) {
	t.Helper()
	m, err := ReadManifest(dir, 5)
	if err != nil {
		t.Fatal(err)
	}
	d, p, err := ReadFile(filepath.Join(dir, m.File))
	if err != nil {
		t.Fatal(err)
	}
	if d.Step != m.Step || d.Seq != m.Seq || d.PayloadCRC != m.CRC32 {
		t.Fatalf("manifest %+v names a file holding %+v", m, d)
	}
	checkPattern(t, d, p)
	return m, d
}

func tempFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}

func TestPersistAtomicAndReplaces(t *testing.T) {
	seg := filepath.Join(t.TempDir(), "rank-0")
	dir := filepath.Join(t.TempDir(), "ckpt")
	saveSeg(t, seg, 1, 100000)
	f, err := os.Open(seg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m1, ok, err := Persist(f, dir, 0)
	if err != nil || !ok {
		t.Fatalf("first write-out: %v %v", ok, err)
	}
	if _, d := loadWritten(t, dir); d.Step != 1 {
		t.Fatalf("written step %d", d.Step)
	}
	// Nothing new: nothing written.
	if _, ok, err := Persist(f, dir, m1.Seq); ok || err != nil {
		t.Fatalf("write-out of an already written save: %v %v", ok, err)
	}
	saveSeg(t, seg, 2, 120000)
	if _, ok, err := Persist(f, dir, m1.Seq); !ok || err != nil {
		t.Fatalf("second write-out: %v %v", ok, err)
	}
	if _, d := loadWritten(t, dir); d.Step != 2 {
		t.Fatalf("written step %d, want 2", d.Step)
	}
	if _, err := os.Stat(filepath.Join(dir, m1.File)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the replaced file %s is still there: %v", m1.File, err)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
}

// TestPersistDiskFull writes to a real 1 MiB tmpfs: a save that does not
// fit fails cleanly, the previous written save stays loadable and no
// temporary file stays.
func TestPersistDiskFull(t *testing.T) {
	dir := testenv.Tmpfs(t, "1m")
	seg := filepath.Join(t.TempDir(), "rank-0")
	saveSeg(t, seg, 1, 300<<10)
	f, err := os.Open(seg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m1, ok, err := Persist(f, dir, 0)
	if err != nil || !ok {
		t.Fatalf("first write-out: %v %v", ok, err)
	}
	saveSeg(t, seg, 2, 900<<10)
	_, ok, err = Persist(f, dir, m1.Seq)
	if !errors.Is(err, syscall.ENOSPC) || ok {
		t.Fatalf("write-out to a full disk: ok=%v err=%v, want ENOSPC", ok, err)
	}
	if m, _ := loadWritten(t, dir); m.Seq != m1.Seq {
		t.Fatalf("manifest after the failure names seq %d, want %d", m.Seq, m1.Seq)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
	// The save is still in memory.
	if d, p, err := ReadNewest(f); err != nil || d.Step != 2 {
		t.Fatalf("memory copy after the failure: %+v %v", d, err)
	} else {
		checkPattern(t, d, p)
	}
}

// TestPersistKilledMidWrite kills a real writer process with SIGKILL in
// the middle of a write-out, through a slowed reader and through the
// launcher's own path (a mapping of the segment): the previous manifest
// and its file stay, and the next write-out replaces them.
func TestPersistKilledMidWrite(t *testing.T) {
	tests := []struct {
		name, mode string
		size       int // of the save the killed writer writes out
		// killAt waits until the child is mid-write.
		killAt func(t *testing.T, dir string)
	}{
		{"slowed reader", "persist", 2 << 20, func(*testing.T, string) {}},
		{"from a mapping", "persist-mapped", 96 << 20, waitForTempData},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			seg := filepath.Join(t.TempDir(), "rank-0")
			dir := filepath.Join(t.TempDir(), "ckpt")
			saveSeg(t, seg, 1, 64<<10)
			f, err := os.Open(seg)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			m1, _, err := Persist(f, dir, 0)
			if err != nil {
				t.Fatal(err)
			}
			saveSeg(t, seg, 2, tc.size)
			cmd := startChild(t, tc.mode, seg, dir, "0")
			tc.killAt(t, dir)
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err == nil {
				t.Fatal("the writer finished before it was killed; the test proves nothing")
			}
			if m, _ := loadWritten(t, dir); m.Seq != m1.Seq {
				t.Fatalf("after the kill the manifest names seq %d, want %d", m.Seq, m1.Seq)
			}
			if len(tempFiles(t, dir)) == 0 {
				t.Fatal("the killed writer left no temporary file: it was not killed mid-write")
			}
			removeStaleTemps(dir)
			// The save of step 2 grew the segment: a new file took the path.
			f2, err := os.Open(seg)
			if err != nil {
				t.Fatal(err)
			}
			defer f2.Close()
			if _, ok, err := Persist(f2, dir, m1.Seq); !ok || err != nil {
				t.Fatalf("write-out after the kill: %v %v", ok, err)
			}
			if _, d := loadWritten(t, dir); d.Step != 2 {
				t.Fatalf("written step %d, want 2", d.Step)
			}
			if tmp := tempFiles(t, dir); len(tmp) != 0 {
				t.Fatalf("temporary files left: %v", tmp)
			}
		})
	}
}

// waitForTempData returns once a temporary file in dir holds data (a
// write-out is copying), failing after 30 s.
func waitForTempData(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				continue
			}
			if fi, err := e.Info(); err == nil && fi.Size() > 0 {
				return
			}
		}
		time.Sleep(200 * time.Microsecond)
	}
	t.Fatal("no write-out began within 30 s")
}

// events records what a store, sender or receiver emits: the typed
// records, and their fields as the event log has them (JSON numbers).
type events struct {
	mu   sync.Mutex
	got  []map[string]any // with "event": the kind
	recs []eventlog.Record
}

func (e *events) record(r eventlog.Record) {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	var f map[string]any
	if err := json.Unmarshal(b, &f); err != nil {
		panic(err)
	}
	f["event"] = r.Kind()
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, f)
	e.recs = append(e.recs, r)
}

func (e *events) count(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, f := range e.got {
		if f["event"] == kind {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStoreWritesEveryNSaves runs the background writer: saves are seen
// (state_save), written after every 2nd save, at once on Kick, at Close,
// and Close removes the segments.
func TestStoreWritesEveryNSaves(t *testing.T) {
	var ev events
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := Open(Options{NLocal: 2, Dir: dir, ShmRoot: t.TempDir(), Every: Every{Saves: 2}, Poll: 10 * time.Millisecond, Emit: ev.record})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close(context.Background())
		}
	})
	if env := strings.Join(s.Env(), " "); !strings.Contains(env, EnvShmDir+"="+s.ShmDir()) || !strings.Contains(env, EnvDir+"="+dir) {
		t.Fatalf("env %q", env)
	}
	seg := s.SegmentPath(1)
	saveSeg(t, seg, 1, 4096)
	waitFor(t, "the first save to be seen", func() bool { return ev.count(EventSave) == 1 })
	time.Sleep(100 * time.Millisecond) // ten polls: one save is not yet due
	if _, err := ReadManifest(dir, 5); err == nil {
		t.Fatal("written after one save, want every 2")
	}
	saveSeg(t, seg, 2, 4096)
	waitFor(t, "the 2nd save to be written", func() bool { _, err := ReadManifest(dir, 5); return err == nil })
	if _, d := loadWritten(t, dir); d.Step != 2 {
		t.Fatalf("written step %d", d.Step)
	}
	saveSeg(t, seg, 3, 4096)
	s.Kick("rank failed")
	waitFor(t, "the kicked write-out", func() bool { m, err := ReadManifest(dir, 5); return err == nil && m.Step == 3 })
	saveSeg(t, seg, 4, 4096)
	closed = true
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, d := loadWritten(t, dir); d.Step != 4 {
		t.Fatalf("after Close the written step is %d, want 4", d.Step)
	}
	if _, err := os.Stat(s.ShmDir()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("segments not removed: %v", err)
	}
	if n := ev.count(EventPersisted); n != 3 {
		t.Fatalf("%d write-outs recorded, want 3", n)
	}
}

// TestStoreUnwritableDir: a write-out that fails is an event and a
// warning; the save stays in memory and training never waits.
func TestStoreUnwritableDir(t *testing.T) {
	var ev events
	dir := testenv.Tmpfs(t, "64k")
	s, err := Open(Options{NLocal: 1, Dir: dir, ShmRoot: t.TempDir(), Every: Every{Saves: 1}, Poll: 10 * time.Millisecond, Emit: ev.record,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	saveSeg(t, s.SegmentPath(0), 1, 256<<10) // does not fit in 64 KiB
	waitFor(t, "the failure event", func() bool { return ev.count(EventPersistFailed) > 0 })
	w := s.Warnings()
	if len(w) == 0 || !strings.Contains(w[0], "no space left") {
		t.Fatalf("warnings %q", w)
	}
	f, err := os.Open(s.SegmentPath(0))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if d, p, err := ReadNewest(f); err != nil {
		t.Fatal(err)
	} else {
		checkPattern(t, d, p)
	}
}

// TestStoreRestoreNotes: the notes ranks' load() leave in the segments'
// directory become state_restore events (a load that found nothing has no
// source), and are removed; a note that does not parse is dropped.
func TestStoreRestoreNotes(t *testing.T) {
	var ev events
	s, err := Open(Options{NLocal: 2, Dir: filepath.Join(t.TempDir(), "ckpt"), ShmRoot: t.TempDir(), Poll: 10 * time.Millisecond, Emit: ev.record,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	notes := map[string]string{
		"restore-1-77-1.json": `{"local_rank":1,"rank":5,"round":2,"step":40,"source":"memory","load_ms":1.5,"at":"2026-11-28T06:00:00.123456+00:00"}`,
		"restore-0-78-1.json": `{"local_rank":0,"rank":4,"round":0,"step":null,"source":null,"load_ms":0.1,"at":"2026-11-28T06:00:00+00:00"}`,
		"restore-0-78-2.json": `{"local_rank":0,`,
		// A peer heal's note (ft_launcher_client.heal): the replacement's.
		"restore-1-79-1.json": `{"local_rank":1,"rank":7,"round":3,"step":24,"source":"peer","load_ms":3.9,"at":"2026-11-28T06:00:01+00:00","heal":"peer","bytes":18048,"from_rank":6}`,
	}
	for name, body := range notes {
		if err := os.WriteFile(filepath.Join(s.ShmDir(), name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the notes to be read", func() bool {
		left, _ := filepath.Glob(filepath.Join(s.ShmDir(), RestoreNotePattern))
		return len(left) == 0
	})
	if n := ev.count(EventRestore); n != 3 {
		t.Fatalf("%d state_restore events, want 3 (the unparsable note dropped)", n)
	}
	ev.mu.Lock()
	for _, r := range ev.recs {
		f := r.(eventlog.StateRestoreEvent)
		switch f.Rank {
		case 5:
			if f.Source == nil || *f.Source != SourceMemory || f.Step == nil || *f.Step != 40 || f.Round != 2 || f.LoadMS != 1.5 {
				t.Errorf("memory restore event %+v", f)
			}
		case 4:
			if f.Source != nil {
				t.Errorf("a load that found nothing has a source: %+v", f)
			}
			if f.Heal != "" || f.FromRank != nil {
				t.Errorf("a plain load has heal fields: %+v", f)
			}
		case 7:
			if f.Source == nil || *f.Source != "peer" || f.Heal != "peer" || f.FromRank == nil || *f.FromRank != 6 || f.Bytes != 18048 {
				t.Errorf("peer heal restore event %+v", f)
			}
		}
	}
	ev.mu.Unlock()
}
