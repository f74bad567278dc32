package ftshm

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pair returns the server's region and a client mapping of the same memory.
func pair(t *testing.T, clientSize int) (server, client *Region) {
	t.Helper()
	fd, server, err := Create()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	client, err = Map(fd, clientSize)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Close(); _ = client.Close() })
	return server, client
}

// TestCreateSealed: a client can neither shrink the region (the server's
// reads would fault) nor grow it, and a fresh region is zero.
func TestCreateSealed(t *testing.T) {
	fd, r, err := Create()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd); _ = r.Close() })
	for _, size := range []int64{0, Size, 2 * RegionSize} {
		if err := unix.Ftruncate(fd, size); err == nil {
			t.Errorf("ftruncate to %d succeeded on a sealed region", size)
		}
	}
	if r.Len() != RegionSize {
		t.Errorf("mapped %d bytes, want %d", r.Len(), RegionSize)
	}
	if c, at := r.LoadHeartbeat(); c != 0 || at != 0 {
		t.Errorf("fresh region: count %d time %d", c, at)
	}
}

func TestMapSizes(t *testing.T) {
	fd, r, err := Create()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd); _ = r.Close() })
	tests := []struct {
		size int
		ok   bool
	}{
		{Size, true},       // heartbeats only
		{RegionSize, true}, // heartbeats and the ring
		{RegionSize + Size, false},
	}
	for _, tc := range tests {
		c, err := Map(fd, tc.size)
		if (err == nil) != tc.ok {
			t.Errorf("Map(%d): %v, want ok=%v", tc.size, err, tc.ok)
		}
		if err == nil {
			_ = c.Close()
		}
	}
	if _, err := Map(-1, Size); err == nil {
		t.Error("Map of a bad fd succeeded")
	}
}

// TestHeartbeatAcrossMappings: what the client stores the server loads.
func TestHeartbeatAcrossMappings(t *testing.T) {
	server, client := pair(t, Size)
	for i, at := range []uint64{100, 250, 1 << 62} {
		client.StoreHeartbeat(uint64(i+1), at)
		if c, got := server.LoadHeartbeat(); c != uint64(i+1) || got != at {
			t.Errorf("heartbeat %d: server read count %d time %d, want %d %d", i, c, got, i+1, at)
		}
	}
}

// TestRingAcrossMappings pushes events through more than two laps of the
// ring, the client publishing the tail and the server the head.
func TestRingAcrossMappings(t *testing.T) {
	server, client := pair(t, RegionSize)
	var tail, head uint64
	for round := 0; round < 5; round++ {
		n := RingCap/2 + round*37
		for i := 0; i < n; i++ {
			if tail-client.Load(OffHead) >= RingCap {
				t.Fatalf("ring full at tail %d", tail)
			}
			client.PutEvent(tail, Event{Kind: EvOpenIter, ID: tail % 7, Iter: tail * 3, Time: tail + 1000})
			tail++
			client.Store(OffTail, tail)
		}
		for end := server.Load(OffTail); head != end; head++ {
			want := Event{Kind: EvOpenIter, ID: head % 7, Iter: head * 3, Time: head + 1000}
			if got := server.GetEvent(head); got != want {
				t.Fatalf("event %d: %+v, want %+v", head, got, want)
			}
		}
		server.Store(OffHead, head)
	}
	if head != tail || tail <= 2*RingCap {
		t.Errorf("consumed %d of %d events", head, tail)
	}
}

// TestMonotonic: the region's clock is CLOCK_MONOTONIC, which Go's own
// monotonic clock also reads.
func TestMonotonic(t *testing.T) {
	t0 := time.Now()
	a, err := Monotonic()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	b, _ := Monotonic()
	el := time.Since(t0)
	if d := time.Duration(b - a); d < 10*time.Millisecond || d > el {
		t.Errorf("monotonic advanced %v over a %v sleep (%v elapsed)", d, 10*time.Millisecond, el)
	}
}

func TestLayout(t *testing.T) {
	// The ring's counters sit on their own cache lines, clear of the
	// heartbeat words, and the ring starts after the heartbeat page.
	if OffTail < OffTime+8 || OffHead-OffTail < 64 || RingOff < Size || RingOff < OffHead+8 {
		t.Errorf("layout overlaps: tail %d head %d ring %d", OffTail, OffHead, RingOff)
	}
	if EventSize != 4*8 || EvWordTime+8 != EventSize || RegionSize != RingOff+RingCap*EventSize {
		t.Errorf("event layout: size %d, last word %d, region %d", EventSize, EvWordTime, RegionSize)
	}
}
