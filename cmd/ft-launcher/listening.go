package main

import (
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// The identifiers of the launcher's listeners in the threat model's table
// (docs/security.md); integration/sockets_test.go fails on a listener
// that is not recorded under one of them.
const (
	listenAgentStore       = "agent-store"       // the ranks' c10d TCPStore (agentstore, tcpstore)
	listenStateReplication = "state-replication" // buddy copies of the ranks' state (state.Receiver)
	listenStream           = "stream"            // the fast node-loss signal (rendezvous/stream.go)
	listenGossip           = "gossip"            // memberlist, TCP and UDP on one port (rendezvous/detector.go)
	listenRelay            = "relay"             // the two-level join's relay port (rendezvous/relay.go; --rdzv-conf relay_group)
	listenMetrics          = "metrics"           // Prometheus /metrics (--metrics-addr)
	listenEtcdClient       = "etcd-client"       // the embedded etcd's client URL (ft-launcher-etcd)
	listenEtcdPeer         = "etcd-peer"         // the embedded etcd's peer URL (ft-launcher-etcd)
	listenRankMonitor      = "rank-monitor"      // one Unix socket per local rank (monitor)
	listenWorkloadControl  = "workload-control"  // the ranks' workload requests, FT_LAUNCHER_IPC_SOCKET (monitor)
)

// agentStoreWhen says when the agent store listens: its port is picked
// per round.
const agentStoreWhen = "from each round's registration; once the round is set, only on its group rank 0's node; " +
	"the port is picked then (agent_store_served names it)"

// listeners collects, as the launcher sets up, every socket it and the
// helpers it starts listen on, for one record once set up (emit). The
// set-up is sequential: no lock.
type listeners struct {
	socks []eventlog.ListeningSocket
}

// own records a listener of this launcher process.
func (l *listeners) own(name, network, addr, when string) {
	l.add(eventlog.ListeningSocket{Name: name, Network: network, Address: addr, PID: os.Getpid(), Process: "ft-launcher", When: when})
}

// add records a listener; nil records nothing.
func (l *listeners) add(s eventlog.ListeningSocket) {
	if l != nil {
		l.socks = append(l.socks, s)
	}
}

// addrLister is the etcd rendezvous: its gossip and stream listeners.
type addrLister interface {
	ListenAddrs() (gossip, stream string)
}

// rendezvous records the rendezvous's listeners (none for a single node).
func (l *listeners) rendezvous(r any) {
	lr, ok := r.(addrLister)
	if !ok {
		return
	}
	gossip, stream := lr.ListenAddrs()
	if gossip != "" {
		l.own(listenGossip, "tcp", gossip, "")
		l.own(listenGossip, "udp", gossip, "")
	}
	if stream != "" {
		l.own(listenStream, "tcp", stream, "")
	}
}

// urlHost is the host:port of a URL like http://127.0.0.2:2379, or the
// text itself when it is not one.
func urlHost(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		return u.Host
	}
	return raw
}

// everyInterface reports an address bound on every interface (0.0.0.0,
// [::] or no host): reachable from every network the node is on.
func everyInterface(network, addr string) bool {
	if network == "unix" {
		return false
	}
	h, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if h == "" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsUnspecified()
}

// emit writes the record and one log line per listener.
func (l *listeners) emit(ev *eventlog.Log, log *slog.Logger) {
	socks := l.socks
	if socks == nil {
		socks = []eventlog.ListeningSocket{} // "sockets": [], not null
	}
	ev.Emit(eventlog.ListeningEvent{Sockets: socks})
	for _, s := range socks {
		attrs := []any{"name", s.Name, "network", s.Network, "address", s.Address, "pid", s.PID, "process", s.Process}
		if everyInterface(s.Network, s.Address) {
			attrs = append(attrs, "every_interface", true)
		}
		if s.When != "" {
			attrs = append(attrs, "when", s.When)
		}
		log.Info("listening", attrs...)
	}
}
