package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
)

// The fast node-loss signal. A launcher that dies while its host lives
// (a crash, an OOM kill, SIGKILL) has its sockets closed by the kernel.
// Every launcher listens on a "stream" port; each active node of a round
// holds a connection to the next streamWatchPeers active nodes (in group
// rank order, wrapping around; the closer lists them in each rank record),
// so every active node is watched by that many others at O(1) cost per
// node and no extra etcd read. When a watched connection ends without
// the "bye" a launcher writes when it closes on purpose, the watcher dials
// the port again: a refused dial (the host answers, nothing listens) means
// the launcher is gone, and the loss is reported at once. Anything else
// (the dial times out, the host is unreachable) is left to gossip, which
// bounds it: a silent node never closes a connection, so this path cannot
// raise a false alarm for a stall or a partition.

const (
	streamWatchPeers = 2
	streamHello      = "hi\n" // written on accept: a live launcher answers
	streamBye        = "bye\n"
	streamDialWait   = 2 * time.Second
)

// Who the stream port answers (docs/state.md, "Who may reach the
// replication port", covers it too): this host and the addresses of the
// job's gossip members, every one this node ever saw join (a member
// gossip later declared dead still probes and watches: refusing it would
// turn a partition into a loss). A connection from another address is
// not greeted: it is held, unanswered, until its address joins (gossip
// may learn a new node after the node dialled) or streamAdmitWait passes,
// and then closed. A closed watch connection without a bye makes the
// watcher dial again, which succeeds, so a held legitimate watcher is
// never reported lost.
const (
	streamAdmitWait    = 5 * time.Second
	streamAdmitPoll    = 100 * time.Millisecond
	streamPendingMax   = 64 // connections held unanswered, in all
	streamPendingPer   = 4  // … from one address
	streamConnsPerAddr = 32 // answered connections from one address (watchers and probes)
	streamLogEvery     = 10 * time.Second
)

// streamServer accepts the watch connections of peers and holds them.
type streamServer struct {
	ln    net.Listener
	admit func(netip.Addr) bool
	log   *slog.Logger
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// per counts the connections from each address, answered (conns) or
	// held; pending the held ones.
	per     map[netip.Addr]int
	pending map[netip.Addr]int
	npend   int
	lastLog map[netip.Addr]time.Time
	wg      sync.WaitGroup
}

// startStream opens this launcher's stream listener on ip.
func (d *lossDetector) startStream(ip string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return err
	}
	s := &streamServer{ln: ln, admit: d.admitsStream, log: d.log, conns: map[net.Conn]struct{}{},
		per: map[netip.Addr]int{}, pending: map[netip.Addr]int{}, lastLog: map[netip.Addr]time.Time{}}
	s.wg.Add(1)
	go s.accept()
	d.mu.Lock()
	d.stream = s
	d.streamAddr = ln.Addr().String()
	d.mu.Unlock()
	return nil
}

func (s *streamServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, or a connection aborted before it was
			// taken: the fast loss signal must not end with it.
			s.log.Warn("stream listener: accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		ip := netutil.RemoteIP(c)
		s.mu.Lock()
		why := ""
		switch {
		case s.per[ip] >= streamConnsPerAddr:
			why = fmt.Sprintf("%d connections from this address already (at most %d)", s.per[ip], streamConnsPerAddr)
		case !s.admit(ip) && (s.npend >= streamPendingMax || s.pending[ip] >= streamPendingPer):
			why = fmt.Sprintf("not an address of the job, and %d such connections are held already (at most %d, %d per address)", s.npend, streamPendingMax, streamPendingPer)
		}
		if why != "" {
			s.mu.Unlock()
			s.refused(ip, why)
			c.Close()
			continue
		}
		s.per[ip]++
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go s.serve(c, ip)
	}
}

// serve greets c once its address is admitted, then holds it until the
// watcher hangs up (or stop closes it).
func (s *streamServer) serve(c net.Conn, ip netip.Addr) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		if s.per[ip]--; s.per[ip] <= 0 {
			delete(s.per, ip)
		}
		s.mu.Unlock()
		c.Close()
	}()
	if !s.waitAdmitted(c, ip) {
		return
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, streamHello); err != nil {
		return
	}
	_ = c.SetWriteDeadline(time.Time{})
	_, _ = io.Copy(io.Discard, c) // returns when the watcher hangs up (or stop closes c)
}

// waitAdmitted holds an unknown address's connection, unanswered, until
// the address is admitted or streamAdmitWait passes (false: refused).
func (s *streamServer) waitAdmitted(c net.Conn, ip netip.Addr) bool {
	if s.admit(ip) {
		return true
	}
	s.mu.Lock()
	s.pending[ip]++
	s.npend++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.pending[ip]--; s.pending[ip] <= 0 {
			delete(s.pending, ip)
		}
		s.npend--
		s.mu.Unlock()
	}()
	deadline := time.Now().Add(streamAdmitWait)
	for time.Now().Before(deadline) {
		// A read that ends early means the peer hung up or stop closed c.
		_ = c.SetReadDeadline(time.Now().Add(streamAdmitPoll))
		var b [64]byte
		if _, err := c.Read(b[:]); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return false
			}
		}
		if s.admit(ip) {
			_ = c.SetReadDeadline(time.Time{})
			return true
		}
	}
	s.refused(ip, fmt.Sprintf("not an address of the job's gossip members or of this host within %s: closed unanswered", streamAdmitWait))
	return false
}

// refused logs a refused connection, once per address every
// streamLogEvery.
func (s *streamServer) refused(ip netip.Addr, why string) {
	s.mu.Lock()
	last, seen := s.lastLog[ip]
	now := time.Now()
	rec := !seen || now.Sub(last) >= streamLogEvery
	if rec {
		if len(s.lastLog) > 4096 {
			clear(s.lastLog)
		}
		s.lastLog[ip] = now
	}
	s.mu.Unlock()
	if rec {
		s.log.Warn("rendezvous: stream port refused a connection", "peer", ip, "why", why)
	}
}

// stop closes the listener and says bye on every held connection, so that
// the watchers know this close is deliberate.
func (s *streamServer) stop() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		_, _ = io.WriteString(c, streamBye)
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// admitsStream reports whether ip may be answered on the stream port: an
// address of this host, or of a gossip member this node ever saw.
func (d *lossDetector) admitsStream(ip netip.Addr) bool {
	d.mu.Lock()
	_, ok := d.seen[ip]
	local := d.local
	d.mu.Unlock()
	if ok {
		return true
	}
	if local == nil {
		local = netutil.LocalAddrs()
		d.mu.Lock()
		d.local = local
		d.mu.Unlock()
	}
	return slices.Contains(local, ip)
}

// sawMember records a gossip member's address for admitsStream.
func (d *lossDetector) sawMember(n net.IP) {
	if ip, ok := netip.AddrFromSlice(n); ok {
		d.mu.Lock()
		d.seen[ip.Unmap()] = struct{}{}
		d.mu.Unlock()
	}
}

// stopStream stops this launcher's stream listener (at Close).
func (e *Etcd) stopStream() { e.loss.stopStream() }

func (d *lossDetector) stopStream() {
	d.mu.Lock()
	s := d.stream
	d.stream = nil
	d.mu.Unlock()
	if s != nil {
		s.stop()
	}
}

// watchStreams watches the stream connections of peers (this node's
// rank record lists them) until ctx ends (the round ends).
func (d *lossDetector) watchStreams(ctx context.Context, r int, peers []streamPeer) {
	defer d.wg.Done()
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.watchPeer(ctx, r, p.ID, p.Addr)
		}()
	}
	wg.Wait()
}

// watchPeer holds a connection to node id's stream port and reports the
// node lost when the connection ends and the port refuses a new one.
func (d *lossDetector) watchPeer(ctx context.Context, r int, id, addr string) {
	dl := net.Dialer{Timeout: streamDialWait}
	c, err := dl.DialContext(ctx, "tcp", addr)
	how, evidence := "stream port refused", time.Time{}
	for ctx.Err() == nil {
		if err != nil {
			if errors.Is(err, syscall.ECONNREFUSED) {
				if evidence.IsZero() {
					evidence = time.Now()
				}
				d.judge.nodeLostAt(r, id, how, evidence)
				d.judge.markDead(id) // for a later round's closer, when r had already ended
			} else if ctx.Err() == nil {
				d.log.Debug("stream watch: dial; leaving the node to gossip", "node", id, "err", err)
			}
			return
		}
		stop := context.AfterFunc(ctx, func() { c.Close() })
		bye, rerr := readBye(c)
		stop()
		c.Close()
		if bye || ctx.Err() != nil {
			return
		}
		if !errors.Is(rerr, io.EOF) && !errors.Is(rerr, syscall.ECONNRESET) {
			d.log.Debug("stream watch: read; leaving the node to gossip", "node", id, "err", rerr)
			return
		}
		// Closed without a bye: dial again to tell a dead launcher (refused)
		// from a live one that dropped the connection (accepted: watch on).
		d.log.Debug("stream watch: connection closed without bye", "node", id, "round", r)
		how, evidence = "connection closed, stream port refused", time.Now()
		c, err = dl.DialContext(ctx, "tcp", addr)
		if err == nil {
			evidence = time.Time{} // alive after all
		}
	}
	if c != nil {
		c.Close()
	}
}

// readBye reads a watch connection until it ends: bye is true when the
// peer said bye first.
func readBye(c net.Conn) (bool, error) {
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if line == streamBye {
			return true, nil
		}
		if err != nil {
			return false, err
		}
	}
}

// streamAnswers reports whether a launcher answers on its stream listener
// at addr within wait: then it is alive and reachable from here, whatever
// a (possibly stale) gossip message says. A stopped process does not
// answer (the kernel completes the handshake, but nobody writes).
func streamAnswers(addr string, wait time.Duration) bool {
	c, err := net.DialTimeout("tcp", addr, wait)
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(wait))
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == streamHello
}
