// Package etcdserver runs the single-member etcd server (go.etcd.io/etcd/
// server/v3/embed) that ft-launcher hosts as its default rendezvous store. It
// is linked only into the ft-launcher-etcd companion command: the etcd
// server's package initialisation alone would add about 10 ms to every
// launcher start, single-node runs included.
package etcdserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/netutil"
	"go.etcd.io/etcd/server/v3/embed"
)

// Options configures the etcd server that a launcher hosts when no
// external etcd is given (the c10d default).
type Options struct {
	// Dir is the data dir; "" creates one under $TMPDIR that Close removes
	// (and that a later start removes if this process is killed first).
	Dir       string
	ClientURL string // e.g. http://127.0.0.2:2379; port 0 picks a free one
	PeerURL   string // "" picks a free port on the client host
	Logger    *slog.Logger
	// ReadyTimeout bounds the wait for the server to serve (default 30s).
	ReadyTimeout time.Duration
	// Name and InitialCluster make this server one member of a cluster
	// (name=peerURL,name=peerURL,...): it serves once a majority of the
	// members are up. Empty: a single-member server.
	Name           string
	InitialCluster string
	// ClusterToken distinguishes clusters that reuse addresses (the run id).
	ClusterToken string
	// ClusterState is "new" (default: the members bootstrap together) or
	// "existing": this member was added to a running cluster (MemberAdd)
	// and joins it on a fresh data dir.
	ClusterState string
	// Adopt restarts a member on the data of its previous server, which
	// died: an ft-launcher-etcd-* dir (Dir reported by that server) whose
	// owner lock is free. Start fails if the dir is gone, locked or holds
	// no etcd data; it owns and removes the dir like a temporary one.
	Adopt string
}

// Server is a running etcd server (a single member or one of a cluster).
type Server struct {
	etcd       *embed.Etcd
	endpoint   string
	owned      *dataDir // the temporary data dir, nil for Options.Dir
	logger     *slog.Logger
	closedOnce chan struct{}
}

// Start starts a single-member etcd server and blocks until it serves.
func Start(ctx context.Context, o Options) (*Server, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	switch o.ClusterState {
	case "", embed.ClusterStateFlagNew, embed.ClusterStateFlagExisting:
	default:
		return nil, fmt.Errorf("embedded etcd: initial cluster state %q: want %q or %q", o.ClusterState, embed.ClusterStateFlagNew, embed.ClusterStateFlagExisting)
	}
	curl, purl, err := urls(o)
	if err != nil {
		return nil, err
	}
	dir, owned := o.Dir, (*dataDir)(nil)
	if o.Adopt != "" {
		if o.Dir != "" {
			return nil, fmt.Errorf("embedded etcd: both a data dir (%s) and a dir to adopt (%s) given; give one", o.Dir, o.Adopt)
		}
		// Before any sweep: the dir's owner is dead, so a sweep would
		// remove it.
		d, err := adoptDataDir(o.Adopt)
		if err != nil {
			return nil, err
		}
		dir, owned = d.data(), d
		sweepStale(os.TempDir(), logger)
	} else if dir == "" {
		sweepStale(os.TempDir(), logger)
		d, err := newDataDir(os.TempDir())
		if err != nil {
			return nil, err
		}
		dir, owned = d.data(), d
	}
	e, err := embed.StartEtcd(config(dir, curl, purl, o))
	if err == nil {
		err = waitReady(ctx, e, o.ReadyTimeout)
		if err != nil {
			e.Close()
		}
	} else {
		err = fmt.Errorf("start embedded etcd on %s: %w", curl.String(), err)
	}
	if err != nil {
		if owned != nil {
			owned.remove()
		}
		return nil, err
	}
	endpoint := curl.String()
	if len(e.Clients) > 0 {
		// Port 0 was resolved by the listener: advertise the real one.
		endpoint = curl.Scheme + "://" + e.Clients[0].Addr().String()
	}
	logger.Info("embedded etcd serving", "endpoint", endpoint, "dir", dir)
	m := &Server{etcd: e, endpoint: endpoint, owned: owned, logger: logger,
		closedOnce: make(chan struct{})}
	go m.reportFailure()
	return m, nil
}

// urls resolves the client and peer URLs (defaults, port 0).
func urls(o Options) (curl, purl *url.URL, err error) {
	if o.ClientURL == "" {
		o.ClientURL = "http://127.0.0.1:0"
	}
	if curl, err = resolveURL(o.ClientURL); err != nil {
		return nil, nil, fmt.Errorf("embedded etcd client url: %w", err)
	}
	if o.PeerURL == "" {
		o.PeerURL = "http://" + net.JoinHostPort(curl.Hostname(), "0")
	}
	if purl, err = resolveURL(o.PeerURL); err != nil {
		return nil, nil, fmt.Errorf("embedded etcd peer url: %w", err)
	}
	return curl, purl, nil
}

// config is the server configuration: a single member, or member o.Name of
// o.InitialCluster.
func config(dir string, curl, purl *url.URL, o Options) *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = "ft-launcher"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	if o.InitialCluster == "" {
		// A single member elects itself after the rest of a randomised
		// election timeout (etcd fast-forwards all but one tick of it):
		// 0.1-1 s of every job's start with etcd's 100/1000 ms. It has no
		// peers to heartbeat or to lose, and is never joined by one (a
		// cluster is named by InitialCluster from its start), so a 10 ms
		// tick costs nothing and brings the election to 10-100 ms. Lease
		// TTLs stay as asked (etcd's minimum becomes 150 ms; ours are
		// seconds).
		cfg.TickMs, cfg.ElectionMs = 10, 100
	} else {
		cfg.Name, cfg.InitialCluster = o.Name, o.InitialCluster
		if o.ClusterToken != "" {
			cfg.InitialClusterToken = o.ClusterToken
		}
		if o.ClusterState == embed.ClusterStateFlagExisting {
			cfg.ClusterState = embed.ClusterStateFlagExisting
		}
	}
	// etcd logs routine shutdown steps at error level; real failures reach
	// us through Err(), which reportFailure logs.
	cfg.LogLevel = "fatal"
	// Large jobs write many rank keys per round; allow big transactions.
	cfg.MaxTxnOps = 4096
	cfg.MaxRequestBytes = 8 << 20
	// Keep 10 minutes of history: every round rewrites O(nodes) keys, and
	// without compaction the database grows with every round a job ever
	// ran until etcd refuses writes at its quota (docs/rendezvous.md,
	// Scale). Watches resume from revisions seconds old, well within.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "10m"
	return cfg
}

// waitReady waits until e serves, fails, the timeout (default 30s) passes
// or ctx ends.
func waitReady(ctx context.Context, e *embed.Etcd, to time.Duration) error {
	if to <= 0 {
		to = 30 * time.Second
	}
	timer := time.NewTimer(to)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("embedded etcd failed while starting: %w", err)
	case <-timer.C:
		return fmt.Errorf("embedded etcd not ready after %v", to)
	case <-ctx.Done():
		return fmt.Errorf("embedded etcd start: %w", ctx.Err())
	}
}

// reportFailure logs a server failure that happens before Close.
func (m *Server) reportFailure() {
	select {
	case err, ok := <-m.etcd.Err():
		if ok && err != nil {
			select {
			case <-m.closedOnce:
			default:
				m.logger.Error("embedded etcd failed", "err", err)
			}
		}
	case <-m.closedOnce:
	}
}

// resolveURL parses u and replaces port 0 with a free port, because etcd's
// peer listener must advertise a concrete address in the initial cluster.
func resolveURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", raw, err)
	}
	if u.Port() == "0" || u.Port() == "" {
		p, err := netutil.FreePort(u.Hostname())
		if err != nil {
			return nil, err
		}
		u.Host = net.JoinHostPort(u.Hostname(), fmt.Sprint(p))
	}
	return u, nil
}

// Endpoint is the client URL to give to NewEtcd.
func (m *Server) Endpoint() string { return m.endpoint }

// OwnedDir is the temporary dir (ft-launcher-etcd-XXXX) that Close removes,
// "" for Options.Dir: what a restart of this member adopts if this server
// dies (Options.Adopt).
func (m *Server) OwnedDir() string {
	if m.owned == nil {
		return ""
	}
	return m.owned.path
}

// Close stops the server and removes the data dir if Start created it.
func (m *Server) Close() error {
	select {
	case <-m.closedOnce:
		return nil
	default:
		close(m.closedOnce)
	}
	// A member of a cluster that lost its quorum (its peers stopping at
	// the same time) may wait a long time for the raft loop; the data dir
	// is only ours and goes either way, bounded.
	stopped := make(chan struct{})
	go func() {
		m.etcd.Close()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(closeBound):
		m.logger.Warn("embedded etcd did not stop in time; removing its data dir anyway", "bound", closeBound)
	}
	if m.owned != nil {
		return m.owned.remove()
	}
	return nil
}

// closeBound bounds Close: the companion gets SIGTERM when its launcher
// dies and must remove its data dir before anything SIGKILLs it.
const closeBound = 2 * time.Second
