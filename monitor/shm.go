package monitor

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// Shared-memory heartbeats (docs/protocol.md). A native client that asks for
// it gets a small memfd region with its Config; a heartbeat is then a plain
// store of the client's CLOCK_MONOTONIC time plus a count, with no syscall.
// The monitor reads the region whenever it drains the session (every P and
// right before evaluating a deadline), so a heartbeat is seen with its exact
// time: detection is neither early nor late because of the batching.

// newShmRegion creates the region: a sealed memfd (the client can neither
// shrink it, which would make the monitor's reads fault, nor grow it) and
// the monitor's mapping. The caller sends fd and closes it.
func newShmRegion() (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate("ftl-heartbeat", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("memfd_create: %w", err)
	}
	fail := func(what string, err error) (int, []byte, error) {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, ftwire.ShmRegionSize); err != nil {
		return fail("ftruncate", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fail("seal", err)
	}
	// Writable: the monitor stores the section ring's head.
	mem, err = unix.Mmap(fd, 0, ftwire.ShmRegionSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fail("mmap", err)
	}
	return fd, mem, nil
}

// shmWord loads the aligned little-endian uint64 at off (x86-64 and arm64
// are little-endian, which is what the wire layout says).
func shmWord(mem []byte, off int) uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&mem[off])).Load()
}

// readShmLocked turns heartbeats stored in the region since the last read
// into heartbeat events at the client's own timestamps, converted to the
// monitor's clock. The count is read before the time, and the client writes
// them in the opposite order, so the time is at least as new as the count.
// Caller holds lc.mu and the region is mapped.
func (lc *lazyConn) readShmLocked() {
	cnt := shmWord(lc.shm, ftwire.ShmOffCount)
	if cnt == lc.shmCount {
		return
	}
	ts := shmWord(lc.shm, ftwire.ShmOffTime)
	k := int64(cnt - lc.shmCount)
	lc.shmCount = cnt
	m := lc.r.m
	// cmOffset was sampled so that the conversion errs late, never early;
	// a time from the future (a broken client) is clamped to now.
	at := min(int64(ts)-m.cmOffset, m.mono())
	if k <= 0 { // the count went backwards: a broken client; count one
		k = 1
	}
	lc.r.heartbeatsAt(lc.gen, at, k)
}

func shmSetWord(mem []byte, off int, v uint64) {
	(*atomic.Uint64)(unsafe.Pointer(&mem[off])).Store(v)
}

// readRingLocked applies the section events the client published in the
// ring since the last read, in order, each at the client's own time
// converted to the monitor's clock (as heartbeats are), so a section opened
// at t has its deadline at t + timeout exactly. An event naming an id not yet
// defined is resolved by reading the socket once more: the client writes the
// definition before it publishes the event, so it is there by now. Socket
// messages are otherwise processed before the ring at each drain; after the
// handshake a ring client sends only DefineSection and SetTimeouts on the
// socket, and neither depends on the order relative to section events (a
// timeout applies to the open time of a section whatever came first).
// Caller holds lc.mu.
func (lc *lazyConn) readRingLocked() error {
	tail := shmWord(lc.shm, ftwire.ShmOffTail)
	if tail == lc.ringHead {
		return nil
	}
	if tail-lc.ringHead > ftwire.ShmRingCap {
		return fmt.Errorf("section ring: tail %d is more than %d past head %d", tail, ftwire.ShmRingCap, lc.ringHead)
	}
	r, gen, m := lc.r, lc.gen, lc.r.m
	now := m.mono()
	for ; lc.ringHead != tail; lc.ringHead++ {
		off := ftwire.ShmRingOff + int(lc.ringHead%ftwire.ShmRingCap)*ftwire.ShmEventSize
		kind := shmWord(lc.shm, off+ftwire.ShmEvWordKind)
		id := shmWord(lc.shm, off+ftwire.ShmEvWordID)
		at := min(int64(shmWord(lc.shm, off+ftwire.ShmEvWordTime))-m.cmOffset, now)
		lc.msgs++
		if kind == ftwire.ShmEvCloseAll {
			r.closeAll(gen, at)
			continue
		}
		name, ok := lc.names[id]
		if !ok {
			lc.readSocketLocked()
			if name, ok = lc.names[id]; !ok {
				return fmt.Errorf("section ring: section id %d was never defined", id)
			}
		}
		var e string
		switch kind {
		case ftwire.ShmEvOpen:
			e = r.openSection(gen, name, nil, at)
		case ftwire.ShmEvOpenIter:
			i := int64(shmWord(lc.shm, off+ftwire.ShmEvWordIter))
			e = r.openSection(gen, name, &i, at)
		case ftwire.ShmEvClose:
			e = r.closeSection(gen, name, at)
		default:
			return fmt.Errorf("section ring: unknown event kind %d", kind)
		}
		if e != "" {
			r.logger().Warn("rank monitor: " + e)
		}
	}
	// Published after the events were read: the client may reuse the slots.
	shmSetWord(lc.shm, ftwire.ShmOffHead, lc.ringHead)
	return nil
}

// monoOffset returns CLOCK_MONOTONIC minus m.mono(), sampled in that order
// so the offset is at most the true one and converted times err late.
func monoOffset(mono func() int64) (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime: %w", err)
	}
	return ts.Nano() - mono(), nil
}
