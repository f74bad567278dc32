package rendezvous

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"
)

var testRelayKey = []byte("0123456789abcdef0123456789abcdef")

// relayJob starts a relay node and members that name it, on a new
// embedded etcd.
func relayJobOf(t *testing.T, members, minNodes int) (*cluster, *Etcd, []*Etcd) {
	t.Helper()
	c := embeddedJob(t)
	n := members + 1
	o := c.opts(0, 2, minNodes, n, 5)
	o.RelayListen, o.RelayKey = "127.0.0.2:0", testRelayKey
	relay := c.add(o)
	var ms []*Etcd
	for i := 1; i <= members; i++ {
		o := c.opts(i, 2, minNodes, n, 5)
		o.Relay, o.RelayKey = relay.RelayAddr(), testRelayKey
		ms = append(ms, c.add(o))
	}
	return c, relay, ms
}

// TestRelayJoin: members register and read their ranks through their
// relay (batched txns), each membership under the member's own lease, in
// a first round and a restart.
func TestRelayJoin(t *testing.T) {
	c, relay, ms := relayJobOf(t, 4, 5)
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 5)
	st := relay.relay.statsNow()
	if st.Registered != 4 || st.Ranks != 4 || st.Declined != 0 || st.Refused != 0 {
		t.Fatalf("first round: relay stats %+v; want 4 registered, 4 ranks read, none declined", st)
	}
	if st.RegisterTxns > 4 || st.RankTxns > 4 {
		t.Fatalf("relay stats %+v: more txns than requests", st)
	}
	cli := testClient(t, c.ep)
	for _, m := range ms {
		get, err := cli.Get(context.Background(), m.k.member(0, m.o.NodeID))
		if err != nil || len(get.Kvs) != 1 {
			t.Fatalf("membership of %s: %v %v", m.o.NodeID, get, err)
		}
		if got, want := get.Kvs[0].Lease, int64(m.sess.current()); got != want {
			t.Fatalf("membership of %s under lease %x, want its own %x", m.o.NodeID, got, want)
		}
	}
	// A restart: everyone registers again through the relay; the ranks
	// did not change, so nobody reads one (the summary's delta).
	if _, err := ms[1].Fail(context.Background(), 0, "rank_crash", "test crash"); err != nil {
		t.Fatal(err)
	}
	as = nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 5)
	if as[0].Round != 1 {
		t.Fatalf("round %d after the crash, want 1", as[0].Round)
	}
	if st := relay.relay.statsNow(); st.Registered != 8 || st.Declined != 0 {
		t.Fatalf("restart: relay stats %+v; want 8 registered, none declined", st)
	}
}

// TestRelayFallsBack: whatever the relay cannot do, the member does
// directly: a relay gone, a member with the wrong key (refused), and a
// quarantined member in a batch (the batch is declined; the quarantined
// node learns of its quarantine, the others join).
func TestRelayFallsBack(t *testing.T) {
	t.Run("relay gone", func(t *testing.T) {
		c, relay, _ := relayJobOf(t, 2, 3)
		relay.relay.stop()
		checkConsistent(t, nextAll(t, c.nodes), 2, 3)
	})
	t.Run("wrong key", func(t *testing.T) {
		c := embeddedJob(t)
		o := c.opts(0, 2, 2, 2, 5)
		o.RelayListen, o.RelayKey = "127.0.0.2:0", testRelayKey
		relay := c.add(o)
		o = c.opts(1, 2, 2, 2, 5)
		o.Relay, o.RelayKey = relay.RelayAddr(), []byte(strings.Repeat("x", 32))
		c.add(o)
		checkConsistent(t, nextAll(t, c.nodes), 2, 2)
		if st := relay.relay.statsNow(); st.Refused == 0 || st.Registered != 0 {
			t.Fatalf("relay stats %+v; want the member refused and nothing registered", st)
		}
	})
	t.Run("quarantined member", func(t *testing.T) {
		c, relay, ms := relayJobOf(t, 3, 3) // the quarantined one will not come
		bad := ms[1]
		qi, _ := json.Marshal(quarantineInfo{Node: bad.o.NodeID, Reason: "test", At: time.Now()})
		if _, err := testClient(t, c.ep).Put(context.Background(), relay.k.quarantine(nodeAddr(bad.o.NodeID)), string(qi)); err != nil {
			t.Fatal(err)
		}
		// Whether its request comes alone or in a batch with others, the
		// batch's guard fails on it: declined, and its members register
		// directly.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		badErr := make(chan error, 1)
		bctx, bcancel := context.WithCancel(ctx)
		defer bcancel()
		go func() {
			_, err := bad.Next(bctx)
			badErr <- err
		}()
		as := nextAll(t, []*Etcd{relay, ms[0], ms[2]})
		checkConsistent(t, as, 2, 3)
		if st := relay.relay.statsNow(); st.Declined < 1 {
			t.Fatalf("relay stats %+v: the quarantined node's registration was not declined", st)
		}
		// It parks (quarantined nodes wait for the job's end): stop it.
		bcancel()
		if err := recvWithin(t, badErr, 20*time.Second, "the quarantined node's Next"); err == nil {
			t.Fatal("the quarantined node was assigned")
		}
		get, gerr := testClient(t, c.ep).Get(context.Background(), bad.k.member(0, bad.o.NodeID))
		if gerr != nil || len(get.Kvs) != 0 {
			t.Fatalf("the quarantined node is registered: %v %v", get.Kvs, gerr)
		}
	})
}

// TestRelayPortAnswersOnlyTheJob: the handshake refuses a peer without the
// job secret (either side), and a frame altered or replayed is refused.
func TestRelayPortAnswersOnlyTheJob(t *testing.T) {
	s := startRelay(tcpListener(t), testRelayKey, &roundParts{}, 0, testLogger(t))
	defer s.stop()
	dial := func(key []byte) (*relayConn, error) {
		c, err := net.DialTimeout("tcp", s.addr(), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		return relayHandshake(c, key, false)
	}
	if _, err := dial([]byte(strings.Repeat("y", 32))); err == nil {
		t.Fatal("a client with the wrong key completed the handshake")
	}
	// A bad request is answered (declined), on an authenticated connection.
	rc, err := dial(testRelayKey)
	if err != nil {
		t.Fatal(err)
	}
	var a relayReply
	for i := range 2 { // acknowledged and answered, twice on one connection
		if err := rc.write(relayReq{Op: "exec", Node: "x"}); err != nil {
			t.Fatal(err)
		}
		if err := rc.readAck(); err != nil {
			t.Fatalf("request %d not acknowledged: %v", i, err)
		}
		if err := rc.read(&a); err != nil || a.OK || !strings.Contains(a.Why, "unknown op") {
			t.Fatalf("bad op answered %+v, %v", a, err)
		}
	}
	payload, _ := json.Marshal(relayReq{Op: "rank", Node: "x"})
	// A replayed frame (sequence 0 again) ends the connection unanswered.
	frame := binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	frame = append(append(frame, payload...), rc.mac(rc.out, 0, payload)...)
	if _, err := rc.c.Write(frame); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.readFrame(); err == nil {
		t.Fatalf("a replayed frame was acknowledged")
	}
	// An altered frame: the same.
	rc, err = dial(testRelayKey)
	if err != nil {
		t.Fatal(err)
	}
	frame = binary.BigEndian.AppendUint32(nil, uint32(len(payload)))
	frame = append(append(frame, payload...), rc.mac(rc.out, 0, payload)...)
	frame[5] ^= 1
	if _, err := rc.c.Write(frame); err != nil {
		t.Fatal(err)
	}
	if _, err := rc.readFrame(); err == nil {
		t.Fatalf("an altered frame was acknowledged")
	}
	// A server without the secret: the client refuses it.
	fake := startRelay(tcpListener(t), []byte(strings.Repeat("z", 32)), &roundParts{}, 0, testLogger(t))
	defer fake.stop()
	c, err := net.DialTimeout("tcp", fake.addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := relayHandshake(c, testRelayKey, false); err == nil {
		t.Fatal("the client accepted a relay without the job secret")
	}
	if st := s.statsNow(); st.Refused < 1 {
		t.Fatalf("relay stats %+v: the wrong key was not counted", st)
	}
}

func TestRelayRequestCheck(t *testing.T) {
	member := func(id string) string { b, _ := json.Marshal(memberInfo{NodeID: id}); return string(b) }
	for _, tc := range []struct {
		name string
		q    relayReq
		want string
	}{
		{"register", relayReq{Op: "register", Node: "a/1", Member: member("a/1"), Lease: 7}, ""},
		{"rank", relayReq{Op: "rank", Round: 3, Node: "a/1"}, ""},
		{"unknown op", relayReq{Op: "delete", Node: "a/1"}, "unknown op"},
		{"negative round", relayReq{Op: "rank", Round: -1, Node: "a/1"}, "bad round"},
		{"no node", relayReq{Op: "rank"}, "bad node id"},
		{"no lease", relayReq{Op: "register", Node: "a/1", Member: member("a/1")}, "without a lease"},
		{"not JSON", relayReq{Op: "register", Node: "a/1", Member: "{", Lease: 7}, "bad member"},
		{"another node's membership", relayReq{Op: "register", Node: "a/1", Member: member("b/1"), Lease: 7}, "registered as node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.q.check()
			if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("check() = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestRelayKeepsConnection: a member asks on one authenticated connection
// request after request, and when the relay has closed it (idle, or
// restarted) asks again on a new one and is answered.
func TestRelayKeepsConnection(t *testing.T) {
	s := startRelay(tcpListener(t), testRelayKey, &roundParts{}, 0, testLogger(t))
	defer s.stop()
	c := &relayClient{addr: s.addr(), key: testRelayKey, log: testLogger(t)}
	defer c.close()
	ask := func() {
		t.Helper()
		// Another generation's request is declined by the relay itself
		// (no etcd needed): an answer, not an error.
		a, err := c.call(context.Background(), relayReq{Op: "rank", Gen: 7, Node: "n1"})
		if err != nil || a.OK || !strings.Contains(a.Why, "generation 7") {
			t.Fatalf("answer %+v, %v; want declined for its generation", a, err)
		}
	}
	for range 3 {
		ask()
	}
	if st := s.statsNow(); st.Conns != 1 {
		t.Fatalf("%d connections for 3 requests, want 1 (kept)", st.Conns)
	}
	// The relay closes the connection (as after relayIdleWait).
	s.mu.Lock()
	for sc := range s.conns {
		_ = sc.Close()
	}
	s.mu.Unlock()
	ask()
	if st := s.statsNow(); st.Conns != 2 {
		t.Fatalf("%d connections, want 2 (the closed one replaced)", st.Conns)
	}
	if st := s.statsNow(); st.Declined != 4 {
		t.Fatalf("relay stats %+v: want 4 requests declined (each asked once, none lost)", st)
	}
}

// TestRelayLostByAddress: a member that reaches its relay by name (a pod's
// relay, not in DNS when the member started) matches a lost node's
// address against the address the name resolved to: another node's loss
// changes nothing, its relay's drops it (for the rest of the run when
// the loss quarantined it).
func TestRelayLostByAddress(t *testing.T) {
	s := startRelay(tcpListener(t), testRelayKey, &roundParts{}, 0, testLogger(t))
	defer s.stop()
	_, port, _ := net.SplitHostPort(s.addr())
	c := &relayClient{addr: net.JoinHostPort("localhost", port), key: testRelayKey, log: testLogger(t)}
	defer c.close()
	if a, err := c.call(context.Background(), relayReq{Op: "rank", Gen: 7, Node: "n1"}); err != nil || a.Why == "" {
		t.Fatalf("answer %+v, %v; want declined for its generation", a, err)
	}
	c.lost("10.9.9.9", true)
	if c.isGone() {
		t.Fatal("another node's loss dropped the relay")
	}
	c.lost("127.0.0.1", true)
	if !c.isGone() {
		t.Fatal("the relay's own loss (by the address its name resolved to) did not drop it")
	}
	if _, err := c.call(context.Background(), relayReq{Op: "rank", Gen: 7, Node: "n1"}); err == nil {
		t.Fatal("a dropped relay was asked")
	}
}

func TestRelayNeedsKey(t *testing.T) {
	o := EtcdOptions{Endpoints: []string{"127.0.0.1:1"}, RunID: "r", NodeID: "n", NProcPerNode: 1, MinNodes: 1, MaxNodes: 1, Relay: "127.0.0.1:9"}
	if err := o.defaults(); err == nil || !strings.Contains(err.Error(), "RelayKey") {
		t.Fatalf("defaults() = %v, want an error naming RelayKey", err)
	}
}

func tcpListener(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// isGone reports whether the relay was dropped for the rest of the run.
func (c *relayClient) isGone() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gone
}
