package rendezvous

import (
	"bufio"
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
)

// The two-level join (docs/rendezvous.md, Scale, "Relays"). A first round
// costs etcd two requests per node (its registration txn and its rank
// read), and at 16,000 nodes one request per node is already most of the
// time a round may take (TestScaleFloor). A relay is a node that writes
// the registrations of the nodes that name it (its group, from the
// scheduler's static topology) in batches, one guarded txn for up to
// relayBatch of them, and reads their rank entries in batches, one
// read-only txn for up to relayRankBatch.
//
// What stays each node's own: its lease (a membership is still put under
// the member's lease, so its expiry still removes it), the proof of that
// lease before it registers (Next waits for a renewal first, as for a
// direct registration) and the fence. A relay changes who sends a
// registration, not what it says nor when it may be sent: a member asks
// only after its own proof, and a batch is written within relayQueueWait
// plus one txn of the asking. Anything a batch cannot say for every one of
// its members (a quarantine, a death record, a lease gone, the round
// assigned, an error, a relay that is slow or gone) is answered
// "register yourself": the member registers directly, which handles each
// case as before (registering twice is harmless). A relay is an
// optimisation that can only fall back.
//
// The relay port answers only the job: a connection proves the job secret
// (RelayKey) in a challenge-response both ways before anything is read,
// and every frame after carries an HMAC over its direction, sequence
// number and bytes, so a host without the secret can neither register a
// node nor read a rank, nor alter or replay a frame. Nothing received is
// executed: a request is JSON of a fixed shape, checked field by field.

const (
	relayBatch     = 48 // registrations per txn: 48 puts, 48 deletes and a read stay within etcd's 128 ops
	relayRankBatch = 120
	// relayBudget bounds a request's life at the relay, from its arrival
	// to the end of the txn that carries it (retried while etcd is
	// overloaded or away); a request older than that is declined unsent.
	relayBudget = 8 * time.Second
	// relayAnswerWait bounds a member's wait for its relay's answer once
	// the handshake showed the relay running; then it registers (or reads
	// its rank) directly. Above relayBudget, so that a member gives up only
	// on a relay that froze mid-request, and the relay has sent nothing for
	// it after that (but for a txn etcd applies after its caller's
	// deadline: a second registration, harmless). A relay that is slow
	// because etcd is slow is waited for: sending its members to etcd one
	// by one would only add load (seen at 16,000 nodes, where a 3 s bound
	// sent 16,000 of them).
	relayAnswerWait = relayBudget + 2*time.Second
	relayDialWait   = time.Second
	relayDownFor    = 10 * time.Second // after a failed dial, direct for this long
	relayAuthWait   = 2 * time.Second  // the handshake, either side; a request's acknowledgement
	// A member keeps its authenticated connection for the next request
	// while it is younger than relayKeepIdle; the relay closes one idle for
	// relayIdleWait (longer, so that it rarely closes one a member is about
	// to use; a member that finds its kept connection closed asks again on
	// a new one).
	relayKeepIdle = 2 * time.Minute
	relayIdleWait = 5 * time.Minute
	// Twice the largest group: every member's kept connection, and room
	// for those that replace connections the relay has not yet seen close.
	relayMaxConns  = 2048
	relayMaxFrame  = 1 << 20
	relayMagic     = "ftl-relay-2\n" // 2: requests acknowledged, connections kept
	relayMACSize   = sha256.Size
	relayNonceSize = 32
	relayLogEvery  = 10 * time.Second
)

// relayReq is a member's request.
type relayReq struct {
	Op        string `json:"op"` // "register" or "rank"
	Round     int    `json:"round"`
	Gen       int    `json:"gen"`
	Node      string `json:"node"`
	Member    string `json:"member,omitempty"` // the registration's value (memberInfo JSON)
	Lease     int64  `json:"lease,omitempty"`
	DeathRead bool   `json:"death_read,omitempty"`
}

// relayKV is a key and value the relay read.
type relayKV struct {
	Key   string `json:"k"`
	Value []byte `json:"v"`
}

// relayReply answers one relayReq. OK false: do it yourself.
type relayReply struct {
	OK  bool      `json:"ok"`
	Rev int64     `json:"rev,omitempty"`
	KVs []relayKV `json:"kvs,omitempty"` // register: the round keys as the batch's txn read them; rank: the entry, if any
	Why string    `json:"why,omitempty"`
}

func (q relayReq) check() error {
	switch {
	case q.Op != "register" && q.Op != "rank":
		return fmt.Errorf("unknown op %q (register, rank)", q.Op)
	case q.Round < 0 || q.Gen < 0:
		return fmt.Errorf("bad round %d or generation %d", q.Round, q.Gen)
	case q.Node == "" || len(q.Node) > 512:
		return errors.New("bad node id")
	}
	if q.Op == "rank" {
		return nil
	}
	if q.Lease <= 0 {
		return errors.New("register without a lease")
	}
	var m memberInfo
	if err := json.Unmarshal([]byte(q.Member), &m); err != nil {
		return fmt.Errorf("bad member: %w", err)
	}
	if m.NodeID != q.Node {
		return fmt.Errorf("member %q registered as node %q", m.NodeID, q.Node)
	}
	return nil
}

// relayConn is an authenticated connection: frames of a length, the bytes
// and an HMAC of the direction, the sequence number and the bytes.
type relayConn struct {
	c                net.Conn
	r                *bufio.Reader
	sess             []byte
	out, in          byte // direction bytes
	sendSeq, recvSeq uint64
}

func relayMAC(key []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// relayHandshake proves the job secret both ways on c (server: the relay
// side) and returns the connection with its session key.
func relayHandshake(c net.Conn, key []byte, server bool) (*relayConn, error) {
	r := bufio.NewReader(c)
	var sn, cn [relayNonceSize]byte
	if server {
		if _, err := rand.Read(sn[:]); err != nil {
			return nil, err
		}
		if _, err := c.Write(append([]byte(relayMagic), sn[:]...)); err != nil {
			return nil, err
		}
		var in [relayNonceSize + relayMACSize]byte
		if _, err := io.ReadFull(r, in[:]); err != nil {
			return nil, fmt.Errorf("read proof: %w", err)
		}
		copy(cn[:], in[:relayNonceSize])
		if !hmac.Equal(in[relayNonceSize:], relayMAC(key, []byte("c"), sn[:], cn[:])) {
			return nil, errors.New("the peer did not prove the job secret")
		}
		if _, err := c.Write(relayMAC(key, []byte("s"), sn[:], cn[:])); err != nil {
			return nil, err
		}
		return &relayConn{c: c, r: r, sess: relayMAC(key, []byte("k"), sn[:], cn[:]), out: 's', in: 'c'}, nil
	}
	var hello [len(relayMagic) + relayNonceSize]byte
	if _, err := io.ReadFull(r, hello[:]); err != nil {
		return nil, fmt.Errorf("read hello: %w", err)
	}
	if string(hello[:len(relayMagic)]) != relayMagic {
		return nil, errors.New("not a relay port")
	}
	copy(sn[:], hello[len(relayMagic):])
	if _, err := rand.Read(cn[:]); err != nil {
		return nil, err
	}
	if _, err := c.Write(append(cn[:], relayMAC(key, []byte("c"), sn[:], cn[:])...)); err != nil {
		return nil, err
	}
	var proof [relayMACSize]byte
	if _, err := io.ReadFull(r, proof[:]); err != nil {
		return nil, fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(proof[:], relayMAC(key, []byte("s"), sn[:], cn[:])) {
		return nil, errors.New("the relay did not prove the job secret")
	}
	return &relayConn{c: c, r: r, sess: relayMAC(key, []byte("k"), sn[:], cn[:]), out: 'c', in: 's'}, nil
}

func (rc *relayConn) mac(dir byte, seq uint64, payload []byte) []byte {
	var h [9]byte
	h[0] = dir
	binary.BigEndian.PutUint64(h[1:], seq)
	return relayMAC(rc.sess, h[:], payload)
}

func (rc *relayConn) write(v any) error {
	payload, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return rc.writeFrame(payload)
}

func (rc *relayConn) writeFrame(payload []byte) error {
	buf := make([]byte, 4, 4+len(payload)+relayMACSize)
	binary.BigEndian.PutUint32(buf, uint32(len(payload)))
	buf = append(buf, payload...)
	buf = append(buf, rc.mac(rc.out, rc.sendSeq, payload)...)
	rc.sendSeq++
	_, err := rc.c.Write(buf)
	return err
}

func (rc *relayConn) read(v any) error {
	payload, err := rc.readFrame()
	if err != nil {
		return err
	}
	return json.Unmarshal(payload, v)
}

// relayAck is the frame a relay sends as soon as it has a request: the
// member then knows the relay is running (and waits for its answer up to
// relayAnswerWait), as the handshake showed on a new connection.
var relayAck = []byte(`"ack"`)

func (rc *relayConn) writeAck() error { return rc.writeFrame(relayAck) }

func (rc *relayConn) readAck() error {
	payload, err := rc.readFrame()
	if err != nil {
		return err
	}
	if !bytes.Equal(payload, relayAck) {
		return errors.New("the relay did not acknowledge the request")
	}
	return nil
}

func (rc *relayConn) readFrame() ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(rc.r, n[:]); err != nil {
		return nil, err
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > relayMaxFrame {
		return nil, fmt.Errorf("frame of %d bytes (at most %d)", size, relayMaxFrame)
	}
	buf := make([]byte, int(size)+relayMACSize)
	if _, err := io.ReadFull(rc.r, buf); err != nil {
		return nil, err
	}
	payload, sum := buf[:size], buf[size:]
	if !hmac.Equal(sum, rc.mac(rc.in, rc.recvSeq, payload)) {
		return nil, errors.New("frame failed its HMAC")
	}
	rc.recvSeq++
	return payload, nil
}

// relayJob is one request waiting in the relay's batcher.
type relayJob struct {
	req   relayReq
	at    time.Time
	reply chan relayReply
}

type relayBatchKey struct {
	op    string
	round int
}

// relayServer is a relay node's listener and batcher.
type relayServer struct {
	ln     net.Listener
	key    []byte
	parts  *roundParts
	gen    int
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	jobs   chan *relayJob
	wg     sync.WaitGroup

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	lastLog time.Time
	refused int
	stats   relayStats
}

// relayStats count what a relay did: memberships it wrote and rank
// entries it read for its members, in how many txns, and the requests it
// sent back to be done directly.
type relayStats struct {
	Registered, RegisterTxns, Ranks, RankTxns, Declined, Refused int
	Conns                                                        int // connections that proved the job secret
}

func (s *relayServer) count(f func(*relayStats)) {
	s.mu.Lock()
	f(&s.stats)
	s.mu.Unlock()
}

func (s *relayServer) statsNow() relayStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// startRelay serves this node's relay on ln.
func startRelay(ln net.Listener, key []byte, parts *roundParts, gen int, log *slog.Logger) *relayServer {
	s := &relayServer{ln: ln, key: key, parts: parts, gen: gen, log: log,
		jobs: make(chan *relayJob, relayMaxConns), conns: map[net.Conn]struct{}{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go s.accept()
	go s.batch()
	return s
}

// addr is the listener's address as bound.
func (s *relayServer) addr() string { return s.ln.Addr().String() }

func (s *relayServer) stop() {
	s.cancel()
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *relayServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors, or a connection aborted before it was
			// taken: the listener lives on.
			s.log.Warn("relay: accept failed", "err", err)
			sleepCtx(s.ctx, 50*time.Millisecond)
			continue
		}
		s.mu.Lock()
		if len(s.conns) >= relayMaxConns || s.ctx.Err() != nil {
			s.mu.Unlock()
			_ = c.Close()
			s.refuse(c, "too many connections")
			continue
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

// refuse logs a refused connection, at most every relayLogEvery.
func (s *relayServer) refuse(c net.Conn, why string) {
	s.mu.Lock()
	s.refused++
	s.stats.Refused++
	n, now := s.refused, time.Now()
	if now.Sub(s.lastLog) < relayLogEvery {
		s.mu.Unlock()
		return
	}
	s.lastLog, s.refused = now, 0
	s.mu.Unlock()
	s.log.Warn("relay refused a connection", "from", c.RemoteAddr().String(), "why", why, "refused", n)
}

func (s *relayServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		_ = c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	_ = c.SetDeadline(time.Now().Add(relayAuthWait))
	rc, err := relayHandshake(c, s.key, true)
	if err != nil {
		s.refuse(c, err.Error())
		return
	}
	s.count(func(st *relayStats) { st.Conns++ })
	for {
		// A member keeps its connection between requests (rounds); one
		// idle for relayIdleWait is closed.
		_ = c.SetDeadline(time.Now().Add(relayIdleWait))
		var q relayReq
		if err := rc.read(&q); err != nil {
			if !errors.Is(err, io.EOF) && s.ctx.Err() == nil {
				s.log.Debug("relay connection ended", "from", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		_ = c.SetWriteDeadline(time.Now().Add(relayAuthWait))
		if err := rc.writeAck(); err != nil {
			return
		}
		var ans relayReply
		if err := q.check(); err != nil {
			ans.Why = err.Error()
			s.count(func(st *relayStats) { st.Declined++ })
		} else if q.Gen != s.gen {
			ans.Why = fmt.Sprintf("generation %d, the relay's is %d", q.Gen, s.gen)
			s.count(func(st *relayStats) { st.Declined++ })
		} else {
			j := &relayJob{req: q, at: time.Now(), reply: make(chan relayReply, 1)}
			select {
			case s.jobs <- j:
				select {
				case ans = <-j.reply:
				case <-s.ctx.Done():
					return
				}
			case <-s.ctx.Done():
				return
			}
		}
		_ = c.SetWriteDeadline(time.Now().Add(relayAnswerWait))
		if err := rc.write(ans); err != nil {
			return
		}
	}
}

// batch gathers requests by kind and round, as a database commits a group:
// a request goes out at once when no batch of its kind and round is in
// flight, and those that arrive meanwhile go out together when it returns
// (up to a full batch each). The batches grow with the load, and a lone
// request waits for nothing.
func (s *relayServer) batch() {
	defer s.wg.Done()
	pending := map[relayBatchKey][]*relayJob{}
	busy := map[relayBatchKey]bool{}
	done := make(chan relayBatchKey)
	start := func(k relayBatchKey) {
		js := pending[k]
		size := relayBatch
		if k.op == "rank" {
			size = relayRankBatch
		}
		n := min(len(js), size)
		batch := slices.Clone(js[:n])
		if pending[k] = js[n:]; len(pending[k]) == 0 {
			delete(pending, k)
		}
		busy[k] = true
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.flush(k, batch)
			select {
			case done <- k:
			case <-s.ctx.Done():
			}
		}()
	}
	for {
		select {
		case <-s.ctx.Done():
			for _, js := range pending {
				answer(js, relayReply{Why: "relay closed"})
			}
			return
		case j := <-s.jobs:
			k := relayBatchKey{j.req.Op, j.req.Round}
			pending[k] = append(pending[k], j)
			if !busy[k] {
				start(k)
			}
		case k := <-done:
			delete(busy, k)
			if len(pending[k]) > 0 {
				start(k)
			}
		}
	}
}

func answer(js []*relayJob, a relayReply) {
	for _, j := range js {
		j.reply <- a
	}
}

// decline sends a batch back to be done directly.
func (s *relayServer) decline(js []*relayJob, why string) {
	s.count(func(st *relayStats) { st.Declined += len(js) })
	answer(js, relayReply{Why: why})
}

// flush runs one batch: a request past its budget is declined, and the
// rest sent within the oldest one's, retried while etcd says "later"
// (overloaded, unavailable): declining a batch because etcd is slow would
// send its members to etcd one by one, more load on an etcd that is
// already too slow.
func (s *relayServer) flush(k relayBatchKey, js []*relayJob) {
	fresh := js[:0:0]
	for _, j := range js {
		if time.Since(j.at) > relayBudget {
			s.decline([]*relayJob{j}, "waited too long at the relay")
			continue
		}
		fresh = append(fresh, j)
	}
	if len(fresh) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(s.ctx, fresh[0].at.Add(relayBudget))
	defer cancel()
	for {
		var err error
		if k.op == "rank" {
			err = s.readRanks(ctx, k.round, fresh)
		} else {
			err = s.register(ctx, k.round, fresh)
		}
		if err == nil {
			return
		}
		if !transient(err) || !sleepCtx(ctx, retryWait(err)) {
			s.log.Debug("relay batch failed; its members do it themselves", "op", k.op, "round", k.round, "members", len(fresh), "err", err)
			s.decline(fresh, "batch failed: "+err.Error())
			return
		}
	}
}

// register writes the batch's memberships of round r in one txn, guarded
// as a direct registration is (round.register) for every member at once,
// and answers them; an error is etcd's, the batch unanswered.
func (s *relayServer) register(ctx context.Context, r int, js []*relayJob) error {
	rd := &round{roundParts: s.parts, r: r}
	read := rd.roundKeysRead()
	guard := rd.joinGuard()
	then := make([]clientv3.Op, 0, 2*len(js)+1)
	for _, j := range js {
		guard = append(guard, rd.nodeGuard(j.req.Node, j.req.DeathRead)...)
		then = append(then, rd.membership(j.req.Node, j.req.Member, clientv3.LeaseID(j.req.Lease))...)
	}
	resp, err := s.parts.cli.Txn(ctx).If(guard...).Then(append(then, read)...).Commit()
	switch {
	case err != nil:
		// A lease gone (one member cut off past its TTL) fails the whole
		// batch, not transiently: each member registers itself, which
		// replaces its lease.
		return err
	case !resp.Succeeded:
		s.decline(js, "round assigned, job closed, or a member quarantined or recorded dead")
		return nil
	}
	s.count(func(st *relayStats) { st.Registered += len(js); st.RegisterTxns++ })
	rr := resp.Responses[len(resp.Responses)-1].GetResponseRange()
	ans := relayReply{OK: true, Rev: resp.Header.Revision}
	for _, kv := range rr.GetKvs() {
		ans.KVs = append(ans.KVs, relayKV{Key: string(kv.Key), Value: kv.Value})
	}
	answer(js, ans)
	return nil
}

// readRanks reads the batch's rank entries of round r in one read-only
// txn (served as a linearizable read, not a raft write).
func (s *relayServer) readRanks(ctx context.Context, r int, js []*relayJob) error {
	k := s.parts.k
	ops := make([]clientv3.Op, len(js))
	for i, j := range js {
		ops[i] = clientv3.OpGet(k.rank(r, j.req.Node))
	}
	resp, err := s.parts.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return err
	}
	s.count(func(st *relayStats) { st.Ranks += len(js); st.RankTxns++ })
	for i, j := range js {
		ans := relayReply{OK: true, Rev: resp.Header.Revision}
		for _, kv := range resp.Responses[i].GetResponseRange().GetKvs() {
			ans.KVs = append(ans.KVs, relayKV{Key: string(kv.Key), Value: kv.Value})
		}
		j.reply <- ans
	}
	return nil
}

// relayClient is a member's way to its relay. It keeps its authenticated
// connection between requests (one handshake per member, not one per
// request: the handshake's HMACs and round trips were most of a relay
// request's cost); a kept connection the relay has closed meanwhile (it
// restarted, or the connection sat idle past relayIdleWait) is replaced
// by a new one and the request asked again there, which repeats nothing
// harmful: a second registration, or a second read.
type relayClient struct {
	addr string
	key  []byte
	log  *slog.Logger

	dial func(ctx context.Context, addr string) (net.Conn, error) // nil: TCP

	mu        sync.Mutex
	downUntil time.Time
	warned    bool
	idle      *relayConn // the kept connection, not in use
	idleSince time.Time
	closed    bool
	gone      bool // the relay's node was lost and quarantined: direct for the rest of the run
	// peer is the address the relay's name last resolved to, where addr
	// is a name (a pod's relay not yet in DNS at start): the node id of
	// a lost relay carries its address, not its name.
	peer string
}

// call sends q and returns the relay's answer; an error (no relay, a
// broken connection, no acknowledgement within relayAuthWait, no answer
// within relayAnswerWait) or a reply that is not OK means: do it directly.
func (c *relayClient) call(ctx context.Context, q relayReq) (relayReply, error) {
	c.mu.Lock()
	down, gone := time.Now().Before(c.downUntil), c.gone
	c.mu.Unlock()
	if gone {
		return relayReply{}, errors.New("relay's node lost")
	}
	if down {
		return relayReply{}, errors.New("relay unreachable recently")
	}
	dl := time.Now().Add(relayAnswerWait)
	if d, ok := ctx.Deadline(); ok && d.Before(dl) {
		dl = d
	}
	if rc := c.take(); rc != nil {
		a, err := c.exchange(rc, q, dl)
		if err == nil {
			c.keep(rc)
			return a, nil
		}
		_ = rc.c.Close()
		if errors.Is(err, os.ErrDeadlineExceeded) || time.Now().After(dl) {
			// Not acknowledged or not answered in time: the relay is
			// frozen or stuck, not closed; a new connection would wait
			// for it again.
			return relayReply{}, fmt.Errorf("relay %s: %w", c.addr, err)
		}
	}
	rc, err := c.connect(ctx)
	if err != nil {
		return relayReply{}, err
	}
	a, err := c.exchange(rc, q, dl)
	if err != nil {
		_ = rc.c.Close()
		return relayReply{}, fmt.Errorf("relay %s: %w", c.addr, err)
	}
	c.keep(rc)
	return a, nil
}

// exchange sends q on rc and reads the acknowledgement (within
// relayAuthWait: a relay that does not acknowledge is not waited for) and
// then the answer (by dl).
func (c *relayClient) exchange(rc *relayConn, q relayReq, dl time.Time) (relayReply, error) {
	var a relayReply
	ackBy := time.Now().Add(relayAuthWait)
	if dl.Before(ackBy) {
		ackBy = dl
	}
	_ = rc.c.SetDeadline(ackBy)
	if err := rc.write(q); err != nil {
		return a, err
	}
	if err := rc.readAck(); err != nil {
		return a, err
	}
	_ = rc.c.SetDeadline(dl)
	err := rc.read(&a)
	return a, err
}

// connect dials the relay and proves the job secret both ways. A relay
// that cannot be dialled is not tried again for relayDownFor; one that
// does not complete the handshake within relayAuthWait (frozen, its host
// hung) is not waited for.
func (c *relayClient) connect(ctx context.Context) (*relayConn, error) {
	var nc net.Conn
	var err error
	if c.dial != nil {
		nc, err = c.dial(ctx, c.addr)
	} else {
		d := net.Dialer{Timeout: relayDialWait}
		nc, err = d.DialContext(ctx, "tcp", c.addr)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.mu.Lock()
			c.downUntil = time.Now().Add(relayDownFor)
			warn := !c.warned
			c.warned = true
			c.mu.Unlock()
			if warn {
				c.log.Warn("relay unreachable; registering directly", "relay", c.addr, "for", relayDownFor, "err", err)
			}
		}
		return nil, fmt.Errorf("relay %s: %w", c.addr, err)
	}
	_ = nc.SetDeadline(time.Now().Add(relayAuthWait))
	rc, err := relayHandshake(nc, c.key, false)
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("relay %s: %w", c.addr, err)
	}
	if h, _, err := net.SplitHostPort(nc.RemoteAddr().String()); err == nil {
		c.mu.Lock()
		c.peer = h
		c.mu.Unlock()
	}
	return rc, nil
}

// take returns the kept connection, if one is fresh enough to use.
func (c *relayClient) take() *relayConn {
	c.mu.Lock()
	defer c.mu.Unlock()
	rc := c.idle
	c.idle = nil
	if rc != nil && time.Since(c.idleSince) > relayKeepIdle {
		_ = rc.c.Close()
		return nil
	}
	return rc
}

// keep holds rc for the next request (one is kept; another is closed).
func (c *relayClient) keep(rc *relayConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle != nil || c.closed {
		_ = rc.c.Close()
		return
	}
	c.idle, c.idleSince = rc, time.Now()
}

// lost tells the client that node host was lost (a round's end record):
// when it is the relay's, the member does not ask it (a silent host would
// cost each member the acknowledgement's or the dial's wait in the very
// round that replaces it): for the rest of the run when the loss
// quarantined it (it cannot rejoin), else for relayDownFor.
func (c *relayClient) lost(host string, forGood bool) {
	rh, _, err := net.SplitHostPort(c.addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil || (rh != host && c.peer != host) {
		return
	}
	if c.gone || (!forGood && time.Now().Before(c.downUntil)) {
		return
	}
	if forGood {
		c.gone = true
	} else {
		c.downUntil = time.Now().Add(relayDownFor)
	}
	if c.idle != nil {
		_ = c.idle.c.Close()
		c.idle = nil
	}
	c.log.Info("this node's relay was lost; registering directly", "relay", c.addr, "for_the_rest_of_the_run", forGood)
}

// close closes the kept connection; later requests do not keep theirs.
func (c *relayClient) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.idle != nil {
		_ = c.idle.c.Close()
		c.idle = nil
	}
}

// registerViaRelay asks this node's relay to register it in round rd.r;
// ok false: register directly.
func (rd *round) registerViaRelay(ctx context.Context, member string, lease clientv3.LeaseID, deathRead bool) (roundRead, bool) {
	if rd.relay == nil {
		return roundRead{}, false
	}
	// The round this one follows ended for a node's loss: when it was
	// the relay's, skip it.
	if le, ok := rd.view.lastEnd(rd.r - 1); ok && (le.Cause == policy.NodeLost || le.Cause == policy.NodeExcluded) && le.Node != "" {
		rd.relay.lost(nodeAddr(le.Node), quarantines(le.Cause, le.Action, le.Node))
	}
	a, err := rd.relay.call(ctx, relayReq{Op: "register", Round: rd.r, Gen: rd.gen, Node: rd.o.NodeID, Member: member,
		Lease: int64(lease), DeathRead: deathRead})
	if err != nil || !a.OK {
		rd.log.Debug("relay did not register this node; registering directly", "round", rd.r, "err", err, "why", a.Why)
		return roundRead{}, false
	}
	seen := roundRead{rev: a.Rev, lease: lease}
	for _, kv := range a.KVs {
		seen.kvs = append(seen.kvs, &mvccpb.KeyValue{Key: []byte(kv.Key), Value: kv.Value})
	}
	return seen, true
}

// rankViaRelay asks this node's relay for its rank entry in round rd.r;
// ok false: read it directly.
func (rd *round) rankViaRelay(ctx context.Context) (ri rankInfo, keyed, ok bool) {
	if rd.relay == nil {
		return rankInfo{}, false, false
	}
	a, err := rd.relay.call(ctx, relayReq{Op: "rank", Round: rd.r, Gen: rd.gen, Node: rd.o.NodeID})
	if err != nil || !a.OK {
		rd.log.Debug("relay did not read this node's rank; reading it directly", "round", rd.r, "err", err, "why", a.Why)
		return rankInfo{}, false, false
	}
	found := len(a.KVs) > 0
	if found && a.KVs[0].Key != rd.k.rank(rd.r, rd.o.NodeID) {
		return rankInfo{}, false, false
	}
	var v []byte
	if found {
		v = a.KVs[0].Value
	}
	ri, keyed, err = rd.decodeRank(v, found)
	return ri, keyed, err == nil
}

// RelayAddr is the address this node's relay listener is bound to ("" when
// it is not a relay).
func (e *Etcd) RelayAddr() string {
	if e.relay == nil {
		return ""
	}
	return e.relay.addr()
}
