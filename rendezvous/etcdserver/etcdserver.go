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
	Dir       string // data dir; "" creates a temp dir that Close removes
	ClientURL string // e.g. http://127.0.0.2:2379; port 0 picks a free one
	PeerURL   string // "" picks a free port on the client host
	Logger    *slog.Logger
	// ReadyTimeout bounds the wait for the server to serve (default 30s).
	ReadyTimeout time.Duration
}

// Server is a running single-member etcd server.
type Server struct {
	etcd       *embed.Etcd
	endpoint   string
	removeDir  string
	logger     *slog.Logger
	closedOnce chan struct{}
}

// Start starts a single-member etcd server and blocks until it serves.
func Start(ctx context.Context, o Options) (*Server, error) {
	logger := o.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if o.ClientURL == "" {
		o.ClientURL = "http://127.0.0.1:0"
	}
	curl, err := resolveURL(o.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd client url: %w", err)
	}
	if o.PeerURL == "" {
		o.PeerURL = "http://" + net.JoinHostPort(curl.Hostname(), "0")
	}
	purl, err := resolveURL(o.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd peer url: %w", err)
	}
	dir, removeDir := o.Dir, ""
	if dir == "" {
		d, err := os.MkdirTemp("", "ft-launcher-etcd-")
		if err != nil {
			return nil, fmt.Errorf("embedded etcd data dir: %w", err)
		}
		dir, removeDir = d, d
	}
	cfg := embed.NewConfig()
	cfg.Name = "ft-launcher"
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*curl}
	cfg.AdvertiseClientUrls = []url.URL{*curl}
	cfg.ListenPeerUrls = []url.URL{*purl}
	cfg.AdvertisePeerUrls = []url.URL{*purl}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	// etcd logs routine shutdown steps at error level; real failures reach
	// us through Err(), which is logged below.
	cfg.LogLevel = "fatal"
	// Large jobs write many rank keys per round; allow big transactions.
	cfg.MaxTxnOps = 4096
	cfg.MaxRequestBytes = 8 << 20

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		if removeDir != "" {
			os.RemoveAll(removeDir)
		}
		return nil, fmt.Errorf("start embedded etcd on %s: %w", curl.String(), err)
	}
	to := o.ReadyTimeout
	if to <= 0 {
		to = 30 * time.Second
	}
	timer := time.NewTimer(to)
	defer timer.Stop()
	fail := func(err error) (*Server, error) {
		e.Close()
		if removeDir != "" {
			os.RemoveAll(removeDir)
		}
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fail(fmt.Errorf("embedded etcd failed while starting: %w", err))
	case <-timer.C:
		return fail(fmt.Errorf("embedded etcd not ready after %v", to))
	case <-ctx.Done():
		return fail(fmt.Errorf("embedded etcd start: %w", ctx.Err()))
	}
	endpoint := curl.String()
	if len(e.Clients) > 0 {
		// Port 0 was resolved by the listener: advertise the real one.
		endpoint = curl.Scheme + "://" + e.Clients[0].Addr().String()
	}
	logger.Info("embedded etcd serving", "endpoint", endpoint, "dir", dir)
	m := &Server{etcd: e, endpoint: endpoint, removeDir: removeDir, logger: logger,
		closedOnce: make(chan struct{})}
	go func() {
		select {
		case err, ok := <-e.Err():
			if ok && err != nil {
				select {
				case <-m.closedOnce:
				default:
					logger.Error("embedded etcd failed", "err", err)
				}
			}
		case <-m.closedOnce:
		}
	}()
	return m, nil
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

// Close stops the server and removes the data dir if StartEmbedded created it.
func (m *Server) Close() error {
	select {
	case <-m.closedOnce:
		return nil
	default:
		close(m.closedOnce)
	}
	m.etcd.Close()
	if m.removeDir != "" {
		if err := os.RemoveAll(m.removeDir); err != nil {
			return fmt.Errorf("remove embedded etcd dir: %w", err)
		}
	}
	return nil
}
