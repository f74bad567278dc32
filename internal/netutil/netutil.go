// Package netutil holds small network helpers shared by the rendezvous and
// the etcd server command.
package netutil

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// FreePort asks the kernel for a free TCP port on addr.
func FreePort(addr string) (int, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", addr, err)
	}
	defer ln.Close()
	_, p, _ := net.SplitHostPort(ln.Addr().String())
	return strconv.Atoi(p)
}

// LocalAddrs are the addresses this host's own processes connect from:
// loopback (127.0.0.1 and ::1) and every address of its interfaces. The
// rest of 127.0.0.0/8 is not among them: a process must bind such an
// address on purpose.
func LocalAddrs() []netip.Addr {
	set := map[netip.Addr]struct{}{
		netip.MustParseAddr("127.0.0.1"): {},
		netip.IPv6Loopback():             {},
	}
	if ifs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range ifs {
			if pn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(pn.IP); ok {
					set[ip.Unmap()] = struct{}{}
				}
			}
		}
	}
	out := make([]netip.Addr, 0, len(set))
	for ip := range set {
		out = append(out, ip)
	}
	return out
}

// RemoteIP is the IP a TCP connection comes from (invalid for another
// kind of connection).
func RemoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}
