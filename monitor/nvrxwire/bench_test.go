package nvrxwire

import (
	"testing"
)

func BenchmarkDecodeHeartbeat(b *testing.B) {
	p := readGolden(b, "heartbeat.p4.bin")
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMessage(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeSectionOpen(b *testing.B) {
	p := readGolden(b, "section_open_v06_byvalue.p4.bin")
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeMessage(p); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeOk(b *testing.B) {
	cfg := defaultConfig()
	b.ReportAllocs()
	for b.Loop() {
		if len(EncodeOkMsg(&cfg)) == 0 {
			b.Fatal("empty")
		}
	}
}
