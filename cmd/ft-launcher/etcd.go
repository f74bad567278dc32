package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// newEtcdRendezvous sets up the multi-node rendezvous. --rdzv-backend etcd
// means an external etcd cluster; c10d and static (what existing scripts pass)
// map to the embedded default, hosted by the launcher whose address matches
// the endpoint (or that has is_host=1 in --rdzv-conf).
func newEtcdRendezvous(ctx context.Context, cfg *configs.Config, log *slog.Logger, reaper *spawn.Reaper, met *metrics.Metrics) (rendezvous.Rendezvous, func(), error) {
	endpoint := cfg.RdzvEndpoint
	defPort := "29400"
	switch cfg.RdzvBackend {
	case "etcd", "etcd-v2":
		defPort = "2379"
	case "static":
		if endpoint == "" {
			endpoint = net.JoinHostPort(cfg.MasterAddr, strconv.Itoa(cfg.MasterPort))
		}
	}
	if endpoint == "" {
		return nil, nil, fmt.Errorf("--rdzv-endpoint is required with --nnodes %d:%d (give host:port of the rendezvous)", cfg.NNodes.Min, cfg.NNodes.Max)
	}
	var eps []string
	for _, e := range strings.Split(endpoint, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(e); err != nil {
			e = net.JoinHostPort(strings.Trim(e, "[]"), defPort)
		}
		eps = append(eps, e)
	}
	host, _ := os.Hostname()
	localAddr := cfg.LocalAddr
	if localAddr == "" {
		localAddr = host
	}

	cleanup := func() {}
	external := cfg.RdzvBackend == "etcd" || cfg.RdzvBackend == "etcd-v2"
	if !external {
		if cfg.RdzvBackend == "c10d" {
			log.Info("--rdzv-backend c10d is served by ft-launcher's embedded etcd rendezvous", "endpoint", eps[0])
		}
		isHost := rendezvous.IsLocalEndpoint(eps[0], cfg.LocalAddr)
		if v, ok := cfg.RdzvConf["is_host"]; ok {
			isHost = v == "1" || strings.EqualFold(v, "true")
		}
		if isHost {
			h, _, _ := net.SplitHostPort(eps[0])
			peerPort, err := rendezvous.FreePort(h)
			if err != nil {
				return nil, nil, err
			}
			ep, stop, err := hostEtcd(reaper, log, "http://"+eps[0], "http://"+net.JoinHostPort(h, strconv.Itoa(peerPort)))
			if err != nil {
				return nil, nil, fmt.Errorf("host the embedded etcd at %s: %w", eps[0], err)
			}
			log.Info("hosting the embedded etcd rendezvous", "endpoint", ep)
			cleanup = stop
		}
	}
	for i, e := range eps {
		eps[i] = "http://" + e
		if cfg.RdzvCACert != "" || cfg.RdzvCert != "" {
			eps[i] = "https://" + e
		}
	}
	timing, err := rdzvTimings(cfg.RdzvConf)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	r, err := rendezvous.NewEtcd(ctx, rendezvous.EtcdOptions{
		JoinTimeout: timing["join_timeout"], LastCall: timing["last_call_timeout"],
		ConnectTimeout: timing["connect_timeout"], LeaseTTL: timing["lease_ttl"],
		EtcdLossBound: timing["etcd_loss_bound"], RejoinWait: rejoinWait(cfg, timing),
		Endpoints: eps, CACert: cfg.RdzvCACert, Cert: cfg.RdzvCert, Key: cfg.RdzvKey,
		Username: cfg.RdzvUser, Password: cfg.RdzvPassword,
		RunID: cfg.RdzvID, NodeID: fmt.Sprintf("%s/%d", localAddr, os.Getpid()), LocalAddr: localAddr,
		NProcPerNode: cfg.NProcPerNode, MinNodes: cfg.NNodes.Min, MaxNodes: cfg.NNodes.Max,
		MaxRestarts: cfg.MaxRestarts, InfraRank: infraRank(cfg),
		HealthCheck: healthCheck(cfg, reaper, log), Metrics: met, Logger: log.With("component", "rendezvous"),
	})
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return r, func() { r.Close(); cleanup() }, nil
}

// infraRank is the node's rank as the infrastructure knows it, used to order
// nodes: --node-rank, else SLURM_PROCID, else JOB_COMPLETION_INDEX; -1 if none.
func infraRank(cfg *configs.Config) int {
	if cfg.NodeRank >= 0 {
		return cfg.NodeRank
	}
	for _, k := range []string{"SLURM_PROCID", "JOB_COMPLETION_INDEX"} {
		if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v >= 0 {
			return v
		}
	}
	return -1
}

// rdzvTimingKeys are the --rdzv-conf keys that set rendezvous timings, in
// seconds. join_timeout and last_call_timeout are torchrun's and nvrx's.
var rdzvTimingKeys = []string{"join_timeout", "last_call_timeout", "connect_timeout", "lease_ttl", "etcd_loss_bound", "rejoin_wait"}

// rdzvTimings reads the timing keys of --rdzv-conf; absent keys are zero
// (the rendezvous default).
func rdzvTimings(conf map[string]string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, k := range rdzvTimingKeys {
		v, ok := conf[k]
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return nil, fmt.Errorf("--rdzv-conf %s=%q: want a positive number of seconds", k, v)
		}
		out[k] = time.Duration(f * float64(time.Second))
	}
	return out, nil
}

// rejoinWait is how long a restart round waits for the previous round's
// active nodes: long enough for a node to stop its ranks (the SIGTERM grace)
// so that it keeps its group rank, unless --rdzv-conf rejoin_wait says.
func rejoinWait(cfg *configs.Config, timing map[string]time.Duration) time.Duration {
	if d, ok := timing["rejoin_wait"]; ok {
		return d
	}
	return cfg.WorkersStopTimeout + 10*time.Second
}
