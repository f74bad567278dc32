package rendezvous

// ListenAddrs are the addresses of this node's gossip member (memberlist:
// TCP and UDP on the same port) and of its stream listener (stream.go),
// host:port as bound; "" for one that is off (gossip disabled).
func (e *Etcd) ListenAddrs() (gossip, stream string) { return e.loss.addrs() }
