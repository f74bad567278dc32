package rendezvous

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/hashicorp/memberlist"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Gossip (SWIM via hashicorp/memberlist) detects a dead launcher within
// about a second, far sooner than its etcd lease expires. Timings are tuned
// for a LAN or loopback; seeds come from the round's assignment.
func gossipConfig(name, addr string, port int) *memberlist.Config {
	c := memberlist.DefaultLANConfig()
	c.Name = name
	c.BindAddr = addr
	c.BindPort = port
	c.AdvertiseAddr = addr
	c.AdvertisePort = port
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.SuspicionMult = 2
	c.GossipInterval = 100 * time.Millisecond
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = 2 * time.Second
	c.LogOutput = io.Discard
	return c
}

type gossipEvents struct{ e *Etcd }

func (g gossipEvents) NotifyJoin(n *memberlist.Node)   {}
func (g gossipEvents) NotifyUpdate(n *memberlist.Node) {}

// NotifyLeave fires for dead and for cleanly departed members; both end the
// round if the member was active and not done (nodeLost checks).
func (g gossipEvents) NotifyLeave(n *memberlist.Node) {
	e := g.e
	e.mu.Lock()
	r := e.ctlRound
	e.mu.Unlock()
	how := "gossip"
	if n.State == memberlist.StateLeft {
		how = "gossip: left"
	}
	go func() {
		e.nodeLost(r, n.Name, how)
		e.markDead(n.Name)
	}()
}

func (e *Etcd) startGossip() error {
	port := e.o.GossipPort
	if port == 0 {
		// memberlist needs the same port for TCP and UDP; pick a free TCP
		// one and let memberlist fail loudly if its UDP twin is taken.
		p, err := FreePort(e.o.LocalAddr)
		if err != nil {
			return fmt.Errorf("rendezvous: gossip port: %w", err)
		}
		port = p
	}
	// memberlist binds and advertises only an IP: a host name given as
	// the local address is resolved here.
	ips, err := (Resolver{}).Resolve(e.o.LocalAddr)
	if err != nil {
		return fmt.Errorf("rendezvous: gossip address: %w", err)
	}
	addr := ips[0]
	c := gossipConfig(e.o.NodeID, addr, port)
	c.Events = gossipEvents{e: e}
	ml, err := memberlist.Create(c)
	if err != nil {
		return fmt.Errorf("rendezvous: start gossip on %s:%d: %w", addr, port, err)
	}
	e.mu.Lock()
	e.ml = ml
	e.gossipAddr = net.JoinHostPort(addr, strconv.Itoa(port))
	e.mu.Unlock()
	return nil
}

// gossipJoin contacts the round's seeds (best effort, asynchronously).
func (e *Etcd) gossipJoin(seeds []string) {
	e.mu.Lock()
	ml, self := e.ml, e.gossipAddr
	e.mu.Unlock()
	if ml == nil {
		return
	}
	others := make([]string, 0, len(seeds))
	for _, s := range seeds {
		if s != self {
			others = append(others, s)
		}
	}
	if len(others) == 0 {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if _, err := ml.Join(others); err != nil {
			e.log.Warn("gossip join", "seeds", others, "err", err)
		}
	}()
}

// stopGossip leaves (when graceful) and shuts memberlist down.
func (e *Etcd) stopGossip(graceful bool) {
	e.mu.Lock()
	ml := e.ml
	e.ml = nil
	e.mu.Unlock()
	if ml == nil {
		return
	}
	if graceful {
		_ = ml.Leave(300 * time.Millisecond)
	}
	_ = ml.Shutdown()
}

// markDead records that gossip declared node id gone, so that a restart
// round's closer (often a standby outside the gossip cluster) does not wait
// for it (see rejoinGate). The record is under our lease: it only has to
// outlive the dead node's own lease.
func (e *Etcd) markDead(id string) {
	if id == e.o.NodeID {
		return
	}
	ctx, cancel := e.lostTimeout(5 * time.Second)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.k.dead(id), e.o.NodeID, clientv3.WithLease(e.currentLease())); err != nil {
		e.log.Debug("record gossip death", "node", id, "err", err)
	}
}
