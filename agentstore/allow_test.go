package agentstore

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/rendezvous"
)

// served reports whether a torch 2.x-style client from src is served by
// the store at port (VALIDATE, then a PING answered) or closed.
func served(t *testing.T, src string, port int) bool {
	t.Helper()
	d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	c, err := d.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("dial from %s: %v", src, err)
	}
	defer c.Close()
	q := binary.LittleEndian.AppendUint32([]byte{0}, 0x3C85F7CE) // VALIDATE
	q = append(q, 13)                                            // PING
	q = binary.LittleEndian.AppendUint32(q, 42)
	if _, err := c.Write(q); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(40 * time.Second))
	var b [4]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return false
	}
	return binary.LittleEndian.Uint32(b[:]) == 42
}

// TestHostAdmitsOnlyTheRoundsNodes: group rank 0's store admits loopback,
// its own addresses and the round's nodes, and refuses another address; a
// multi-node round whose nodes are unknown, or a node name that does not
// resolve, admits every address rather than refuse a rank.
func TestHostAdmitsOnlyTheRoundsNodes(t *testing.T) {
	h := New(context.Background(), Options{})
	defer h.Close()
	p, err := h.Port("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	round := func(r int, nodes []string) {
		t.Helper()
		if _, err := h.Port("127.0.0.1", r); err != nil {
			t.Fatal(err)
		}
		asg := rendezvous.Assignment{Round: r, GroupRank: 0, GroupWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: p, NodeAddrs: nodes}
		if err := h.Round(asg); err != nil {
			t.Fatal(err)
		}
	}
	// Single node: loopback 127.0.0.1, not 127.0.0.2.
	if err := h.Round(rendezvous.Assignment{Round: 0, GroupRank: 0, GroupWorldSize: 1, MasterAddr: "127.0.0.1", MasterPort: p}); err != nil {
		t.Fatal(err)
	}
	if !served(t, "127.0.0.1", p) || served(t, "127.0.0.2", p) {
		t.Fatal("single node: want 127.0.0.1 served and 127.0.0.2 refused")
	}
	round(1, []string{"127.0.0.1", "127.0.0.3"})
	if !served(t, "127.0.0.3", p) || served(t, "127.0.0.2", p) {
		t.Fatal("round 1: want node 127.0.0.3 served and 127.0.0.2 refused")
	}
	round(2, nil)
	if !served(t, "127.0.0.2", p) {
		t.Fatal("round 2 (nodes unknown): want every address served")
	}
	round(3, []string{"127.0.0.1", "no-such-node.invalid"})
	if !served(t, "127.0.0.2", p) {
		t.Fatal("round 3 (a node name that does not resolve): want every address served")
	}
	if st := h.srv.Stats(); st.Counts.NotMember != 2 {
		t.Fatalf("not-member refusals %d, want 2", st.Counts.NotMember)
	}
}
