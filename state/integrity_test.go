package state

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// flipPayload flips one bit in the middle of the newest save's payload, as
// a memory error would.
func flipPayload(t *testing.T, path string) Desc {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, err := Newest(f)
	if err != nil {
		t.Fatal(err)
	}
	off := int64(d.Offset + d.Length/2)
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestWriteOutRefusesDamagedSave: a save whose payload no longer matches
// its saver's CRC is not written out (the previous file stays, no
// temporary file is left); a save without the saver's CRC is written with
// a CRC computed at the write-out, and its file says so (no flagSaveCRC).
func TestWriteOutRefusesDamagedSave(t *testing.T) {
	for _, opened := range []string{"read-write", "read-only"} {
		t.Run(opened, func(t *testing.T) {
			seg := filepath.Join(t.TempDir(), "rank-0")
			dir := filepath.Join(t.TempDir(), "ckpt")
			open := func() *os.File {
				flag := os.O_RDWR
				if opened == "read-only" {
					flag = os.O_RDONLY
				}
				f, err := os.OpenFile(seg, flag, 0)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				return f
			}
			saveSeg(t, seg, 1, 300<<10)
			m1, ok, err := Persist(open(), dir, 0)
			if err != nil || !ok {
				t.Fatalf("first write-out: %v %v", ok, err)
			}
			if _, d := loadWritten(t, dir); d.Flags&flagSaveCRC == 0 {
				t.Fatalf("the file of a save with its saver's CRC has flags %#x, want flagSaveCRC", d.Flags)
			}
			saveSeg(t, seg, 2, 300<<10)
			bad := flipPayload(t, seg)
			_, ok, err = Persist(open(), dir, m1.Seq)
			var ce *CorruptError
			if ok || !errors.Is(err, ErrCorrupt) || !errors.As(err, &ce) || ce.Desc.Seq != bad.Seq || ce.Desc.Step != 2 {
				t.Fatalf("write-out of a damaged save: ok=%v err=%v, want ErrCorrupt naming save %d", ok, err, bad.Seq)
			}
			if m, _ := loadWritten(t, dir); m.Seq != m1.Seq {
				t.Fatalf("the manifest names seq %d after the refusal, want the previous %d", m.Seq, m1.Seq)
			}
			if tmp := tempFiles(t, dir); len(tmp) != 0 {
				t.Fatalf("temporary files left: %v", tmp)
			}
			// Without the saver's CRC nothing can tell the flip: the file
			// gets a CRC of the write-out, and no flagSaveCRC.
			if _, err := (&Saver{Path: seg, Rank: 5, SkipCRC: true}).Save(3, pattern(3, 300<<10)); err != nil {
				t.Fatal(err)
			}
			if _, ok, err := Persist(open(), dir, m1.Seq); !ok || err != nil {
				t.Fatalf("write-out of a save without CRC: %v %v", ok, err)
			}
			if _, d := loadWritten(t, dir); d.Step != 3 || d.Flags&flagSaveCRC != 0 {
				t.Fatalf("file of a save without CRC: step %d flags %#x, want step 3 without flagSaveCRC", d.Step, d.Flags)
			}
		})
	}
}

// TestStoreDamagedSaveNotWritten: the store records a damaged save once
// (state_corrupt by write-out, state_persist_failed, a verdict warning),
// keeps the previous file, does not retry that save at every due point,
// and writes the rank's next save as usual.
func TestStoreDamagedSaveNotWritten(t *testing.T) {
	var ev events
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := Open(Options{NLocal: 1, Dir: dir, ShmRoot: t.TempDir(), Every: Every{Saves: 1}, Poll: 10 * time.Millisecond, Emit: ev.record,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	seg := s.SegmentPath(0)
	saveSeg(t, seg, 1, 64<<10)
	waitFor(t, "the first write-out", func() bool { return ev.count(EventPersisted) == 1 })
	// A save whose bytes change after its CRC was computed and before its
	// commit: committed damaged, before the store can look at it.
	p := pattern(2, 64<<10)
	sv := &Saver{Path: seg, Rank: 5, chunk: 16 << 10, beforeChunk: func(off int) {
		if off == 16<<10 {
			p[40<<10] ^= 0x01
		}
	}}
	if _, err := sv.Save(2, p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the damaged save's state_corrupt", func() bool { return ev.count(EventCorrupt) == 1 })
	time.Sleep(150 * time.Millisecond) // 15 polls: not tried again
	if n := ev.count(EventCorrupt); n != 1 {
		t.Fatalf("%d state_corrupt events, want 1 (a damaged save is not retried)", n)
	}
	if n := ev.count(EventPersistFailed); n != 1 {
		t.Fatalf("%d state_persist_failed events, want 1", n)
	}
	c := ev.last(EventCorrupt)
	if c["by"] != "write-out" || c["source"] != string(SourceMemory) || c["step"] != float64(2) || c["seq"] != float64(2) {
		t.Fatalf("state_corrupt %v", c)
	}
	if m, d := loadWritten(t, dir); m.Step != 1 || d.Step != 1 {
		t.Fatalf("written step %d after the refusal, want 1", m.Step)
	}
	if w := s.Warnings(); len(w) != 1 {
		t.Fatalf("verdict warnings %q, want the refusal", w)
	}
	saveSeg(t, seg, 3, 64<<10)
	waitFor(t, "the next save written", func() bool { m, err := ReadManifest(dir, 5); return err == nil && m.Step == 3 })
}

// TestStoreRecordsDamagedLoad: the damaged sources a rank's load() passed
// over (its restore note's "rejected", as the client's state/restore.py writes it) become
// state_corrupt events naming what was used instead, and verdict warnings.
func TestStoreRecordsDamagedLoad(t *testing.T) {
	var ev events
	s, err := Open(Options{NLocal: 1, Dir: filepath.Join(t.TempDir(), "ckpt"), ShmRoot: t.TempDir(), Poll: 10 * time.Millisecond, Emit: ev.record,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	note := `{"local_rank":0,"rank":3,"round":1,"step":8,"source":"memory","load_ms":2,"at":"2026-12-05T06:00:00+00:00",` +
		`"rejected":[{"source":"memory","slot":1,"seq":10,"step":9,"error":"state payload: CRC 1234abcd, saved 0badf00d"},` +
		`{"source":"memory","slot":0,"seq":null,"step":null,"error":"its descriptor is damaged"}]}`
	if err := os.WriteFile(filepath.Join(s.ShmDir(), "restore-0-9-1.json"), []byte(note), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the note's events", func() bool { return ev.count(EventRestore) == 1 })
	if n := ev.count(EventCorrupt); n != 2 {
		t.Fatalf("%d state_corrupt events, want 2", n)
	}
	ev.mu.Lock()
	var got []eventlog.StateCorruptEvent
	for _, r := range ev.recs {
		if c, ok := r.(eventlog.StateCorruptEvent); ok {
			got = append(got, c)
		}
	}
	ev.mu.Unlock()
	c := got[0]
	if c.By != "load" || c.Rank != 3 || c.Source != SourceMemory || c.Slot == nil || *c.Slot != 1 || c.Seq == nil || *c.Seq != 10 ||
		c.Step == nil || *c.Step != 9 || c.UsedSource == nil || *c.UsedSource != SourceMemory || c.UsedStep == nil || *c.UsedStep != 8 {
		t.Fatalf("state_corrupt %+v", c)
	}
	if got[1].Seq != nil || got[1].Step != nil || got[1].Error != "its descriptor is damaged" {
		t.Fatalf("state_corrupt of a damaged descriptor %+v", got[1])
	}
	if w := s.Warnings(); len(w) != 2 {
		t.Fatalf("verdict warnings %q, want 2", w)
	}
}

// gatedWriter stands for a write-out slower than the rank's saves: the
// first write of every attempt (reset) returns only after the saver has
// committed 3 more saves, enough to reuse the slot being copied without a
// pin.
type gatedWriter struct {
	saves *atomic.Int64
	fresh bool
	n     int
}

func (g *gatedWriter) reset() error { g.fresh, g.n = true, 0; return nil }

func (g *gatedWriter) Write(p []byte) (int, error) {
	if g.fresh {
		g.fresh = false
		want := g.saves.Load() + 3
		deadline := time.Now().Add(30 * time.Second)
		for g.saves.Load() < want {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("the saver made no 3 saves in 30 s")
			}
			time.Sleep(time.Millisecond)
		}
	}
	g.n += len(p)
	return len(p), nil
}

// TestPinnedWriteOutSurvivesContinuousSaves: a write-out overtaken by 3
// saves of a rank that saves continuously completes at its first attempt
// when it pins the save it copies (the segment open for writing, as the
// store opens it), and the bytes it copied are that save's; without the
// pin (the segment read-only) every attempt is overtaken and it gives up,
// as every write-out did under continuous saves before the pin.
func TestPinnedWriteOutSurvivesContinuousSaves(t *testing.T) {
	for _, c := range []struct {
		name string
		flag int
	}{{"pinned", os.O_RDWR}, {"unpinned", os.O_RDONLY}} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0")
			const size = 2 << 20
			s := &Saver{Path: path, Rank: 5}
			if _, err := s.Save(0, pattern(0, size)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var saves atomic.Int64
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for step := int64(1); ctx.Err() == nil; step++ {
					if _, err := s.Save(step, pattern(step, size)); err != nil {
						t.Error(err)
						return
					}
					saves.Add(1)
				}
			}()
			defer func() { cancel(); wg.Wait() }()
			f, err := os.OpenFile(path, c.flag, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			g := &gatedWriter{saves: &saves}
			var attempts int
			var got []byte
			d, _, err := copyNewestBy(f, f, func() error { attempts++; got = got[:0]; return g.reset() }, func(d Desc) (uint32, error) {
				sum, err := copyMapped(f, d, io.MultiWriter(g, (*appendWriter)(&got)))
				return sum, err
			})
			if c.name == "unpinned" {
				if !errors.Is(err, errChanged) || attempts != 8 {
					t.Fatalf("without the pin: %d attempts, err %v; want 8 overtaken attempts (errChanged)", attempts, err)
				}
				return
			}
			if err != nil || attempts != 1 {
				t.Fatalf("with the pin: %d attempts, err %v; want 1 attempt that completes", attempts, err)
			}
			checkPattern(t, d, got)
			if readPin(f) != 0 {
				t.Fatal("the pin was left in place after the copy")
			}
			t.Logf("copied step %d while the rank committed %d saves", d.Step, saves.Load())
		})
	}
}

type appendWriter []byte

func (a *appendWriter) Write(p []byte) (int, error) { *a = append(*a, p...); return len(p), nil }

// TestPinLayout: the pin's bytes are the ones the client's state/segment.py reads and the
// client tests write (seq u64, CRC-32 of those 8 bytes u32, zero u32, at
// byte 192); a torn or damaged pin pins nothing.
func TestPinLayout(t *testing.T) {
	b := encodePin(0x0102030405060708)
	want := []byte{8, 7, 6, 5, 4, 3, 2, 1}
	c := crc32.ChecksumIEEE(want)
	want = append(want, byte(c), byte(c>>8), byte(c>>16), byte(c>>24), 0, 0, 0, 0)
	if !bytes.Equal(b, want) || pinOff != 192 || pinOff < descOff[1]+DescSize {
		t.Fatalf("pin %x at %d, want %x at 192 after the descriptors", b, pinOff, want)
	}
	seg := make([]byte, HeaderSize)
	copy(seg[pinOff:], b)
	if got := readPin(bytes.NewReader(seg)); got != 0x0102030405060708 {
		t.Fatalf("readPin %x", got)
	}
	seg[pinOff+3] ^= 1
	if got := readPin(bytes.NewReader(seg)); got != 0 {
		t.Fatalf("a damaged pin reads as %x, want 0 (none)", got)
	}
}

// TestReplicaRefusesDamagedSave: a save whose payload no longer matches
// its saver's CRC is not handed to a buddy (which would restore it under
// a fresh CRC): the stream is aborted, the buddy keeps its previous copy,
// the sender reports the damage, and the rank's next save is copied.
func TestReplicaRefusesDamagedSave(t *testing.T) {
	const n = 256 << 10
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 1, n)
	recv, _ := startReceiver(t, ReceiverOptions{})
	_, sev := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{})
	waitFor(t, "the first copy", func() bool { return copySeq(recv, "node-a", 4) == 1 })
	p := pattern(2, n)
	sv := &Saver{Path: filepath.Join(dir, "rank-0"), Rank: 4, chunk: 64 << 10, beforeChunk: func(off int) {
		if off == 64<<10 {
			p[200<<10] ^= 0x01 // after the CRC, before the commit: committed damaged
		}
	}}
	if _, err := sv.Save(2, p); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the damaged save refused", func() bool { return sev.with(EventReplicaFailed, "is damaged") > 0 })
	if s := copySeq(recv, "node-a", 4); s != 1 {
		t.Fatalf("the buddy holds seq %d, want the intact seq 1", s)
	}
	saveRank(t, dir, 0, 4, 3, n)
	waitFor(t, "the next save copied", func() bool { return copySeq(recv, "node-a", 4) == 3 })
}
