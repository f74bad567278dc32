package state

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
)

// The written-out format (docs/state.md; ft_launcher_client.state.load_file
// reads it): per rank a data file and a manifest naming it.
//
//	<dir>/rank-<R>.json                       manifest (atomic: temp, fsync, rename, fsync dir)
//	<dir>/rank-<R>-seq-<Q>.ftstate            64-byte file header + the payload as saved
//
// File header (little endian): magic "FTSTATE1", version u32, flags u32,
// step i64, length u64, payload CRC-32 (IEEE) u32, rank i32, seq u64,
// the save's duration in ns u64, zero padding to 64 bytes. Flags: 1 (the
// CRC is set), 2 (the CRC is the saver's, and the payload was checked
// against it before it was written; without it the saver set none and the
// CRC was computed as the file was written: it vouches for the disk, not
// for the memory the payload was read from).
const (
	FileMagic      = "FTSTATE1"
	FileHeaderSize = 64
	FileVersion    = 1
	// ManifestFormat is the manifest's "format" value.
	ManifestFormat = "ft-launcher-state/1"
)

// Manifest names a rank's newest written save.
type Manifest struct {
	Format     string    `json:"format"`
	Rank       int32     `json:"rank"`
	Step       int64     `json:"step"`
	Seq        uint64    `json:"seq"`
	Bytes      uint64    `json:"bytes"`
	CRC32      uint32    `json:"crc32"`
	File       string    `json:"file"` // relative to the manifest's directory
	WrittenAt  time.Time `json:"written_at"`
	SaveMillis float64   `json:"save_ms"` // the caller's stall for this save
}

// ManifestPath is rank's manifest in dir.
func ManifestPath(dir string, rank int32) string {
	return filepath.Join(dir, fmt.Sprintf("rank-%d.json", rank))
}

func dataName(rank int32, seq uint64) string {
	return fmt.Sprintf("rank-%d-seq-%d.ftstate", rank, seq)
}

func fileHeader(d Desc, crc uint32) []byte {
	b := make([]byte, FileHeaderSize)
	le := binary.LittleEndian
	copy(b, FileMagic)
	le.PutUint32(b[8:], FileVersion)
	flags := uint32(flagCRC)
	if d.HasCRC() { // the saver's CRC, which the copy was checked against (copyNewestBy)
		flags |= flagSaveCRC
	}
	le.PutUint32(b[12:], flags)
	le.PutUint64(b[16:], uint64(d.Step))
	le.PutUint64(b[24:], d.Length)
	le.PutUint32(b[32:], crc)
	le.PutUint32(b[36:], uint32(d.Rank))
	le.PutUint64(b[40:], d.Seq)
	le.PutUint64(b[48:], d.DurationNS)
	return b
}

// ReadFile reads a data file written by Persist (or by the Python client's
// fallback) and checks its length and CRC.
func ReadFile(path string) (Desc, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Desc{}, nil, fmt.Errorf("read state file: %w", err)
	}
	if len(b) < FileHeaderSize || string(b[:8]) != FileMagic {
		return Desc{}, nil, fmt.Errorf("state file %s: not an ft-launcher state file (magic %q)", path, b[:min(8, len(b))])
	}
	le := binary.LittleEndian
	d := Desc{Step: int64(le.Uint64(b[16:])), Length: le.Uint64(b[24:]), PayloadCRC: le.Uint32(b[32:]),
		Rank: int32(le.Uint32(b[36:])), Seq: le.Uint64(b[40:]), DurationNS: le.Uint64(b[48:]), Flags: le.Uint32(b[12:]) | flagCRC}
	if v := le.Uint32(b[8:]); v != FileVersion {
		return Desc{}, nil, fmt.Errorf("state file %s: version %d, this launcher reads %d", path, v, FileVersion)
	}
	p := b[FileHeaderSize:]
	if uint64(len(p)) != d.Length {
		return Desc{}, nil, fmt.Errorf("state file %s: %d payload bytes, header says %d (truncated)", path, len(p), d.Length)
	}
	if c := crc32.ChecksumIEEE(p); c != d.PayloadCRC {
		return Desc{}, nil, fmt.Errorf("state file %s: payload CRC %08x, header says %08x (corrupt)", path, c, d.PayloadCRC)
	}
	return d, p, nil
}

// ReadManifest reads rank's manifest in dir.
func ReadManifest(dir string, rank int32) (Manifest, error) {
	var m Manifest
	b, err := os.ReadFile(ManifestPath(dir, rank))
	if err != nil {
		return m, fmt.Errorf("read state manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("state manifest %s: %w", ManifestPath(dir, rank), err)
	}
	if m.Format != ManifestFormat {
		return m, fmt.Errorf("state manifest %s: format %q, want %q", ManifestPath(dir, rank), m.Format, ManifestFormat)
	}
	return m, nil
}

// tmpPrefix starts the name of every temporary file Persist makes, so that
// the leftovers of a writer killed mid-write are recognised and removed.
const tmpPrefix = ".ftstate-"

// Persist writes the segment's newest committed save to dir: the data file
// (temporary name, fsync, rename), then the manifest (atomically, the
// directory fsynced), then it removes the data file the previous manifest
// named. A crash or a full disk at any point leaves the previous manifest
// and the file it names intact. prev is the seq already written for this
// segment: Persist writes nothing (and returns ok=false) when the newest
// save is not newer.
func Persist(seg io.ReaderAt, dir string, prev uint64) (m Manifest, ok bool, err error) {
	return PersistContext(context.Background(), seg, dir, prev)
}

// PersistContext is Persist, abandoned (the temporary file removed, the
// previous manifest kept) when ctx ends before the data file is complete:
// the store cancels a periodic write-out when an urgent one is asked for.
func PersistContext(ctx context.Context, seg io.ReaderAt, dir string, prev uint64) (m Manifest, ok bool, err error) {
	d, err := Newest(seg)
	if err != nil {
		return m, false, err
	}
	if d.Seq <= prev {
		return m, false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return m, false, fmt.Errorf("state directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, tmpPrefix+"*.tmp")
	if err != nil {
		return m, false, fmt.Errorf("state directory %s: %w", dir, err)
	}
	fail := func(err error) (Manifest, bool, error) {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return Manifest{}, false, err
	}
	reset := func() error {
		if err := tmp.Truncate(0); err != nil {
			return err
		}
		_, err := tmp.Seek(FileHeaderSize, io.SeekStart)
		return err
	}
	var crc uint32
	if f, isFile := seg.(*os.File); isFile { // the segment itself: copied from a mapping
		d, crc, err = copyNewestMapped(f, ctxWriter{ctx, tmp}, reset)
	} else {
		d, crc, err = CopyNewest(seg, ctxWriter{ctx, tmp}, reset)
	}
	if err != nil {
		return fail(fmt.Errorf("write state of rank to %s: %w", tmp.Name(), err))
	}
	if err := ctx.Err(); err != nil {
		return fail(fmt.Errorf("write state file: %w", err))
	}
	if _, err := tmp.WriteAt(fileHeader(d, crc), 0); err != nil {
		return fail(fmt.Errorf("write state file header: %w", err))
	}
	if err := tmp.Sync(); err != nil {
		return fail(fmt.Errorf("fsync state file: %w", err))
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return Manifest{}, false, fmt.Errorf("close state file: %w", err)
	}
	name := dataName(d.Rank, d.Seq)
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		_ = os.Remove(tmp.Name())
		return Manifest{}, false, fmt.Errorf("state file: %w", err)
	}
	old, oldErr := ReadManifest(dir, d.Rank)
	m = Manifest{Format: ManifestFormat, Rank: d.Rank, Step: d.Step, Seq: d.Seq, Bytes: d.Length, CRC32: crc,
		File: name, WrittenAt: time.Now().UTC(), SaveMillis: float64(d.DurationNS) / 1e6}
	js, _ := json.MarshalIndent(m, "", "  ")
	if err := atomicfile.Write(ManifestPath(dir, d.Rank), append(js, '\n'), 0o644); err != nil {
		_ = os.Remove(filepath.Join(dir, name))
		return Manifest{}, false, fmt.Errorf("state manifest: %w", err)
	}
	if oldErr == nil && old.File != name && !strings.ContainsRune(old.File, os.PathSeparator) {
		if err := os.Remove(filepath.Join(dir, old.File)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return m, true, fmt.Errorf("remove the previous state file: %w", err)
		}
	}
	return m, true, nil
}

// ctxWriter is w, failing with ctx's error once ctx ends (checked before
// each write: CopyNewest writes 1 MiB at a time).
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(p)
}

// removeStaleTemps removes the temporary files a killed writer left in dir.
func removeStaleTemps(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) && strings.HasSuffix(e.Name(), ".tmp") {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
