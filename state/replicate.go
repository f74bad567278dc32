package state

// Replication to buddy nodes (docs/state.md, "Replication to buddy
// nodes"): a launcher streams its ranks' committed saves over TCP to K
// buddy launchers, reading them from the segments as the writer does, so
// the training process takes no part. A buddy keeps, per (sender node,
// rank), the newest complete copy and at most one copy in flight; a copy
// becomes complete only once its length and its CRC-32C (sent in a
// trailer after the payload) verify, so a sender that dies mid-stream
// leaves nothing restorable and the previous complete copy stands.
//
// Every message starts with the same frame header:
//
//	 0 magic "FTRP"      4 version u16     6 kind u8       7 status u8
//	 8 rank i32         12 crc u32 (fetch replies; copies put it in the trailer)
//	16 step i64         24 seq u64        32 length u64   40 save duration ns u64
//	48 job id length u16, sender node length u16, message length u16, 0 u16
//	56 job id, sender node, message (UTF-8)
//
// A copy: the sender sends a kindCopy header; the buddy answers kindAccept
// or kindRefuse (message: why: job or version mismatch, no memory); after
// an accept the sender sends `length` payload bytes and an 8-byte trailer
// (CRC-32C u32, status u32: 0 complete, 1 aborted because the saver reused
// the slot during the stream), and the buddy answers kindOK or kindBad.
// A fetch: kindFetch naming node and rank, answered by kindNotFound or by a
// kindCopy header, the payload and a trailer (no accept step).

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"time"
)

// Protocol constants.
const (
	ReplMagic   = "FTRP"
	ReplVersion = 1
	frameFixed  = 56
	trailerSize = 8
	// maxFrameString bounds the job id, node id and message, so that a
	// stray connection cannot make the receiver allocate much.
	maxFrameString = 4096
	// MaxCopyBytes bounds one copy's payload (1 TiB), for the same reason.
	MaxCopyBytes = 1 << 40
)

// Frame kinds.
const (
	kindCopy     = 1
	kindAccept   = 2
	kindRefuse   = 3
	kindOK       = 4
	kindBad      = 5
	kindFetch    = 6
	kindNotFound = 7
)

// Trailer status.
const (
	trailerComplete = 0
	trailerAborted  = 1
)

// castagnoli is the CRC-32C table of the replication checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frame is one protocol message header.
type frame struct {
	Version    uint16
	Kind       uint8
	Status     uint8
	Rank       int32
	CRC        uint32
	Step       int64
	Seq        uint64
	Length     uint64
	DurationNS uint64
	Job        string
	Node       string
	Msg        string
}

// ErrProtocol: the peer does not speak this protocol version or sent a
// malformed frame.
var ErrProtocol = errors.New("state replication protocol")

func (f frame) encode() []byte {
	job, node, msg := clip(f.Job), clip(f.Node), clip(f.Msg)
	b := make([]byte, frameFixed, frameFixed+len(job)+len(node)+len(msg))
	le := binary.LittleEndian
	copy(b, ReplMagic)
	v := f.Version
	if v == 0 {
		v = ReplVersion
	}
	le.PutUint16(b[4:], v)
	b[6], b[7] = f.Kind, f.Status
	le.PutUint32(b[8:], uint32(f.Rank))
	le.PutUint32(b[12:], f.CRC)
	le.PutUint64(b[16:], uint64(f.Step))
	le.PutUint64(b[24:], f.Seq)
	le.PutUint64(b[32:], f.Length)
	le.PutUint64(b[40:], f.DurationNS)
	le.PutUint16(b[48:], uint16(len(job)))
	le.PutUint16(b[50:], uint16(len(node)))
	le.PutUint16(b[52:], uint16(len(msg)))
	b = append(b, job...)
	b = append(b, node...)
	return append(b, msg...)
}

func clip(s string) string {
	if len(s) > maxFrameString {
		return s[:maxFrameString]
	}
	return s
}

// readFrame reads one frame header. A bad magic or an over-long field is
// ErrProtocol; a version other than ReplVersion is returned with the frame
// (the caller answers it with a clear refusal).
func readFrame(r io.Reader) (frame, error) {
	var h [frameFixed]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return frame{}, err
	}
	if string(h[:4]) != ReplMagic {
		return frame{}, fmt.Errorf("%w: magic %q, want %q (not an ft-launcher state replica peer)", ErrProtocol, h[:4], ReplMagic)
	}
	le := binary.LittleEndian
	f := frame{Version: le.Uint16(h[4:]), Kind: h[6], Status: h[7], Rank: int32(le.Uint32(h[8:])),
		CRC: le.Uint32(h[12:]), Step: int64(le.Uint64(h[16:])), Seq: le.Uint64(h[24:]),
		Length: le.Uint64(h[32:]), DurationNS: le.Uint64(h[40:])}
	lj, ln, lm := int(le.Uint16(h[48:])), int(le.Uint16(h[50:])), int(le.Uint16(h[52:]))
	if lj > maxFrameString || ln > maxFrameString || lm > maxFrameString {
		return frame{}, fmt.Errorf("%w: frame strings of %d, %d, %d bytes (at most %d each)", ErrProtocol, lj, ln, lm, maxFrameString)
	}
	s := make([]byte, lj+ln+lm)
	if _, err := io.ReadFull(r, s); err != nil {
		return frame{}, fmt.Errorf("%w: frame cut short: %v", ErrProtocol, err)
	}
	f.Job, f.Node, f.Msg = string(s[:lj]), string(s[lj:lj+ln]), string(s[lj+ln:])
	if f.Length > MaxCopyBytes {
		return frame{}, fmt.Errorf("%w: a copy of %d bytes (at most %d)", ErrProtocol, f.Length, uint64(MaxCopyBytes))
	}
	return f, nil
}

// checkPeer returns why a peer's frame does not belong to this job and
// protocol version, or nil.
func checkPeer(f frame, job string) error {
	if f.Version != ReplVersion {
		return fmt.Errorf("%w: peer speaks version %d, this launcher speaks %d (run the same ft-launcher version on every node)", ErrProtocol, f.Version, ReplVersion)
	}
	if f.Job != job {
		return fmt.Errorf("%w: peer belongs to job %q, this launcher to job %q", ErrProtocol, f.Job, job)
	}
	return nil
}

func trailer(crc uint32, status uint32) []byte {
	b := make([]byte, trailerSize)
	binary.LittleEndian.PutUint32(b, crc)
	binary.LittleEndian.PutUint32(b[4:], status)
	return b
}

// readPayload reads a copy's payload of f.Length bytes and its trailer,
// and returns the payload once the trailer says it is complete and its
// CRC-32C matches. A stream cut short is an error (the partial copy is
// the caller's to drop).
func readPayload(r io.Reader, f frame) ([]byte, uint32, error) {
	p := make([]byte, f.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, 0, fmt.Errorf("copy of rank %d seq %d cut short: %w", f.Rank, f.Seq, err)
	}
	var t [trailerSize]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return nil, 0, fmt.Errorf("copy of rank %d seq %d: trailer cut short: %w", f.Rank, f.Seq, err)
	}
	crc, status := binary.LittleEndian.Uint32(t[:]), binary.LittleEndian.Uint32(t[4:])
	if status != trailerComplete {
		return nil, 0, errAborted
	}
	if got := crc32.Checksum(p, castagnoli); got != crc {
		return nil, 0, fmt.Errorf("%w: copy of rank %d seq %d (%d bytes): CRC-32C %08x, sender says %08x", errChecksum, f.Rank, f.Seq, f.Length, got, crc)
	}
	return p, crc, nil
}

var (
	errAborted  = errors.New("the sender aborted the copy (the rank saved again into that slot during the stream)")
	errChecksum = errors.New("checksum mismatch")
)

// Copy is a verified replica of one rank's save.
type Copy struct {
	Node     string // the launcher that sent it
	Rank     int32  // the global rank that saved it
	Step     int64
	Seq      uint64
	CRC32C   uint32
	Duration time.Duration // the rank's save stall
	Received time.Time
	Payload  []byte // never modified once the copy is complete
}

// writeCopy sends c as a kindCopy header, its payload and a trailer.
func writeCopy(w *bufio.Writer, job string, c *Copy) error {
	f := frame{Kind: kindCopy, Job: job, Node: c.Node, Rank: c.Rank, Step: c.Step, Seq: c.Seq,
		Length: uint64(len(c.Payload)), CRC: c.CRC32C, DurationNS: uint64(c.Duration)}
	if _, err := w.Write(f.encode()); err != nil {
		return err
	}
	if _, err := w.Write(c.Payload); err != nil {
		return err
	}
	if _, err := w.Write(trailer(c.CRC32C, trailerComplete)); err != nil {
		return err
	}
	return w.Flush()
}
