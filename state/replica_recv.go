package state

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// Replication events (Options.Emit / ReceiverOptions.Emit / ReplicatorOptions.Emit).
const (
	EventReplicaSent      = eventlog.StateReplicaSent      // StateReplicaSentEvent
	EventReplicaFailed    = eventlog.StateReplicaFailed    // StateReplicaFailedEvent
	EventReplicaRefused   = eventlog.StateReplicaRefused   // StateReplicaRefusedEvent
	EventReplicaReceived  = eventlog.StateReplicaReceived  // StateReplicaReceivedEvent
	EventReplicaDiscarded = eventlog.StateReplicaDiscarded // StateReplicaDiscardedEvent
)

// ReceiverOptions configure a buddy's Receiver.
type ReceiverOptions struct {
	// Job is the job (run) id; copies and fetches of another job are
	// refused.
	Job string
	// Addr is the address to listen on ("host:port"; port 0 picks one).
	Addr string
	// MaxBytes caps the bytes held in copies (complete and in flight);
	// 0: only MemAvailable bounds them.
	MaxBytes uint64
	// CopyTimeout bounds receiving or serving one copy; 0 means 60 s.
	CopyTimeout time.Duration
	Emit        func(eventlog.Record) // nil: no events (*eventlog.Log\'s Emit)
	Logger      *slog.Logger          // nil: slog.Default

	// memAvailable reads the free memory (default: MemAvailable of
	// /proc/meminfo); a test hook.
	memAvailable func() (uint64, error)
	// slowRead, when set, is called before each read of at most 1 KiB of
	// a payload (tests: a buddy that reads at a trickle).
	slowRead func()
}

type replKey struct {
	node string
	rank int32
}

// inflight is a copy being received: the connection it arrives on and the
// bytes reserved for it.
type inflight struct {
	conn  net.Conn
	bytes uint64
}

type replSlot struct {
	complete *Copy // newest verified copy; never modified, replaced whole
	inflight *inflight
}

// Receiver is the buddy side: it keeps the newest complete copy of every
// (sender node, rank) and at most one copy in flight, and serves them back
// (Fetch). Memory: at most its budget, fixed from MemAvailable when the
// first copy is offered (a quarter of it left for everything else) and
// capped by MaxBytes; a copy that would exceed it is refused with a clear
// error and the sender relies on files for that rank.
type Receiver struct {
	opts   ReceiverOptions
	ln     net.Listener
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex // guards everything below
	slots     map[replKey]*replSlot
	held      uint64
	budget    uint64
	budgetSet bool
	budgetWhy string
	conns     map[net.Conn]struct{}
	closed    bool
}

// Listen starts a Receiver on opts.Addr.
func Listen(ctx context.Context, opts ReceiverOptions) (*Receiver, error) {
	if opts.Job == "" {
		return nil, errors.New("state replica receiver: no job id")
	}
	if opts.CopyTimeout <= 0 {
		opts.CopyTimeout = 60 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Emit == nil {
		opts.Emit = func(eventlog.Record) {}
	}
	if opts.memAvailable == nil {
		opts.memAvailable = memAvailable
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("state replica receiver: listen on %q: %w", opts.Addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Receiver{opts: opts, ln: ln, cancel: cancel, slots: map[replKey]*replSlot{}, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	context.AfterFunc(ctx, func() { _ = r.Close() })
	return r, nil
}

// Addr is the address the receiver listens on.
func (r *Receiver) Addr() string { return r.ln.Addr().String() }

// Copy returns the newest complete copy of rank from node, or nil. The
// copy is never modified; the caller must not modify it either.
func (r *Receiver) Copy(node string, rank int32) *Copy {
	r.mu.Lock()
	defer r.mu.Unlock()
	if s := r.slots[replKey{node, rank}]; s != nil {
		return s.complete
	}
	return nil
}

// Held is the bytes held in copies, complete and in flight.
func (r *Receiver) Held() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// Close stops listening, drops every connection (copies in flight are
// discarded) and waits for the handlers.
func (r *Receiver) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	err := r.ln.Close()
	for c := range r.conns {
		_ = c.Close()
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	return err
}

func (r *Receiver) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			r.opts.Logger.Warn("state replica receiver: accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		r.conns[c] = struct{}{}
		r.wg.Add(1)
		r.mu.Unlock()
		go r.serve(c)
	}
}

func (r *Receiver) serve(c net.Conn) {
	defer r.wg.Done()
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		_ = c.Close()
	}()
	br, bw := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 64<<10)
	for {
		f, err := readFrame(br)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				r.opts.Logger.Warn("state replica receiver: dropping a connection", "peer", c.RemoteAddr().String(), "err", err)
				r.opts.Emit(eventlog.StateReplicaRefusedEvent{Sender: eventlog.Opt(""), Peer: c.RemoteAddr().String(), Error: err.Error()})
			}
			return
		}
		if err := checkPeer(f, r.opts.Job); err != nil {
			r.opts.Logger.Warn("state replica receiver: refusing a peer", "node", f.Node, "err", err)
			r.opts.Emit(eventlog.StateReplicaRefusedEvent{Sender: &f.Node, Rank: eventlog.Opt(int(f.Rank)), Error: err.Error()})
			r.reply(bw, frame{Kind: kindRefuse, Status: 1, Msg: err.Error()})
			return
		}
		var keep bool
		switch f.Kind {
		case kindCopy:
			keep = r.receive(c, br, bw, f)
		case kindFetch:
			keep = r.serveFetch(c, bw, f)
		default:
			r.reply(bw, frame{Kind: kindBad, Msg: fmt.Sprintf("%v: unexpected frame kind %d", ErrProtocol, f.Kind)})
		}
		if !keep {
			return
		}
	}
}

func (r *Receiver) reply(w *bufio.Writer, f frame) error {
	f.Job = r.opts.Job
	if _, err := w.Write(f.encode()); err != nil {
		return err
	}
	return w.Flush()
}

// receive takes one copy; it reports whether the connection is still in
// step (false: the stream broke and the connection is dropped).
func (r *Receiver) receive(c net.Conn, br *bufio.Reader, bw *bufio.Writer, f frame) bool {
	key := replKey{f.Node, f.Rank}
	if err := r.reserve(key, c, f.Length); err != nil {
		r.opts.Logger.Warn("state replica receiver: refusing a copy", "node", f.Node, "rank", f.Rank, "err", err)
		r.opts.Emit(eventlog.StateReplicaRefusedEvent{Sender: &f.Node, Rank: eventlog.Opt(int(f.Rank)), Bytes: eventlog.Opt(int64(f.Length)), Error: err.Error()})
		return r.reply(bw, frame{Kind: kindRefuse, Msg: err.Error()}) == nil
	}
	if err := r.reply(bw, frame{Kind: kindAccept, Rank: f.Rank, Seq: f.Seq}); err != nil {
		r.release(key, c, nil)
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(r.opts.CopyTimeout))
	var src io.Reader = br
	if r.opts.slowRead != nil {
		src = trickle{br, r.opts.slowRead}
	}
	p, crc, err := readPayload(src, f)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		r.release(key, c, nil)
		r.opts.Emit(eventlog.StateReplicaDiscardedEvent{Sender: f.Node, Rank: int(f.Rank), Seq: int64(f.Seq), Step: f.Step, Error: err.Error()})
		if errors.Is(err, errAborted) || errors.Is(err, errChecksum) {
			if errors.Is(err, errChecksum) {
				r.opts.Logger.Warn("state replica receiver: discarded a corrupt copy", "node", f.Node, "rank", f.Rank, "err", err)
			}
			return r.reply(bw, frame{Kind: kindBad, Seq: f.Seq, Msg: err.Error()}) == nil
		}
		r.opts.Logger.Warn("state replica receiver: discarded a partial copy; the previous complete one is kept", "node", f.Node, "rank", f.Rank, "err", err)
		return false
	}
	cp := &Copy{Node: f.Node, Rank: f.Rank, Step: f.Step, Seq: f.Seq, CRC32C: crc,
		Duration: time.Duration(f.DurationNS), Received: time.Now(), Payload: p}
	if !r.release(key, c, cp) {
		return r.reply(bw, frame{Kind: kindBad, Seq: f.Seq, Msg: "superseded by a newer copy from the same sender"}) == nil
	}
	r.opts.Emit(eventlog.StateReplicaReceivedEvent{Sender: f.Node, Rank: int(f.Rank), Step: f.Step, Seq: int64(f.Seq), Bytes: int64(f.Length)})
	return r.reply(bw, frame{Kind: kindOK, Rank: f.Rank, Seq: f.Seq}) == nil
}

// reserve accounts n bytes for a copy of key arriving on c. It fixes the
// budget when the first copy is offered. A copy still in flight for key
// (its sender reconnected; the old stream is dead) is superseded: its
// connection is closed and its bytes released.
func (r *Receiver) reserve(key replKey, c net.Conn, n uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.budgetSet {
		r.budgetSet = true
		avail, err := r.opts.memAvailable()
		switch {
		case err != nil && r.opts.MaxBytes == 0:
			r.budgetWhy = fmt.Sprintf("MemAvailable unreadable: %v", err)
		case err != nil:
			r.budget, r.budgetWhy = r.opts.MaxBytes, "MaxBytes"
		default:
			r.budget = avail - avail/4
			r.budgetWhy = fmt.Sprintf("3/4 of MemAvailable %d bytes at the first copy", avail)
			if r.opts.MaxBytes > 0 && r.opts.MaxBytes < r.budget {
				r.budget, r.budgetWhy = r.opts.MaxBytes, fmt.Sprintf("MaxBytes (MemAvailable %d bytes at the first copy)", avail)
			}
		}
	}
	s := r.slots[key]
	if s == nil {
		s = &replSlot{}
		r.slots[key] = s
	}
	if s.inflight != nil {
		r.held -= s.inflight.bytes
		if s.inflight.conn != c {
			_ = s.inflight.conn.Close()
		}
		s.inflight = nil
	}
	if r.held+n > r.budget {
		return fmt.Errorf("buddy cannot hold a copy of %d bytes of rank %d from node %q: it would hold %d bytes, over its budget of %d bytes (%s); the sender relies on the files in the state directory for this rank",
			n, key.rank, key.node, r.held+n, r.budget, r.budgetWhy)
	}
	r.held += n
	s.inflight = &inflight{conn: c, bytes: n}
	return nil
}

// release ends the copy in flight of key on c: cp, when not nil, becomes
// the complete copy (replacing the previous one). It returns false when
// the copy was superseded meanwhile (its bytes were released then).
func (r *Receiver) release(key replKey, c net.Conn, cp *Copy) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slots[key]
	if s == nil || s.inflight == nil || s.inflight.conn != c {
		return false
	}
	r.held -= s.inflight.bytes
	s.inflight = nil
	if cp != nil {
		if s.complete != nil {
			r.held -= uint64(len(s.complete.Payload))
		}
		s.complete = cp
		r.held += uint64(len(cp.Payload))
	}
	return true
}

// newestOf is the complete copy of rank with the highest step from any
// sender node (the newest received among equal steps), or nil.
func (r *Receiver) newestOf(rank int32) *Copy {
	r.mu.Lock()
	defer r.mu.Unlock()
	var best *Copy
	for k, s := range r.slots {
		c := s.complete
		if k.rank != rank || c == nil {
			continue
		}
		if best == nil || c.Step > best.Step || (c.Step == best.Step && c.Received.After(best.Received)) {
			best = c
		}
	}
	return best
}

// serveFetch answers a fetch of (node, rank); node "" asks for rank's
// newest copy from any node.
func (r *Receiver) serveFetch(c net.Conn, bw *bufio.Writer, f frame) bool {
	var cp *Copy
	if f.Node == "" {
		cp = r.newestOf(f.Rank)
	} else {
		cp = r.Copy(f.Node, f.Rank)
	}
	if cp == nil {
		return r.reply(bw, frame{Kind: kindNotFound, Rank: f.Rank,
			Msg: fmt.Sprintf("this buddy holds no complete copy of rank %d from node %q", f.Rank, f.Node)}) == nil
	}
	_ = c.SetWriteDeadline(time.Now().Add(r.opts.CopyTimeout))
	defer func() { _ = c.SetWriteDeadline(time.Time{}) }()
	return writeCopy(bw, r.opts.Job, cp) == nil
}

// trickle reads at most 1 KiB at a time, calling wait before each read.
type trickle struct {
	r    io.Reader
	wait func()
}

func (t trickle) Read(p []byte) (int, error) {
	t.wait()
	return t.r.Read(p[:min(len(p), 1024)])
}

// memAvailable is MemAvailable of /proc/meminfo, in bytes.
func memAvailable() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read free memory: %w", err)
	}
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		fs := strings.Fields(string(l))
		if len(fs) >= 2 && fs[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemAvailable %q: %w", fs[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemAvailable line")
}
