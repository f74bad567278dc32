package nvrxwire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// MaxFrame is the largest frame payload accepted by default. Frames larger
// than this are rejected from their header alone, before any body is read.
const MaxFrame = 16 << 20

// ReadFrame reads one frame: a 4-byte big-endian length N followed by N bytes.
// A declared length above max (or above MaxFrame when max <= 0) is rejected
// without reading or allocating the body. A clean EOF before the header
// returns io.EOF; EOF inside the header or body returns io.ErrUnexpectedEOF.
func ReadFrame(r io.Reader, max int) ([]byte, error) {
	if max <= 0 || max > MaxFrame {
		max = MaxFrame
	}
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("nvrxwire: read frame header: %w", err)
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(max) {
		return nil, fmt.Errorf("nvrxwire: frame length %d exceeds limit %d", n, max)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("nvrxwire: read frame body (%d bytes): %w", n, err)
	}
	return buf, nil
}

// AppendFrame appends payload framed: its 4-byte big-endian length, then
// the payload. It is the one place nvrx frames are built.
func AppendFrame(dst, payload []byte) ([]byte, error) {
	if uint64(len(payload)) > math.MaxUint32 {
		return dst, fmt.Errorf("nvrxwire: frame payload of %d bytes does not fit a 32-bit length", len(payload))
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	return append(dst, payload...), nil
}

// WriteFrame writes the length header and payload with a single Write call,
// so concurrent writers on a stream socket never interleave half frames.
func WriteFrame(w io.Writer, payload []byte) error {
	buf, err := AppendFrame(make([]byte, 0, 4+len(payload)), payload)
	if err != nil {
		return err
	}
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("nvrxwire: write frame: %w", err)
	}
	return nil
}
