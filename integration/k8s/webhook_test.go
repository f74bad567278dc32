package k8s

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// TestWebhookBinary: the real `ft-resumer appwrapper-controller` started
// with `webhooksEnabled: true` makes its own certificate (the Secret in
// --webhook-namespace), writes the CA into the caBundle of the webhook
// configurations of deploy/k8s/webhook.yaml applied after it started (and
// again when a configuration loses it), and serves them: the API
// server then adds the default queue label to a valid AppWrapper (which the
// same binary takes to Running), and refuses a nested AppWrapper and an
// edited component with the webhook's message.
//
// The configurations keep their shipped names and paths; only what this
// API server needs changes: they reach the server by URL (127.0.0.1, so
// the certificate also names it, --webhook-cert-hosts; there is no Service
// routing here) and call it for the test's namespace only.
func TestWebhookBinary(t *testing.T) {
	k8stest.Need(t, env)
	ctx := context.Background()
	ns := env.Namespace(t)
	port := listenPort(t)

	shipped := appwrapper.ShippedWebhookCerts(ns, "")
	vwc, mwc, err := k8stest.WebhookManifests()
	if err != nil {
		t.Fatal(err)
	}
	if vwc.Name != shipped.Validating || mwc.Name != shipped.Mutating || len(vwc.Webhooks) != 1 || len(mwc.Webhooks) != 1 {
		t.Fatalf("webhook.yaml: configurations %q and %q, want %q and %q with one webhook each", vwc.Name, mwc.Name, shipped.Validating, shipped.Mutating)
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	for _, cc := range []*admissionregv1.WebhookClientConfig{&vwc.Webhooks[0].ClientConfig, &mwc.Webhooks[0].ClientConfig} {
		if cc.Service == nil || cc.Service.Name != shipped.Service || cc.Service.Path == nil || len(cc.CABundle) != 0 {
			t.Fatalf("webhook.yaml: clientConfig %+v, want the Service %s with a path and no caBundle", cc, shipped.Service)
		}
		u := fmt.Sprintf("https://127.0.0.1:%d%s", port, *cc.Service.Path)
		cc.URL, cc.Service = &u, nil
	}
	vwc.Webhooks[0].NamespaceSelector = sel
	mwc.Webhooks[0].NamespaceSelector = sel
	t.Cleanup(func() {
		// Deleted after the controller stops (cleanups run in reverse).
		_ = env.Client.Delete(context.Background(), vwc)
		_ = env.Client.Delete(context.Background(), mwc)
	})

	// The controller starts first, with no webhook configuration to
	// find: it must not exit, and fills in the caBundle once they are
	// applied (no restart).
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte("webhooksEnabled: true\ndefaultQueueName: team-queue\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	controller(t, "--config", cfgPath, "--webhook-port", fmt.Sprint(port), "--webhook-namespace", ns,
		"--webhook-cert-dir", filepath.Join(dir, "certs"), "--webhook-cert-hosts", "127.0.0.1")
	waitFor(t, "the controller's certificate Secret", func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: shipped.Secret}, &corev1.Secret{}) == nil
	}, func() string { return "no Secret " + shipped.Secret })
	for _, o := range []client.Object{vwc, mwc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}

	// The certificate: a Secret in the namespace, its CA in both caBundles.
	sec := &corev1.Secret{}
	waitFor(t, "the webhook certificate's Secret", func() bool {
		return env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: shipped.Secret}, sec) == nil
	}, func() string { return "no Secret " + shipped.Secret })
	ca := sec.Data["ca.crt"]
	if len(ca) == 0 {
		t.Fatalf("Secret %s has no ca.crt (keys %v)", shipped.Secret, keys(sec.Data))
	}
	waitFor(t, "the caBundle of both webhook configurations", func() bool {
		v, m := &admissionregv1.ValidatingWebhookConfiguration{}, &admissionregv1.MutatingWebhookConfiguration{}
		if env.Client.Get(ctx, client.ObjectKeyFromObject(vwc), v) != nil || env.Client.Get(ctx, client.ObjectKeyFromObject(mwc), m) != nil {
			return false
		}
		return bytes.Equal(v.Webhooks[0].ClientConfig.CABundle, ca) && bytes.Equal(m.Webhooks[0].ClientConfig.CABundle, ca)
	}, func() string { return "caBundle not the Secret's CA" })
	// Applied again without it (a re-created configuration): restored.
	v := &admissionregv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKeyFromObject(vwc), v); err != nil {
		t.Fatal(err)
	}
	v.Webhooks[0].ClientConfig.CABundle = nil
	if err := env.Client.Update(ctx, v); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the caBundle restored", func() bool {
		v := &admissionregv1.ValidatingWebhookConfiguration{}
		return env.Client.Get(ctx, client.ObjectKeyFromObject(vwc), v) == nil && bytes.Equal(v.Webhooks[0].ClientConfig.CABundle, ca)
	}, func() string { return "caBundle not restored" })

	// A valid AppWrapper, once the server listens: the first admissions
	// may come before it does (failurePolicy Fail refuses them).
	valid := object(t, trainingAW("valid", nil))
	valid.SetNamespace(ns)
	var lastErr error
	waitFor(t, "the webhook to admit a valid AppWrapper", func() bool {
		lastErr = env.Client.Create(ctx, valid.DeepCopy())
		return lastErr == nil
	}, func() string { return fmt.Sprintf("last error: %v", lastErr) })
	aw := getAW(t, ns, "valid")
	if aw.Labels[appwrapper.QueueNameLabel] != "team-queue" {
		t.Errorf("labels %v: want the default queue label %s=team-queue (the mutating webhook)", aw.Labels, appwrapper.QueueNameLabel)
	}
	waitPhase(t, ns, "valid", v1beta2.AppWrapperRunning)

	// Refused, with the webhook's message.
	nested := object(t, []byte(`apiVersion: workload.codeflare.dev/v1beta2
kind: AppWrapper
metadata:
  name: outer
spec:
  components:
  - template:
      apiVersion: batch/v1
      kind: Job
      metadata:
        name: outer-job
      spec:
        template:
          spec:
            restartPolicy: Never
            containers:
            - name: c
              image: example.com/trainer:latest
  - template:
      apiVersion: workload.codeflare.dev/v1beta2
      kind: AppWrapper
      metadata:
        name: inner
`))
	nested.SetNamespace(ns)
	if err := env.Client.Create(ctx, nested); err == nil || !strings.Contains(err.Error(), "nested AppWrappers are forbidden") {
		t.Errorf("create a nested AppWrapper: %v, want refused: nested AppWrappers are forbidden", err)
	}
	edited := getAW(t, ns, "valid")
	edited.Spec.Components[0].Template.Raw = bytes.Replace(edited.Spec.Components[0].Template.Raw,
		[]byte(`"parallelism":2`), []byte(`"parallelism":1`), 1)
	if !bytes.Contains(edited.Spec.Components[0].Template.Raw, []byte(`"parallelism":1`)) {
		t.Fatalf("the stored template has no parallelism 2 to edit: %s", edited.Spec.Components[0].Template.Raw)
	}
	if err := env.Client.Update(ctx, edited); err == nil || !strings.Contains(err.Error(), "spec.components[0].template: Forbidden: field is immutable") {
		t.Errorf("edit a component's template: %v, want refused as immutable", err)
	}
	relabel := getAW(t, ns, "valid")
	relabel.Labels["team"] = "a"
	if err := env.Client.Update(ctx, relabel); err != nil {
		t.Errorf("a label change: %v, want admitted", err)
	}
}

// object decodes a YAML document.
func object(t *testing.T, doc []byte) *unstructured.Unstructured {
	t.Helper()
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
		t.Fatalf("YAML: %v", err)
	}
	return &obj
}

func keys(m map[string][]byte) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

// listenPort is a port free for the controller's webhook server, which
// listens on every address. It is taken below the ephemeral range: a port
// the kernel picked (127.0.0.1:0) can be handed to one of the many
// outgoing connections to the API server and etcd before the binary binds
// it ("address already in use").
func listenPort(t *testing.T) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	start := 10000 + rand.IntN(max(low-10000, 1))
	for i := range 200 {
		p := 10000 + (start-10000+i)%max(low-10000, 1)
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
		if err == nil {
			l.Close()
			return p
		}
	}
	t.Fatalf("no free port in [10000, %d)", low)
	return 0
}
