package rendezvous

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedOptions configures the in-process etcd server that the launcher
// hosts when no external etcd is given (the c10d default).
type EmbeddedOptions struct {
	Dir       string // data dir; "" creates a temp dir that Close removes
	ClientURL string // e.g. http://127.0.0.2:2379; port 0 picks a free one
	PeerURL   string // "" picks a free port on the client host
	Logger    *slog.Logger
	// ReadyTimeout bounds the wait for the server to serve (default 30s).
	ReadyTimeout time.Duration
}

// Embedded is a running single-member etcd server.
type Embedded struct {
	etcd       *embed.Etcd
	endpoint   string
	removeDir  string
	logger     *slog.Logger
	closedOnce chan struct{}
}

// StartEmbedded starts a single-member etcd server and blocks until it serves.
func StartEmbedded(ctx context.Context, o EmbeddedOptions) (*Embedded, error) {
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
	fail := func(err error) (*Embedded, error) {
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
	m := &Embedded{etcd: e, endpoint: endpoint, removeDir: removeDir, logger: logger,
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
		p, err := FreePort(u.Hostname())
		if err != nil {
			return nil, err
		}
		u.Host = net.JoinHostPort(u.Hostname(), fmt.Sprint(p))
	}
	return u, nil
}

// Endpoint is the client URL to give to NewEtcd.
func (m *Embedded) Endpoint() string { return m.endpoint }

// Close stops the server and removes the data dir if StartEmbedded created it.
func (m *Embedded) Close() error {
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

// IsLocalEndpoint reports whether this launcher should host the etcd server
// named by endpoint ("host:port" or a URL). The rule:
//   - when localAddr is set, the endpoint is local only if its host equals
//     localAddr (after resolving a hostname endpoint to IPs); this lets
//     several launchers on one machine, bound to 127.0.0.2, 127.0.0.3, ...,
//     agree that exactly one of them hosts;
//   - otherwise it is local when its host is "localhost", a loopback IP,
//     this machine's hostname, or an address of one of its interfaces.
func IsLocalEndpoint(endpoint string, localAddr string) bool {
	host := endpointHost(endpoint)
	if host == "" {
		return false
	}
	ips := hostIPs(host)
	if localAddr != "" {
		if host == localAddr {
			return true
		}
		for _, ip := range ips {
			if ip.String() == localAddr {
				return true
			}
		}
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if hn, err := os.Hostname(); err == nil && strings.EqualFold(hn, host) {
		return true
	}
	ifAddrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range ifAddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

func endpointHost(endpoint string) string {
	s := endpoint
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return strings.Trim(s, "[]")
}

func hostIPs(host string) []net.IP {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil
	}
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.IP)
	}
	return out
}
