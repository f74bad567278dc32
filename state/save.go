package state

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"time"
)

// Saver writes saves into one segment with the protocol the Python client
// uses (state/segment.py's Segment.save), for Go ranks and for the tests that
// kill a saver in the middle. One Saver per segment at a time: the segment
// belongs to the one process that holds its rank.
type Saver struct {
	Path string
	Rank int32
	// SkipCRC leaves the payload's CRC to the reader (a shorter stall).
	SkipCRC bool
	// chunk, when > 0, writes the payload in pieces of this size and calls
	// beforeChunk before each (tests: a saver killed mid-write).
	chunk       int
	beforeChunk func(off int)
}

// growFactor is the slot room given above the payload that needed it, so
// that a state that grows a little does not re-create the segment.
const growNum, growDen = 5, 4

// slotRoom is the capacity of a new slot for a payload of n bytes: n × 1.25
// rounded up to 1 MiB.
func slotRoom(n int) uint64 {
	const mib = 1 << 20
	c := uint64(n) * growNum / growDen
	return (c + mib - 1) / mib * mib
}

// Save commits payload as the save of step. It never leaves the segment
// without a committed save: the slot it writes is the one not holding the
// newest save, unless the launcher's writer pinned that one (claim), and a
// segment too small is re-created whole beside the old one and renamed
// over it.
func (s *Saver) Save(step int64, payload []byte) (Desc, error) {
	start := time.Now()
	f, err := os.OpenFile(s.Path, os.O_RDWR, 0)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Desc{}, fmt.Errorf("open state segment: %w", err)
	}
	var ds [2]Desc
	var ok [2]bool
	if f != nil {
		defer f.Close()
		if ds, ok, err = readSlots(f); err != nil {
			return Desc{}, fmt.Errorf("state segment %s: %w", s.Path, err)
		}
	}
	newest := -1
	for i := range ds {
		if ok[i] && (newest < 0 || ds[i].Seq > ds[newest].Seq) {
			newest = i
		}
	}
	var seq uint64 = 1
	if newest >= 0 {
		seq = ds[newest].Seq + 1
	}
	d := Desc{Seq: seq, Step: step, Length: uint64(len(payload)), Rank: s.Rank}
	if !s.SkipCRC {
		d.PayloadCRC, d.Flags = crc32.ChecksumIEEE(payload), flagCRC
	}
	if f == nil || newest < 0 || ds[newest].Capacity < uint64(len(payload)) {
		return s.grow(d, payload, start)
	}
	d.Capacity = ds[newest].Capacity
	target, err := s.claim(f, ds, ok, newest)
	if err != nil {
		return Desc{}, err
	}
	d.Offset = HeaderSize + uint64(target)*d.Capacity
	if err := s.writePayload(f, payload, int64(d.Offset)); err != nil {
		return Desc{}, err
	}
	d.DurationNS = uint64(time.Since(start))
	if _, err := f.WriteAt(d.encode(), descOff[target]); err != nil {
		return Desc{}, fmt.Errorf("state segment %s: commit slot %d: %w", s.Path, target, err)
	}
	return d, nil
}

// claim returns the slot the save writes, its descriptor zeroed (from
// here it names no save): the slot not holding the newest save, or, when
// the launcher's writer pinned that one (it is copying that older save to
// a file), the newest's, so that a saver faster than a write-out never
// overwrites the save being written out; the pinned save stays committed
// throughout. The saver zeroes, then reads the pin; the writer pins, then
// reads the descriptor (pinSlot): one of them sees the other and backs
// off. The same protocol as the client's state/segment.py claim.
func (s *Saver) claim(f *os.File, ds [2]Desc, ok [2]bool, newest int) (int, error) {
	zero := make([]byte, DescSize)
	for try := 0; try < 4; try++ {
		target := 1 - newest
		if pin := readPin(f); pin != 0 && ok[target] && ds[target].Seq == pin {
			target = newest
		}
		raw := make([]byte, DescSize)
		if _, err := f.ReadAt(raw, descOff[target]); err != nil {
			return 0, fmt.Errorf("state segment %s: read slot %d: %w", s.Path, target, err)
		}
		if _, err := f.WriteAt(zero, descOff[target]); err != nil {
			return 0, fmt.Errorf("state segment %s: invalidate slot %d: %w", s.Path, target, err)
		}
		if !ok[target] || readPin(f) != ds[target].Seq {
			return target, nil
		}
		// Pinned meanwhile: the writer copies it, untouched.
		if _, err := f.WriteAt(raw, descOff[target]); err != nil {
			return 0, fmt.Errorf("state segment %s: give slot %d back: %w", s.Path, target, err)
		}
	}
	// The pin kept moving: the writer's check after its copy sees the slot
	// reused and copies the newest save again.
	target := 1 - newest
	if _, err := f.WriteAt(zero, descOff[target]); err != nil {
		return 0, fmt.Errorf("state segment %s: invalidate slot %d: %w", s.Path, target, err)
	}
	return target, nil
}

// grow creates a segment with room for payload, commits payload in its
// slot 0, and renames it over the old one (whose save stays readable until
// the rename).
func (s *Saver) grow(d Desc, payload []byte, start time.Time) (Desc, error) {
	tmp := s.Path + ".grow"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return Desc{}, fmt.Errorf("create state segment: %w", err)
	}
	defer f.Close()
	d.Capacity = slotRoom(len(payload))
	d.Offset = HeaderSize
	if err := f.Truncate(int64(HeaderSize + 2*d.Capacity)); err != nil {
		_ = os.Remove(tmp)
		return Desc{}, fmt.Errorf("size state segment to %d bytes: %w", HeaderSize+2*d.Capacity, err)
	}
	if _, err := f.WriteAt([]byte(Magic), 0); err != nil {
		_ = os.Remove(tmp)
		return Desc{}, fmt.Errorf("state segment %s: %w", tmp, err)
	}
	if err := s.writePayload(f, payload, HeaderSize); err != nil {
		_ = os.Remove(tmp)
		return Desc{}, err
	}
	d.DurationNS = uint64(time.Since(start))
	if _, err := f.WriteAt(d.encode(), descOff[0]); err != nil {
		_ = os.Remove(tmp)
		return Desc{}, fmt.Errorf("state segment %s: commit: %w", tmp, err)
	}
	if err := os.Rename(tmp, s.Path); err != nil {
		_ = os.Remove(tmp)
		return Desc{}, fmt.Errorf("state segment: %w", err)
	}
	return d, nil
}

func (s *Saver) writePayload(f *os.File, payload []byte, off int64) error {
	if s.chunk <= 0 {
		if _, err := f.WriteAt(payload, off); err != nil {
			return fmt.Errorf("state segment %s: write payload: %w", s.Path, err)
		}
		return nil
	}
	for i := 0; i < len(payload); i += s.chunk {
		if s.beforeChunk != nil {
			s.beforeChunk(i)
		}
		end := min(i+s.chunk, len(payload))
		if _, err := f.WriteAt(payload[i:end], off+int64(i)); err != nil {
			return fmt.Errorf("state segment %s: write payload: %w", s.Path, err)
		}
	}
	return nil
}
