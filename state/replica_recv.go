package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
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
	// Allow is who is admitted until SetAllowed changes it; the zero
	// value admits nobody (auth.go).
	Allow Allowlist
	// Secret is the job secret: with one, every frame must carry its HMAC
	// tag (replicate.go); nil: the allowlist alone protects the port.
	Secret []byte
	// HandshakeTimeout closes a connection that sent no complete first
	// frame within it; 0 means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxConns and MaxConnsPerAddr bound the connections held; 0 means
	// DefaultMaxConns and DefaultMaxConnsPerAddr.
	MaxConns, MaxConnsPerAddr int
	// NLocal is the ranks per node (the job's --nproc-per-node), for the
	// bound on the bytes held; 0 means 1.
	NLocal int
	// OwnLargest is the size of this node's largest own save now (the
	// segments' newest payloads); nil: none. The copies of a job's ranks
	// are about that size, which bounds a copy (copyLimit).
	OwnLargest func() uint64
	// MinCopyLimit is the smallest bound on one copy; 0 means
	// DefaultMinCopyLimit.
	MinCopyLimit uint64
	Emit         func(eventlog.Record) // nil: no events (*eventlog.Log\'s Emit)
	Logger       *slog.Logger          // nil: slog.Default

	// memAvailable reads the free memory (default: MemAvailable of
	// /proc/meminfo); a test hook.
	memAvailable func() (uint64, error)
	// logEvery spaces the records of refusals per address (default 5 s);
	// a test hook.
	logEvery time.Duration
	// slowRead, when set, is called before each read of at most 1 KiB of
	// a payload (tests: a buddy that reads at a trickle).
	slowRead func()
}

// Defaults of ReceiverOptions.
const (
	DefaultHandshakeTimeout = 5 * time.Second
	DefaultMaxConns         = 64
	DefaultMaxConnsPerAddr  = 8
	// DefaultMinCopyLimit is the bound on one copy before the job's own
	// saves make it larger: CopyLimitFactor times the largest save of this
	// node's ranks or of the copies it holds.
	DefaultMinCopyLimit = 256 << 20
	CopyLimitFactor     = 4
)

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

	key  []byte // HMAC key (macKey), nil without a secret
	rlog refusalLog

	mu        sync.Mutex // guards everything below
	allow     allowSet
	perAddr   map[netip.Addr]int
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
	if opts.logEvery <= 0 {
		opts.logEvery = 5 * time.Second
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if opts.MaxConns <= 0 {
		opts.MaxConns = DefaultMaxConns
	}
	if opts.MaxConnsPerAddr <= 0 {
		opts.MaxConnsPerAddr = DefaultMaxConnsPerAddr
	}
	if opts.NLocal <= 0 {
		opts.NLocal = 1
	}
	if opts.MinCopyLimit == 0 {
		opts.MinCopyLimit = DefaultMinCopyLimit
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("state replica receiver: listen on %q: %w", opts.Addr, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Receiver{opts: opts, ln: ln, cancel: cancel, slots: map[replKey]*replSlot{}, conns: map[net.Conn]struct{}{},
		key: macKey(opts.Secret, opts.Job), rlog: refusalLog{every: opts.logEvery},
		allow: newAllowSet(opts.Allow), perAddr: map[netip.Addr]int{}}
	r.wg.Add(1)
	go r.accept()
	context.AfterFunc(ctx, func() { _ = r.Close() })
	return r, nil
}

// Addr is the address the receiver listens on.
func (r *Receiver) Addr() string { return r.ln.Addr().String() }

// SetAllowed replaces who is admitted (a new round's nodes). Connections
// already admitted stay; each new frame is checked against the new list.
// Copies held from nodes no longer listed stay (a restore may need them)
// until the bytes held need their room.
func (r *Receiver) SetAllowed(a Allowlist) {
	s := newAllowSet(a)
	r.mu.Lock()
	r.allow = s
	r.mu.Unlock()
}

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
		ip := remoteIP(c)
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = c.Close()
			return
		}
		// Who may connect is decided before a byte is read: a non-member
		// is answered and dropped at once, and never holds a connection.
		var why string
		var reason eventlog.ReplicaRefusal
		switch {
		case !r.allow.admits(ip):
			why, reason = fmt.Sprintf("%s is not an address of this job's round that this buddy knows (only the round's nodes that replicate to or restore from it, and this host, are admitted)", ip), eventlog.ReplicaRefusedNotMember
		case len(r.conns) >= r.opts.MaxConns:
			why, reason = fmt.Sprintf("this buddy holds %d connections already (at most %d)", len(r.conns), r.opts.MaxConns), eventlog.ReplicaRefusedConnLimit
		case r.perAddr[ip] >= r.opts.MaxConnsPerAddr:
			why, reason = fmt.Sprintf("this buddy holds %d connections from %s already (at most %d per address)", r.perAddr[ip], ip, r.opts.MaxConnsPerAddr), eventlog.ReplicaRefusedConnLimit
		}
		r.conns[c] = struct{}{}
		r.perAddr[ip]++
		r.wg.Add(1)
		r.mu.Unlock()
		if why != "" {
			go r.refuseConn(c, ip, reason, why)
			continue
		}
		go r.serve(c, ip)
	}
}

// forget drops c from the connections held.
func (r *Receiver) forget(c net.Conn, ip netip.Addr) {
	r.mu.Lock()
	delete(r.conns, c)
	if r.perAddr[ip]--; r.perAddr[ip] <= 0 {
		delete(r.perAddr, ip)
	}
	r.mu.Unlock()
	_ = c.Close()
}

// refuseConn answers a connection that is not admitted with a refusal
// (try later: the list may be a round behind the peer's) and closes it.
func (r *Receiver) refuseConn(c net.Conn, ip netip.Addr, reason eventlog.ReplicaRefusal, why string) {
	defer r.wg.Done()
	defer r.forget(c, ip)
	r.refused(ip, c.RemoteAddr().String(), reason, nil, why)
	// No job id: a non-member learns nothing of the job from the answer.
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(frame{Kind: kindRefuse, Status: refuseLater, Msg: why}.encode(r.key))
}

// refused records a refusal: a slog warning and an event, at most one per
// address every few seconds (the next one counts those left out).
func (r *Receiver) refused(ip netip.Addr, peer string, reason eventlog.ReplicaRefusal, f *frame, why string) {
	rec, n := r.rlog.note(ip)
	if !rec {
		return
	}
	ev := eventlog.StateReplicaRefusedEvent{Peer: peer, Reason: reason, Error: why}
	args := []any{"peer", peer, "reason", reason, "err", why}
	if f != nil {
		ev.Sender, ev.Rank = &f.Node, eventlog.Opt(int(f.Rank))
		args = append(args, "node", f.Node, "rank", f.Rank)
		if f.Kind == kindCopy {
			ev.Bytes = eventlog.Opt(int64(f.Length))
			args = append(args, "bytes", f.Length)
		}
	}
	if n > 0 {
		ev.Suppressed = eventlog.Opt(n)
		args = append(args, "suppressed", n)
	}
	r.opts.Logger.Warn("state replica receiver: refused a peer", args...)
	r.opts.Emit(ev)
}

func (r *Receiver) serve(c net.Conn, ip netip.Addr) {
	defer r.wg.Done()
	defer r.forget(c, ip)
	br, bw := bufio.NewReaderSize(c, 64<<10), bufio.NewWriterSize(c, 64<<10)
	// A peer says what it wants at once; one that stays silent would only
	// hold a connection.
	_ = c.SetReadDeadline(time.Now().Add(r.opts.HandshakeTimeout))
	first := true
	for {
		f, err := readFrame(br, r.key)
		if first {
			_ = c.SetReadDeadline(time.Time{})
		}
		switch {
		case err == nil:
		case errors.Is(err, ErrAuth):
			r.refused(ip, c.RemoteAddr().String(), eventlog.ReplicaRefusedAuth, &f, err.Error())
			r.reply(bw, frame{Kind: kindRefuse, Status: refuseFatal, Msg: err.Error()})
			return
		case errors.Is(err, ErrProtocol):
			r.refused(ip, c.RemoteAddr().String(), eventlog.ReplicaRefusedProtocol, nil, err.Error())
			return
		case first && isTimeout(err):
			r.refused(ip, c.RemoteAddr().String(), eventlog.ReplicaRefusedHandshake, nil,
				fmt.Sprintf("no complete first frame within the handshake timeout of %s: connection closed", r.opts.HandshakeTimeout))
			return
		default:
			return
		}
		first = false
		if err := checkPeer(f, r.opts.Job); err != nil {
			r.refused(ip, c.RemoteAddr().String(), eventlog.ReplicaRefusedProtocol, &f, err.Error())
			r.reply(bw, frame{Kind: kindRefuse, Status: refuseFatal, Msg: err.Error()})
			return
		}
		var keep bool
		switch f.Kind {
		case kindCopy:
			keep = r.receive(c, ip, br, bw, f)
		case kindFetch:
			keep = r.serveFetch(c, ip, bw, f)
		default:
			r.reply(bw, frame{Kind: kindBad, Msg: fmt.Sprintf("%v: unexpected frame kind %d", ErrProtocol, f.Kind)})
		}
		if !keep {
			return
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func (r *Receiver) reply(w *bufio.Writer, f frame) error {
	f.Job = r.opts.Job
	if _, err := w.Write(f.encode(r.key)); err != nil {
		return err
	}
	return w.Flush()
}

// refuseLater refuses f for now and ends the connection: the sender tries
// again later (the list may be a round behind, or the job's saves grow).
func (r *Receiver) refuseLater(c net.Conn, ip netip.Addr, bw *bufio.Writer, f frame, reason eventlog.ReplicaRefusal, why string) bool {
	r.refused(ip, c.RemoteAddr().String(), reason, &f, why)
	_ = r.reply(bw, frame{Kind: kindRefuse, Status: refuseLater, Rank: f.Rank, Seq: f.Seq, Msg: why})
	return false
}

// receive takes one copy; it reports whether the connection is still in
// step (false: the stream broke and the connection is dropped).
func (r *Receiver) receive(c net.Conn, ip netip.Addr, br *bufio.Reader, bw *bufio.Writer, f frame) bool {
	key := replKey{f.Node, f.Rank}
	r.mu.Lock()
	err := r.allow.sender(f.Node, ip)
	limit := r.copyLimitLocked()
	r.mu.Unlock()
	if err != nil {
		return r.refuseLater(c, ip, bw, f, eventlog.ReplicaRefusedNotSender, err.Error())
	}
	if f.Length > limit {
		return r.refuseLater(c, ip, bw, f, eventlog.ReplicaRefusedOversized,
			fmt.Sprintf("a copy of %d bytes of rank %d from node %q is over this buddy's limit of %d bytes per copy (%d times the largest save of this job's ranks it knows, at least %d)",
				f.Length, f.Rank, f.Node, limit, CopyLimitFactor, r.opts.MinCopyLimit))
	}
	if err := r.reserve(key, c, f.Length); err != nil {
		var over jobBoundError
		if errors.As(err, &over) {
			return r.refuseLater(c, ip, bw, f, eventlog.ReplicaRefusedOversized, err.Error())
		}
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
	p, crc, err := readPayload(src, f, r.key)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		r.release(key, c, nil)
		r.opts.Emit(eventlog.StateReplicaDiscardedEvent{Sender: f.Node, Rank: int(f.Rank), Seq: int64(f.Seq), Step: f.Step, Error: err.Error()})
		if errors.Is(err, ErrAuth) {
			r.refused(ip, c.RemoteAddr().String(), eventlog.ReplicaRefusedAuth, &f, err.Error())
			_ = r.reply(bw, frame{Kind: kindBad, Seq: f.Seq, Msg: err.Error()})
			return false
		}
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
func (r *Receiver) serveFetch(c net.Conn, ip netip.Addr, bw *bufio.Writer, f frame) bool {
	r.mu.Lock()
	ok := r.allow.admits(ip)
	r.mu.Unlock()
	if !ok {
		return r.refuseLater(c, ip, bw, f, eventlog.ReplicaRefusedNotMember,
			fmt.Sprintf("%s may not fetch from this buddy: only this host and the round's nodes that restore from it may", ip))
	}
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
	return writeCopy(bw, r.opts.Job, r.key, cp) == nil
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
