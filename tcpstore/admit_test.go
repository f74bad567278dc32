package tcpstore

import (
	"bufio"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// dialFrom connects from the loopback source address src (Linux routes all
// of 127.0.0.0/8 to lo, so 127.0.0.2 is another "host" on this machine).
func dialFrom(t testing.TB, src, addr string, d dialect) *wireClient {
	t.Helper()
	dl := net.Dialer{Timeout: ioTimeout, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	nc, err := dl.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { nc.Close() })
	return &wireClient{t: t, nc: nc, br: bufio.NewReader(nc), d: d}
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// TestAllowlist: with the job's nodes set, a connection from another
// address is refused before a byte of it is read, and members are served.
// After Reset the list is provisional: an address not on it waits for the
// next SetAllowed, which admits it (a node new to the round) or refuses it.
func TestAllowlist(t *testing.T) {
	s := startServer(t, Limits{HandshakeTimeout: 20 * time.Second})
	addr := s.Addr().String()
	s.SetAllowed(addrs("127.0.0.1", "::1"))

	member := dialFrom(t, "127.0.0.1", addr, dialectV2)
	member.handshake()
	member.set("/k", "v")
	outsider := dialFrom(t, "127.0.0.2", addr, dialectV2)
	outsider.sendRaw(concat([]byte{0}, u32(validationMagic)))
	outsider.expectClosed()
	if st := s.Stats(); st.Counts.NotMember != 1 || st.Refused != 1 {
		t.Fatalf("stats after the outsider = %+v, want one not-member refusal", st)
	}
	if v := must[string](t)(member.get("/k")); v != "v" {
		t.Fatalf("member's get = %q", v)
	}

	// A new round: 127.0.0.3 joins it, 127.0.0.2 does not.
	s.Reset()
	joining := dialFrom(t, "127.0.0.3", addr, dialectV2)
	joining.sendRaw(concat([]byte{0}, u32(validationMagic))) // VALIDATE, held unread
	stranger := dialFrom(t, "127.0.0.2", addr, dialectV2)
	eventually(t, "both connections held", func() bool { return s.Stats().Conns == 2 })
	joining.expectSilent(200 * time.Millisecond) // not refused while undecided
	s.SetAllowed(addrs("127.0.0.1", "127.0.0.3"))
	if n := must[uint32](t)(joining.ping(9)); n != 9 {
		t.Fatalf("joining node's ping = %d", n)
	}
	stranger.expectClosed()
	later := dialFrom(t, "127.0.0.2", addr, dialectLegacy)
	later.expectClosed()
	if st := s.Stats(); st.Counts.NotMember != 3 {
		t.Fatalf("not-member refusals = %d, want 3", st.Counts.NotMember)
	}
	// nil admits everyone again.
	s.SetAllowed(nil)
	open := dialFrom(t, "127.0.0.2", addr, dialectV2)
	open.handshake()
}

// TestHandshakeTimeout: a connection that sends nothing, or half of its
// first query, is closed after HandshakeTimeout; a torch 1.13 client's
// callback connection (silent, after a legacy query from its address) is
// not, and neither is a client that completed its first query and idles.
func TestHandshakeTimeout(t *testing.T) {
	testenv.SkipShort(t, "waits on real handshake and write deadlines")
	const shake = 400 * time.Millisecond
	s := startServer(t, Limits{HandshakeTimeout: shake})
	addr := s.Addr().String()

	idleV2 := dial(t, addr, dialectV2) // validated, then idle
	main := dial(t, addr, dialectLegacy)
	must[int64](t)(main.add("init/", 1)) // what 1.13's main connection sends first
	callback := dialRaw(t, addr, dialectLegacy)

	start := time.Now()
	silent := dialFrom(t, "127.0.0.2", addr, dialectV2)
	half := dialFrom(t, "127.0.0.2", addr, dialectV2)
	half.sendRaw([]byte{0, 0xCE}) // two bytes of VALIDATE
	halfLegacy := dialFrom(t, "127.0.0.2", addr, dialectLegacy)
	halfLegacy.sendRaw(concat([]byte{halfLegacy.code(opSet)}, u64(3), []byte("/k"))) // key cut short
	for _, c := range []*wireClient{silent, half, halfLegacy} {
		c.expectClosed()
	}
	if took := time.Since(start); took < shake {
		t.Fatalf("closed after %v, before the %v handshake timeout", took, shake)
	}
	eventually(t, "3 refusals", func() bool { return s.Stats().Refused == 3 })
	if st := s.Stats(); st.Counts.NoHandshake != 3 {
		t.Fatalf("stats = %+v, want 3 handshake timeouts", st)
	}
	time.Sleep(shake)
	callback.send(opWatchKey, str("/w"))
	if b := must[byte](t)(callback.readByte()); b != watchKeyCallbackRegistered {
		t.Fatalf("callback connection's watch answered %d", b)
	}
	if n := must[uint32](t)(idleV2.ping(3)); n != 3 {
		t.Fatalf("idle v2 ping = %d", n)
	}
	if v := must[int64](t)(main.add("init/", 1)); v != 2 {
		t.Fatalf("main add = %d", v)
	}
	// One vouch per 1.13 client: a second silent connection from the
	// same address is closed.
	second := dialRaw(t, addr, dialectLegacy)
	second.expectClosed()
	eventually(t, "4 handshake timeouts", func() bool { return s.Stats().Counts.NoHandshake == 4 })
}

// TestPerAddrCap: one address holds at most MaxConnsPerAddr connections.
// At the cap a new connection closes the address's oldest one that has not
// completed its first query (an idle flood cannot lock a rank out); with
// none to close it is refused. Other addresses are not affected.
func TestPerAddrCap(t *testing.T) {
	const capN = 4
	s := startServer(t, Limits{MaxConnsPerAddr: capN})
	addr := s.Addr().String()

	var idle []*wireClient
	for range capN {
		idle = append(idle, dialFrom(t, "127.0.0.2", addr, dialectV2))
	}
	eventually(t, "the idle flood accepted", func() bool { return s.Stats().Pending == capN })
	var ranks []*wireClient
	for i := range capN {
		r := dialFrom(t, "127.0.0.2", addr, dialectV2)
		r.handshake() // served although the address was at its cap
		r.set("/rank"+string(rune('0'+i)), "up")
		must[string](t)(r.get("/rank" + string(rune('0'+i)))) // served
		ranks = append(ranks, r)
	}
	for _, c := range idle {
		c.expectClosed()
	}
	if st := s.Stats(); st.Counts.NoHandshake != capN || st.Conns != capN {
		t.Fatalf("stats = %+v, want the %d idle connections closed for room", st, capN)
	}
	extra := dialFrom(t, "127.0.0.2", addr, dialectV2)
	extra.expectClosed()
	if st := s.Stats(); st.Counts.PerAddrCap != 1 {
		t.Fatalf("per-address refusals = %d, want 1", st.Counts.PerAddrCap)
	}
	other := dialFrom(t, "127.0.0.3", addr, dialectV2)
	other.handshake()
	if v := must[string](t)(other.get("/rank3")); v != "up" {
		t.Fatalf("get = %q", v)
	}
	if n := must[uint32](t)(ranks[0].ping(1)); n != 1 {
		t.Fatalf("rank ping = %d", n)
	}
}

// TestGlobalCapClosesPending: at MaxConns the oldest connection that has
// not completed its first query, from any address, makes room.
func TestGlobalCapClosesPending(t *testing.T) {
	s := startServer(t, Limits{MaxConns: 3})
	addr := s.Addr().String()
	a := dialFrom(t, "127.0.0.2", addr, dialectV2)
	b := dialFrom(t, "127.0.0.3", addr, dialectV2)
	c := dialFrom(t, "127.0.0.4", addr, dialectV2)
	eventually(t, "three pending", func() bool { return s.Stats().Pending == 3 })
	r := dial(t, addr, dialectV2)
	a.expectClosed()
	r.set("/k", "v")
	b.expectSilent(100 * time.Millisecond)
	c.expectSilent(100 * time.Millisecond)
	if st := s.Stats(); st.Conns != 3 || st.Counts.NoHandshake != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestResetDropsIdle: Reset closes the connections of the old attempt that
// never completed a query (an idle flood of 500), and retires only the
// torch 1.13 callback connection vouched for by its client.
func TestResetDropsIdle(t *testing.T) {
	const flood = 500
	s := startServer(t, Limits{MaxConnsPerAddr: 2 * flood})
	addr := s.Addr().String()
	main := dial(t, addr, dialectLegacy)
	must[int64](t)(main.add("init/", 1))
	callback := dialRaw(t, addr, dialectLegacy)
	eventually(t, "the callback connection accepted", func() bool { return s.Stats().Conns == 2 })
	var idle []*wireClient
	for range flood {
		idle = append(idle, dialFrom(t, "127.0.0.2", addr, dialectV2))
	}
	eventually(t, "the flood accepted", func() bool { return s.Stats().Pending == flood })
	start := time.Now()
	s.Reset()
	t.Logf("Reset closed %d idle connections in %v", flood, time.Since(start))
	for _, c := range idle {
		c.expectClosed()
	}
	main.expectClosed()
	st := s.Stats()
	if st.Conns != 1 || st.Pending != 0 || st.Counts.IdleAtReset != flood || st.Refused != 0 {
		t.Fatalf("stats after Reset = %+v, want only the retired callback connection", st)
	}
	callback.send(opWatchKey, str("/w"))
	if b := must[byte](t)(callback.readByte()); b != watchKeyCallbackRegistered {
		t.Fatalf("retired callback connection's watch answered %d", b)
	}
}

// TestRetiredNotCountedPerAddr: the torch 1.13 callback connections that
// Reset retires do not count against their address's cap, so ones kept
// across rounds cannot lock the address's ranks out.
func TestRetiredNotCountedPerAddr(t *testing.T) {
	s := startServer(t, Limits{MaxConnsPerAddr: 2})
	addr := s.Addr().String()
	for round := range 3 {
		main := dial(t, addr, dialectLegacy)
		must[int64](t)(main.add("init/", 1))
		dialRaw(t, addr, dialectLegacy) // its callback connection
		eventually(t, "main and callback", func() bool { return s.Stats().Conns == 2+round })
		s.Reset()
		main.expectClosed()
		if st := s.Stats(); st.Conns != round+1 || st.Counts.PerAddrCap != 0 {
			t.Fatalf("round %d: stats after Reset = %+v, want %d retired connections", round, st, round+1)
		}
	}
}
