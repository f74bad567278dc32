package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// newEtcdRendezvous sets up the multi-node rendezvous from the validated
// cfg.Rdzv: on the user's etcd (external mode) or on the embedded etcd,
// which this launcher starts first when cfg.Rdzv.HostsEtcd says it hosts it.
func newEtcdRendezvous(ctx context.Context, cfg *configs.Config, log *slog.Logger, reaper *spawn.Reaper, met *metrics.Metrics) (rendezvous.Rendezvous, func(), error) {
	rz := cfg.Rdzv
	if rz.Mode == configs.RdzvSingleNode || len(rz.Endpoints) == 0 {
		return nil, nil, fmt.Errorf("internal error: etcd rendezvous asked for with rendezvous mode %q and endpoints %v", rz.Mode, rz.Endpoints)
	}
	localAddr := cfg.LocalAddr
	if localAddr == "" {
		localAddr, _ = os.Hostname()
	}

	cleanup := func() {}
	if rz.Mode == configs.RdzvEmbedded {
		if cfg.RdzvBackend == "c10d" {
			log.Info("--rdzv-backend c10d is served by ft-launcher's embedded etcd rendezvous", "endpoint", rz.Endpoints[0])
		}
		if rz.HostsEtcd {
			h, _, _ := net.SplitHostPort(rz.Endpoints[0])
			peerPort, err := rendezvous.FreePort(h)
			if err != nil {
				return nil, nil, fmt.Errorf("embedded etcd peer port on %s: %w", h, err)
			}
			ep, stop, err := hostEtcd(ctx, reaper, log, "http://"+rz.Endpoints[0], "http://"+net.JoinHostPort(h, strconv.Itoa(peerPort)))
			if err != nil {
				return nil, nil, fmt.Errorf("host the embedded etcd at %s: %w", rz.Endpoints[0], err)
			}
			log.Info("hosting the embedded etcd rendezvous", "endpoint", ep, "decided_by", rz.HostsEtcdBy)
			cleanup = stop
		}
	}
	r, err := rendezvous.NewEtcd(ctx, rendezvous.EtcdOptions{
		JoinTimeout: rz.JoinTimeout, LastCall: rz.LastCallTimeout,
		ConnectTimeout: rz.ConnectTimeout, LeaseTTL: rz.LeaseTTL,
		EtcdLossBound: rz.EtcdLossBound, RejoinWait: rz.RejoinWait,
		Endpoints: rz.ClientURLs(), CACert: cfg.RdzvCACert, Cert: cfg.RdzvCert, Key: cfg.RdzvKey,
		Username: cfg.RdzvUser, Password: cfg.RdzvPassword,
		RunID: cfg.RdzvID, NodeID: fmt.Sprintf("%s/%d", localAddr, os.Getpid()), LocalAddr: localAddr,
		NProcPerNode: cfg.NProcPerNode, MinNodes: cfg.NNodes.Min, MaxNodes: cfg.NNodes.Max,
		MaxRestarts: cfg.MaxRestarts, InfraRank: cfg.InfraRank,
		HealthCheck: healthCheck(cfg, reaper, log), Metrics: met, Logger: log.With("component", "rendezvous"),
		// A Slurm allocation of exactly MIN nodes gets no replacement
		// node: a round short of MIN ends the job after min_nodes_wait.
		FixedAllocation: cfg.Slurm.InJob() && cfg.NNodes.Min == cfg.NNodes.Max,
	})
	if err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("etcd rendezvous at %v: %w", rz.Endpoints, err)
	}
	return r, func() { r.Close(); cleanup() }, nil
}
