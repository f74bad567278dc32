// Package ftshm is the shared-memory region of the native rank-monitor
// protocol (docs/protocol.md, "Shared-memory heartbeats" and "Section events
// through shared memory"): its layout, the sealed memfd behind it, and the
// ordered word accesses that make it safe without locks. The monitor
// (server) and ftclient (Go client) both use it; the Python client keeps its
// own copy of the layout.
//
// The region is little-endian uint64 words accessed with aligned 8-byte
// atomic loads and stores (x86-64 and arm64 are little-endian, which is what
// the layout says).
//
// Heartbeats: the client stores its CLOCK_MONOTONIC time in ns at OffTime,
// then the incremented heartbeat count at OffCount; the server reads the
// count first, so the time it reads is at least as new as the count.
//
// Section ring (granted with ShmSections): a single-producer,
// single-consumer ring of events. The client writes an event's four words at
// RingOff + (tail mod RingCap) × EventSize, then stores tail+1 at OffTail;
// the server applies events in order and stores the number consumed at
// OffHead. Both counters only grow; the ring is full when tail − head =
// RingCap. Event words: kind (Ev*), section id (defined over the socket
// first), iteration (EvOpenIter only) and the client's CLOCK_MONOTONIC time.
package ftshm

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Layout.
const (
	Size     = 4096 // the heartbeat words' page; regions are at least this big
	OffCount = 0
	OffTime  = 8

	OffTail    = 64  // client-written, own cache line
	OffHead    = 128 // server-written, own cache line
	RingOff    = 4096
	EventSize  = 32
	RingCap    = 1024
	RegionSize = RingOff + RingCap*EventSize // size of a region the server creates

	EvWordKind = 0
	EvWordID   = 8
	EvWordIter = 16
	EvWordTime = 24
)

// Event kinds.
const (
	EvOpen     = 1
	EvClose    = 2
	EvCloseAll = 3
	EvOpenIter = 4
)

// Event is one section event of the ring.
type Event struct {
	Kind, ID, Iter uint64
	Time           uint64 // the client's CLOCK_MONOTONIC in ns
}

// Region is a mapping of the shared region.
type Region struct{ mem []byte }

// Create makes a region for one session: a memfd sealed against shrinking
// (the server's reads would fault) and growing, mapped read-write (the
// server stores the ring's head). The caller sends fd to the client and
// closes it; the mapping stays until Close.
func Create() (fd int, r *Region, err error) {
	fd, err = unix.MemfdCreate("ftl-heartbeat", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("ftshm: memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, *Region, error) {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("ftshm: %s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, RegionSize); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	mem, err := unix.Mmap(fd, 0, RegionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return fd, &Region{mem: mem}, nil
}

// Map maps the first size bytes of the region behind fd (the client side),
// after checking that the region is that big. fd may be closed afterwards.
func Map(fd, size int) (*Region, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ftshm: fstat: %w", err)
	}
	if st.Size < int64(size) {
		return nil, fmt.Errorf("ftshm: region of %d bytes, want %d", st.Size, size)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ftshm: mmap: %w", err)
	}
	return &Region{mem: mem}, nil
}

// Close unmaps the region; it must not be used afterwards.
func (r *Region) Close() error {
	if err := unix.Munmap(r.mem); err != nil {
		return fmt.Errorf("ftshm: munmap: %w", err)
	}
	r.mem = nil
	return nil
}

// Len is the mapped size.
func (r *Region) Len() int { return len(r.mem) }

// Load atomically loads the word at off.
func (r *Region) Load(off int) uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&r.mem[off])).Load()
}

// Store atomically stores v at off.
func (r *Region) Store(off int, v uint64) {
	(*atomic.Uint64)(unsafe.Pointer(&r.mem[off])).Store(v)
}

// StoreHeartbeat publishes heartbeat number count sent at time at: the time
// first, then the count, the reverse of LoadHeartbeat's order.
func (r *Region) StoreHeartbeat(count, at uint64) {
	r.Store(OffTime, at)
	r.Store(OffCount, count)
}

// LoadHeartbeat returns the heartbeat count and then the latest time, which
// is at least as new as that count.
func (r *Region) LoadHeartbeat() (count, at uint64) {
	count = r.Load(OffCount)
	return count, r.Load(OffTime)
}

// slot is the offset of the ring slot of event number seq.
func slot(seq uint64) int { return RingOff + int(seq%RingCap)*EventSize }

// PutEvent writes event number seq into its slot; the client publishes it
// by storing seq+1 at OffTail afterwards.
func (r *Region) PutEvent(seq uint64, e Event) {
	off := slot(seq)
	r.Store(off+EvWordKind, e.Kind)
	r.Store(off+EvWordID, e.ID)
	r.Store(off+EvWordIter, e.Iter)
	r.Store(off+EvWordTime, e.Time)
}

// GetEvent reads event number seq, which the client has published.
func (r *Region) GetEvent(seq uint64) Event {
	off := slot(seq)
	return Event{Kind: r.Load(off + EvWordKind), ID: r.Load(off + EvWordID),
		Iter: r.Load(off + EvWordIter), Time: r.Load(off + EvWordTime)}
}

// Monotonic returns CLOCK_MONOTONIC in ns, the clock of every time stored in
// the region.
func Monotonic() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("ftshm: clock_gettime: %w", err)
	}
	return ts.Nano(), nil
}
