package main

import (
	"errors"
	"log/slog"
	"net"
	"strconv"

	"github.com/ftlauncher/ft-launcher/configs"
)

// relaySetup is this node's part in the two-level join (--rdzv-conf
// relay_group; docs/rendezvous.md, "Relays"): a relay node's listener on
// its advertised address and the relay port, or a member's relay address
// (its relay node's name from the Slurm allocation or the pod's
// subdomain, resolved now if it can be, else at each connection), and the
// key both prove. Relays only save etcd requests: a relay port that
// cannot be bound is logged and the node registers directly, as its
// members then do.
func relaySetup(cfg *configs.Config, localAddr string, resolve func(string) ([]string, error), log *slog.Logger) (ln net.Listener, relay string, key []byte, err error) {
	rl := cfg.Rdzv.Relay
	if rl.Group == 0 {
		return nil, "", nil, nil
	}
	if key, err = relayKeyOf(cfg); err != nil {
		return nil, "", nil, err
	}
	if key == nil {
		return nil, "", nil, errors.New("--rdzv-conf relay_group: the job secret file is empty")
	}
	port := strconv.Itoa(rl.Port)
	name, self := rl.RelayNode()
	if self {
		addr := net.JoinHostPort(localAddr, port)
		if ln, err = net.Listen("tcp", addr); err != nil {
			log.Warn("cannot listen on the relay port; this node and its group register directly", "addr", addr, "err", err)
			return nil, "", nil, nil
		}
		log.Info("relay for its group", "addr", addr, "group", rl.Group, "node_index", rl.Index)
		return ln, "", key, nil
	}
	ips, rerr := resolve(name)
	if rerr != nil || len(ips) == 0 {
		// A pod's relay may not be in DNS yet (pods start in any order);
		// the member then resolves the name each time it connects, and
		// registers directly while it does not resolve.
		log.Info("this node's relay does not resolve yet; resolving it when connecting", "relay_node", name, "err", rerr)
		return nil, net.JoinHostPort(name, port), key, nil
	}
	return nil, net.JoinHostPort(ips[0], port), key, nil
}

// relayKeyOf derives the relay port's key from the job secret (nil: no
// secret), as gossip's is: one secret, a key per use.
func relayKeyOf(cfg *configs.Config) ([]byte, error) { return jobSecretKey(cfg, "relay") }
