package appwrapper

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// The one test of this package that needs an API server: it drives an
// unexported step of the reconciler, so it cannot live with the others in
// k8s/appwrapper/envtests. It starts its own control plane, so that the
// package's pure tests need none.

// controlPlane starts etcd, kube-apiserver and kube-controller-manager for
// t and stops them at its end; without the binaries t ends in
// testenv.Missing (a skip, or a failure under CI).
func controlPlane(t *testing.T) *k8stest.Env {
	t.Helper()
	if _, err := k8stest.Assets(); err != nil {
		testenv.Missing(t, testenv.ControlPlane, err.Error())
	}
	env, err := k8stest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Error(err)
		}
	})
	return env
}

// laggingCache stands for an informer cache that has not seen a fresh
// object yet: every unstructured Get says NotFound.
type laggingCache struct{ client.Client }

func (l laggingCache) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return apierrors.NewNotFound(u.GroupVersionKind().GroupVersion().WithResource(strings.ToLower(u.GetKind())+"s").GroupResource(), key.Name)
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// TestMissingComponentConfirmedUncached: the evaluation step that decides
// MissingComponent (upstream issue #416; docs/kubernetes.md, "What it does
// better than the upstream controller") believes a lagging cache only when an
// uncached read of the real API server agrees. This one test drives the step
// directly, with a cache that lags forever, since a real lag cannot be produced
// on demand.
func TestMissingComponentConfirmedUncached(t *testing.T) {
	env := controlPlane(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fresh"}, Spec: batchv1.JobSpec{
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "x"}}}}}}
	if err := env.Client.Create(ctx, job); err != nil {
		t.Fatal(err)
	}
	r := &Reconciler{client: laggingCache{env.Client}, apiReader: env.Client, now: time.Now}
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "aw"}}
	aw.Spec.Components = []v1beta2.AppWrapperComponent{{}}
	aw.Status.ComponentStatus = []v1beta2.AppWrapperComponentStatus{{Name: "fresh", Kind: "Job", APIVersion: "batch/v1"}}
	s := &pass{r: r, aw: aw}

	h, err := s.componentHealth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.deployed != 1 || len(h.missing) != 0 {
		t.Errorf("with the Job in the API server: deployed %d, missing %v; want 1 and none", h.deployed, h.missing)
	}
	if err := env.Client.Delete(ctx, job, client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if h, err = s.componentHealth(ctx); err != nil {
			t.Fatal(err)
		}
		if h.deployed == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if h.deployed != 0 || len(h.missing) != 1 {
		t.Errorf("with the Job deleted: deployed %d, missing %v; want 0 and the Job", h.deployed, h.missing)
	}
}
