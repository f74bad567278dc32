package tcpstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Limits bound what clients can make the server hold or wait on. A zero field
// takes the value of DefaultLimits.
type Limits struct {
	MaxKeyBytes   int   // one key
	MaxValueBytes int   // one value (SET/COMPARE_SET/APPEND/ADD results)
	MaxKeys       int   // keys held at once
	MaxTotalBytes int64 // keys+values held at once
	MaxConns      int   // open client connections
	// MaxConnsPerAddr bounds the open connections from one source address,
	// so that one address cannot take every MaxConns slot (retired callback
	// connections of older attempts do not count). A launcher sizes
	// it from its ranks per node (agentstore.ConnsPerAddr).
	MaxConnsPerAddr int
	MaxWaiters      int // outstanding WAIT/BARRIER/watch registrations

	// MaxWaitsPerConn bounds the WAIT (and BARRIER) queries one connection
	// may have outstanding. A torch client has at most one, more only after 1.13
	// timed out on a wait (it cannot cancel one), so a connection that
	// piles up more is buggy or hostile and must not take every waiter slot.
	MaxWaitsPerConn int
	// MaxKeysPerQuery bounds the keys named by one CHECK, WAIT, MULTI_GET
	// or MULTI_SET (torch's libuv server allows 128 Ki).
	MaxKeysPerQuery int
	// MaxRegsPerConn bounds the wait and watch registrations (one per
	// key) one connection may hold, so that one connection cannot take
	// every MaxWaiters slot with a few WAITs on many keys.
	MaxRegsPerConn int
	// MaxQueuedBytes bounds the server-initiated messages (wait answers,
	// watch updates, which carry a key's old and new values) queued for
	// clients and not yet written, all connections together; the
	// connection whose message would pass it is refused.
	MaxQueuedBytes int64
	// MaxQueuedBytesPerConn bounds them for one connection: a client that
	// does not read its notifications is refused before it holds much.
	MaxQueuedBytesPerConn int64
	// MessageTimeout is how long the rest of a query may take to arrive once
	// its first byte has, and how long a reply may take to be written. A
	// connection may stay idle between queries for as long as it likes.
	MessageTimeout time.Duration
	// HandshakeTimeout is how long a new connection may take to complete
	// its first query (VALIDATE for torch 2.2+, any query for 1.13: both
	// send it right after connecting). A connection that has not is closed,
	// unless it is a torch 1.13 callback connection (admit.go), which sends
	// nothing, ever.
	HandshakeTimeout time.Duration
}

// DefaultLimits are generous for any real job (torch's own libuv server
// caps keys at 8 KiB and values at 8 MiB) and small enough that hostile
// clients cannot make the launcher hold more than about a GiB: 512 MiB of
// keys, values, registrations and queries being read, 256 MiB of queued
// notifications, and the connections' buffers (16384 × 8 KiB).
func DefaultLimits() Limits {
	return Limits{
		MaxKeyBytes:           8 << 10,
		MaxValueBytes:         8 << 20,
		MaxKeys:               1 << 20,
		MaxTotalBytes:         512 << 20,
		MaxConns:              16384,
		MaxConnsPerAddr:       256,
		MaxWaiters:            1 << 20,
		MaxWaitsPerConn:       64,
		MaxKeysPerQuery:       128 << 10,
		MaxRegsPerConn:        128 << 10,
		MaxQueuedBytes:        256 << 20,
		MaxQueuedBytesPerConn: 64 << 20, // four watch updates of the largest value (old and new)
		MessageTimeout:        30 * time.Second,
		HandshakeTimeout:      5 * time.Second,
	}
}

// withDefaults fills zero fields from DefaultLimits.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	orDefault(&l.MaxKeyBytes, d.MaxKeyBytes)
	orDefault(&l.MaxValueBytes, d.MaxValueBytes)
	orDefault(&l.MaxKeys, d.MaxKeys)
	orDefault(&l.MaxTotalBytes, d.MaxTotalBytes)
	orDefault(&l.MaxConns, d.MaxConns)
	orDefault(&l.MaxWaiters, d.MaxWaiters)
	orDefault(&l.MaxWaitsPerConn, d.MaxWaitsPerConn)
	orDefault(&l.MaxKeysPerQuery, d.MaxKeysPerQuery)
	orDefault(&l.MaxRegsPerConn, d.MaxRegsPerConn)
	orDefault(&l.MaxQueuedBytes, d.MaxQueuedBytes)
	orDefault(&l.MaxQueuedBytesPerConn, d.MaxQueuedBytesPerConn)
	orDefault(&l.MessageTimeout, d.MessageTimeout)
	orDefault(&l.MaxConnsPerAddr, d.MaxConnsPerAddr)
	orDefault(&l.HandshakeTimeout, d.HandshakeTimeout)
	return l
}

func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// Options configure a Server.
type Options struct {
	Limits Limits
	Logger *slog.Logger // nil: slog.Default()
}

// Stats is a snapshot of what the server holds.
type Stats struct {
	Keys    int    // keys held in the current attempt
	Bytes   int64  // their keys+values
	Conns   int    // open client connections
	Waiters int    // outstanding wait and watch registrations (one per key)
	Queued  int64  // bytes of notifications queued for clients, not yet written
	Refused uint64 // connections refused or closed for breaking a limit or the protocol, since Listen
	// Pending are the open connections that have not completed their first
	// query and are not vouched for (admit.go).
	Pending int
	// Counts break some of the refusals down, and count what Reset closed.
	Counts Counts
}

// Counts are connections refused or closed by the admission rules, since
// Listen (admit.go). Each of the first three is also in Stats.Refused.
type Counts struct {
	NotMember   uint64 // from an address that is not a node of the job
	NoHandshake uint64 // no complete first query within HandshakeTimeout, or closed for room before it
	PerAddrCap  uint64 // refused at MaxConnsPerAddr, nothing pending to close instead
	IdleAtReset uint64 // pending connections of an older attempt that Reset closed (not refusals)
}

type counters struct {
	NotMember, NoHandshake, PerAddrCap, IdleAtReset atomic.Uint64
}

func (s *Server) count(c *atomic.Uint64) { c.Add(1) }

// Server is a c10d TCPStore-compatible server.
type Server struct {
	lim  Limits
	log  *slog.Logger
	ln   *net.TCPListener
	addr *net.TCPAddr

	stopCtx   func() bool // stops the context.AfterFunc that closes the server
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // accept loop and connection goroutines

	refused    atomic.Uint64
	counts     counters
	refusals   rateLog
	acceptErrs rateLog
	inflight   atomic.Int64 // bytes held for queries being served, against MaxTotalBytes

	mu     sync.Mutex
	closed bool
	st     *state
	// retired holds the watches of older attempts' callback connections
	// (Reset); nothing ever changes in it.
	retired *state
	conns   map[*conn]struct{}
	queued  int64 // bytes of every connection's queued notifications

	// Admission (admit.go), under mu.
	allow        map[netip.Addr]struct{} // nil: every address
	provisional  bool                    // allow is an older attempt's (Reset): non-members wait for SetAllowed
	allowChanged chan struct{}           // closed by SetAllowed
	perAddr      map[netip.Addr]addrConns
	pendingList  pendingConns
}

// Listen binds addr ("host:port", port 0 = any) and serves in goroutines; the
// listener accepts connections when Listen returns (no client ever races it).
// Cancelling ctx closes the server.
func Listen(ctx context.Context, addr string, opts Options) (*Server, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("tcpstore: listen on %s: %w", addr, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		lim:   opts.Limits.withDefaults(),
		log:   log.With("component", "tcpstore"),
		ln:    l.(*net.TCPListener),
		conns: map[*conn]struct{}{},

		allowChanged: make(chan struct{}),
	}
	s.st = newState(s.lim)
	s.addr = s.ln.Addr().(*net.TCPAddr)
	s.wg.Add(1)
	go s.acceptLoop()
	s.stopCtx = context.AfterFunc(ctx, func() { _ = s.Close() })
	s.log.Info("TCPStore server listening", "addr", s.addr.String())
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() *net.TCPAddr { return s.addr }

func (s *Server) acceptLoop() {
	defer s.wg.Done()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off, do not spin,
			// and do not flood the log either.
			s.acceptErrs.log(s.log, "TCPStore accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = nc.Close()
			return
		}
		ip := connKey(nc.RemoteAddr())
		adm := s.admissionLocked(ip)
		if adm == notMember {
			s.mu.Unlock()
			s.count(&s.counts.NotMember)
			s.refuse(nc.RemoteAddr(), "not a node of the job")
			_ = nc.Close()
			continue
		}
		if reason, perAddr, args := s.makeRoomLocked(ip); reason != "" {
			s.mu.Unlock()
			if perAddr {
				s.count(&s.counts.PerAddrCap)
			}
			s.refuse(nc.RemoteAddr(), reason, args...)
			_ = nc.Close()
			continue
		}
		c := newConn(s, nc, s.st)
		c.addr, c.shakeBy, c.admitted = ip, time.Now().Add(s.lim.HandshakeTimeout), adm == admitted
		s.trackLocked(c)
		s.wg.Add(2)
		s.mu.Unlock()
		go c.serve()
		go c.notifyLoop()
	}
}

// Reset starts a new attempt: every key is dropped, every waiter and current
// connection is closed. Memory after Reset does not depend on earlier attempts.
// The allowlist becomes provisional until the next SetAllowed (admit.go).
//
// One kind of connection is retired instead of closed: one that never sent
// anything but WATCH_KEY and that was vouched for as (or queried like) the
// callback connection every torch 1.13 TCPStore opens and never uses.
// Closing it makes 1.13's listener thread spin on the closed socket, a
// core's worth per surviving rank of an in-process restart until it leaves
// its process group. A retired connection is bound to a state that never
// changes (its watches never fire) and holds nothing of the old attempt;
// any other query closes it. A silent connection nobody vouched for (an
// idle flood) is closed.
func (s *Server) Reset() {
	s.mu.Lock()
	old := s.conns
	s.st = newState(s.lim)
	if s.retired == nil {
		s.retired = newState(s.lim)
	}
	s.provisional = s.allow != nil
	closing := make(map[*conn]struct{}, len(old))
	idle := 0
	for c := range old {
		if c.spoke.Load() || c.pending != nil {
			if !c.spoke.Load() {
				idle++
			}
			closing[c] = struct{}{}
			s.forgetLocked(c)
			continue
		}
		if !c.retired.Load() {
			c.st.dropWatches(c)
			c.st = s.retired
			c.retired.Store(true)
		}
	}
	retired := len(s.conns)
	s.mu.Unlock()
	s.counts.IdleAtReset.Add(uint64(idle))
	closeAll(closing)
	s.log.Debug("TCPStore reset", "closed_conns", len(closing), "idle_closed", idle, "retired_conns", retired)
}

// closeAll closes the connections and waits until their goroutines let go
// of them.
func closeAll(conns map[*conn]struct{}) {
	for c := range conns {
		c.close()
	}
	for c := range conns {
		<-c.exited
	}
}

// Close stops listening, closes every connection and waits for the server's
// goroutines. It is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.stopCtx != nil {
			s.stopCtx()
		}
		s.mu.Lock()
		s.closed = true
		old := make(map[*conn]struct{}, len(s.conns))
		for c := range s.conns {
			old[c] = struct{}{}
			s.forgetLocked(c)
		}
		s.st = newState(s.lim)
		s.mu.Unlock()
		if err := s.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			s.closeErr = fmt.Errorf("tcpstore: close listener: %w", err)
		}
		closeAll(old)
		s.wg.Wait()
		s.log.Info("TCPStore server closed", "addr", s.addr.String())
	})
	return s.closeErr
}

// Stats reports what the server holds now.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{
		Keys:    len(s.st.kv),
		Bytes:   s.st.bytes,
		Conns:   len(s.conns),
		Waiters: s.st.waiters,
		Queued:  s.queued,
		Refused: s.refused.Load(),
		Pending: s.pendingList.Len(),
		Counts: Counts{
			NotMember:   s.counts.NotMember.Load(),
			NoHandshake: s.counts.NoHandshake.Load(),
			PerAddrCap:  s.counts.PerAddrCap.Load(),
			IdleAtReset: s.counts.IdleAtReset.Load(),
		},
	}
}

// refuse logs a refusal at a limited rate and counts it. The count comes
// last, so whoever sees it (Stats, a test) also finds the log line.
func (s *Server) refuse(peer net.Addr, reason string, args ...any) {
	s.refusals.log(s.log, "TCPStore client refused", append([]any{"peer", peer.String(), "reason", reason}, args...)...)
	s.refused.Add(1)
}

// rateLog logs the first refusalBurst events one by one, then at most one
// line per refusalEvery carrying how many it held back: a client that
// reconnects in a loop cannot flood the launcher's log.
type rateLog struct {
	mu         sync.Mutex
	logged     int
	suppressed int
	last       time.Time
}

const (
	refusalBurst = 10
	refusalEvery = time.Second
)

func (r *rateLog) log(log *slog.Logger, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if r.logged >= refusalBurst && now.Sub(r.last) < refusalEvery {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	if r.suppressed > 0 {
		args = append(args, "suppressed_since_last", r.suppressed)
	}
	r.logged++
	r.suppressed = 0
	r.last = now
	r.mu.Unlock()
	log.Warn(msg, args...)
}
