package rendezvous

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// dialStreamFrom connects to the stream port at addr from the loopback
// alias from (Linux routes 127.0.0.0/8 to lo: no setup needed).
func dialStreamFrom(t *testing.T, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestStreamPortAnswersOnlyTheJob: the stream port greets this host and
// the job's gossip members; a connection from any other address gets no
// greeting and is closed after streamAdmitWait, unless its address joins
// the gossip meanwhile (a new node that dialled before gossip told this
// one of it), which then greets it.
func TestStreamPortAnswersOnlyTheJob(t *testing.T) {
	d := newLossDetector("self", DefaultGossipTimings, testLogger(t), nil, nil)
	if err := d.startStream("127.0.0.1"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.stopStream)
	_, addr := d.addrs()

	if !streamAnswers(addr, 5*time.Second) {
		t.Fatal("the stream port does not greet this host")
	}
	// A non-member: no greeting, and the connection is closed.
	c := dialStreamFrom(t, "127.0.0.99", addr)
	_ = c.SetReadDeadline(time.Now().Add(streamAdmitWait + 10*time.Second))
	start := time.Now()
	line, err := bufio.NewReader(c).ReadString('\n')
	if line != "" || err == nil {
		t.Fatalf("a non-member read %q, %v; want nothing and the connection closed", line, err)
	}
	if el := time.Since(start); el < streamAdmitWait/2 {
		t.Fatalf("closed after %s, want it held about %s first (a member gossip has not told of yet)", el, streamAdmitWait)
	}
	// A new member dials before gossip tells this node of it: greeted once
	// its address is seen.
	c = dialStreamFrom(t, "127.0.0.98", addr)
	time.AfterFunc(300*time.Millisecond, func() { d.sawMember(net.ParseIP("127.0.0.98")) })
	_ = c.SetReadDeadline(time.Now().Add(streamAdmitWait + 10*time.Second))
	if line, err := bufio.NewReader(c).ReadString('\n'); line != streamHello {
		t.Fatalf("a member seen after it dialled read %q, %v; want the greeting", line, err)
	}
}
