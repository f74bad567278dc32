package rendezvous

import (
	"bytes"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestGossipKey: members holding the job's key gossip with each other; a
// member without it, or with another key, cannot join them, and a key of
// a size AES does not take is refused.
func TestGossipKey(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	other := bytes.Repeat([]byte{8}, 32)
	start := func(name string, k []byte) *memberlist.Memberlist {
		t.Helper()
		c := gossipConfig(name, "127.0.0.1", 0, DefaultGossipTimings)
		if err := withGossipKey(c, k); err != nil {
			t.Fatal(err)
		}
		ml, err := memberlist.Create(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		t.Cleanup(func() { _ = ml.Shutdown() })
		return ml
	}
	addr := func(ml *memberlist.Memberlist) string {
		n := ml.LocalNode()
		return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	}
	a, b := start("a", key), start("b", key)
	if _, err := b.Join([]string{addr(a)}); err != nil {
		t.Fatalf("a member with the key could not join: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for a.NumMembers() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("a sees %d members, want 2", a.NumMembers())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		key  []byte
	}{{"no key", nil}, {"another key", other}} {
		t.Run(tc.name, func(t *testing.T) {
			x := start("x-"+strings.ReplaceAll(tc.name, " ", "-"), tc.key)
			if n, err := x.Join([]string{addr(a)}); err == nil && n > 0 {
				t.Fatalf("a member with %s joined (%d contacted)", tc.name, n)
			}
			// Give a rumour time to spread, had one got through.
			time.Sleep(time.Second)
			if a.NumMembers() != 2 || x.NumMembers() != 1 {
				t.Fatalf("members: keyed %d (want 2), outsider %d (want 1)", a.NumMembers(), x.NumMembers())
			}
		})
	}
	if err := withGossipKey(gossipConfig("y", "127.0.0.1", 0, DefaultGossipTimings), []byte("short")); err == nil ||
		!strings.Contains(err.Error(), "16, 24 or 32") {
		t.Fatalf("a 5-byte key: err %v, want one naming the allowed sizes", err)
	}
}
