package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/agentstore"
	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// newEtcdRendezvous sets up the multi-node rendezvous from the validated
// cfg.Rdzv: on the user's etcd (external mode) or on the embedded etcd,
// which this launcher starts first when cfg.Rdzv.HostsEtcd says it hosts it.
// keep is where the keeper of a hosted member reports (etcdmember.go).
// wd, when set, is the fence watchdog that each lease renewal extends.
// ls records the hosted etcd's listeners.
func newEtcdRendezvous(ctx context.Context, cfg *configs.Config, log *slog.Logger, reaper *spawn.Reaper, met *metrics.Metrics, store *agentstore.Host, keep keeperDeps, wd *fence.Watchdog, replicaAddr string, ls *listeners) (rendezvous.Rendezvous, func(), error) {
	rz := cfg.Rdzv
	if rz.Mode == configs.RdzvSingleNode || len(rz.Endpoints) == 0 {
		return nil, nil, fmt.Errorf("internal error: etcd rendezvous asked for with rendezvous mode %q and endpoints %v", rz.Mode, rz.Endpoints)
	}
	localAddr := advertisedAddr(cfg)

	cleanup := func() {}
	if rz.Mode == configs.RdzvEmbedded {
		if cfg.RdzvBackend == "c10d" {
			log.Info("--rdzv-backend c10d is served by ft-launcher's embedded etcd rendezvous", "endpoint", rz.Endpoints[0])
		}
		if rz.HostsEtcd {
			m, err := etcdMember(cfg)
			if err != nil {
				return nil, nil, err
			}
			keep.metrics, keep.peers = met, rz.ClientURLs()
			ep, pid, stop, err := hostEtcd(ctx, reaper, log.With("component", "etcd-member"), m, keep)
			if err != nil {
				return nil, nil, fmt.Errorf("host the embedded etcd at %s: %w", m.clientURL, err)
			}
			for _, l := range []struct{ name, url string }{{listenEtcdClient, m.clientURL}, {listenEtcdPeer, m.peerURL}} {
				ls.add(eventlog.ListeningSocket{Name: l.name, Network: "tcp", Address: urlHost(l.url), PID: pid, Process: etcdCompanion})
			}
			log.Info("hosting the embedded etcd rendezvous", "endpoint", ep, "member", m.name, "members", len(rz.Endpoints),
				"decided_by", rz.HostsEtcdBy)
			cleanup = stop
		}
	}
	if rz.Mode == configs.RdzvEmbedded && !rz.HostsEtcd {
		defer warnWhileNobodyServes(cfg, log)()
	}
	var masterPort func(int) (int, error)
	if store != nil {
		masterPort = func(round int) (int, error) { return store.Port(localAddr, round) }
	}
	gossipKey, err := gossipKeyOf(cfg)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	relayLn, relayAddr, relayKey, err := relaySetup(cfg, localAddr, launcherNetwork(os.Getenv).Resolve, log)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	if relayLn != nil {
		ls.own(listenRelay, "tcp", relayLn.Addr().String(), "")
	}
	r, err := rendezvous.NewEtcd(ctx, rendezvous.EtcdOptions{MasterPort: masterPort, GossipKey: gossipKey,
		RelayListener: relayLn, Relay: relayAddr, RelayKey: relayKey,
		JoinTimeout: rz.JoinTimeout, LastCall: rz.LastCallTimeout,
		ConnectTimeout: rz.ConnectTimeout, LeaseTTL: rz.LeaseTTL, FenceMargin: rz.FenceMargin,
		EtcdLossBound: rz.EtcdLossBound, RejoinWait: rz.RejoinWait, MinNodesWait: rz.MinNodesWait,
		Gossip: rendezvous.GossipTimings{ProbeInterval: rz.Gossip.ProbeInterval, ProbeTimeout: rz.Gossip.ProbeTimeout,
			SuspicionMult: rz.Gossip.SuspicionMult, IndirectChecks: rz.Gossip.IndirectChecks},
		Endpoints: rz.ClientURLs(), CACert: cfg.RdzvCACert, Cert: cfg.RdzvCert, Key: cfg.RdzvKey,
		Username: cfg.RdzvUser, Password: cfg.RdzvPassword,
		RunID: cfg.RdzvID, NodeID: fmt.Sprintf("%s/%d", localAddr, os.Getpid()), LocalAddr: localAddr,
		ReplicaAddr:  replicaAddr,
		NProcPerNode: cfg.NProcPerNode, MinNodes: cfg.NNodes.Min, MaxNodes: cfg.NNodes.Max,
		MaxRestarts: cfg.MaxRestarts, RestartWindow: cfg.RestartWindow, RestartDelay: cfg.RestartDelay, InfraRank: cfg.InfraRank,
		HealthCheck: healthCheck(cfg, reaper, log), Metrics: met, Logger: log.With("component", "rendezvous"),
		// The fence watchdog kills this node's ranks watchdogMargin before
		// its lease could expire, unless a renewal extends it first: after
		// the launcher's own fence, which acts at the full margin.
		OnLeaseRenewed: func(validUntil time.Time) {
			wd.Extend(validUntil.Add(-watchdogMargin(rz.LeaseTTL, rz.FenceMargin)))
		},
		// A Slurm allocation of exactly MIN nodes gets no replacement
		// node: a round short of MIN ends the job after min_nodes_wait.
		FixedAllocation: cfg.Slurm.InJob() && cfg.NNodes.Min == cfg.NNodes.Max,
	})
	if err != nil {
		if relayLn != nil {
			_ = relayLn.Close() // NewEtcd closes it only once it started serving
		}
		cleanup()
		err = fmt.Errorf("etcd rendezvous at %v: %w", rz.Endpoints, err)
		// Only when nothing answered: a local failure (a port, gossip)
		// says nothing about who hosts the embedded etcd.
		if rz.Mode == configs.RdzvEmbedded && !rz.HostsEtcd && ctx.Err() == nil && errors.Is(err, rendezvous.ErrUnreachable) {
			err = fmt.Errorf("%w; %s", err, noHostHint(cfg))
		}
		return nil, nil, err
	}
	return r, func() { r.Close(); cleanup() }, nil
}

// launcherNetwork is what parsing asks about addresses: DNS, then, inside a
// Slurm job, Slurm's node table (node names need not be in DNS); this
// machine's interfaces, routes and host name.
func launcherNetwork(getenv func(string) string) configs.Network {
	res := rendezvous.Resolver{}
	if getenv("SLURM_JOB_ID") != "" {
		res.NodeAddr = slurm.Scheduler{}.NodeAddr
	}
	return configs.Network{Resolve: res.Resolve, LocalIPs: rendezvous.LocalIPs, RouteTo: rendezvous.RouteTo,
		Hostname: func() string { h, _ := os.Hostname(); return h },
		EtcHosts: func() ([]byte, error) { return readHead("/etc/hosts", 1<<20) }}
}

// readHead reads at most limit bytes of path: a kubelet's /etc/hosts is a
// few hundred.
func readHead(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return b, nil
}

// nobodyServesAfter is how long a launcher that does not host the embedded
// etcd waits for it before saying what it compared: the host normally
// serves within a second of its start.
const nobodyServesAfter = 3 * time.Second

// warnWhileNobodyServes logs, once, if nothing listens at the embedded
// etcd's endpoints nobodyServesAfter from now, why this launcher does not
// host it, instead of only failing after connect_timeout. The returned
// function cancels it.
func warnWhileNobodyServes(cfg *configs.Config, log *slog.Logger) func() {
	t := time.AfterFunc(nobodyServesAfter, func() {
		if !anyListens(cfg.Rdzv.Endpoints) {
			log.Warn("nothing listens at the embedded etcd's endpoints yet; still waiting (connect_timeout)", "hint", noHostHint(cfg))
		}
	})
	return func() { t.Stop() }
}

// anyListens reports whether a TCP connect to one of the endpoints succeeds.
func anyListens(endpoints []string) bool {
	for _, ep := range endpoints {
		if c, err := net.DialTimeout("tcp", ep, time.Second); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// noHostHint says that perhaps no launcher hosts the embedded etcd, what
// makes a launcher host it, and what this one compared.
func noHostHint(cfg *configs.Config) string {
	rz := cfg.Rdzv
	eps := strings.Join(rz.Endpoints, ",")
	if rz.Given != nil {
		eps = strings.Join(rz.Given, ",") + " (" + eps + ")"
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("no launcher hosts the embedded etcd at %s? The launcher whose --local-addr (else its host name, Slurm node name "+
		"or an address of its node) matches an endpoint hosts it, or the one given --rdzv-conf is_host=1; this node's addresses were "+
		"%s (local address, from %s), host name %s, interfaces %s: %s",
		eps, cfg.LocalAddr, cfg.Sources["local_addr"], host, strings.Join(rendezvous.LocalIPs(), ","), rz.HostsEtcdBy)
}

// etcdMember is what this launcher's embedded etcd serves: with one
// endpoint a single member on a free peer port; with several, member i of
// a cluster whose member j serves clients at Endpoints[j] and peers at its
// port + 1, named m<j>, its token the run id.
func etcdMember(cfg *configs.Config) (member, error) {
	rz := cfg.Rdzv
	ep := rz.Endpoints[rz.EtcdMember]
	h, ps, _ := net.SplitHostPort(ep)
	if len(rz.Endpoints) == 1 {
		peerPort, err := rendezvous.FreePort(h)
		if err != nil {
			return member{}, fmt.Errorf("embedded etcd peer port on %s: %w", h, err)
		}
		return member{clientURL: "http://" + ep, peerURL: "http://" + net.JoinHostPort(h, strconv.Itoa(peerPort))}, nil
	}
	var cluster []string
	for j, e := range rz.Endpoints {
		eh, eps, _ := net.SplitHostPort(e)
		p, _ := strconv.Atoi(eps)
		cluster = append(cluster, fmt.Sprintf("m%d=http://%s", j, net.JoinHostPort(eh, strconv.Itoa(p+1))))
	}
	port, _ := strconv.Atoi(ps)
	return member{name: fmt.Sprintf("m%d", rz.EtcdMember), clientURL: "http://" + ep,
		peerURL: "http://" + net.JoinHostPort(h, strconv.Itoa(port+1)),
		cluster: strings.Join(cluster, ","), token: "ft-launcher-" + cfg.RdzvID}, nil
}
