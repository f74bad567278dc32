package rendezvous

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

// retryPause is the pause between attempts of the retry loops below.
const retryPause = 200 * time.Millisecond

// sleepCtx waits d or until ctx ends; it reports whether the full d passed.
// Every retry loop pauses through it, so none outlives its context.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// connect sets up the etcd client (a shared one from the options, else a
// new one) and waits until etcd answers.
func (e *Etcd) connect(ctx context.Context) error {
	if e.o.Client != nil {
		e.cli = e.o.Client
	} else {
		cfg, err := clientConfig(e.o)
		if err != nil {
			return err
		}
		cli, err := e.newClient(ctx, cfg)
		if err != nil {
			return err
		}
		e.cli, e.ownsClient = cli, true
	}
	return e.waitReachable(ctx)
}

// clientConfig is the etcd client configuration for o.
func clientConfig(o EtcdOptions) (clientv3.Config, error) {
	cfg := clientv3.Config{Endpoints: o.Endpoints, DialTimeout: 5 * time.Second,
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
		Username: o.Username, Password: o.Password,
		// The client logs every retry while etcd is away; our own
		// slog lines report reachability once per state change.
		Logger: zap.NewNop(),
		// Reconnect within about a second once etcd is back (gRPC's
		// default backoff grows to minutes): a member's lease must be
		// kept alive again before its TTL runs out after an etcd restart.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second})}}
	if o.CACert != "" || o.Cert != "" {
		tc, err := loadTLS(o.CACert, o.Cert, o.Key)
		if err != nil {
			return cfg, err
		}
		cfg.TLS = tc
	}
	return cfg, nil
}

func loadTLS(ca, cert, key string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("read etcd CA cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA cert %s: no certificates", ca)
		}
		tc.RootCAs = pool
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("load etcd client cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	return tc, nil
}

// newClient creates the etcd client. With a username the client
// authenticates inside clientv3.New, which then fails when etcd is not up
// yet: retry that for ConnectTimeout, but report a refused login at once.
func (e *Etcd) newClient(ctx context.Context, cfg clientv3.Config) (*clientv3.Client, error) {
	deadline := time.Now().Add(e.o.ConnectTimeout)
	for {
		cfg.DialTimeout = min(5*time.Second, max(time.Until(deadline), 100*time.Millisecond))
		cli, err := clientv3.New(cfg)
		if err == nil {
			return cli, nil
		}
		if errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrGRPCAuthFailed) {
			return nil, fmt.Errorf("etcd at %s refused the login of user %q (wrong rdzv username or password?): %w",
				e.endpoints(), cfg.Username, err)
		}
		if cfg.Username == "" || ctx.Err() != nil || time.Now().After(deadline) || !sleepCtx(ctx, retryPause) {
			return nil, fmt.Errorf("%w at %s after %v: %w%s", ErrUnreachable, e.endpoints(), e.o.ConnectTimeout, err, e.tlsHintCfg(ctx, cfg.TLS))
		}
	}
}

// tlsHint explains a TLS failure, which the etcd client only reports as a
// timeout: it tries one handshake itself and returns "" when that works.
func (e *Etcd) tlsHint(ctx context.Context) string {
	if e.o.CACert == "" && e.o.Cert == "" {
		return ""
	}
	tc, err := loadTLS(e.o.CACert, e.o.Cert, e.o.Key)
	if err != nil {
		return ""
	}
	return e.tlsHintCfg(ctx, tc)
}

func (e *Etcd) tlsHintCfg(ctx context.Context, tc *tls.Config) string {
	if tc == nil {
		return ""
	}
	for _, ep := range e.o.Endpoints {
		host := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Host
		}
		if err := tlsProbe(ctx, host, tc); err != nil {
			return fmt.Sprintf(" (TLS with %s: %v)", host, err)
		}
	}
	return ""
}

// tlsProbe handshakes with addr and reads briefly: with TLS 1.3 a server
// that rejects our client certificate says so only after the handshake.
func tlsProbe(ctx context.Context, addr string, tc *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d := tls.Dialer{Config: tc.Clone()}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // the server waits for our request: TLS is fine
		}
		return err
	}
	return nil
}

// waitReachable retries a read until etcd answers or ConnectTimeout passes.
func (e *Etcd) waitReachable(ctx context.Context) error {
	deadline := time.Now().Add(e.o.ConnectTimeout)
	for {
		actx, cancel := context.WithTimeout(ctx, min(2*time.Second, time.Until(deadline)+10*time.Millisecond))
		_, err := e.cli.Get(actx, e.rk.generation())
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("connect to etcd at %s: %w", e.endpoints(), ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w at %s after %v: %w%s", ErrUnreachable, e.endpoints(), e.o.ConnectTimeout, err, e.tlsHint(ctx))
		}
		if !sleepCtx(ctx, retryPause) {
			return fmt.Errorf("connect to etcd at %s: %w", e.endpoints(), ctx.Err())
		}
	}
}

func (e *Etcd) endpoints() string {
	if len(e.o.Endpoints) == 0 && e.cli != nil {
		return strings.Join(e.cli.Endpoints(), ",")
	}
	return strings.Join(e.o.Endpoints, ",")
}
