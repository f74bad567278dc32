// Package netutil holds small network helpers shared by the rendezvous and
// the etcd server command.
package netutil

import (
	"fmt"
	"net"
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
