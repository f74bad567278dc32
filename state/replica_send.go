package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// ReplicatorOptions configure the sending side of replication.
type ReplicatorOptions struct {
	Job string // job (run) id, the same on every node
	// Secret is the job secret (--job-secret-file): every frame and copy
	// is sent with its HMAC tag; nil: none.
	Secret []byte
	Node   string // this launcher's node id, the key of its copies at the buddies
	// NLocal and Segment name the segments to replicate (Store.SegmentPath).
	NLocal  int
	Segment func(lr int) string
	// Buddies are the buddy launchers' receiver addresses ("host:port").
	Buddies []string
	// Poll is how often the segments' headers are read; 0 means 200 ms.
	Poll time.Duration
	// CopyTimeout bounds one copy to one buddy (header, payload, answer);
	// a copy that takes longer is dropped and the next try sends the
	// newest save. 0 means 30 s.
	CopyTimeout time.Duration
	// DialTimeout bounds a connection attempt; 0 means 5 s.
	DialTimeout time.Duration
	// LocalIP, when valid, is the address copies are sent from: the
	// node's advertised address, which its buddies admit its copies from
	// (a multi-homed host would otherwise pick one by route).
	LocalIP netip.Addr
	// MaxBackoff bounds the wait before reconnecting to a failed buddy
	// (it doubles from Poll up to this); 0 means 5 s.
	MaxBackoff time.Duration
	Emit       func(eventlog.Record) // nil: no events (*eventlog.Log\'s Emit)
	Logger     *slog.Logger          // nil: slog.Default

	// corrupt, when set, alters the payload bytes on the wire after they
	// were checksummed (tests: a checksum mismatch).
	corrupt func(p []byte)
}

// BuddyStatus is what the sender knows of one buddy.
type BuddyStatus struct {
	Addr      string
	Connected bool
	// Sent is the seq of each local rank's newest save the buddy verified.
	Sent []uint64
	// Refused is, per local rank, why the buddy refused its copies ("":
	// not refused). A refused rank is no longer sent to that buddy; it
	// relies on the files in the state directory.
	Refused   []string
	Copies    int // copies verified
	Skipped   uint64
	Failures  int
	LastError string
}

// Replicator streams every local rank's newest committed save to each
// buddy: one goroutine and one connection per buddy, reading the segments
// as the background writer does. It never queues: each try sends the
// newest save, so saves made while a copy was under way coalesce into the
// next one. Neither the ranks nor the caller ever wait for it.
type Replicator struct {
	opts   ReplicatorOptions
	key    []byte
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards buddies
	buddies []*buddy
}

type buddy struct {
	opts ReplicatorOptions
	key  []byte
	addr string
	kick chan struct{}
	stop context.CancelFunc
	done chan struct{}

	// conn, br, bw are used by the buddy's goroutine only.
	conn   net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	unhook func() bool

	mu sync.Mutex // guards st
	st BuddyStatus
}

// StartReplicator starts one sender per buddy; they stop when ctx is
// cancelled or at Close.
func StartReplicator(ctx context.Context, opts ReplicatorOptions) (*Replicator, error) {
	if opts.Job == "" || opts.Node == "" {
		return nil, fmt.Errorf("state replication: job id %q and node id %q must both be set", opts.Job, opts.Node)
	}
	if opts.NLocal < 1 || opts.Segment == nil {
		return nil, fmt.Errorf("state replication: %d local ranks and a segment path are needed", opts.NLocal)
	}
	if opts.Poll <= 0 {
		opts.Poll = 200 * time.Millisecond
	}
	if opts.CopyTimeout <= 0 {
		opts.CopyTimeout = 30 * time.Second
	}
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = 5 * time.Second
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Emit == nil {
		opts.Emit = func(eventlog.Record) {}
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Replicator{opts: opts, key: macKey(opts.Secret, opts.Job), ctx: ctx, cancel: cancel}
	r.SetBuddies(opts.Buddies)
	return r, nil
}

// SetBuddies changes the buddies (a new round's ring): senders to buddies
// no longer listed stop (a copy under way is cut), new ones start from
// nothing sent; the others keep their connection and progress.
func (r *Replicator) SetBuddies(addrs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[string]bool{}
	for _, a := range addrs {
		want[a] = true
	}
	kept := r.buddies[:0]
	var stopped []*buddy
	have := map[string]bool{}
	for _, b := range r.buddies {
		if want[b.addr] {
			kept = append(kept, b)
			have[b.addr] = true
		} else {
			b.stop()
			stopped = append(stopped, b)
		}
	}
	r.buddies = kept
	for _, b := range stopped {
		<-b.done
	}
	if r.ctx.Err() != nil {
		return
	}
	for _, a := range addrs {
		if have[a] {
			continue
		}
		have[a] = true
		ctx, stop := context.WithCancel(r.ctx)
		b := &buddy{opts: r.opts, key: r.key, addr: a, kick: make(chan struct{}, 1), stop: stop, done: make(chan struct{}),
			st: BuddyStatus{Addr: a, Sent: make([]uint64, r.opts.NLocal), Refused: make([]string, r.opts.NLocal)}}
		r.buddies = append(r.buddies, b)
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			defer close(b.done)
			b.run(ctx)
		}()
	}
}

// Notify asks every buddy's sender to look at the segments now (a save
// was seen); it never blocks.
func (r *Replicator) Notify() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, b := range r.buddies {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
}

// Status returns what each buddy's sender knows.
func (r *Replicator) Status() []BuddyStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]BuddyStatus, 0, len(r.buddies))
	for _, b := range r.buddies {
		b.mu.Lock()
		s := b.st
		s.Sent = append([]uint64(nil), s.Sent...)
		s.Refused = append([]string(nil), s.Refused...)
		b.mu.Unlock()
		out = append(out, s)
	}
	return out
}

// Close stops the senders (a copy under way is cut; the buddy discards it).
func (r *Replicator) Close() {
	r.cancel()
	r.wg.Wait()
}

// BuddyRing returns the buddies of the node at index self of ring (the
// round's nodes in group-rank order): the next k nodes after it, wrapping
// around, never itself; all the others when k >= len(ring)-1.
func BuddyRing(ring []string, self, k int) []string {
	n := len(ring)
	if self < 0 || self >= n || k <= 0 {
		return nil
	}
	k = min(k, n-1)
	out := make([]string, 0, k)
	for i := 1; i <= k; i++ {
		out = append(out, ring[(self+i)%n])
	}
	return out
}

func (b *buddy) run(ctx context.Context) {
	defer b.drop()
	t := time.NewTicker(b.opts.Poll)
	defer t.Stop()
	backoff := b.opts.Poll
	var next time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-b.kick:
		}
		if time.Now().Before(next) {
			continue
		}
		err := b.syncAll(ctx)
		if err == nil {
			backoff, next = b.opts.Poll, time.Time{}
			continue
		}
		if ctx.Err() != nil {
			return
		}
		b.drop()
		backoff = min(2*backoff, b.opts.MaxBackoff)
		next = time.Now().Add(backoff)
		b.mu.Lock()
		b.st.Failures++
		b.st.LastError = err.Error()
		b.mu.Unlock()
		var lr replRankError
		errors.As(err, &lr)
		b.opts.Emit(eventlog.StateReplicaFailedEvent{Buddy: b.addr, LocalRank: lr.lr, Error: err.Error(),
			ElapsedMS: lr.elapsed.Milliseconds(), RetryInMS: backoff.Milliseconds()})
		b.opts.Logger.Warn("state replication: a copy to a buddy failed; the next try sends the newest save", "buddy", b.addr,
			"err", err, "retry_in", backoff)
	}
}

// replRankError is a failed copy of local rank lr; elapsed is how long
// the failing attempt took (at most CopyTimeout once connected).
type replRankError struct {
	lr      int
	elapsed time.Duration
	err     error
}

func (e replRankError) Error() string { return fmt.Sprintf("local rank %d: %v", e.lr, e.err) }
func (e replRankError) Unwrap() error { return e.err }

// syncAll sends each local rank's newest save that the buddy lacks.
func (b *buddy) syncAll(ctx context.Context) error {
	for lr := 0; lr < b.opts.NLocal; lr++ {
		b.mu.Lock()
		sent, refused := b.st.Sent[lr], b.st.Refused[lr] != ""
		b.mu.Unlock()
		if refused {
			continue
		}
		if err := b.syncRank(ctx, lr, sent); err != nil {
			return err
		}
	}
	return nil
}

func (b *buddy) syncRank(ctx context.Context, lr int, sent uint64) error {
	f, err := os.Open(b.opts.Segment(lr))
	if errors.Is(err, fs.ErrNotExist) {
		return nil // the rank never saved
	}
	if err != nil {
		return replRankError{lr: lr, err: fmt.Errorf("open segment: %w", err)}
	}
	defer f.Close()
	const attempts = 4 // a saver outpacing the copy aborts it; the next try takes the newest
	for range attempts {
		d, err := Newest(f)
		if errors.Is(err, ErrEmpty) || (err == nil && d.Seq <= sent) {
			return nil
		}
		if err != nil {
			return replRankError{lr: lr, err: err}
		}
		start := time.Now()
		if err := b.connect(ctx); err != nil {
			return replRankError{lr, time.Since(start), err}
		}
		err = b.send(ctx, f, d)
		var ref refusedError
		switch {
		case errors.As(err, &ref) && ref.later:
			// Not admitted now (the buddy's list is a round behind, or its
			// limit grows with the job's saves): the connection is gone, try again.
			b.drop()
			return replRankError{lr, time.Since(start), err}
		case errors.As(err, &ref):
			b.mu.Lock()
			b.st.Refused[lr] = ref.msg
			b.mu.Unlock()
			b.opts.Emit(eventlog.StateReplicaRefusedEvent{Buddy: b.addr, LocalRank: eventlog.Opt(lr), Rank: eventlog.Opt(int(d.Rank)), Error: ref.msg})
			b.opts.Logger.Warn("state replication: the buddy refused this rank's copies; it relies on the files in the state directory",
				"buddy", b.addr, "local_rank", lr, "err", ref.msg)
			if ref.fatal {
				b.drop()
			}
			return nil
		case errors.Is(err, errAborted):
			continue
		case err != nil:
			return replRankError{lr, time.Since(start), err}
		}
		skipped := d.Seq - sent - 1
		if sent == 0 {
			skipped = 0
		}
		b.mu.Lock()
		b.st.Sent[lr], b.st.Copies, b.st.Skipped, b.st.Connected = d.Seq, b.st.Copies+1, b.st.Skipped+skipped, true
		b.mu.Unlock()
		b.opts.Emit(eventlog.StateReplicaSentEvent{Buddy: b.addr, LocalRank: lr, Rank: int(d.Rank), Step: d.Step,
			Seq: int64(d.Seq), Bytes: int64(d.Length), SendMS: float64(time.Since(start).Microseconds()) / 1000, Skipped: int64(skipped)})
		return nil
	}
	return replRankError{lr: lr, err: fmt.Errorf("the rank saved again during each of %d copies in a row", attempts)}
}

// refusedError: the buddy refused a copy (fatal: the whole buddy, a job or
// version mismatch).
type refusedError struct {
	msg   string
	fatal bool
	later bool // refuseLater: not now
}

func (e refusedError) Error() string { return "refused by the buddy: " + e.msg }

func (b *buddy) connect(ctx context.Context) error {
	if b.conn != nil {
		return nil
	}
	d := net.Dialer{Timeout: b.opts.DialTimeout, LocalAddr: localTCP(b.opts.LocalIP)}
	c, err := d.DialContext(ctx, "tcp", b.addr)
	if err != nil {
		return fmt.Errorf("connect to buddy %s: %w", b.addr, err)
	}
	b.conn, b.br, b.bw = c, bufio.NewReaderSize(c, 4096), bufio.NewWriterSize(c, 256<<10)
	// Cancelling ctx cuts a copy under way at once.
	b.unhook = context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	b.mu.Lock()
	b.st.Connected = true
	b.mu.Unlock()
	return nil
}

func (b *buddy) drop() {
	if b.conn == nil {
		return
	}
	b.unhook()
	_ = b.conn.Close()
	b.conn = nil
	b.mu.Lock()
	b.st.Connected = false
	b.mu.Unlock()
}

// send streams the save d from seg to the buddy within CopyTimeout. It
// returns errAborted when the rank reused d's slot during the stream (the
// buddy discards the copy; the connection stays usable).
func (b *buddy) send(ctx context.Context, seg *os.File, d Desc) error {
	if err := b.conn.SetDeadline(time.Now().Add(b.opts.CopyTimeout)); err != nil {
		return fmt.Errorf("buddy %s: %w", b.addr, err)
	}
	// The deadline just set overrides the one a cancellation sets: a
	// cancellation before this point is seen here, a later one cuts the copy.
	if err := ctx.Err(); err != nil {
		return err
	}
	wrap := func(what string, err error) error {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return fmt.Errorf("copy of save %d (step %d, %d bytes) to buddy %s: %s: not done within %s (a slow or stuck buddy): %w",
				d.Seq, d.Step, d.Length, b.addr, what, b.opts.CopyTimeout, err)
		}
		return fmt.Errorf("copy of save %d (step %d, %d bytes) to buddy %s: %s: %w", d.Seq, d.Step, d.Length, b.addr, what, err)
	}
	h := frame{Kind: kindCopy, Job: b.opts.Job, Node: b.opts.Node, Rank: d.Rank, Step: d.Step, Seq: d.Seq,
		Length: d.Length, DurationNS: d.DurationNS}
	hb := h.encode(b.key)
	if _, err := b.bw.Write(hb); err != nil {
		return wrap("send header", err)
	}
	if err := b.bw.Flush(); err != nil {
		return wrap("send header", err)
	}
	rep, err := b.answer()
	if err != nil {
		return wrap("read the answer to the header", err)
	}
	switch rep.Kind {
	case kindAccept:
	case kindRefuse:
		return refusedError{msg: rep.Msg, fatal: rep.Status == refuseFatal, later: rep.Status == refuseLater}
	default:
		return wrap("answer to the header", fmt.Errorf("%w: frame kind %d", ErrProtocol, rep.Kind))
	}
	crc := crc32.New(castagnoli)
	// The saver's CRC, when it set one, is checked too: a save damaged in
	// memory after its commit must not reach a buddy, which would restore
	// it under a fresh CRC (docs/state.md, "Integrity").
	var saverCRC hash.Hash32
	if d.HasCRC() {
		saverCRC = crc32.NewIEEE()
	}
	var mac hash.Hash
	if b.key != nil {
		mac = payloadMAC(b.key, hb[len(hb)-macSize:])
	}
	buf := make([]byte, 256<<10)
	sec := io.NewSectionReader(seg, int64(d.Offset), int64(d.Length))
	for {
		n, rerr := sec.Read(buf)
		if n > 0 {
			crc.Write(buf[:n])
			if saverCRC != nil {
				saverCRC.Write(buf[:n])
			}
			if mac != nil {
				mac.Write(buf[:n])
			}
			if b.opts.corrupt != nil {
				b.opts.corrupt(buf[:n])
			}
			if _, err := b.bw.Write(buf[:n]); err != nil {
				return wrap("send payload", err)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return wrap("read segment", rerr) // the stream is out of step: the caller drops the connection
		}
	}
	status := uint32(trailerComplete)
	var damaged error
	if ok, err := stillCommitted(seg, d); err != nil || !ok {
		status = trailerAborted
	} else if saverCRC != nil && saverCRC.Sum32() != d.PayloadCRC {
		status, damaged = trailerAborted, &CorruptError{Desc: d, PayloadCRC: saverCRC.Sum32()}
	}
	tr := trailer(crc.Sum32(), status)
	if _, err := b.bw.Write(tr); err != nil {
		return wrap("send trailer", err)
	}
	if mac != nil {
		mac.Write(tr)
		if _, err := b.bw.Write(mac.Sum(nil)); err != nil {
			return wrap("send trailer", err)
		}
	}
	if err := b.bw.Flush(); err != nil {
		return wrap("send payload", err)
	}
	rep, err = b.answer()
	if err != nil {
		return wrap("read the buddy's verdict", err)
	}
	_ = b.conn.SetDeadline(time.Time{})
	switch {
	case rep.Kind == kindOK && status == trailerComplete:
		return nil
	case damaged != nil:
		return wrap("check against the saver's CRC", damaged)
	case status == trailerAborted:
		return errAborted
	case rep.Kind == kindBad:
		return wrap("verify", fmt.Errorf("the buddy discarded it: %s", rep.Msg))
	default:
		return wrap("verify", fmt.Errorf("%w: frame kind %d", ErrProtocol, rep.Kind))
	}
}

func (b *buddy) answer() (frame, error) {
	f, err := readFrame(b.br, b.key)
	if err != nil {
		return f, err
	}
	if f.Kind == kindRefuse {
		return f, nil // its message says why (job, version, memory)
	}
	return f, checkPeer(f, b.opts.Job)
}
