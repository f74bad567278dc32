package metrics

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what clients of the metrics endpoint can hold (docs/metrics.md).
// The launcher's file descriptors are shared with its rank monitors, the
// ranks' pipes and the agent store, so a client must not pin them: a
// connection that sends nothing is closed after ReadHeaderTimeout, an idle
// keep-alive after IdleTimeout, and at most MaxConns are open at once.
type Limits struct {
	ReadHeaderTimeout time.Duration // from accept (or the end of the previous request) to a complete request header
	ReadTimeout       time.Duration // to read a whole request
	WriteTimeout      time.Duration // from the end of the request header to the end of the response
	IdleTimeout       time.Duration // a keep-alive connection waiting for its next request
	MaxConns          int           // open connections; over it the oldest idle one is closed
}

// DefaultLimits returns the limits of --metrics-addr. A scrape (one GET,
// a response of a few tens of KiB) needs a fraction of a second; a scraper
// keeping its connection between scrapes up to IdleTimeout apart keeps it,
// one scraping less often reconnects.
func DefaultLimits() Limits {
	return Limits{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxConns:          64,
	}
}

// maxHeaderBytes: a scrape's request header is a few hundred bytes.
const maxHeaderBytes = 16 << 10

// boundedListener caps the open connections at max. Unlike a semaphore
// (golang.org/x/net/netutil.LimitListener), which stops accepting at the
// cap so that a scrape waits behind every idle connection of a flood until
// they time out, it accepts the newcomer and closes the connection that has
// been waiting longest without a request in progress (never sent one, or
// idle between keep-alive requests). Only when every open connection has a
// request in progress is the newcomer closed instead. So a flood of silent
// or idle connections holds at most max descriptors and a scraper, whose
// connection sends its request at once, still gets through.
type boundedListener struct {
	net.Listener
	max int

	mu    sync.Mutex
	open  map[*boundedConn]struct{}
	peak  int // most connections open at once (tests, docs/benchmarks.md)
	evict int // connections closed to make room (tests)
}

func newBoundedListener(ln net.Listener, max int) *boundedListener {
	return &boundedListener{Listener: ln, max: max, open: map[*boundedConn]struct{}{}}
}

// boundedConn is an accepted connection; waiting and since are under the
// listener's mu.
type boundedConn struct {
	net.Conn
	l       *boundedListener
	waiting bool      // no request in progress (http.StateNew or StateIdle)
	since   time.Time // when it started waiting
	once    sync.Once
}

// Accept returns the next connection, making room for it.
func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		bc := &boundedConn{Conn: c, l: l, waiting: true, since: time.Now()}
		l.mu.Lock()
		var victim *boundedConn
		if len(l.open) >= l.max {
			for o := range l.open {
				if o.waiting && (victim == nil || o.since.Before(victim.since)) {
					victim = o
				}
			}
			if victim == nil { // every slot serves a request: refuse the newcomer
				l.mu.Unlock()
				_ = c.Close()
				continue
			}
			delete(l.open, victim)
			l.evict++
		}
		l.open[bc] = struct{}{}
		l.peak = max(l.peak, len(l.open))
		l.mu.Unlock()
		if victim != nil {
			_ = victim.Close()
		}
		return bc, nil
	}
}

// connState is the server's http.Server.ConnState: it tells which
// connections wait for a request.
func (l *boundedListener) connState(c net.Conn, st http.ConnState) {
	bc, ok := c.(*boundedConn)
	if !ok {
		return
	}
	switch st {
	case http.StateActive, http.StateIdle:
		l.mu.Lock()
		bc.waiting = st == http.StateIdle
		if bc.waiting {
			bc.since = time.Now()
		}
		l.mu.Unlock()
	case http.StateHijacked, http.StateClosed:
		l.release(bc)
	}
}

func (l *boundedListener) release(bc *boundedConn) {
	l.mu.Lock()
	delete(l.open, bc)
	l.mu.Unlock()
}

// Close closes the connection once and frees its slot.
func (c *boundedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		c.l.release(c)
		err = c.Conn.Close()
	})
	return err
}

// stats returns the connections open now, the most ever open at once and
// how many were closed to make room.
func (l *boundedListener) stats() (open, peak, evicted int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.open), l.peak, l.evict
}
