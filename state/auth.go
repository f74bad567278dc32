package state

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
)

// Who may talk to a Receiver (docs/state.md, "Who may reach the
// replication port"). Copies are accepted only from the round's nodes that
// replicate to this one, each from its own address (a copy that claims
// node X must come from an address of X's host), and fetches are served
// only to this host and to those nodes (the ones that restore from it).
// Without a job secret that is all that protects the port: a process that
// can send from an admitted address (a node of the job, or any process on
// this host for fetches) is trusted. With one, every frame must also carry
// the job's HMAC tag (replicate.go).

// Allowlist is who a Receiver admits. The zero value admits nobody.
type Allowlist struct {
	// Local are this host's addresses (loopback and its interfaces): its
	// own launcher fetches from them.
	Local []netip.Addr
	// Senders are the round's nodes that replicate to this receiver (by
	// node id, as their copies name them) and the addresses each may
	// send from. They may also fetch.
	Senders map[string][]netip.Addr
}

// allowSet is an Allowlist as the receiver looks it up.
type allowSet struct {
	fetch   map[netip.Addr]struct{}
	senders map[string]map[netip.Addr]struct{}
}

func newAllowSet(a Allowlist) allowSet {
	s := allowSet{fetch: map[netip.Addr]struct{}{}, senders: map[string]map[netip.Addr]struct{}{}}
	for _, ip := range a.Local {
		s.fetch[ip.Unmap()] = struct{}{}
	}
	for node, ips := range a.Senders {
		m := map[netip.Addr]struct{}{}
		for _, ip := range ips {
			m[ip.Unmap()] = struct{}{}
			s.fetch[ip.Unmap()] = struct{}{}
		}
		s.senders[node] = m
	}
	return s
}

// admits reports whether ip may connect at all.
func (s allowSet) admits(ip netip.Addr) bool {
	_, ok := s.fetch[ip]
	return ok
}

// sender returns why a copy that claims node, from ip, is refused, or nil.
func (s allowSet) sender(node string, ip netip.Addr) error {
	ips, ok := s.senders[node]
	if !ok {
		return fmt.Errorf("node %q does not replicate to this buddy in the round it knows (only %d nodes do)", node, len(s.senders))
	}
	if _, ok := ips[ip]; !ok {
		return fmt.Errorf("a copy that claims node %q comes from %s, which is not that node's address", node, ip)
	}
	return nil
}

// remoteIP is the IP a connection comes from.
func remoteIP(c net.Conn) netip.Addr { return netutil.RemoteIP(c) }

// refusalLog rate-limits the warnings and events of refused peers per
// address, so that a flood of connections cannot flood the logs: one
// record per address per interval, which counts the ones it stands for.
type refusalLog struct {
	mu    sync.Mutex
	every time.Duration
	last  map[netip.Addr]time.Time
	quiet map[netip.Addr]int
}

// note reports whether a refusal from ip is to be recorded, and how many
// were left unrecorded since the last record.
func (l *refusalLog) note(ip netip.Addr) (record bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.quiet = map[netip.Addr]time.Time{}, map[netip.Addr]int{}
	}
	now := time.Now()
	if t, ok := l.last[ip]; ok && now.Sub(t) < l.every {
		l.quiet[ip]++
		return false, 0
	}
	if len(l.last) > 4096 { // bound the map: forget old addresses
		for a, t := range l.last {
			if now.Sub(t) >= l.every {
				delete(l.last, a)
				delete(l.quiet, a)
			}
		}
	}
	l.last[ip] = now
	n := l.quiet[ip]
	delete(l.quiet, ip)
	return true, n
}
