// Package state is the launcher-owned store of the ranks' training state
// (docs/state.md): for every local rank a segment in shared memory that the
// rank saves into (ft_launcher_client.state.save) and that outlives the
// rank, so that the process which next holds the rank restores from memory;
// and a background writer that copies the newest committed save of each
// segment to the user's state directory with an atomic manifest; and the
// replication of the committed saves to buddy launchers over TCP, with a
// fetch that restores a lost node's ranks from a buddy (replicate.go).
//
// The segment layout is shared with the Python client
// (client/python/ft_launcher_client/state/format.py); both sides must agree on
// every offset below.
//
//	[0, 4096)       header: magic "FTSHM001", then two slot descriptors
//	                of 64 bytes at DescOff[0] and DescOff[1], then the
//	                writer's pin (16 bytes at pinOff)
//	[4096, …)       slot payloads, each at its descriptor's Offset with
//	                room for its descriptor's Capacity bytes
//
// A save writes the slot that does not hold the newest commit: it zeroes
// that slot's descriptor, writes the payload, then writes the descriptor
// (sequence = newest + 1) with a CRC of its own. A descriptor whose CRC does
// not match, or whose sequence is 0, names no save. So a rank killed at any
// instant leaves the previous save readable and the interrupted one
// invisible; no ordering of a shared header word is needed, because each
// slot's validity is decided by its own descriptor alone.
//
// The launcher's writer pins the save it copies to a file (pinSlot): the
// saver then writes its next saves into the other slot, even when that
// one holds the newest save, so that a rank saving faster than a
// write-out completes cannot starve it (a copy overtaken by two saves
// starts again).
package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
)

// Segment layout constants (mirrored in the client's state/format.py).
const (
	Magic      = "FTSHM001"
	HeaderSize = 4096
	DescSize   = 64
	// flagCRC: the descriptor's PayloadCRC is set (the client may skip the
	// checksum to cut its save stall; the writer then computes one).
	flagCRC = 1
	// flagSaveCRC, in a written-out file's flags: its CRC is the saver's,
	// checked against the payload before the file was written; without
	// it the CRC was computed at the write-out (the saver set none) and
	// vouches only for what the writer read.
	flagSaveCRC = 2
	// pinOff is the writer's pin: the seq u64 of the save it is copying
	// (0: none), the CRC-32 of those 8 bytes u32 (a torn or damaged pin
	// pins nothing), zero u32.
	pinOff  = 192
	pinSize = 16
)

// DescOff are the offsets of the two slot descriptors in the header.
var descOff = [2]int64{64, 128}

// Desc is one slot descriptor.
type Desc struct {
	Seq        uint64 // commit number; 0: empty or being written
	Step       int64  // the training step the caller saved
	Offset     uint64 // payload offset in the segment
	Length     uint64 // payload bytes
	Capacity   uint64 // room of the slot
	DurationNS uint64 // how long the save blocked the caller
	Rank       int32  // the global rank that saved it
	PayloadCRC uint32 // CRC-32 (IEEE) of the payload, when Flags&flagCRC
	Flags      uint32
}

// HasCRC reports whether the saver computed the payload's checksum.
func (d Desc) HasCRC() bool { return d.Flags&flagCRC != 0 }

// Duration is the caller's stall for this save.
func (d Desc) Duration() time.Duration { return time.Duration(d.DurationNS) }

// encode returns the 64 bytes of d, its own CRC last.
func (d Desc) encode() []byte {
	b := make([]byte, DescSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:], d.Seq)
	le.PutUint64(b[8:], uint64(d.Step))
	le.PutUint64(b[16:], d.Offset)
	le.PutUint64(b[24:], d.Length)
	le.PutUint64(b[32:], d.Capacity)
	le.PutUint64(b[40:], d.DurationNS)
	le.PutUint32(b[48:], uint32(d.Rank))
	le.PutUint32(b[52:], d.PayloadCRC)
	le.PutUint32(b[56:], d.Flags)
	le.PutUint32(b[60:], crc32.ChecksumIEEE(b[:60]))
	return b
}

// decodeDesc returns the descriptor in b and whether it names a committed
// save (its CRC matches and its sequence is not 0).
func decodeDesc(b []byte) (Desc, bool) {
	le := binary.LittleEndian
	if len(b) < DescSize || le.Uint32(b[60:]) != crc32.ChecksumIEEE(b[:60]) {
		return Desc{}, false
	}
	d := Desc{
		Seq: le.Uint64(b[0:]), Step: int64(le.Uint64(b[8:])), Offset: le.Uint64(b[16:]),
		Length: le.Uint64(b[24:]), Capacity: le.Uint64(b[32:]), DurationNS: le.Uint64(b[40:]),
		Rank: int32(le.Uint32(b[48:])), PayloadCRC: le.Uint32(b[52:]), Flags: le.Uint32(b[56:]),
	}
	if d.Seq == 0 || d.Length > d.Capacity || d.Offset < HeaderSize {
		return Desc{}, false
	}
	return d, true
}

// copyBuf is the size of the writer's reads and writes (CopyNewest).
const copyBuf = 1 << 20

// ErrEmpty: the segment holds no committed save.
var ErrEmpty = errors.New("no committed save")

// errChanged: the slot was overwritten while it was read (the caller retries).
var errChanged = errors.New("the slot was overwritten while it was read")

// readSlots returns both slot descriptors and which of them are committed.
// A segment shorter than its header holds nothing committed (a saver
// creates it whole before it renames it into place, so this is an empty
// file the launcher made).
func readSlots(r io.ReaderAt) (ds [2]Desc, ok [2]bool, err error) {
	h := make([]byte, HeaderSize)
	n, err := r.ReadAt(h, 0)
	if n < HeaderSize {
		if err == io.EOF || err == nil {
			return ds, ok, nil
		}
		return ds, ok, fmt.Errorf("read segment header: %w", err)
	}
	if string(h[:8]) != Magic {
		return ds, ok, fmt.Errorf("segment header: magic %q, want %q (not an ft-launcher state segment)", h[:8], Magic)
	}
	for i, off := range descOff {
		ds[i], ok[i] = decodeDesc(h[off : off+DescSize])
	}
	return ds, ok, nil
}

// readHeader returns the segment's committed descriptors, newest first
// (0, 1 or 2 of them).
func readHeader(r io.ReaderAt) ([]Desc, error) {
	ds, ok, err := readSlots(r)
	if err != nil {
		return nil, err
	}
	var out []Desc
	for i := range ds {
		if ok[i] {
			out = append(out, ds[i])
		}
	}
	if len(out) == 2 && out[1].Seq > out[0].Seq {
		out[0], out[1] = out[1], out[0]
	}
	return out, nil
}

// Newest returns the newest committed descriptor of the segment.
func Newest(r io.ReaderAt) (Desc, error) {
	ds, err := readHeader(r)
	if err != nil {
		return Desc{}, err
	}
	if len(ds) == 0 {
		return Desc{}, ErrEmpty
	}
	return ds[0], nil
}

// stillCommitted reports whether d is still a committed descriptor of r:
// a saver that reuses d's slot zeroes it first, so a payload read between
// two looks that both find d was not overwritten.
func stillCommitted(r io.ReaderAt, d Desc) (bool, error) {
	ds, err := readHeader(r)
	if err != nil {
		return false, err
	}
	for _, x := range ds {
		if x == d {
			return true, nil
		}
	}
	return false, nil
}

// CopyNewest copies the payload of the newest committed save to w and
// returns its descriptor and the payload's CRC-32 (IEEE, computed here and
// checked against the descriptor's when the saver set one). A slot
// overwritten during the copy is retried (a saver that outpaces the copy
// by two saves); w then receives the payload again, so w must be
// restartable: reset is called before every attempt.
func CopyNewest(r io.ReaderAt, w io.Writer, reset func() error) (Desc, uint32, error) {
	// 1 MiB a read and a write: with io.Copy's 32 KiB, a 256 MiB write-out
	// took 16,384 system calls, a good part of the writer's CPU time
	// (docs/benchmarks-history.md, "Save and restore speed").
	buf := make([]byte, copyBuf)
	return copyNewestBy(r, nil, reset, func(d Desc) (uint32, error) {
		h := crc32.NewIEEE()
		_, err := io.CopyBuffer(io.MultiWriter(w, h), io.NewSectionReader(r, int64(d.Offset), int64(d.Length)), buf)
		return h.Sum32(), err
	})
}

// ErrCorrupt: a committed save's payload does not match the CRC its saver
// computed (a bit flipped in memory since the save): it is not written out.
var ErrCorrupt = errors.New("the save is damaged")

// CorruptError is ErrCorrupt with the save it names.
type CorruptError struct {
	Desc       Desc   // the save's descriptor (PayloadCRC: what its saver computed)
	PayloadCRC uint32 // what its payload holds now
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("save %d (step %d) of rank %d is damaged: payload CRC %08x, its saver computed %08x (changed in memory since the save)",
		e.Desc.Seq, e.Desc.Step, e.Desc.Rank, e.PayloadCRC, e.Desc.PayloadCRC)
}

// Is makes errors.Is(err, ErrCorrupt) hold.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// errNoPin: the pin could not be written (the segment is open read-only).
var errNoPin = errors.New("cannot pin the save")

// encodePin is the pin naming save seq (0: none).
func encodePin(seq uint64) []byte {
	b := make([]byte, pinSize)
	binary.LittleEndian.PutUint64(b, seq)
	binary.LittleEndian.PutUint32(b[8:], crc32.ChecksumIEEE(b[:8]))
	return b
}

// readPin returns the seq of the pinned save, 0 when none (or when the pin
// is torn or damaged: the writer's own check covers that case).
func readPin(r io.ReaderAt) uint64 {
	b := make([]byte, pinSize)
	if n, _ := r.ReadAt(b, pinOff); n < pinSize {
		return 0
	}
	if binary.LittleEndian.Uint32(b[8:]) != crc32.ChecksumIEEE(b[:8]) {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

// pinSlot pins d (its seq) in the segment w (opened for writing) and
// checks that d is still committed; unpin removes the pin. The saver
// zeroes a slot's descriptor before it reads the pin, and the writer
// writes the pin before it reads the descriptor; both go through the
// kernel, whose locked instructions order each side's write before its
// read, so at least one of them sees the other's write: either the saver
// backs off the pinned slot (state/segment.py's claim, Saver.claim), or the
// writer finds the slot reused and picks the newest save again. ok is
// false when d was no longer committed (unpinned again); a pin that
// cannot be written (a read-only descriptor) is an error, and the caller
// copies without one.
func pinSlot(w io.WriterAt, r io.ReaderAt, d Desc) (ok bool, unpin func(), err error) {
	if _, err := w.WriteAt(encodePin(d.Seq), pinOff); err != nil {
		return false, nil, fmt.Errorf("%w: save %d: %w", errNoPin, d.Seq, err)
	}
	unpin = func() { _, _ = w.WriteAt(encodePin(0), pinOff) }
	ok, err = stillCommitted(r, d)
	if err != nil || !ok {
		unpin()
		return false, nil, err
	}
	return true, unpin, nil
}

// copyNewestBy is CopyNewest's loop with the slot's copy given: copySlot
// writes d's payload and returns its CRC-32. With pin set (r is the
// segment opened for writing too), each attempt pins the save it copies,
// so that a saver does not reuse its slot meanwhile; without, a saver that
// saves twice during the copy makes it start again (8 attempts).
func copyNewestBy(r io.ReaderAt, pin io.WriterAt, reset func() error, copySlot func(d Desc) (uint32, error)) (Desc, uint32, error) {
	const attempts = 8
	for i := 0; i < attempts; i++ {
		d, err := Newest(r)
		if err != nil {
			return Desc{}, 0, err
		}
		unpin := func() {}
		if pin != nil {
			ok, un, err := pinSlot(pin, r, d)
			switch {
			case errors.Is(err, errNoPin):
				pin = nil // not writable: copy without pins
			case err != nil:
				return Desc{}, 0, err
			case !ok:
				continue // reused before the pin held: the newest again
			default:
				unpin = un
			}
		}
		sum, ok, err := func() (uint32, bool, error) {
			defer unpin()
			if err := reset(); err != nil {
				return 0, false, err
			}
			sum, err := copySlot(d)
			if err != nil {
				return 0, false, fmt.Errorf("copy slot of save %d (step %d): %w", d.Seq, d.Step, err)
			}
			ok, err := stillCommitted(r, d)
			return sum, ok, err
		}()
		if err != nil {
			return Desc{}, 0, err
		}
		if !ok {
			continue
		}
		if d.HasCRC() && sum != d.PayloadCRC {
			return Desc{}, 0, &CorruptError{Desc: d, PayloadCRC: sum}
		}
		return d, sum, nil
	}
	return Desc{}, 0, fmt.Errorf("%w %d times in a row", errChanged, attempts)
}

// ReadNewest returns the newest committed save's descriptor and payload.
func ReadNewest(r io.ReaderAt) (Desc, []byte, error) {
	var buf sliceWriter
	d, _, err := CopyNewest(r, &buf, func() error { buf.b = buf.b[:0]; return nil })
	return d, buf.b, err
}

type sliceWriter struct{ b []byte }

func (s *sliceWriter) Write(p []byte) (int, error) { s.b = append(s.b, p...); return len(p), nil }
