package rendezvous

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
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

// streamServer accepts the watch connections of peers and holds them.
type streamServer struct {
	ln    net.Listener
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// startStream opens this launcher's stream listener on ip.
func (d *lossDetector) startStream(ip string) error {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return err
	}
	s := &streamServer{ln: ln, conns: map[net.Conn]struct{}{}}
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
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := io.WriteString(c, streamHello); err != nil {
			c.Close()
			continue
		}
		_ = c.SetWriteDeadline(time.Time{})
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_, _ = io.Copy(io.Discard, c) // returns when the watcher hangs up (or stop closes c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
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
