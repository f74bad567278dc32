package nvrxwire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// countingWriter records each Write call.
type countingWriter struct{ calls [][]byte }

func (w *countingWriter) Write(p []byte) (int, error) {
	w.calls = append(w.calls, append([]byte(nil), p...))
	return len(p), nil
}

// failingReader fails the test if anything past the header is read.
type headerOnly struct {
	hdr []byte
	t   *testing.T
}

func (r *headerOnly) Read(p []byte) (int, error) {
	if len(r.hdr) == 0 {
		r.t.Error("body was read for an oversized frame")
		return 0, io.EOF
	}
	n := copy(p, r.hdr)
	r.hdr = r.hdr[n:]
	return n, nil
}

func TestWriteFrameSingleWrite(t *testing.T) {
	w := &countingWriter{}
	payload := EncodeBytesOK()
	if err := WriteFrame(w, payload); err != nil {
		t.Fatal(err)
	}
	if len(w.calls) != 1 {
		t.Fatalf("%d Write calls, want 1", len(w.calls))
	}
	want := append([]byte{0, 0, 0, byte(len(payload))}, payload...)
	if !bytes.Equal(w.calls[0], want) {
		t.Fatalf("wrote % x, want % x", w.calls[0], want)
	}
}

// TestAppendFrame: the header is the big-endian payload length, and
// ReadFrame reads back what AppendFrame built, after what dst held.
func TestAppendFrame(t *testing.T) {
	tests := []struct {
		name    string
		dst     []byte
		payload []byte
		header  []byte
	}{
		{"empty", nil, nil, []byte{0, 0, 0, 0}},
		{"ok message", nil, EncodeBytesOK(), []byte{0, 0, 0, byte(len(EncodeBytesOK()))}},
		{"after other bytes", []byte("xy"), []byte("abc"), []byte{0, 0, 0, 3}},
		{"length over 255", nil, bytes.Repeat([]byte{7}, 70000), []byte{0, 1, 0x11, 0x70}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := AppendFrame(bytes.Clone(tc.dst), tc.payload)
			if err != nil {
				t.Fatal(err)
			}
			want := append(append(bytes.Clone(tc.dst), tc.header...), tc.payload...)
			if !bytes.Equal(got, want) {
				t.Fatalf("AppendFrame = % x..., want % x...", got[:min(len(got), 8)], want[:min(len(want), 8)])
			}
			back, err := ReadFrame(bytes.NewReader(got[len(tc.dst):]), 0)
			if err != nil || !bytes.Equal(back, tc.payload) {
				t.Errorf("ReadFrame = %d bytes, %v", len(back), err)
			}
		})
	}
}

func TestReadFrameErrors(t *testing.T) {
	hdr := func(n uint32) []byte { return binary.BigEndian.AppendUint32(nil, n) }
	tests := []struct {
		name    string
		in      []byte
		max     int
		wantErr string
		is      error
	}{
		{"clean EOF", nil, 0, "", io.EOF},
		{"short header", []byte{0, 0}, 0, "header", io.ErrUnexpectedEOF},
		{"truncated body", append(hdr(10), "abc"...), 0, "read frame body (10 bytes)", io.ErrUnexpectedEOF},
		{"over explicit max", append(hdr(100), make([]byte, 100)...), 99, "frame length 100 exceeds limit 99", nil},
		{"over MaxFrame", hdr(MaxFrame + 1), 0, "exceeds limit", nil},
		{"max above MaxFrame is clamped", hdr(MaxFrame + 1), 1 << 30, "exceeds limit 16777216", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tt.in), tt.max)
			if err == nil {
				t.Fatal("no error")
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("error %v is not %v", err, tt.is)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %q does not contain %q", err, tt.wantErr)
			}
		})
	}
	t.Run("oversized length is rejected from the header alone", func(t *testing.T) {
		if _, err := ReadFrame(&headerOnly{hdr: hdr(0xFFFFFFFF), t: t}, 0); err == nil {
			t.Fatal("no error")
		}
	})
	t.Run("empty frame", func(t *testing.T) {
		b, err := ReadFrame(bytes.NewReader(hdr(0)), 0)
		if err != nil || len(b) != 0 {
			t.Fatalf("got %v, %v", b, err)
		}
	})
}

// TestFramesOverUnixSocket streams every golden payload over a real Unix
// socket, as a Python client does, and decodes each on the server side.
func TestFramesOverUnixSocket(t *testing.T) {
	vectors := loadGolden(t)
	sock := filepath.Join(t.TempDir(), "rmon.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		n := 0
		for {
			p, err := ReadFrame(conn, MaxFrame)
			if errors.Is(err, io.EOF) {
				done <- result{n: n}
				return
			}
			if err != nil {
				done <- result{n: n, err: err}
				return
			}
			if _, err := Decode(p); err != nil {
				done <- result{n: n, err: err}
				return
			}
			n++
			if err := WriteFrame(conn, EncodeOkMsg(nil)); err != nil {
				done <- result{n: n, err: err}
				return
			}
		}
	}()

	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	for _, vec := range vectors {
		if err := WriteFrame(conn, readGolden(t, vec.File)); err != nil {
			t.Fatal(err)
		}
		reply, err := ReadFrame(conn, 0)
		if err != nil {
			t.Fatalf("reply to %s: %v", vec.File, err)
		}
		if !bytes.Equal(reply, EncodeOkMsg(nil)) {
			t.Fatalf("reply to %s: % x", vec.File, reply)
		}
	}
	conn.(*net.UnixConn).CloseWrite()
	r := <-done
	if r.err != nil {
		t.Fatalf("server: %v", r.err)
	}
	if r.n != len(vectors) {
		t.Fatalf("server decoded %d frames, want %d", r.n, len(vectors))
	}
}
