package envtests

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// TestWebhook serves the admission webhook from a manager, configured by
// deploy/k8s/webhook.yaml's configurations, with the certificate it
// manages itself (WebhookCerts: a Secret, the caBundle set
// on the webhook configurations), to the real API server, which calls it
// for the test's namespace only (namespaceSelector). A user who may create
// AppWrappers and Jobs but not Secrets:
//   - may wrap a Job, and the default queue label is added;
//   - may not wrap a Secret (the per-component SubjectAccessReview);
//
// and, for anyone: no nested AppWrapper, no object in another namespace,
// at most 8 pod sets, declared pod sets must agree with the kind, and the
// components are immutable (labels are not).
func TestWebhook(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	// controller-runtime's webhook server (v0.25) binds Host:Port itself in
	// Start and takes no listener, so the port is reserved here and held
	// through the setup (the configurations name it), then released just
	// before the manager starts: only that short window is open to another
	// listener taking it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	port := l.Addr().(*net.TCPAddr).Port

	// The webhook configurations of deploy/k8s/webhook.yaml, reached by
	// URL (no Service routing here), limited to ns and renamed for it.
	shipped := appwrapper.ShippedWebhookCerts(ns, filepath.Join(t.TempDir(), "certs"))
	vwc, mwc, err := k8stest.WebhookManifests()
	if err != nil {
		t.Fatal(err)
	}
	if vwc.Name != shipped.Validating || mwc.Name != shipped.Mutating || len(vwc.Webhooks) != 1 || len(mwc.Webhooks) != 1 {
		t.Fatalf("webhook.yaml: configurations %q and %q, want %q and %q with one webhook each", vwc.Name, mwc.Name, shipped.Validating, shipped.Mutating)
	}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: ns}}
	toURL := func(cc *admissionregv1.WebhookClientConfig) {
		if cc.Service == nil || cc.Service.Name != shipped.Service || cc.Service.Path == nil {
			t.Fatalf("webhook.yaml: clientConfig %+v, want the Service %s with a path", cc, shipped.Service)
		}
		u := fmt.Sprintf("https://127.0.0.1:%d%s", port, *cc.Service.Path)
		cc.URL, cc.Service = &u, nil
	}
	vname, mname := vwc.Name+"-"+ns, mwc.Name+"-"+ns
	vwc.Name, vwc.Webhooks[0].NamespaceSelector = vname, sel
	toURL(&vwc.Webhooks[0].ClientConfig)
	mwc.Name, mwc.Webhooks[0].NamespaceSelector = mname, sel
	toURL(&mwc.Webhooks[0].ClientConfig)
	for _, o := range []client.Object{vwc, mwc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), vwc)
		_ = env.Client.Delete(context.Background(), mwc)
	})

	certs := shipped
	certs.Hosts = []string{"127.0.0.1"}
	certs.Validating, certs.Mutating = vname, mname
	if err := certs.Ensure(ctx, env.Client, time.Now()); err != nil {
		t.Fatal(err)
	}
	// A second replica (a second Ensure) reuses the Secret's certificate.
	first := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: certs.Secret}, first); err != nil {
		t.Fatal(err)
	}
	if err := certs.Ensure(ctx, env.Client, time.Now()); err != nil {
		t.Fatal(err)
	}
	again := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: certs.Secret}, again); err != nil {
		t.Fatal(err)
	}
	if string(first.Data["ca.crt"]) != string(again.Data["ca.crt"]) {
		t.Errorf("a second Ensure replaced a valid certificate")
	}

	cfg := appwrapper.DefaultConfig()
	cfg.DefaultQueueName = "team-queue"
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme:                 env.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer:          webhook.NewServer(webhook.Options{Host: "127.0.0.1", Port: port, CertDir: certs.Dir}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := appwrapper.SetupWebhookWithManager(mgr, cfg); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	if err := l.Close(); err != nil {
		t.Fatalf("release the webhook port: %v", err)
	}
	go func() { stopped <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("manager: %v", err)
		}
	})

	// The user: AppWrappers and Jobs, not Secrets.
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aw-user"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1beta2.GroupVersion.Group}, Resources: []string{"appwrappers"}, Verbs: []string{"create", "get", "update", "patch"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create"}},
	}}
	bind := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aw-user"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "aw-user"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice-" + ns}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	kc, err := env.KubeconfigAs(t.TempDir(), "alice-"+ns)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	rc.QPS, rc.Burst = 1000, 1000 // the latency below is the server's, not client-go's rate limiter
	alice, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}

	// Wait for the server: the first admission may come before it listens.
	ok := appWrapper("ok", nil, jobTemplate(t, "ok", 2, nil))
	ok.Namespace = ns
	deadline := time.Now().Add(waitTimeout)
	for {
		err = alice.Create(ctx, ok)
		if err == nil || !strings.Contains(err.Error(), "connection refused") || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("a Job the user may create: %v", err)
	}
	if ok.Labels[appwrapper.QueueNameLabel] != "team-queue" {
		t.Errorf("labels %v: want the default queue label", ok.Labels)
	}

	secret := rawObject(t, &corev1.Secret{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"}, ObjectMeta: metav1.ObjectMeta{Name: "s"}})
	nested := rawObject(t, &v1beta2.AppWrapper{TypeMeta: metav1.TypeMeta{APIVersion: "workload.codeflare.dev/v1beta2", Kind: "AppWrapper"},
		ObjectMeta: metav1.ObjectMeta{Name: "inner"}})
	var nine []runtime.RawExtension
	for i := range 9 {
		nine = append(nine, jobTemplate(t, fmt.Sprintf("j%d", i), 1, nil))
	}
	badPath := appWrapper("badpath", nil, jobTemplate(t, "bp", 1, nil))
	badPath.Spec.Components[0].DeclaredPodSets = []v1beta2.AppWrapperPodSet{{Path: "template.spec.nothing"}}
	for _, tc := range []struct {
		name string
		c    client.Client
		aw   *v1beta2.AppWrapper
		want string
	}{
		{"secret not allowed to the user", alice, appWrapper("sec", nil, jobTemplate(t, "sj", 1, nil), secret), `may not create secrets in namespace`},
		{"nested", env.Client, appWrapper("nest", nil, jobTemplate(t, "nj", 1, nil), nested), "nested AppWrappers are forbidden"},
		{"other namespace", env.Client, appWrapper("other", nil, jobTemplate(t, "oj", 1, func(j *batchv1.Job) { j.Namespace = "elsewhere" })), "cannot create objects in other namespaces"},
		{"nine pod sets", env.Client, appWrapper("nine", nil, nine...), "at most 8 are allowed"},
		{"no pod sets", env.Client, appWrapper("nopods", nil, secret), "at least 1 is required"},
		{"bad path", env.Client, badPath, "spec.components[0].podSets"},
		// A kind the API server does not serve is the request's fault:
		// Invalid, naming the kind, not an internal error of the webhook.
		{"kind not served", alice, appWrapper("widget", nil, jobTemplate(t, "wj", 1, nil),
			runtime.RawExtension{Raw: []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`)}),
			`spec.components[1].template: Invalid value: "": kind Widget of apiVersion example.com/v1 is not served by the API server`},
		{"kind of a served group not served", alice, appWrapper("gadget", nil, jobTemplate(t, "gj", 1, nil),
			runtime.RawExtension{Raw: []byte(`{"apiVersion":"batch/v1","kind":"Gadget","metadata":{"name":"g"}}`)}),
			`spec.components[1].template: Invalid value: "": kind Gadget of apiVersion batch/v1 is not served by the API server`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.aw.Namespace = ns
			err := tc.c.Create(ctx, tc.aw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create: %v, want an error containing %q", err, tc.want)
			}
			if apierrors.IsInternalError(err) || strings.Contains(fmt.Sprint(err), "Internal error") {
				t.Errorf("create: %v, want no internal error", err)
			}
		})
	}

	// Admission latency (logged, not asserted): dry-run creates by the
	// user, with the webhook (its namespace) and without (another one
	// where the same Role applies).
	other := env.Namespace(t)
	for _, o := range []client.Object{role.DeepCopy(), bind.DeepCopy()} {
		o.SetNamespace(other)
		o.SetResourceVersion("")
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	p50 := func(ns string) time.Duration {
		var ds []time.Duration
		for i := range 20 {
			aw := appWrapper(fmt.Sprintf("lat-%d", i), nil, jobTemplate(t, "lat", 2, nil))
			aw.Namespace = ns
			start := time.Now()
			if err := alice.Create(ctx, aw, client.DryRunAll); err != nil {
				t.Fatalf("dry-run create in %s: %v", ns, err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		return ds[len(ds)/2]
	}
	with, without := p50(ns), p50(other)
	t.Logf("AppWrapper create (dry run, 1 Job component), p50 of 20: %v with the webhook (mutating + validating with 1 SubjectAccessReview), %v without",
		with.Round(10*time.Microsecond), without.Round(10*time.Microsecond))

	// Updates: components immutable, labels not.
	edited := ok.DeepCopy()
	edited.Spec.Components[0] = v1beta2.AppWrapperComponent{Template: jobTemplate(t, "ok", 3, nil)}
	if err := alice.Update(ctx, edited); err == nil || !strings.Contains(err.Error(), "spec.components[0].template: Forbidden: field is immutable") {
		t.Errorf("edit of a template: %v, want refused", err)
	}
	relabel := ok.DeepCopy()
	relabel.Labels["team"] = "a"
	if err := alice.Update(ctx, relabel); err != nil {
		t.Errorf("a label change: %v, want allowed", err)
	}
}

// TestWebhookCertsWithShippedRBAC: the certificate management runs as the
// controller's service account with deploy/k8s/rbac.yaml's rules only, on
// the shipped names: it creates the Secret, and sets the caBundle of the
// shipped configurations (created here with a namespaceSelector that
// matches no namespace, so the shared API server calls no webhook).
func TestWebhookCertsWithShippedRBAC(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "deploy", "k8s", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
			t.Fatal(err)
		}
		if len(obj.Object) == 0 {
			continue
		}
		if err := env.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatalf("apply %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
	const ns = "ft-launcher-system"
	shipped := appwrapper.ShippedWebhookCerts(ns, filepath.Join(t.TempDir(), "certs"))
	nowhere := &metav1.LabelSelector{MatchLabels: map[string]string{"ft-launcher.dev/no-such-label": "x"}}
	fail := admissionregv1.Fail
	none := admissionregv1.SideEffectClassNone
	path := "/validate"
	cc := admissionregv1.WebhookClientConfig{Service: &admissionregv1.ServiceReference{Namespace: ns, Name: shipped.Service, Path: &path}}
	vwc := &admissionregv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: shipped.Validating},
		Webhooks: []admissionregv1.ValidatingWebhook{{Name: "v.ft-launcher.dev", FailurePolicy: &fail, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: nowhere, ClientConfig: cc}}}
	mwc := &admissionregv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: shipped.Mutating},
		Webhooks: []admissionregv1.MutatingWebhook{{Name: "m.ft-launcher.dev", FailurePolicy: &fail, SideEffects: &none,
			AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: nowhere, ClientConfig: cc}}}
	for _, o := range []client.Object{vwc, mwc} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), vwc)
		_ = env.Client.Delete(context.Background(), mwc)
		_ = env.Client.Delete(context.Background(), &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: shipped.Secret}})
	})

	kc, err := env.KubeconfigAs(t.TempDir(), "system:serviceaccount:"+ns+":appwrapper-controller", "system:serviceaccounts", "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := client.New(rc, client.Options{Scheme: env.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	if err := shipped.Ensure(ctx, sa, time.Now()); err != nil {
		t.Fatalf("as the service account: %v", err)
	}
	sec := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: shipped.Secret}, sec); err != nil {
		t.Fatal(err)
	}
	got := &admissionregv1.ValidatingWebhookConfiguration{}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: shipped.Validating}, got); err != nil {
		t.Fatal(err)
	}
	if string(got.Webhooks[0].ClientConfig.CABundle) != string(sec.Data["ca.crt"]) || len(sec.Data["ca.crt"]) == 0 {
		t.Errorf("caBundle not set to the Secret's CA")
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if st, err := os.Stat(filepath.Join(shipped.Dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
	// A certificate about to expire is renewed at the next start: the
	// generated one is valid a year and renewed with less than 30 days left
	// (webhookcerts.go).
	const certValidity, certRenewBefore = 365 * 24 * time.Hour, 30 * 24 * time.Hour
	if err := shipped.Ensure(ctx, sa, time.Now().Add(certValidity-certRenewBefore/2)); err != nil {
		t.Fatal(err)
	}
	renewed := &corev1.Secret{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: shipped.Secret}, renewed); err != nil {
		t.Fatal(err)
	}
	if string(renewed.Data["ca.crt"]) == string(sec.Data["ca.crt"]) {
		t.Errorf("a certificate with less than %v left was not renewed", certRenewBefore)
	}
}
