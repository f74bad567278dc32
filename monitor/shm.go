package monitor

import (
	"fmt"

	"github.com/ftlauncher/ft-launcher/internal/ftshm"
)

// Shared-memory heartbeats and section events (docs/protocol.md; the layout
// is internal/ftshm). A native client that asks for it gets a small memfd
// region with its Config; a heartbeat is then a plain store of the client's
// CLOCK_MONOTONIC time plus a count, with no syscall. The monitor reads the
// region whenever it drains the session (every P and right before evaluating
// a deadline), so a heartbeat is seen with its exact time: detection is
// neither early nor late because of the batching.

// readShmLocked turns heartbeats stored in the region since the last read
// into heartbeat events at the client's own timestamps, converted to the
// monitor's clock. Caller holds lc.mu and the region is mapped.
func (lc *lazyConn) readShmLocked() {
	cnt, ts := lc.shm.LoadHeartbeat()
	if cnt == lc.shmCount {
		return
	}
	k := int64(cnt - lc.shmCount)
	lc.shmCount = cnt
	m := lc.m
	// cmOffset was sampled so that the conversion errs late, never early;
	// a time from the future (a broken client) is clamped to now.
	at := min(int64(ts)-m.cmOffset, m.mono())
	if k <= 0 { // the count went backwards: a broken client; count one
		k = 1
	}
	lc.r.heartbeatsAt(lc.gen, at, k)
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
	tail := lc.shm.Load(ftshm.OffTail)
	if tail == lc.ringHead {
		return nil
	}
	if tail-lc.ringHead > ftshm.RingCap {
		return fmt.Errorf("section ring: tail %d is more than %d past head %d", tail, ftshm.RingCap, lc.ringHead)
	}
	r, gen, m := lc.r, lc.gen, lc.m
	now := m.mono()
	for ; lc.ringHead != tail; lc.ringHead++ {
		ev := lc.shm.GetEvent(lc.ringHead)
		at := min(int64(ev.Time)-m.cmOffset, now)
		lc.msgs++
		if ev.Kind == ftshm.EvCloseAll {
			r.closeAll(gen, at)
			continue
		}
		name, ok := lc.names[ev.ID]
		if !ok {
			lc.readSocketLocked()
			if name, ok = lc.names[ev.ID]; !ok {
				return fmt.Errorf("section ring: section id %d was never defined", ev.ID)
			}
		}
		var e string
		switch ev.Kind {
		case ftshm.EvOpen:
			e = r.openSection(gen, name, nil, at)
		case ftshm.EvOpenIter:
			i := int64(ev.Iter)
			e = r.openSection(gen, name, &i, at)
		case ftshm.EvClose:
			e = r.closeSection(gen, name, at)
		default:
			return fmt.Errorf("section ring: unknown event kind %d", ev.Kind)
		}
		if e != "" && e != sectionLimitCause {
			r.logger().Warn("rank monitor: " + e)
		}
	}
	// Published after the events were read: the client may reuse the slots.
	lc.shm.Store(ftshm.OffHead, lc.ringHead)
	return nil
}

// monoOffset returns CLOCK_MONOTONIC minus m.mono(), sampled in that order
// so the offset is at most the true one and converted times err late.
func monoOffset(mono func() int64) (int64, error) {
	cm, err := ftshm.Monotonic()
	if err != nil {
		return 0, err
	}
	return cm - mono(), nil
}
