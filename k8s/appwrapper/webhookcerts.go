package appwrapper

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// WebhookCerts says where the webhook's self-managed certificate lives.
type WebhookCerts struct {
	// Namespace and Secret hold the CA and the serving certificate, shared
	// by every replica: the first to start creates it, the others read it.
	Namespace, Secret string
	// Service is the webhook Service's name; the certificate names
	// <service>.<namespace>.svc and .svc.cluster.local.
	Service string
	// Hosts are further names or IP addresses for the certificate (a
	// webhook reached by URL).
	Hosts []string
	// Dir receives tls.crt and tls.key for the webhook server.
	Dir string
	// Validating and Mutating name the webhook configurations whose
	// caBundle is set to the CA.
	Validating, Mutating string
}

// ShippedWebhookCerts is WebhookCerts with the names deploy/k8s/webhook.yaml
// and rbac.yaml give the webhook's objects.
func ShippedWebhookCerts(namespace, dir string) WebhookCerts {
	return WebhookCerts{
		Namespace:  namespace,
		Secret:     "appwrapper-webhook-cert",
		Service:    "appwrapper-webhook",
		Dir:        dir,
		Validating: "ft-launcher-appwrapper-validating",
		Mutating:   "ft-launcher-appwrapper-mutating",
	}
}

// certValidity is how long a generated certificate is valid; a start with
// less than certRenewBefore left makes a new one.
const (
	certValidity    = 365 * 24 * time.Hour
	certRenewBefore = 30 * 24 * time.Hour
)

// Ensure makes the serving certificate exist (creating or renewing it in
// the Secret), writes it to Dir and puts its CA into the webhook
// configurations' caBundle. c must be an uncached client allowed to get,
// create and update the Secret and to get and update the two webhook
// configurations. An alternative is cert-manager (docs/kubernetes.md).
func (wc WebhookCerts) Ensure(ctx context.Context, c client.Client, now time.Time) error {
	sec := &corev1.Secret{}
	key := client.ObjectKey{Namespace: wc.Namespace, Name: wc.Secret}
	err := c.Get(ctx, key, sec)
	switch {
	case apierrors.IsNotFound(err):
		sec, err = wc.generate(now)
		if err != nil {
			return err
		}
		if err := c.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
			// Another replica was first: use its certificate.
			if err := c.Get(ctx, key, sec); err != nil {
				return fmt.Errorf("webhook certificate: read Secret %s: %w", key, err)
			}
		} else if err != nil {
			return fmt.Errorf("webhook certificate: create Secret %s: %w", key, err)
		}
	case err != nil:
		return fmt.Errorf("webhook certificate: read Secret %s: %w", key, err)
	default:
		if expiry, err := certExpiry(sec.Data[corev1.TLSCertKey]); err != nil || expiry.Sub(now) < certRenewBefore {
			fresh, gerr := wc.generate(now)
			if gerr != nil {
				return gerr
			}
			sec.Data = fresh.Data
			if err := c.Update(ctx, sec); apierrors.IsConflict(err) {
				// Another replica renewed it first: use its certificate.
				if err := c.Get(ctx, key, sec); err != nil {
					return fmt.Errorf("webhook certificate: read Secret %s: %w", key, err)
				}
			} else if err != nil {
				return fmt.Errorf("webhook certificate: renew Secret %s: %w", key, err)
			}
		}
	}
	if err := os.MkdirAll(wc.Dir, 0o700); err != nil {
		return fmt.Errorf("webhook certificate: %w", err)
	}
	for name, data := range map[string][]byte{corev1.TLSCertKey: sec.Data[corev1.TLSCertKey], corev1.TLSPrivateKeyKey: sec.Data[corev1.TLSPrivateKeyKey]} {
		if len(data) == 0 {
			return fmt.Errorf("webhook certificate: Secret %s lacks %s", key, name)
		}
		if err := os.WriteFile(filepath.Join(wc.Dir, name), data, 0o600); err != nil {
			return fmt.Errorf("webhook certificate: %w", err)
		}
	}
	_, err = wc.setCABundle(ctx, c, sec.Data["ca.crt"])
	return err
}

// setCABundle puts ca into the caBundle of every webhook of the two
// configurations that exist; one not applied (yet) is skipped, so the
// controller starts whether deploy/k8s/webhook.yaml is applied before or
// after it, and KeepCABundle fills it in once it is. changed is true when
// a configuration was written.
func (wc WebhookCerts) setCABundle(ctx context.Context, c client.Client, ca []byte) (changed bool, err error) {
	// Replicas start together and write the same CA: a conflict is retried.
	if wc.Validating != "" {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			v := &admissionregv1.ValidatingWebhookConfiguration{}
			if err := c.Get(ctx, client.ObjectKey{Name: wc.Validating}, v); err != nil {
				return client.IgnoreNotFound(err)
			}
			dirty := false
			for i := range v.Webhooks {
				if !bytes.Equal(v.Webhooks[i].ClientConfig.CABundle, ca) {
					v.Webhooks[i].ClientConfig.CABundle, dirty = ca, true
				}
			}
			if !dirty {
				return nil
			}
			changed = true
			return c.Update(ctx, v)
		}); err != nil {
			return changed, fmt.Errorf("webhook certificate: set caBundle of ValidatingWebhookConfiguration %s: %w", wc.Validating, err)
		}
	}
	if wc.Mutating != "" {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			m := &admissionregv1.MutatingWebhookConfiguration{}
			if err := c.Get(ctx, client.ObjectKey{Name: wc.Mutating}, m); err != nil {
				return client.IgnoreNotFound(err)
			}
			dirty := false
			for i := range m.Webhooks {
				if !bytes.Equal(m.Webhooks[i].ClientConfig.CABundle, ca) {
					m.Webhooks[i].ClientConfig.CABundle, dirty = ca, true
				}
			}
			if !dirty {
				return nil
			}
			changed = true
			return c.Update(ctx, m)
		}); err != nil {
			return changed, fmt.Errorf("webhook certificate: set caBundle of MutatingWebhookConfiguration %s: %w", wc.Mutating, err)
		}
	}
	return changed, nil
}

// CABundleKeepInterval is how often KeepCABundle looks at the webhook
// configurations: the longest an AppWrapper create is refused after
// deploy/k8s/webhook.yaml is applied to a running controller (or
// re-created without its caBundle).
const CABundleKeepInterval = 2 * time.Second

// KeepCABundle sets the CA of the Secret as the caBundle of the webhook
// configurations every interval until ctx ends, so that applying
// webhook.yaml after the controller started, or again, needs no restart.
// Every replica runs it (each serves the webhook); they write the same CA.
// Errors are logged to logf and retried.
func (wc WebhookCerts) KeepCABundle(ctx context.Context, c client.Client, interval time.Duration, logf func(msg string, err error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		sec := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: wc.Namespace, Name: wc.Secret}, sec); err != nil {
			if ctx.Err() == nil {
				logf("webhook certificate: read Secret", err)
			}
			continue
		}
		changed, err := wc.setCABundle(ctx, c, sec.Data["ca.crt"])
		switch {
		case err != nil && ctx.Err() == nil:
			logf("webhook certificate", err)
		case changed:
			logf("webhook certificate: caBundle set on the webhook configurations", nil)
		}
	}
}

// generate makes a CA and a serving certificate it signs, as a TLS Secret
// with the CA in "ca.crt".
func (wc WebhookCerts) generate(now time.Time) (*corev1.Secret, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "ft-launcher appwrapper webhook CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: CA: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: CA: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: key: %w", err)
	}
	host := wc.Service + "." + wc.Namespace + ".svc"
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host, host + ".cluster.local"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range wc.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("webhook certificate: %w", err)
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: wc.Namespace, Name: wc.Secret},
		Type:       corev1.SecretTypeTLS,
		Data: map[string][]byte{
			corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
			"ca.crt":                pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		},
	}, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return big.NewInt(time.Now().UnixNano())
	}
	return n
}

// certExpiry is the NotAfter of the first certificate in PEM data.
func certExpiry(data []byte) (time.Time, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return time.Time{}, errors.New("no PEM certificate")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		return time.Time{}, err
	}
	return c.NotAfter, nil
}
