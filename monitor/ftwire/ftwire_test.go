package ftwire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// TestFrameRoundTrip: what the Append helpers build, the readers parse.
func TestFrameRoundTrip(t *testing.T) {
	tests := []struct {
		name    string
		t       byte
		payload []byte
	}{
		{"empty", MsgSetTimeouts, nil},
		{"json", MsgHello, []byte(`{"global_rank":3}`)},
		{"two-byte length", MsgConfig, bytes.Repeat([]byte("x"), 300)},
		{"at the limit", MsgAck, make([]byte, MaxPayload)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := AppendFrame([]byte(Magic), tc.t, tc.payload)
			r := bufio.NewReader(bytes.NewReader(b))
			if err := ReadMagic(r); err != nil {
				t.Fatal(err)
			}
			if typ, err := r.ReadByte(); err != nil || typ != tc.t || !LengthPrefixed(typ) {
				t.Fatalf("type %#x %v", typ, err)
			}
			p, err := ReadPayload(r)
			if err != nil || !bytes.Equal(p, tc.payload) {
				t.Fatalf("payload %d bytes, %v", len(p), err)
			}
			if r.Buffered() != 0 {
				t.Errorf("%d bytes left", r.Buffered())
			}
		})
	}
}

func TestReadPayloadErrors(t *testing.T) {
	tests := []struct {
		name string
		in   []byte
		want string
	}{
		{"over the limit", binary.AppendUvarint(nil, MaxPayload+1), "exceeds"},
		{"truncated", append(binary.AppendUvarint(nil, 10), "abc"...), "read payload"},
		{"no length", nil, "length"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadPayload(bufio.NewReader(bytes.NewReader(tc.in)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestSectionMessages(t *testing.T) {
	b := AppendDefineSection(nil, 300, "checkpoint")
	r := bufio.NewReader(bytes.NewReader(b))
	if typ, _ := r.ReadByte(); typ != MsgDefineSection {
		t.Fatalf("type %#x", typ)
	}
	p, err := ReadPayload(r)
	if err != nil {
		t.Fatal(err)
	}
	if id, name, err := ParseDefineSection(p); err != nil || id != 300 || name != "checkpoint" {
		t.Errorf("define section: %d %q %v", id, name, err)
	}
	if _, _, err := ParseDefineSection(nil); err == nil {
		t.Error("empty define section parsed")
	}
	if got := AppendSectionOp(nil, MsgSectionClose, 5); !bytes.Equal(got, []byte{MsgSectionClose, 5}) {
		t.Errorf("section close % x", got)
	}
	if got := AppendSectionOpenIter(nil, 1, 200); !bytes.Equal(got, []byte{MsgSectionOpenIter, 1, 0xc8, 0x01}) {
		t.Errorf("section open iter % x", got)
	}
}

func TestReadMagic(t *testing.T) {
	tests := []struct {
		in string
		ok bool
	}{
		{Magic, true},
		{"FTL2", false},
		{"XYZ1", false},
		{"FT", false},
	}
	for _, tc := range tests {
		if err := ReadMagic(strings.NewReader(tc.in)); (err == nil) != tc.ok {
			t.Errorf("ReadMagic(%q) = %v", tc.in, err)
		}
	}
}
