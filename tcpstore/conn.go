package tcpstore

import (
	"bufio"
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// refusal is an error that closes the connection as a refusal: counted in
// Stats.Refused and logged at a limited rate.
type refusal struct{ reason string }

func (r *refusal) Error() string { return r.reason }

func refusef(format string, args ...any) error {
	return &refusal{reason: fmt.Sprintf(format, args...)}
}

// notifySlack is how many server-initiated messages (wait answers, watch
// updates, cancel acknowledgements) may be queued for one connection beyond
// the answers to its MaxWaitsPerConn waits; a connection that lets more pile
// up unread is refused.
const notifySlack = 16

// conn is one client connection: a reader goroutine (serve) answers queries
// in order, a notifier goroutine writes what other connections caused
// (a WAIT answered by someone's SET, a watched key changing).
type conn struct {
	s  *Server
	nc net.Conn
	st *state // the attempt the connection belongs to
	br *bufio.Reader

	wmu sync.Mutex // one message at a time on the wire
	bw  *bufio.Writer

	out       chan []byte
	done      chan struct{} // closed by close
	closeOnce sync.Once
	notified  chan struct{} // notifier returned
	exited    chan struct{} // both goroutines returned, state cleaned up

	dialect  dialect
	reserved int64 // bytes held for the query being served, in Server.inflight
	queried  bool  // a query other than WATCH_KEY has been served
	// spoke: the connection validated (v2) or sent a query other than
	// WATCH_KEY; a connection that never did may be a torch 1.13 client's
	// callback connection, which Reset retires instead of closing.
	spoke atomic.Bool
	// retired: an older attempt's callback connection kept open by Reset,
	// bound to Server.retired; any query other than WATCH_KEY closes it.
	retired atomic.Bool

	// Admission (admit.go). addr, shakeBy and admitted are set before
	// serve starts.
	addr       netip.Addr  // source address, counted against MaxConnsPerAddr
	shakeBy    time.Time   // the first query must be complete by then
	admitted   bool        // the allowlist admitted addr at accept
	handshaken atomic.Bool // the first query was read in full

	// Under Server.mu:
	pending    *list.Element // on Server.pendingList: neither handshaken nor vouched
	vouched    bool          // may stay silent: a torch 1.13 callback connection
	legacyMain bool          // a legacy-dialect connection whose first query (not WATCH_KEY) was served: vouches for one
	evicted    bool          // closed to make room before its first query
	waits      []*waiter
	watching   []string
	overflow   bool
	queued     int64 // bytes of the messages in out (counted in Server.queued)
}

func newConn(s *Server, nc net.Conn, st *state) *conn {
	return &conn{
		s:        s,
		nc:       nc,
		st:       st,
		br:       bufio.NewReaderSize(nc, 4096),
		bw:       bufio.NewWriterSize(nc, 4096),
		out:      make(chan []byte, s.lim.MaxWaitsPerConn+notifySlack),
		done:     make(chan struct{}),
		notified: make(chan struct{}),
		exited:   make(chan struct{}),
	}
}

func (c *conn) close() {
	c.closeOnce.Do(func() {
		close(c.done)
		_ = c.nc.Close()
	})
}

// push queues a server-initiated message; called under Server.mu. A full
// queue, or queued bytes past MaxQueuedBytesPerConn or (all connections
// together) MaxQueuedBytes, means the client does not read what it is
// sent: it is refused, and what it had queued is released when it ends.
func (c *conn) push(msg []byte) {
	if c.overflow {
		return
	}
	n := int64(len(msg))
	lim := &c.s.lim
	if c.queued+n > lim.MaxQueuedBytesPerConn || c.s.queued+n > lim.MaxQueuedBytes {
		c.overflow = true
		c.close()
		return
	}
	select {
	case c.out <- msg:
		c.queued += n
		c.s.queued += n
	default:
		c.overflow = true
		c.close()
	}
}

// sent releases the bytes of one queued message once written.
func (c *conn) sent(n int) {
	c.s.mu.Lock()
	c.queued -= int64(n)
	c.s.queued -= int64(n)
	c.s.mu.Unlock()
}

// forgetWait drops w from c's outstanding waits; called under Server.mu.
func (c *conn) forgetWait(w *waiter) {
	for i, x := range c.waits {
		if x == w {
			c.waits = append(c.waits[:i], c.waits[i+1:]...)
			return
		}
	}
}

func (c *conn) notifyLoop() {
	defer c.s.wg.Done()
	defer close(c.notified)
	for {
		select {
		case <-c.done:
			return
		case msg := <-c.out:
			err := c.write(func(w *bufio.Writer) { _, _ = w.Write(msg) })
			c.sent(len(msg))
			if err != nil {
				c.close()
				return
			}
		}
	}
}

// write sends one message, bounded by the message timeout.
func (c *conn) write(fill func(*bufio.Writer)) error {
	c.shook()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(c.s.lim.MessageTimeout))
	fill(c.bw)
	return c.bw.Flush()
}

func (c *conn) serve() {
	s := c.s
	var err error
	defer func() {
		c.close()
		<-c.notified
		s.mu.Lock()
		c.st.cancelWaits(c)
		c.st.dropWatches(c)
		s.queued -= c.queued // messages never written (the notifier returned)
		c.queued = 0
		overflow, evicted := c.overflow, c.evicted
		s.forgetLocked(c)
		s.mu.Unlock()
		c.release()
		var r *refusal
		switch {
		case evicted:
			s.count(&s.counts.NoHandshake)
			s.refuse(c.nc.RemoteAddr(), "closed to make room: no complete first query yet")
		case errors.As(err, &r):
			s.refuse(c.nc.RemoteAddr(), r.reason, "dialect", c.dialect.String())
		case overflow:
			s.refuse(c.nc.RemoteAddr(), "client does not read the server's notifications", "max_messages", cap(c.out),
				"max_bytes", s.lim.MaxQueuedBytesPerConn)
		case errors.Is(err, os.ErrDeadlineExceeded) && !c.handshaken.Load():
			s.count(&s.counts.NoHandshake)
			s.refuse(c.nc.RemoteAddr(), "no complete first query within the handshake timeout", "timeout", s.lim.HandshakeTimeout.String())
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.refuse(c.nc.RemoteAddr(), "query or reply not completed in time", "timeout", s.lim.MessageTimeout.String())
		case err != nil && !isClosed(err):
			s.log.Debug("TCPStore connection ended", "peer", c.nc.RemoteAddr().String(), "err", err)
		}
		close(c.exited)
		s.wg.Done()
	}()
	if !c.admitted && !c.admit() {
		return
	}
	for {
		// Idle between queries as long as it likes, once it has completed
		// its first query (or is vouched for as a silent callback
		// connection): before that, the handshake deadline holds.
		shaking := !c.handshaken.Load() && !c.isVouched()
		if shaking {
			_ = c.nc.SetReadDeadline(c.shakeBy)
		} else {
			_ = c.nc.SetReadDeadline(time.Time{})
		}
		var b byte
		if b, err = c.br.ReadByte(); err != nil {
			if shaking && errors.Is(err, os.ErrDeadlineExceeded) && c.vouchLate() {
				err = nil
				continue
			}
			return
		}
		// The rest of the query must follow promptly: a client cannot hold a
		// half-sent query (and the bytes reserved for it) forever.
		if !shaking {
			_ = c.nc.SetReadDeadline(time.Now().Add(s.lim.MessageTimeout))
		}
		if c.dialect == dialectUnknown {
			var validated bool
			if validated, err = c.detect(b); err != nil {
				return
			}
			if validated {
				if !c.speak() {
					return // an older attempt's client: it sees nothing of this one
				}
				c.shook()
				continue
			}
		}
		o := c.dialect.op(b)
		if o != opWatchKey && !c.speak() {
			return
		}
		err = c.handle(o, b)
		c.release()
		if err != nil {
			return
		}
		c.shook()
		if o != opWatchKey {
			c.queried = true
		}
	}
}

// speak marks c as a connection that queries, which Reset closes and never
// retires; false when Reset retired it already (an older attempt's
// client, which must see nothing of this attempt). spoke goes from false
// to true only under Server.mu, where Reset reads it: either Reset sees it
// and closes c, or this sees retired and serves nothing.
func (c *conn) speak() bool {
	if c.spoke.Load() {
		return true
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.retired.Load() {
		return false
	}
	c.spoke.Store(true)
	return true
}

// shook records that c completed its first query. It runs before the
// first reply is written (write), since a torch 1.13 client opens its
// callback connection as soon as it reads the answer to its first query,
// and that connection must find this one vouching for it.
func (c *conn) shook() {
	if c.handshaken.Swap(true) {
		return
	}
	c.s.mu.Lock()
	c.legacyMain = c.dialect == dialectLegacy && c.spoke.Load()
	if c.dialect != dialectLegacy || c.spoke.Load() {
		c.vouched = false // not a callback connection after all: its vouch is free again
	}
	c.s.shookLocked(c)
	c.s.mu.Unlock()
}

func (c *conn) isVouched() bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.vouched
}

// vouchLate vouches for c, silent at its handshake deadline, if its
// address has a torch 1.13 client whose callback connection it may be.
func (c *conn) vouchLate() bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.evicted || c.pending == nil || !c.s.vouchLocked(c.addr) {
		return false
	}
	c.vouched = true
	c.s.shookLocked(c)
	return true
}

// detect picks the dialect from the first query: a v2 client starts with
// VALIDATE (0) and the magic number, a legacy client with any query, whose
// 0 is SET followed by a uint64 key length. The two cannot be confused: the
// low half of a key length equal to the magic would be a 1 GiB key.
func (c *conn) detect(b byte) (validated bool, err error) {
	if b == 0 {
		p, err := c.br.Peek(4)
		if err != nil {
			return false, err
		}
		if binary.LittleEndian.Uint32(p) == validationMagic {
			_, _ = c.br.Discard(4)
			c.dialect = dialectV2
			return true, nil
		}
	}
	c.dialect = dialectLegacy
	return false, nil
}

// listItemCost is charged to the in-flight reservation, on top of its bytes,
// for each key or value read as part of a list (the keys of CHECK, WAIT and
// MULTI_GET, both halves of each MULTI_SET pair): the string or slice header
// that holds it, the room a growing slice keeps for it, and MULTI_GET's reply
// slot. Without it a MULTI_SET of 128 Ki empty pairs would hold megabytes
// with nothing reserved.
const listItemCost = 64

// listKeysCost is charged per key that LIST_KEYS lists: the string header
// of its snapshot (the key bytes are shared with the store).
const listKeysCost = 16

// reserve charges n bytes of the query being served to Server.inflight,
// refusing the client when all connections together would hold more than
// MaxTotalBytes; serve releases them once the query is answered.
func (c *conn) reserve(n int64) error {
	if n <= 0 {
		return nil
	}
	if c.s.inflight.Add(n) > c.s.lim.MaxTotalBytes {
		c.s.inflight.Add(-n)
		return refusef("queries being served hold more than %d bytes", c.s.lim.MaxTotalBytes)
	}
	c.reserved += n
	return nil
}

func (c *conn) release() {
	if c.reserved != 0 {
		c.s.inflight.Add(-c.reserved)
		c.reserved = 0
	}
}

// locked runs f on the connection's attempt under the server lock.
func (c *conn) locked(f func(st *state) error) error {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return f(c.st)
}

func isClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}
