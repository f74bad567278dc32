package state

import (
	"bufio"
	"context"
	"errors"
	"hash/crc32"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dialFrom connects to addr from the loopback alias from (Linux routes
// all of 127.0.0.0/8 to lo: no setup needed).
func dialFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// pushCopy sends a copy header for n bytes from `from` claiming node, then
// (when accepted) n bytes of payload; it returns the buddy's first answer.
func pushCopy(t *testing.T, from, addr, node string, n uint64, key []byte) frame {
	t.Helper()
	c := dialFrom(t, from, addr)
	if _, err := c.Write(frame{Kind: kindCopy, Job: testJob, Node: node, Rank: 0, Step: 1e9, Seq: 1, Length: n}.encode(key)); err != nil {
		t.Fatalf("send header: %v", err)
	}
	rep, err := readFrame(bufio.NewReader(c), key)
	if err != nil {
		t.Fatalf("answer: %v", err)
	}
	return rep
}

var (
	nodeB   = netip.MustParseAddr("127.0.0.2")
	nodeC   = netip.MustParseAddr("127.0.0.3")
	outside = "127.0.0.99"
)

func authAllow() Allowlist {
	return Allowlist{Local: []netip.Addr{loopback}, Senders: map[string][]netip.Addr{"node-b": {nodeB}, "node-c": {nodeC}}}
}

// TestReceiverRefusesNonMembers: from an address that is not one of the
// round's nodes, a copy (however small or large) and a fetch are refused
// before a payload byte is read; the copy is never held, and each refusal
// is recorded with its reason.
func TestReceiverRefusesNonMembers(t *testing.T) {
	recv, ev := startReceiver(t, ReceiverOptions{Allow: authAllow()})
	// The forged copy of the campaign: step 10^9, any node id.
	for _, node := range []string{"node-b", "forged"} {
		rep := pushCopy(t, outside, recv.Addr(), node, 64, nil)
		if rep.Kind != kindRefuse || rep.Status != refuseLater || !strings.Contains(rep.Msg, "127.0.0.99 is not an address of this job") {
			t.Fatalf("copy claiming %q from %s: answer kind %d status %d %q, want a refusal naming the address", node, outside, rep.Kind, rep.Status, rep.Msg)
		}
	}
	if c := recv.Copy("node-b", 0); c != nil || recv.Held() != 0 {
		t.Fatalf("a refused copy is held: %+v, %d bytes held", c, recv.Held())
	}
	// A fetch from outside: refused, whatever the buddy holds.
	if _, err := fetch(context.Background(), netip.MustParseAddr(outside), recv.Addr(), testJob, nil, "", 0); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("fetch from %s: %v, want ErrNotAdmitted", outside, err)
	}
	waitFor(t, "a refusal event", func() bool { return ev.with(EventReplicaRefused, "127.0.0.99") >= 1 })
	if e := ev.last(EventReplicaRefused); e["reason"] != "not_member" {
		t.Fatalf("refusal event %v, want reason not_member", e)
	}
}

// TestReceiverBindsNodeToAddress: a copy claiming node-b is accepted from
// node-b's address only; node-c, a member, cannot send in node-b's name.
func TestReceiverBindsNodeToAddress(t *testing.T) {
	recv, ev := startReceiver(t, ReceiverOptions{Allow: authAllow()})
	rep := pushCopy(t, nodeC.String(), recv.Addr(), "node-b", 64, nil)
	if rep.Kind != kindRefuse || rep.Status != refuseLater || !strings.Contains(rep.Msg, `claims node "node-b" comes from 127.0.0.3`) {
		t.Fatalf("copy claiming node-b from node-c's address: kind %d status %d %q, want a refusal", rep.Kind, rep.Status, rep.Msg)
	}
	waitFor(t, "a refusal event", func() bool { return ev.with(EventReplicaRefused, "node-b") >= 1 })
	if e := ev.last(EventReplicaRefused); e["reason"] != "not_sender" {
		t.Fatalf("refusal event %v, want reason not_sender", e)
	}
	if rep := pushCopy(t, nodeB.String(), recv.Addr(), "node-b", 64, nil); rep.Kind != kindAccept {
		t.Fatalf("copy claiming node-b from node-b's address: kind %d %q, want accept", rep.Kind, rep.Msg)
	}
	// A new round that no longer lists node-b refuses it too.
	recv.SetAllowed(Allowlist{Local: []netip.Addr{loopback}, Senders: map[string][]netip.Addr{"node-c": {nodeC}}})
	if rep := pushCopy(t, nodeB.String(), recv.Addr(), "node-b", 64, nil); rep.Kind != kindRefuse {
		t.Fatalf("copy from node-b after the round dropped it: kind %d, want a refusal", rep.Kind)
	}
}

// rssKiB is this process's resident set.
func rssKiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestReceiverRefusesGiantCopyEarly: 1 GiB of zeros pushed as a copy,
// by a non-member and by a member whose job saves far less, is refused at
// its header; the buddy's memory does not grow by the payload.
func TestReceiverRefusesGiantCopyEarly(t *testing.T) {
	recv, _ := startReceiver(t, ReceiverOptions{Allow: authAllow(), OwnLargest: func() uint64 { return 1 << 20 }})
	before := rssKiB(t)
	for _, from := range []string{outside, nodeB.String()} {
		c := dialFrom(t, from, recv.Addr())
		const n = 1 << 30
		if _, err := c.Write(frame{Kind: kindCopy, Job: testJob, Node: "node-b", Length: n}.encode(nil)); err != nil {
			t.Fatal(err)
		}
		// Push the payload regardless of the answer, as an attacker would.
		zeros := make([]byte, 1<<20)
		sent := 0
		for sent < n {
			w, err := c.Write(zeros)
			sent += w
			if err != nil {
				break
			}
		}
		rep, err := readFrame(bufio.NewReader(c), nil)
		if err != nil || rep.Kind != kindRefuse {
			t.Fatalf("1 GiB copy from %s: answer %+v, %v; want a refusal", from, rep, err)
		}
		if from == nodeB.String() && !strings.Contains(rep.Msg, "over this buddy's limit") {
			t.Fatalf("1 GiB copy from a member: %q, want the per-copy limit named", rep.Msg)
		}
		if sent >= n {
			t.Errorf("from %s: the buddy read the whole 1 GiB payload before closing", from)
		}
	}
	if grew := rssKiB(t) - before; grew > 128<<10 {
		t.Fatalf("RSS grew by %d KiB over 1 GiB pushes, want far less than the payload", grew)
	}
	if recv.Held() != 0 {
		t.Fatalf("held %d bytes after refused copies", recv.Held())
	}
}

// TestReceiverClosesSilentConnection: a connection that sends nothing is
// closed once the handshake timeout passes.
func TestReceiverClosesSilentConnection(t *testing.T) {
	recv, ev := startReceiver(t, ReceiverOptions{Allow: authAllow(), HandshakeTimeout: 300 * time.Millisecond})
	c := dialFrom(t, nodeB.String(), recv.Addr())
	start := time.Now()
	_, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("silent connection: %v, want the buddy to close it (EOF)", err)
	}
	if el := time.Since(start); el < 150*time.Millisecond {
		t.Fatalf("closed after %s, well before the handshake timeout of 300ms", el)
	}
	waitFor(t, "a handshake refusal event", func() bool { return ev.with(EventReplicaRefused, "handshake timeout") >= 1 })
}

// TestReplicaSecret: with a job secret, a sender and a fetcher holding it
// work; a frame with a wrong tag, or none, is refused; a copy whose
// payload was altered after its tag is discarded.
func TestReplicaSecret(t *testing.T) {
	secret := []byte("the job's secret, 32 bytes long!")
	recv, ev := startReceiver(t, ReceiverOptions{Allow: testAllow, Secret: secret, logEvery: time.Nanosecond})
	dir := t.TempDir()
	saveRank(t, dir, 0, 0, 7, 100<<10)
	_, _ = startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{Secret: secret})
	waitFor(t, "the copy", func() bool { return copySeq(recv, "node-a", 0) == 1 })
	c, err := Fetch(context.Background(), recv.Addr(), testJob, secret, "node-a", 0)
	if err != nil || c.Step != 7 {
		t.Fatalf("fetch with the secret: %+v, %v", c, err)
	}
	if _, err := Fetch(context.Background(), recv.Addr(), testJob, []byte("another secret of the same size!"), "node-a", 0); !errors.Is(err, ErrAuth) && (err == nil || !strings.Contains(err.Error(), "tag")) {
		t.Fatalf("fetch with a wrong secret: %v, want an authentication error", err)
	}
	for _, tc := range []struct {
		name string
		key  []byte
		want string
	}{
		{"wrong key", macKey([]byte("another secret of the same size!"), testJob), "does not match"},
		{"no tag", nil, "without a tag"},
		{"other job's key", macKey(secret, "job-2"), "does not match"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn := dialFrom(t, "127.0.0.1", recv.Addr())
			if _, err := conn.Write(frame{Kind: kindCopy, Job: testJob, Node: "node-a", Rank: 0, Step: 1e9, Seq: 99, Length: 8}.encode(tc.key)); err != nil {
				t.Fatal(err)
			}
			// The refusal is tagged with the real key: read it raw.
			rep, _ := readFrame(bufio.NewReader(conn), macKey(secret, testJob))
			if rep.Kind != kindRefuse || !strings.Contains(rep.Msg, tc.want) {
				t.Fatalf("answer %d %q, want a refusal containing %q", rep.Kind, rep.Msg, tc.want)
			}
		})
	}
	// A payload altered on the wire after its tag was computed.
	conn := dialFrom(t, "127.0.0.1", recv.Addr())
	key := macKey(secret, testJob)
	p := []byte("forged!!")
	h := frame{Kind: kindCopy, Job: testJob, Node: "node-a", Rank: 0, Step: 1e9, Seq: 99, Length: uint64(len(p))}.encode(key)
	br := bufio.NewReader(conn)
	_, _ = conn.Write(h)
	if rep, err := readFrame(br, key); err != nil || rep.Kind != kindAccept {
		t.Fatalf("header with the right tag: %+v, %v; want accept", rep, err)
	}
	tr := trailer(crc32.Checksum(p, castagnoli), trailerComplete)
	m := payloadMAC(key, h[len(h)-macSize:])
	m.Write([]byte("genuine!"))
	m.Write(tr)
	_, _ = conn.Write(append(append(append([]byte{}, p...), tr...), m.Sum(nil)...))
	if rep, err := readFrame(br, key); err != nil || rep.Kind != kindBad || !strings.Contains(rep.Msg, "HMAC") {
		t.Fatalf("altered payload: %+v, %v; want it discarded for its tag", rep, err)
	}
	if c := recv.Copy("node-a", 0); c == nil || c.Step != 7 {
		t.Fatalf("the held copy is %+v, want the genuine one of step 7", c)
	}
	if ev.with(EventReplicaRefused, "tag") < 3 {
		t.Fatalf("%d refusals recorded for bad tags, want at least 3", ev.with(EventReplicaRefused, "tag"))
	}
}

// BenchmarkNonMemberRefusal: from a non-member's connect to the refusal in
// hand (the buddy answers before reading anything; docs/benchmarks.md).
//
//	go test -run '^$' -bench BenchmarkNonMemberRefusal -benchtime 2000x ./state/
func BenchmarkNonMemberRefusal(b *testing.B) {
	recv, err := Listen(context.Background(), ReceiverOptions{Job: testJob, Addr: "127.0.0.1:0", Allow: authAllow(),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer recv.Close()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(outside)}}
	var worst time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		c, err := d.Dial("tcp", recv.Addr())
		if err != nil {
			b.Fatal(err)
		}
		rep, err := readFrame(bufio.NewReader(c), nil)
		if err != nil || rep.Kind != kindRefuse {
			b.Fatalf("answer %+v, %v; want a refusal", rep, err)
		}
		_ = c.Close()
		worst = max(worst, time.Since(t0))
	}
	b.ReportMetric(float64(worst.Microseconds()), "worst-us")
}

// TestSenderRetriesUntilAdmitted: a buddy that does not list the sender yet
// (its round is behind the sender's) refuses "not now"; the sender tries
// again and its copies arrive once the buddy's round lists it, and the
// rank is never marked refused. A fetch asked before the list admits the
// fetcher succeeds once it does.
func TestSenderRetriesUntilAdmitted(t *testing.T) {
	recv, ev := startReceiver(t, ReceiverOptions{Allow: Allowlist{Local: []netip.Addr{nodeC}}})
	dir := t.TempDir()
	saveRank(t, dir, 0, 5, 3, 64<<10)
	rep, _ := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{LocalIP: nodeB, Node: "node-b"})
	waitFor(t, "a refusal of node-b", func() bool { return ev.with(EventReplicaRefused, "127.0.0.2") >= 1 })
	if copySeq(recv, "node-b", 5) != 0 {
		t.Fatal("a copy arrived from a sender the buddy does not list")
	}
	recv.SetAllowed(authAllow())
	waitFor(t, "node-b's copy once listed", func() bool { return copySeq(recv, "node-b", 5) == 1 })
	// A fetch asked while the buddy's list is a round behind.
	recv.SetAllowed(Allowlist{Local: []netip.Addr{nodeC}})
	done := make(chan error, 1)
	go func() {
		c, err := fetchAdmitted(context.Background(), nodeB, recv.Addr(), testJob, nil, 5)
		if err == nil && c.Step != 3 {
			err = errors.New("fetched the wrong step")
		}
		done <- err
	}()
	time.Sleep(300 * time.Millisecond)
	recv.SetAllowed(authAllow())
	if err := <-done; err != nil {
		t.Fatalf("fetch asked before the buddy admitted it: %v", err)
	}
	for _, s := range rep.Status() {
		if s.Refused[0] != "" {
			t.Fatalf("the rank is marked refused: %q", s.Refused[0])
		}
	}
}
