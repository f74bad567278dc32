package rendezvous

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// testPKI is a throw-away CA with one server and one client certificate,
// written as PEM files.
type testPKI struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ft-launcher test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		return write(cn+".pem", "CERTIFICATE", der), write(cn+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

// runOneRound runs a 2-node job through one successful round. The nodes
// hold the production lease TTL rather than the helper's 2 s: with auth or
// TLS every renewal costs the server more, and on a loaded machine renewals
// then missed their TTL/2 budget until the lease expired and the round
// started over, past nextAll's bound (reproduced with the test and two CPU
// hogs on one core). These tests are about the credentials, not leases.
func runOneRound(t *testing.T, c *cluster, tweak func(*EtcdOptions)) {
	t.Helper()
	for i := 0; i < 2; i++ {
		o := c.opts(i, 1, 2, 2, 0)
		o.LeaseTTL = 0 // the default
		tweak(&o)
		c.add(o)
	}
	checkConsistent(t, nextAll(t, c.nodes), 1, 2)
	for i, code := range succeedAll(t, c.nodes, 0) {
		if code != 0 {
			t.Fatalf("node %d code %d", i, code)
		}
	}
}

// TestRealEtcdTLS runs a round against Debian's etcd serving HTTPS and
// requiring client certificates.
func TestRealEtcdTLS(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	pki := newTestPKI(t)
	p := startEtcdProcWith(t, "https", "--cert-file", pki.serverCert, "--key-file", pki.serverKey,
		"--trusted-ca-file", pki.ca, "--client-cert-auth")
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	runOneRound(t, c, func(o *EtcdOptions) {
		o.CACert, o.Cert, o.Key = pki.ca, pki.clientCert, pki.clientKey
	})

	// Without a client certificate the server refuses: a clear error, not a hang.
	_, err := NewEtcd(context.Background(), EtcdOptions{Endpoints: []string{p.clientURL}, CACert: pki.ca,
		RunID: "r", NodeID: "n", NProcPerNode: 1, MinNodes: 1, MaxNodes: 1, ConnectTimeout: time.Second,
		DisableGossip: true, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), p.clientURL) || !strings.Contains(err.Error(), "TLS with") {
		t.Fatalf("no client cert: got %v, want an error naming %s and the TLS failure", err, p.clientURL)
	}
	t.Logf("without a client certificate: %v", err)
}

// TestRealEtcdAuth runs a round with username/password against Debian's
// etcd with auth enabled; a wrong password is a clear error.
func TestRealEtcdAuth(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	// Each phase gets its own generous budget: one context shared by the
	// setup, the round and the wrong-password login left the login only
	// what the others had not spent, which a loaded machine could use up.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	admin, err := clientv3.New(clientv3.Config{Endpoints: []string{p.clientURL}, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	for _, step := range []struct {
		name string
		do   func() error
	}{
		{"add root", func() error { _, err := admin.UserAdd(ctx, "root", "s3cret"); return err }},
		{"grant root", func() error { _, err := admin.UserGrantRole(ctx, "root", "root"); return err }},
		{"enable auth", func() error { _, err := admin.AuthEnable(ctx); return err }},
	} {
		// The server may still be starting: retry briefly.
		for err := step.do(); err != nil; err = step.do() {
			if ctx.Err() != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	runOneRound(t, c, func(o *EtcdOptions) { o.Username, o.Password = "root", "s3cret" })

	// A refused login is reported at once, whatever ConnectTimeout is; a
	// generous one keeps a slow server from turning it into "unreachable".
	lctx, lcancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer lcancel()
	start := time.Now()
	_, err = NewEtcd(lctx, EtcdOptions{Endpoints: []string{p.clientURL}, Username: "root", Password: "wrong",
		RunID: "r", NodeID: "n", NProcPerNode: 1, MinNodes: 1, MaxNodes: 1, ConnectTimeout: 30 * time.Second,
		DisableGossip: true, Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "authentication failed") || !strings.Contains(err.Error(), `"root"`) {
		t.Fatalf("wrong password: got %v, want an authentication error naming the user", err)
	}
	t.Logf("wrong password (%v): %v", time.Since(start).Round(time.Millisecond), err)
}
