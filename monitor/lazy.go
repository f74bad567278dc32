package monitor

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/ftshm"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// Batched reading of native (FTL1) sessions after the handshake.
//
// FTL1 is fire-and-forget after Config, so nothing has to be read promptly:
// instead of parking a reader goroutine in the netpoller (one epoll wake-up,
// goroutine switch and 1-byte read(2) per heartbeat, docs/benchmarks-history.md), the
// socket is taken out of the netpoller (its fd is duplicated and the net.Conn
// closed, which deregisters it from epoll) and drained without blocking:
//   - every drain interval P by one Manager-wide poller goroutine, and
//   - always immediately before a rank's deadline is evaluated, before
//     RankStatus and before EndCycle's observations are taken.
//
// Messages read by one read(2) are stamped with the time taken after that
// read returned, which is never before they arrived and at most P (plus
// scheduling delay) after. Stamps only move clocks later, so detection can be
// up to P late but never early, and a message that arrived before the expiry
// is always processed before the hang is declared.

const (
	// maxDrainInterval bounds P.
	maxDrainInterval = 10 * time.Millisecond
	// minDrainInterval stops a tiny timeout from turning the poller into a
	// busy loop.
	minDrainInterval = time.Millisecond
	// drainDivisor: P is at most the smallest enabled timeout / drainDivisor.
	drainDivisor = 20
	readChunk    = 4096
	// A client writing faster than the socket buffer holds per P would
	// block in write(2) until the next drain: a Unix stream socket queues
	// one skb per write, about 270 small writes with the default 208 KiB
	// buffer. So the poller wakes early enough to find about targetBatch
	// messages on the busiest connection, but not more often than every
	// minBusyInterval.
	targetBatch     = 64
	minBusyInterval = 100 * time.Microsecond
)

// drainIntervalFor returns P for the given timeouts: min(10 ms, smallest
// enabled timeout / 20), at least 1 ms.
func drainIntervalFor(t *Timeouts) time.Duration {
	p := maxDrainInterval
	consider := func(d time.Duration) {
		if d > 0 {
			p = min(p, d/drainDivisor)
		}
	}
	consider(t.InitialHeartbeat)
	consider(t.Heartbeat)
	consider(t.OutOfSection)
	for _, d := range t.Sections {
		consider(d)
	}
	return max(p, minDrainInterval)
}

// lazyConn is a native session after its handshake. Every field below mu is
// only touched with mu held, so the fd is never closed while being read.
type lazyConn struct {
	// m serves the session: its clock and client-clock offset, and where
	// client timeouts and in-process reports go (the rank's monitor r does
	// not hold the manager).
	m    *Manager
	r    *rankMon
	gen  uint64
	done chan struct{} // closed once the fd is closed
	// closing asks the next drain to close the fd; Close must not take mu
	// because it runs under r.mu, which a drain takes while holding mu.
	closing atomic.Bool

	mu      sync.Mutex
	fd      int // -1 once closed
	err     error
	pending []byte // an incomplete message carried to the next drain
	since   int64  // when pending became non-empty
	names   map[uint64]string
	msgs    int // messages processed
	buf     [readChunk]byte
	// shm is the mapping of the session's shared-memory region (nil
	// without one); unmapped with the fd.
	shm      *ftshm.Region
	shmCount uint64 // heartbeat count at the last read
	ring     bool   // section events come through shm's ring
	ringHead uint64 // ring events consumed
	eof      bool   // the socket reached EOF in this drain
	rerr     error  // the socket failed in this drain
}

// Close requests the session's end; the fd is closed by the next drain
// (within P) or by Manager.Close.
func (lc *lazyConn) Close() error {
	lc.closing.Store(true)
	return nil
}

// closeLocked closes the fd once and wakes the session's goroutine.
func (lc *lazyConn) closeLocked(err error) {
	if lc.fd < 0 {
		return
	}
	_ = unix.Close(lc.fd)
	lc.fd = -1
	if lc.shm != nil {
		_ = lc.shm.Close()
		lc.shm = nil
	}
	lc.err = err
	close(lc.done)
}

// drain reads everything buffered on the socket without blocking and
// processes it in order. It returns the number of messages processed.
func (lc *lazyConn) drain() int {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.fd < 0 {
		return 0
	}
	if lc.closing.Load() {
		lc.closeLocked(nil)
		return 0
	}
	if lc.shm != nil {
		lc.readShmLocked()
	}
	before := lc.msgs
	lc.readSocketLocked()
	if lc.ring {
		// Events published before an EOF are still applied.
		if err := lc.readRingLocked(); err != nil && lc.rerr == nil {
			lc.rerr = err
		}
	}
	if lc.rerr != nil || lc.eof {
		lc.closeLocked(lc.rerr)
	}
	return lc.msgs - before
}

// readSocketLocked reads and processes everything buffered on the socket,
// recording EOF or an error in lc for drain to act on.
func (lc *lazyConn) readSocketLocked() {
	if lc.eof || lc.rerr != nil {
		return
	}
	m := lc.m
	for {
		n, err := unix.Read(lc.fd, lc.buf[:])
		now := m.mono() // after the read: never earlier than any byte's arrival
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			lc.checkPartialLocked(now)
			return
		case err != nil:
			lc.rerr = fmt.Errorf("read: %w", err)
			return
		case n == 0: // EOF: the client closed
			lc.eof = true
			return
		}
		if err := lc.processLocked(lc.buf[:n], now); err != nil {
			lc.rerr = err
			return
		}
		if n < len(lc.buf) {
			// A short read on a stream socket means it was empty at that
			// instant: no need for the extra EAGAIN syscall.
			lc.checkPartialLocked(now)
			return
		}
	}
}

// checkPartialLocked enforces the half-message limit of docs/protocol.md.
func (lc *lazyConn) checkPartialLocked(now int64) {
	if len(lc.pending) > 0 && now-lc.since > int64(frameTimeout) {
		lc.rerr = fmt.Errorf("message incomplete for more than %s", frameTimeout)
	}
}

// processLocked handles every complete message of pending+b, all stamped now.
func (lc *lazyConn) processLocked(b []byte, now int64) error {
	data := b
	if len(lc.pending) > 0 {
		lc.pending = append(lc.pending, b...)
		data = lc.pending
	}
	for len(data) > 0 {
		n, err := lc.message(data, now)
		if err != nil {
			return err
		}
		if n == 0 { // incomplete
			break
		}
		lc.msgs++
		data = data[n:]
	}
	switch {
	case len(data) == 0:
		lc.pending = lc.pending[:0]
	case len(lc.pending) == 0:
		lc.since = now
		lc.pending = append(lc.pending, data...) // b is reused by the next read
	case len(data) != len(lc.pending):
		// A message completed, so the rest started in this read.
		lc.since = now
		lc.pending = append(lc.pending[:0], data...) // memmove, overlap-safe
	}
	return nil
}

// message handles the first message of b. It returns the bytes consumed, 0
// when b holds only part of a message.
func (lc *lazyConn) message(b []byte, now int64) (int, error) {
	r, gen := lc.r, lc.gen
	uv := func(off int) (uint64, int, error) {
		v, n := binary.Uvarint(b[off:])
		if n < 0 {
			return 0, 0, errors.New("malformed uvarint")
		}
		return v, n, nil
	}
	section := func(id uint64) (string, error) {
		name, ok := lc.names[id]
		if !ok {
			return "", fmt.Errorf("section id %d was never defined", id)
		}
		return name, nil
	}
	log := r.logger
	switch t := b[0]; t {
	case ftwire.MsgHeartbeat:
		r.heartbeatAt(gen, now)
		return 1, nil
	case ftwire.MsgSectionCloseAll:
		r.closeAll(gen, now)
		return 1, nil
	case ftwire.MsgSectionOpen, ftwire.MsgSectionClose, ftwire.MsgSectionOpenIter:
		id, n1, err := uv(1)
		if err != nil || n1 == 0 {
			return 0, err
		}
		used := 1 + n1
		var iter *int64
		if t == ftwire.MsgSectionOpenIter {
			v, n2, err := uv(used)
			if err != nil || n2 == 0 {
				return 0, err
			}
			used += n2
			i := int64(v)
			iter = &i
		}
		name, err := section(id)
		if err != nil {
			return 0, err
		}
		var e string
		if t == ftwire.MsgSectionClose {
			e = r.closeSection(gen, name, now)
		} else {
			e = r.openSection(gen, name, iter, now)
		}
		if e != "" && e != sectionLimitCause {
			log().Warn("rank monitor: " + e)
		}
		return used, nil
	default:
		if !ftwire.LengthPrefixed(t) {
			return 0, fmt.Errorf("unknown message type %#x", t)
		}
		size, n1, err := uv(1)
		if err != nil || n1 == 0 {
			return 0, err
		}
		if size > ftwire.MaxPayload {
			return 0, fmt.Errorf("payload of %d bytes exceeds %d", size, ftwire.MaxPayload)
		}
		end := 1 + n1 + int(size)
		if len(b) < end {
			return 0, nil
		}
		p := b[1+n1 : end]
		switch t {
		case ftwire.MsgDefineSection:
			id, name, err := ftwire.ParseDefineSection(p)
			if err != nil {
				return 0, err
			}
			if _, ok := lc.names[id]; !ok && len(lc.names) >= MaxSectionNames {
				return 0, fmt.Errorf("more than %d section ids defined", MaxSectionNames)
			}
			if len(name) > MaxSectionNameLen {
				return 0, fmt.Errorf("section name of %d bytes, more than %d", len(name), MaxSectionNameLen)
			}
			lc.names[id] = name
		case ftwire.MsgSetTimeouts:
			var u ftwire.TimeoutsUpdate
			if err := json.Unmarshal(p, &u); err != nil {
				return 0, fmt.Errorf("decode timeouts: %w", err)
			}
			lc.m.applyClientTimeouts(r, gen, &u)
		case ftwire.MsgInProcessReport:
			var u ftwire.InProcessReport
			if err := json.Unmarshal(p, &u); err != nil {
				return 0, fmt.Errorf("decode in-process report: %w", err)
			}
			lc.m.inProcessReport(r, u)
		default:
			log().Debug("rank monitor: skipping unknown message", "type", t)
		}
		return end, nil
	}
}

// poller drains every lazy session every P; it sleeps while there is none.
type poller struct {
	mu    sync.Mutex
	conns map[*lazyConn]struct{}
	wake  chan struct{}
	every atomic.Int64 // P in ns
}

func newPoller(p time.Duration) *poller {
	pl := &poller{conns: map[*lazyConn]struct{}{}, wake: make(chan struct{}, 1)}
	pl.every.Store(int64(p))
	return pl
}

func (pl *poller) add(lc *lazyConn) {
	pl.mu.Lock()
	pl.conns[lc] = struct{}{}
	pl.mu.Unlock()
	select {
	case pl.wake <- struct{}{}:
	default:
	}
}

func (pl *poller) remove(lc *lazyConn) {
	pl.mu.Lock()
	delete(pl.conns, lc)
	pl.mu.Unlock()
}

func (pl *poller) snapshot(dst []*lazyConn) []*lazyConn {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	for lc := range pl.conns {
		dst = append(dst, lc)
	}
	return dst
}

// run is the poller goroutine.
func (m *Manager) runPoller() {
	pl := m.poll
	t := time.NewTimer(time.Hour)
	t.Stop()
	var batch []*lazyConn
	next := time.Duration(pl.every.Load())
	for {
		batch = pl.snapshot(batch[:0])
		if len(batch) == 0 {
			select {
			case <-pl.wake:
				continue
			case <-m.ctx.Done():
				return
			}
		}
		start := time.Now()
		t.Reset(next)
		select {
		case <-t.C:
		case <-m.ctx.Done():
			return
		}
		busiest := 0
		for _, lc := range batch {
			busiest = max(busiest, lc.drain())
		}
		next = nextInterval(time.Duration(pl.every.Load()), busiest, time.Since(start))
	}
}

// nextInterval is P, shortened while the busiest connection sent more than
// targetBatch messages per P (busiest messages in the last elapsed).
func nextInterval(p time.Duration, busiest int, elapsed time.Duration) time.Duration {
	if busiest <= 0 || elapsed <= 0 {
		return p
	}
	// elapsed × targetBatch / busiest, the time targetBatch messages take.
	d := time.Duration(float64(elapsed) * targetBatch / float64(busiest))
	return min(p, max(d, minBusyInterval))
}

// serveLazy hands a native session over to the poller once its handshake
// is done and returns when the session ends. buffered holds what the
// handshake reader had already read past Hello. shm, the session's
// shared-memory mapping or nil, is owned by serveLazy from here on.
func (m *Manager) serveLazy(r *rankMon, gen uint64, c *net.UnixConn, buffered []byte, shm *ftshm.Region, ring bool) error {
	unmap := func() {
		if shm != nil {
			_ = shm.Close()
		}
	}
	rc, err := c.SyscallConn()
	if err != nil {
		unmap()
		return fmt.Errorf("raw conn: %w", err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		unmap()
		return fmt.Errorf("dup socket: %w", err)
	}
	if derr != nil {
		unmap()
		return fmt.Errorf("dup socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		unmap()
		return fmt.Errorf("set nonblocking: %w", err)
	}
	lc := &lazyConn{m: m, r: r, gen: gen, done: make(chan struct{}), fd: fd, names: map[uint64]string{}, shm: shm, ring: ring && shm != nil}
	if !r.handover(gen, lc) {
		_ = unix.Close(fd)
		unmap()
		return nil // replaced meanwhile
	}
	// Closing the net.Conn deregisters the socket from the netpoller; the
	// duplicate keeps it open.
	c.Close()
	lc.mu.Lock()
	if len(buffered) > 0 {
		if err := lc.processLocked(buffered, m.mono()); err != nil {
			lc.closeLocked(err)
		}
	}
	lc.mu.Unlock()
	m.poll.add(lc)
	defer m.poll.remove(lc)
	select {
	case <-lc.done:
	case <-m.ctx.Done():
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	lc.closeLocked(nil)
	return lc.err
}
