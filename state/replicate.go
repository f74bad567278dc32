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
//	48 job id length u16, sender node length u16, message length u16, flags u16
//	56 job id, sender node, message (UTF-8)
//	   with flags&flagMAC: a 32-byte HMAC-SHA256 of the bytes above
//
// With a job secret (--job-secret-file) every frame carries flagMAC and its
// tag, keyed by macKey(secret, job), and a copy's trailer is followed by a
// second tag over the header's tag, the payload and the trailer, so that a
// peer without the secret can neither push a copy, fetch one, nor answer
// in a buddy's place. Without a secret the frames carry no tag and only
// the receiver's allowlist of the round's addresses protects it (auth.go).
//
// A copy: the sender sends a kindCopy header; the buddy answers kindAccept
// or kindRefuse (message: why: job or version mismatch, no memory; status
// refuseLater: not admitted now, try again later); after
// an accept the sender sends `length` payload bytes and an 8-byte trailer
// (CRC-32C u32, status u32: 0 complete, 1 aborted because the saver reused
// the slot during the stream), and the buddy answers kindOK or kindBad.
// A fetch: kindFetch naming node and rank, answered by kindNotFound or by a
// kindCopy header, the payload and a trailer (no accept step).

import (
	"bufio"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"time"
)

// Protocol constants.
const (
	ReplMagic   = "FTRP"
	ReplVersion = 2 // 2: flags and HMAC tags
	frameFixed  = 56
	trailerSize = 8
	macSize     = sha256.Size
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

// Frame flags.
const flagMAC = 1 // the frame is followed by its HMAC-SHA256 tag

// Refusal status (kindRefuse's Status).
const (
	refuseRank  = 0 // this rank's copies are refused (no memory): the sender stops sending it
	refuseFatal = 1 // the whole buddy (job, version, secret mismatch)
	refuseLater = 2 // not admitted now (not a member of the round this buddy knows, or over the size limit now): try again later
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
	Flags      uint16
	Job        string
	Node       string
	Msg        string
	// tag is the frame's HMAC tag as read (flagMAC), for the copy's
	// payload tag that chains to it.
	tag []byte
}

// ErrProtocol: the peer does not speak this protocol version or sent a
// malformed frame.
var ErrProtocol = errors.New("state replication protocol")

// encode returns the frame's bytes; with key, flagged and followed by its
// HMAC tag.
func (f frame) encode(key []byte) []byte {
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
	if key != nil {
		le.PutUint16(b[54:], f.Flags|flagMAC)
	} else {
		le.PutUint16(b[54:], f.Flags&^flagMAC)
	}
	b = append(b, job...)
	b = append(b, node...)
	b = append(b, msg...)
	if key != nil {
		b = append(b, frameMAC(key, b)...)
	}
	return b
}

// macKey is the key of a job's frame tags: the secret bound to the job, so
// that a frame of one job is no good in another that shares the secret.
func macKey(secret []byte, job string) []byte {
	if len(secret) == 0 {
		return nil
	}
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("ft-launcher state replication\x00"))
	m.Write([]byte(job))
	return m.Sum(nil)
}

func frameMAC(key, b []byte) []byte {
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(nil)
}

// payloadMAC starts the tag of a copy's payload and trailer, chained to
// its header's tag.
func payloadMAC(key, headerTag []byte) hash.Hash {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("payload"))
	m.Write(headerTag)
	return m
}

// ErrAuth: a frame's HMAC tag is missing, unexpected or wrong.
var ErrAuth = errors.New("state replication authentication")

func clip(s string) string {
	if len(s) > maxFrameString {
		return s[:maxFrameString]
	}
	return s
}

// readFrame reads one frame header. A bad magic or an over-long field is
// ErrProtocol; a version other than ReplVersion is returned with the frame
// (the caller answers it with a clear refusal). With key, a frame without
// a tag or with a wrong one is ErrAuth; without, a frame with a tag is.
func readFrame(r io.Reader, key []byte) (frame, error) {
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
		Length: le.Uint64(h[32:]), DurationNS: le.Uint64(h[40:]), Flags: le.Uint16(h[54:])}
	lj, ln, lm := int(le.Uint16(h[48:])), int(le.Uint16(h[50:])), int(le.Uint16(h[52:]))
	if lj > maxFrameString || ln > maxFrameString || lm > maxFrameString {
		return frame{}, fmt.Errorf("%w: frame strings of %d, %d, %d bytes (at most %d each)", ErrProtocol, lj, ln, lm, maxFrameString)
	}
	s := make([]byte, lj+ln+lm)
	if _, err := io.ReadFull(r, s); err != nil {
		return frame{}, fmt.Errorf("%w: frame cut short: %v", ErrProtocol, err)
	}
	f.Job, f.Node, f.Msg = string(s[:lj]), string(s[lj:lj+ln]), string(s[lj+ln:])
	if f.Version != ReplVersion {
		return f, nil // checkPeer refuses it by its version; its layout may differ
	}
	if f.Flags&flagMAC != 0 {
		f.tag = make([]byte, macSize)
		if _, err := io.ReadFull(r, f.tag); err != nil {
			return frame{}, fmt.Errorf("%w: frame tag cut short: %v", ErrProtocol, err)
		}
	}
	switch {
	case key != nil && f.tag == nil:
		return f, fmt.Errorf("%w: the peer sent a frame without a tag, and this launcher has a job secret (--job-secret-file): start every node of the job with the same secret", ErrAuth)
	case key == nil && f.tag != nil:
		return f, fmt.Errorf("%w: the peer authenticates its frames with a job secret, and this launcher has none (--job-secret-file): start every node of the job with the same secret", ErrAuth)
	case key != nil && !hmac.Equal(f.tag, frameMAC(key, append(h[:], s...))):
		return f, fmt.Errorf("%w: the frame's HMAC tag does not match (a peer with another job secret, or a forged or altered frame)", ErrAuth)
	}
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
// CRC-32C (and, with key, its tag) matches. A stream cut short is an error
// (the partial copy is the caller's to drop).
func readPayload(r io.Reader, f frame, key []byte) ([]byte, uint32, error) {
	p := make([]byte, f.Length)
	if _, err := io.ReadFull(r, p); err != nil {
		return nil, 0, fmt.Errorf("copy of rank %d seq %d cut short: %w", f.Rank, f.Seq, err)
	}
	var t [trailerSize]byte
	if _, err := io.ReadFull(r, t[:]); err != nil {
		return nil, 0, fmt.Errorf("copy of rank %d seq %d: trailer cut short: %w", f.Rank, f.Seq, err)
	}
	if key != nil {
		tag := make([]byte, macSize)
		if _, err := io.ReadFull(r, tag); err != nil {
			return nil, 0, fmt.Errorf("copy of rank %d seq %d: tag cut short: %w", f.Rank, f.Seq, err)
		}
		m := payloadMAC(key, f.tag)
		m.Write(p)
		m.Write(t[:])
		if !hmac.Equal(tag, m.Sum(nil)) {
			return nil, 0, fmt.Errorf("%w: copy of rank %d seq %d (%d bytes): the payload's HMAC tag does not match (forged or altered)", errPayloadAuth, f.Rank, f.Seq, f.Length)
		}
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
	// errPayloadAuth wraps ErrAuth: the caller answers it as a bad copy.
	errPayloadAuth = fmt.Errorf("%w: payload", ErrAuth)
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

// writeCopy sends c as a kindCopy header, its payload and a trailer
// (with key, each tagged).
func writeCopy(w *bufio.Writer, job string, key []byte, c *Copy) error {
	f := frame{Kind: kindCopy, Job: job, Node: c.Node, Rank: c.Rank, Step: c.Step, Seq: c.Seq,
		Length: uint64(len(c.Payload)), CRC: c.CRC32C, DurationNS: uint64(c.Duration)}
	hb := f.encode(key)
	if _, err := w.Write(hb); err != nil {
		return err
	}
	if _, err := w.Write(c.Payload); err != nil {
		return err
	}
	tr := trailer(c.CRC32C, trailerComplete)
	if _, err := w.Write(tr); err != nil {
		return err
	}
	if key != nil {
		m := payloadMAC(key, hb[len(hb)-macSize:])
		m.Write(c.Payload)
		m.Write(tr)
		if _, err := w.Write(m.Sum(nil)); err != nil {
			return err
		}
	}
	return w.Flush()
}
