package agentstore

import (
	"net/netip"
	"sync"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
	"github.com/ftlauncher/ft-launcher/rendezvous"
)

// ConnsPerAddr is the agent store's cap on connections from one address
// (tcpstore.Limits.MaxConnsPerAddr) for nproc ranks per node: a torch 1.13
// rank opens two (its store and the callback connection), a torch 2.x rank
// one, and its process groups may clone the store; an in-process restart's
// survivors keep a retired callback connection each. Four per rank covers
// all of these; the 64 on top covers several launchers on one host (as in
// the tests, where every node's ranks reach the store from 127.0.0.1)
// and tools. Connections that never complete their first query do not
// crowd ranks out: they are closed to make room (tcpstore, admit.go).
func ConnsPerAddr(nproc int) int {
	return 4*max(nproc, 1) + 64
}

// resolveTimeout bounds the lookup of one node's host name.
const resolveTimeout = 2 * time.Second

// allowed is the round's allowlist: loopback (127.0.0.1 and ::1, from which
// this node's ranks reach a store advertised on a loopback address, and any
// local process), every address of this host's interfaces, and every
// address of the round's nodes. ok is false when the list cannot be known
// (a multi-node round whose nodes the rendezvous did not list, or a node
// name that does not resolve): the store then admits every address for the
// round rather than refuse a rank.
func (h *Host) allowed(asg rendezvous.Assignment) (list []netip.Addr, why string, ok bool) {
	if asg.GroupWorldSize > 1 && asg.NodeAddrs == nil {
		return nil, "the rendezvous did not list the round's nodes", false
	}
	set := map[netip.Addr]struct{}{}
	for _, ip := range LocalAddrs() {
		set[ip] = struct{}{}
	}
	names := append([]string{asg.MasterAddr}, asg.NodeAddrs...)
	ips, bad := h.names.Resolve(names)
	if bad != "" {
		return nil, "node " + bad + " does not resolve", false
	}
	for _, ip := range ips {
		set[ip] = struct{}{}
	}
	for ip := range set {
		list = append(list, ip)
	}
	return list, "", true
}

// LocalAddrs are the addresses this host's own processes connect from
// (netutil.LocalAddrs): loopback and every address of its interfaces.
func LocalAddrs() []netip.Addr { return netutil.LocalAddrs() }

// Names resolves the round's node addresses for an allowlist (the agent
// store's, the state replica receiver's). Not safe for concurrent use.
type Names struct {
	cache map[string][]netip.Addr
}

// NewNames returns an empty cache.
func NewNames() *Names { return &Names{cache: map[string][]netip.Addr{}} }

// Resolve maps node addresses (IPs or host names) to IPs, caching names
// (a node's name does not move during a job) and looking up new ones in
// parallel. bad names the first that did not resolve.
func (h *Names) Resolve(names []string) (ips []netip.Addr, bad string) {
	var todo []string
	for _, n := range names {
		if n == "" {
			continue
		}
		if ip, err := netip.ParseAddr(n); err == nil {
			ips = append(ips, ip.Unmap())
			continue
		}
		if c, ok := h.cache[n]; ok {
			ips = append(ips, c...)
			continue
		}
		todo = append(todo, n)
	}
	if len(todo) == 0 {
		return ips, ""
	}
	res := make([][]netip.Addr, len(todo))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, n := range todo {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			got, err := (rendezvous.Resolver{Timeout: resolveTimeout}).Resolve(n)
			if err != nil {
				return
			}
			for _, g := range got {
				if ip, err := netip.ParseAddr(g); err == nil {
					res[i] = append(res[i], ip.Unmap())
				}
			}
		}()
	}
	wg.Wait()
	for i, n := range todo {
		if len(res[i]) == 0 {
			if bad == "" {
				bad = n
			}
			continue
		}
		h.cache[n] = res[i]
		ips = append(ips, res[i]...)
	}
	return ips, bad
}
