package monitor

import (
	"testing"
	"time"
)

// TestComputeTime: the time a rank spends in "compute" sections is summed,
// an open one counted up to now; a rank that opened none has no compute
// time (the straggler measurement then reads its CPU demand).
func TestComputeTime(t *testing.T) {
	m := newManager(t, 2, nil, "")
	p0 := startRank(t, m, "connect;open compute;sleep 300ms;close compute;sleep 300ms;open compute;sleep 200ms;mark inside;sleep 5s;exit 0")
	p1 := startRank(t, m, "connect;hbn 20 50ms;exit 0")
	m.BeginCycle(0, map[int]int{0: p0.cmd.Process.Pid, 1: p1.cmd.Process.Pid})
	p0.waitLine(t, "inside", 30*time.Second)
	time.Sleep(100 * time.Millisecond) // the ring's events are drained within a poll
	d, ok := m.ComputeTime(0)
	if !ok || d < 450*time.Millisecond || d > 3*time.Second {
		t.Fatalf("compute time %v (seen %v), want at least 300 + 200 ms, not the 300 ms outside", d, ok)
	}
	if d2, _ := m.ComputeTime(0); d2 < d {
		t.Fatalf("compute time went back: %v then %v", d, d2)
	}
	if _, ok := m.ComputeTime(1); ok {
		t.Fatal("a rank without compute sections has a compute time")
	}
}
