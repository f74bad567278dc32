package envtests

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
)

// ownedJobs lists (uncached) the Jobs of the namespace that the AppWrapper
// controls.
func (h *harness) ownedJobs(aw *v1beta2.AppWrapper) []batchv1.Job {
	h.t.Helper()
	var jobs batchv1.JobList
	if err := env.Client.List(h.ctx, &jobs, client.InNamespace(h.ns)); err != nil {
		h.t.Fatal(err)
	}
	var out []batchv1.Job
	for _, j := range jobs.Items {
		if ref := metav1.GetControllerOf(&j); ref != nil && ref.UID == aw.UID {
			out = append(out, j)
		}
	}
	return out
}

func jobNames(jobs []batchv1.Job) []string {
	var out []string
	for _, j := range jobs {
		out = append(out, j.Name)
	}
	return out
}

// TestGenerateNameCreatedOnce: a component named by metadata.generateName
// whose creation the status write after it fails to record (the
// AppWrapper is changed between the Create and that write, so the write
// conflicts) is found by its labels at the next pass, not created again:
// the AppWrapper owns exactly one Job, before and after a reset.
func TestGenerateNameCreatedOnce(t *testing.T) {
	var once sync.Once
	var mu sync.Mutex
	var creates []string
	var h *harness
	h = newHarnessWith(t, 2, nil, func(r *appwrapper.Reconciler) {
		r.SetTestHooks(appwrapper.TestHooks{AfterCreate: func(obj client.Object, err error) {
			mu.Lock()
			creates = append(creates, fmt.Sprintf("%s: %v", obj.GetName(), err))
			mu.Unlock()
			if err != nil {
				return
			}
			once.Do(func() {
				// A metadata change moves the resourceVersion: the status
				// write that follows this Create conflicts.
				aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: obj.GetNamespace(), Name: "gen"}}
				patch := []byte(`{"metadata":{"annotations":{"test/bump":"1"}}}`)
				if err := env.Client.Patch(context.Background(), aw, client.RawPatch(types.MergePatchType, patch)); err != nil {
					t.Errorf("bump the AppWrapper: %v", err)
				}
			})
		}})
	})
	const name = "gen"
	hist := h.watch(name)
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1s",
		v1beta2.RetryPausePeriodDurationAnnotation, "1s",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, "", 2, func(j *batchv1.Job) { j.GenerateName = "gen-" })))
	aw := h.waitFor(name, "Running with its pods ready", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
	})
	if aw.Annotations["test/bump"] != "1" {
		t.Fatalf("the AppWrapper was not changed after the Create (annotations %v): no conflict was forced", aw.Annotations)
	}
	// The conflicting write left the creation unrecorded: some version
	// after the Create still shows it initiated, with no name.
	unrecorded := false
	for _, v := range hist.all() {
		if len(v.Status.ComponentStatus) == 1 && v.Annotations["test/bump"] == "1" &&
			cond2(v.Status.ComponentStatus[0].Conditions).Reason == appwrapper.ReasonComponentCreationInitiated {
			unrecorded = true
		}
	}
	if !unrecorded {
		t.Errorf("no version after the conflict shows the creation unrecorded; the test forced nothing")
	}
	jobs := h.ownedJobs(aw)
	if len(jobs) != 1 || aw.Status.ComponentStatus[0].Name != jobs[0].Name {
		t.Fatalf("owned Jobs %v, componentStatus names %q: want exactly the one it records", jobNames(jobs), aw.Status.ComponentStatus[0].Name)
	}
	mu.Lock()
	if len(creates) != 1 {
		t.Errorf("Create calls %v, want one", creates)
	}
	mu.Unlock()

	// A reset deletes it and creates exactly one new one.
	first := jobs[0].UID
	pods := h.waitRunning(name, 2)
	h.fail(pods[0].Name, 1, "rank 0 exited with code 1")
	aw = h.waitFor(name, "Running again after a reset", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
	})
	h.eventually("one owned Job, a new one", func() (bool, string) {
		jobs := h.ownedJobs(aw)
		return len(jobs) == 1 && jobs[0].UID != first, fmt.Sprintf("owned Jobs %v", jobNames(jobs))
	})
}

// TestResetDeletesUnlistedOwned: a reset deletes every object of the
// components' kinds that the AppWrapper controls, not only those its status
// names: one carrying the UID label, one carrying only the AppWrapper's name
// label (as an older controller left them). An object of the same labels
// not controlled by it is left alone.
func TestResetDeletesUnlistedOwned(t *testing.T) {
	h := newHarness(t, 2, nil)
	const name = "orphans"
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1s",
		v1beta2.RetryPausePeriodDurationAnnotation, "1s",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 2, nil)))
	aw := h.waitFor(name, "Running with its pods ready", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
	})
	ctrlRef := true
	owner := metav1.OwnerReference{APIVersion: v1beta2.GroupVersion.String(), Kind: "AppWrapper", Name: aw.Name, UID: aw.UID,
		Controller: &ctrlRef, BlockOwnerDeletion: &ctrlRef}
	suspended := func(j *batchv1.Job) { s := true; j.Spec.Suspend = &s }
	mk := func(jobName string, labels map[string]string, owned bool) *batchv1.Job {
		j := &batchv1.Job{}
		if err := json.Unmarshal(jobTemplate(t, jobName, 1, suspended).Raw, j); err != nil {
			t.Fatal(err)
		}
		j.Namespace, j.Labels = h.ns, labels
		if owned {
			j.OwnerReferences = []metav1.OwnerReference{owner}
		}
		if err := h.c.Create(h.ctx, j); err != nil {
			t.Fatalf("create Job %s: %v", jobName, err)
		}
		return j
	}
	byUID := mk("extra-uid", map[string]string{v1beta2.UIDLabel: string(aw.UID), v1beta2.ComponentLabel: "0"}, true)
	byName := mk("extra-name", map[string]string{v1beta2.AppWrapperLabel: name}, true)
	notOurs := mk("not-ours", map[string]string{v1beta2.AppWrapperLabel: name}, false)

	pods := h.waitRunning(name, 2)
	h.fail(pods[0].Name, 1, "rank 0 exited with code 1")
	aw = h.waitFor(name, "Running again after a reset", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
	})
	for _, j := range []*batchv1.Job{byUID, byName} {
		h.eventually("Job "+j.Name+" deleted by the reset", func() (bool, string) {
			got := &batchv1.Job{}
			err := env.Client.Get(h.ctx, client.ObjectKeyFromObject(j), got)
			if apierrors.IsNotFound(err) || (err == nil && got.UID != j.UID) {
				return true, ""
			}
			return false, fmt.Sprintf("get: %v, deletionTimestamp %v", err, got.DeletionTimestamp)
		})
	}
	got := &batchv1.Job{}
	if err := env.Client.Get(h.ctx, client.ObjectKeyFromObject(notOurs), got); err != nil || !got.DeletionTimestamp.IsZero() {
		t.Errorf("the Job the AppWrapper does not control: %v, deletionTimestamp %v; want it left alone", err, got.DeletionTimestamp)
	}
	if jobs := h.ownedJobs(aw); len(jobs) != 1 || jobs[0].Name != name {
		t.Errorf("owned Jobs after the reset %v, want [%s]", jobNames(jobs), name)
	}
}

// TestRefusedCreateBacksOff: a creation the API server refuses (a full
// ResourceQuota; Pod Security) is retried at resuming's interval (1 s),
// never in a loop driven by the controller's own status writes. The bound
// is on the count of Create calls over the time observed, not on time.
func TestRefusedCreateBacksOff(t *testing.T) {
	privileged := func(t *testing.T) runtime.RawExtension {
		return rawObject(t, &corev1.Pod{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
			ObjectMeta: metav1.ObjectMeta{Name: "bare"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{
				Name: "main", Image: "registry.example/trainer:1",
				SecurityContext: &corev1.SecurityContext{Privileged: ptr(true)},
			}}},
		})
	}
	for _, tc := range []struct {
		name     string
		refuse   func(h *harness)
		template func(t *testing.T) runtime.RawExtension
		detail   string
	}{
		{
			name: "ResourceQuota full",
			refuse: func(h *harness) {
				quota := &corev1.ResourceQuota{
					ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "no-jobs"},
					Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}},
				}
				if err := h.c.Create(h.ctx, quota); err != nil {
					h.t.Fatal(err)
				}
				// No quota controller runs here: the usage is written by hand.
				quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}}
				if err := h.c.Status().Update(h.ctx, quota); err != nil {
					h.t.Fatal(err)
				}
			},
			template: func(t *testing.T) runtime.RawExtension { return jobTemplate(t, "refused", 1, nil) },
			detail:   "exceeded quota",
		},
		{
			name: "Pod Security restricted",
			refuse: func(h *harness) {
				ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}
				patch := []byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted"}}}`)
				if err := h.c.Patch(h.ctx, ns, client.RawPatch(types.MergePatchType, patch)); err != nil {
					h.t.Fatal(err)
				}
			},
			template: privileged,
			detail:   "violates PodSecurity",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var attempts []time.Time
			var lastErr error
			h := newHarnessWith(t, 1, nil, func(r *appwrapper.Reconciler) {
				r.SetTestHooks(appwrapper.TestHooks{AfterCreate: func(_ client.Object, err error) {
					mu.Lock()
					attempts = append(attempts, time.Now())
					lastErr = err
					mu.Unlock()
				}})
			})
			tc.refuse(h)
			const name = "refused"
			hist := h.watch(name)
			h.create(appWrapper(name, ann(v1beta2.AdmissionGracePeriodDurationAnnotation, "10m"), tc.template(t)))
			h.waitFor(name, "the creation refused", func(aw *v1beta2.AppWrapper) bool {
				return len(aw.Status.ComponentStatus) == 1 &&
					cond2(aw.Status.ComponentStatus[0].Conditions).Reason == appwrapper.ReasonComponentCreationErrored
			})
			// Observe a few seconds of retries.
			const observe = 5 * time.Second
			time.Sleep(observe)
			mu.Lock()
			n, first, last, err := len(attempts), attempts[0], attempts[len(attempts)-1], lastErr
			mu.Unlock()
			if err == nil || !apierrors.IsForbidden(err) {
				t.Fatalf("last Create: %v, want Forbidden (%s)", err, tc.detail)
			}
			// One attempt per second at most, plus the first and one
			// for a pass queued by another event (a hot loop makes
			// hundreds).
			span := last.Sub(first)
			if limit := int(span/time.Second) + 3; n > limit {
				t.Errorf("%d Create attempts in %v, want at most %d (one a second)", n, span.Round(time.Millisecond), limit)
			}
			if n < 2 {
				t.Errorf("%d Create attempts in %v: not retried", n, observe)
			}
			// The status writes: about two per attempt, not a loop.
			writes := len(hist.all())
			if writes > 2*n+8 {
				t.Errorf("%d AppWrapper versions for %d attempts: the status writes loop", writes, n)
			}
			aw := h.get(name)
			if aw.Status.Phase != v1beta2.AppWrapperResuming {
				t.Errorf("phase %s while the refusal is retried, want Resuming", aw.Status.Phase)
			}
			t.Logf("%d Create attempts in %v, %d AppWrapper versions; last error: %v", n, span.Round(time.Millisecond), writes, err)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestNoWatchOfUnwatchableKind: the controller, run as a user whose
// ClusterRole lets it create, list and delete ConfigMaps but not watch
// them, creates a wrapped ConfigMap and runs the workload, but starts no
// ConfigMap watch (whose informer would retry the refused watch for as
// long as the process runs); the Job, which it may watch, is watched.
func TestNoWatchOfUnwatchableKind(t *testing.T) {
	needEnv(t)
	ctx := context.Background()
	ns := env.Namespace(t)
	user := "limited-" + ns
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{v1beta2.GroupVersion.Group}, Resources: []string{"appwrappers"}, Verbs: []string{"get", "list", "watch", "update", "patch"}},
		{APIGroups: []string{v1beta2.GroupVersion.Group}, Resources: []string{"appwrappers/status"}, Verbs: []string{"get", "update", "patch"}},
		{APIGroups: []string{v1beta2.GroupVersion.Group}, Resources: []string{"appwrappers/finalizers"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"get", "list", "watch", "create", "delete"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "create", "delete"}},
	}}
	bind := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	for _, o := range []client.Object{role, bind} {
		if err := env.Client.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), bind)
		_ = env.Client.Delete(context.Background(), role)
	})
	kc, err := env.KubeconfigAs(t.TempDir(), user, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	var r *appwrapper.Reconciler
	h := newHarnessAs(t, ns, rc, 1, nil, func(rr *appwrapper.Reconciler) { r = rr })
	const name = "cm"
	cm := rawObject(t, &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: "cm-config"}, Data: map[string]string{"k": "v"}})
	h.create(appWrapper(name, nil, jobTemplate(t, name, 1, nil), cm))
	h.waitFor(name, "Running with its pod ready", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
	})
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm-config"}, &corev1.ConfigMap{}); err != nil {
		t.Fatalf("the wrapped ConfigMap: %v", err)
	}
	if r.Watches(corev1.SchemeGroupVersion.WithKind("ConfigMap")) {
		t.Errorf("the controller watches ConfigMaps, which it may not watch")
	}
	if !r.Watches(batchv1.SchemeGroupVersion.WithKind("Job")) {
		t.Errorf("the controller does not watch Jobs")
	}
	// Deleting the AppWrapper deletes both without the watch.
	if err := env.Client.Delete(ctx, &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}); err != nil {
		t.Fatal(err)
	}
	h.eventually("the AppWrapper and the ConfigMap gone", func() (bool, string) {
		errA := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &v1beta2.AppWrapper{})
		errC := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "cm-config"}, &corev1.ConfigMap{})
		return apierrors.IsNotFound(errA) && apierrors.IsNotFound(errC), fmt.Sprintf("AppWrapper: %v; ConfigMap: %v", errA, errC)
	})
}
