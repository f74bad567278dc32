package tcpstore

import (
	"container/list"
	"net"
	"net/netip"
	"time"
)

// Who may connect, and for how long a connection may stay silent.
//
// The server admits a connection in three steps, all before it reads a byte
// of it:
//
//  1. Its source address must be allowed (SetAllowed; nil allows every
//     address). Between Reset and the next SetAllowed the list is the
//     previous round's and only provisional: an address not on it waits, up
//     to MessageTimeout (30 s), for the new list instead of being refused,
//     since a rank of a node new to the round may connect before the
//     launcher hands the store that round's nodes. Its handshake deadline
//     starts when it is admitted.
//  2. Its address may hold at most MaxConnsPerAddr connections, and the
//     server at most MaxConns. At either cap the oldest connection that has
//     not completed its first query (a silent or half-sent one) is closed to
//     make room; only when there is none is the new connection refused. An
//     idle flood therefore cannot lock out a rank, which completes its first
//     query within milliseconds of connecting.
//  3. It must complete its first query within HandshakeTimeout. torch 2.2+
//     sends VALIDATE at once and torch 1.13's main connection its ADD of
//     "init/"; torch 1.13's callback connection, opened right after that
//     ADD was answered, sends nothing, ever. Such a silent connection is
//     vouched for (exempt) when its address has more torch-1.13-dialect
//     connections that have queried than vouched silent ones: one per 1.13
//     client. An unvouched silent connection is closed at the timeout, and
//     at Reset.

// admission is what the allowlist says of an address.
type admission uint8

const (
	admitted admission = iota
	undecided
	notMember
)

// connKey is the source address a connection counts against.
func connKey(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}

// SetAllowed admits connections only from addrs (IPv4-mapped IPv6
// addresses match their IPv4 form); nil admits every address, the default.
// It makes the list final for the current attempt: connections waiting for
// it are admitted or refused now, and a non-member that connects later is
// refused at once. Connections already served are kept.
func (s *Server) SetAllowed(addrs []netip.Addr) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if addrs == nil {
		s.allow = nil
	} else {
		s.allow = make(map[netip.Addr]struct{}, len(addrs))
		for _, a := range addrs {
			s.allow[a.Unmap()] = struct{}{}
		}
	}
	s.provisional = false
	close(s.allowChanged)
	s.allowChanged = make(chan struct{})
}

// admissionLocked is what the allowlist says of ip; under mu.
func (s *Server) admissionLocked(ip netip.Addr) admission {
	if s.allow == nil {
		return admitted
	}
	if _, ok := s.allow[ip]; ok {
		return admitted
	}
	if s.provisional {
		return undecided
	}
	return notMember
}

// admit runs step 1 for a connection accepted while its address was
// undecided: it waits for SetAllowed, the handshake deadline or the close.
func (c *conn) admit() bool {
	s := c.s
	t := time.NewTimer(s.lim.MessageTimeout)
	defer t.Stop()
	for {
		s.mu.Lock()
		a, changed := s.admissionLocked(c.addr), s.allowChanged
		s.mu.Unlock()
		switch a {
		case admitted:
			c.shakeBy = time.Now().Add(s.lim.HandshakeTimeout)
			return true
		case notMember:
			s.count(&s.counts.NotMember)
			s.refuse(c.nc.RemoteAddr(), "not a node of the job")
			return false
		}
		select {
		case <-changed:
		case <-c.done:
			return false
		case <-t.C:
			s.count(&s.counts.NotMember)
			s.refuse(c.nc.RemoteAddr(), "not known to be a node of the job in time", "timeout", s.lim.MessageTimeout.String())
			return false
		}
	}
}

// addrConns are the open connections from one source address, oldest first.
type addrConns []*conn

// pendingConns are the connections that have not completed their first
// query and are not vouched for, oldest first: the ones closed to make room.
type pendingConns = list.List

// makeRoomLocked applies step 2 for a new connection from ip: it closes the
// oldest pending connection of ip (when ip is at its cap) and of the server
// (when it is at MaxConns). It reports why the new connection must be
// refused instead (perAddr: at ip's cap), or "" when it may be served.
// Under mu.
func (s *Server) makeRoomLocked(ip netip.Addr) (reason string, perAddr bool, args []any) {
	// Retired connections (an older attempt's torch 1.13 callback
	// connections, Reset) do not count: only MaxConns bounds them, so that
	// ones kept across many rounds cannot fill an address's cap.
	ac, open := s.perAddr[ip], 0
	var victim *conn
	for _, c := range ac {
		if c.retired.Load() {
			continue
		}
		open++
		if victim == nil && c.pending != nil {
			victim = c
		}
	}
	if open >= s.lim.MaxConnsPerAddr {
		if victim == nil {
			return "too many connections from this address", true, []any{"open", open, "max_conns_per_addr", s.lim.MaxConnsPerAddr}
		}
		s.evictLocked(victim)
	}
	if len(s.conns) >= s.lim.MaxConns {
		if s.pendingList.Len() == 0 {
			return "too many connections", false, []any{"open", len(s.conns), "max_conns", s.lim.MaxConns}
		}
		s.evictLocked(s.pendingList.Front().Value.(*conn))
	}
	return "", false, nil
}

// evictLocked closes a pending connection to make room for a new one; its
// goroutines finish the clean-up. Under mu.
func (s *Server) evictLocked(c *conn) {
	c.evicted = true
	s.forgetLocked(c)
	c.close()
}

// trackLocked counts a new connection against its address and, unless it is
// vouched for, puts it on the pending list. Under mu.
func (s *Server) trackLocked(c *conn) {
	s.conns[c] = struct{}{}
	if s.perAddr == nil {
		s.perAddr = map[netip.Addr]addrConns{}
	}
	c.vouched = s.vouchLocked(c.addr)
	s.perAddr[c.addr] = append(s.perAddr[c.addr], c)
	if !c.vouched {
		c.pending = s.pendingList.PushBack(c)
	}
}

// forgetLocked drops c from the server's books; idempotent. Under mu.
func (s *Server) forgetLocked(c *conn) {
	delete(s.conns, c)
	s.shookLocked(c)
	ac := s.perAddr[c.addr]
	for i, x := range ac {
		if x == c {
			ac = append(ac[:i], ac[i+1:]...)
			break
		}
	}
	if len(ac) == 0 {
		delete(s.perAddr, c.addr)
	} else {
		s.perAddr[c.addr] = ac
	}
}

// shookLocked takes c off the pending list: it completed its first query or
// was vouched for. Under mu.
func (s *Server) shookLocked(c *conn) {
	if c.pending != nil {
		s.pendingList.Remove(c.pending)
		c.pending = nil
	}
}

// vouchLocked reports whether a silent connection from ip may be a torch
// 1.13 callback connection: ip has more legacy-dialect connections of the
// current attempt that queried than vouched connections. Under mu.
func (s *Server) vouchLocked(ip netip.Addr) bool {
	mains, callbacks := 0, 0
	for _, c := range s.perAddr[ip] {
		if c.retired.Load() || c.evicted {
			continue
		}
		if c.legacyMain {
			mains++
		}
		if c.vouched {
			callbacks++
		}
	}
	return mains > callbacks
}
