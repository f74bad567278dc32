// Package envtests tests the AppWrapper reconciler and admission webhook of
// k8s/appwrapper against a real kube-apiserver, etcd and
// kube-controller-manager (k8stest). They live apart from the package so
// that its pure tests (the decisions: assess, params, pod sets, summaries,
// injection) run on any machine; TestMain here fails the run without the
// control-plane binaries unless FTL_K8S_TESTS=skip.
package envtests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The tests of this package run the reconciler in a real controller-runtime
// manager (mgr.Start, one per test, watching only the test's namespace)
// against a real kube-apiserver and etcd. The Job controller and the
// garbage collector are a real kube-controller-manager; pods are bound and
// run by the k8stest stand-in kubelet, since no container runtime exists
// here. Nothing calls Reconcile by hand.

var env *k8stest.Env

func TestMain(m *testing.M) {
	// Each manager gets its own logger; this silences the global one.
	ctrllog.SetLogger(logr.Discard())
	// With FTL_K8S_TESTS=skip and no binaries, the package's API-server-free
	// tests still run; the others end in needEnv.
	k8stest.Main(m, &env)
}

// needEnv ends a test that needs the control plane when there is none: a
// skip, or a failure under CI.
func needEnv(t *testing.T) {
	t.Helper()
	k8stest.Need(t, env)
}

// waitTimeout bounds every wait: generous, since the tests assert what
// happens, never how fast.
const waitTimeout = 2 * time.Minute

// harness is one test's namespace, controller and stand-in kubelet.
type harness struct {
	t       *testing.T
	ns      string
	ctx     context.Context
	c       client.Client
	r       *appwrapper.Reconciler
	kubelet *k8stest.Kubelet
	nodes   []string
}

// testLog forwards the manager's log to t.Log until the test ends.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) write(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(prefix, args)
	}
}

// newHarness starts a manager running the reconciler with DefaultConfig
// changed by mutate, and a stand-in kubelet serving nodes named
// <namespace>-n0 ... (cluster-scoped, so unique per test).
func newHarness(t *testing.T, nodes int, mutate func(*appwrapper.Config)) *harness {
	t.Helper()
	return newHarnessWith(t, nodes, mutate, nil)
}

// newHarnessWith is newHarness with setup called on the reconciler before
// its watches are registered.
func newHarnessWith(t *testing.T, nodes int, mutate func(*appwrapper.Config), setup func(*appwrapper.Reconciler)) *harness {
	t.Helper()
	needEnv(t)
	return newHarnessAs(t, env.Namespace(t), nil, nodes, mutate, setup)
}

// newHarnessAs is newHarnessWith in namespace ns with the manager talking
// to the API server as rc (nil: env.Config, a cluster admin).
func newHarnessAs(t *testing.T, ns string, rc *rest.Config, nodes int, mutate func(*appwrapper.Config), setup func(*appwrapper.Reconciler)) *harness {
	t.Helper()
	needEnv(t)
	t.Parallel()
	if rc == nil {
		rc = env.Config
	}
	h := &harness{t: t, ns: ns, ctx: context.Background(), c: env.Client}
	for i := range nodes {
		h.nodes = append(h.nodes, fmt.Sprintf("%s-n%d", ns, i))
	}
	cfg := appwrapper.DefaultConfig()
	if mutate != nil {
		mutate(&cfg)
	}

	tl := &testLog{t: t}
	copts := cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}}
	appwrapper.ConfigureCache(&copts)
	skip := true
	mgr, err := ctrl.NewManager(rc, ctrl.Options{
		Scheme:                 env.Scheme,
		Cache:                  copts,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// One controller per test in one process.
		Controller: config.Controller{SkipNameValidation: &skip},
		Logger:     funcr.New(tl.write, funcr.Options{Verbosity: 0}),
	})
	if err != nil {
		t.Fatalf("manager: %v", err)
	}
	if h.r, err = appwrapper.NewReconciler(mgr, cfg); err != nil {
		t.Fatalf("reconciler: %v", err)
	}
	if setup != nil {
		setup(h.r)
	}
	if err := h.r.SetupWithManager(mgr); err != nil {
		t.Fatalf("setup: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("manager: %v", err)
		}
		tl.mu.Lock()
		tl.done = true
		tl.mu.Unlock()
		for _, n := range h.nodes {
			_ = env.Client.Delete(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}})
		}
	})
	if nodes > 0 {
		h.kubelet = env.NewKubelet(t, ns, h.nodes...)
	}
	return h
}

// ---- building AppWrappers ----

// jobTemplate is a batch/v1 Job component of pods identical pods.
func jobTemplate(t *testing.T, name string, pods int32, mod func(*batchv1.Job)) runtime.RawExtension {
	t.Helper()
	backoff := int32(6)
	job := &batchv1.Job{
		TypeMeta:   metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			Parallelism:  &pods,
			Completions:  &pods,
			BackoffLimit: &backoff,
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "main", Image: "registry.example/trainer:1"}},
			}},
		},
	}
	if mod != nil {
		mod(job)
	}
	return rawObject(t, job)
}

// rawObject encodes obj as a component template, without the empty status
// and creation time a typed object carries.
func rawObject(t *testing.T, obj runtime.Object) runtime.RawExtension {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	delete(m, "status")
	if md, ok := m["metadata"].(map[string]any); ok {
		delete(md, "creationTimestamp")
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return runtime.RawExtension{Raw: b}
}

func appWrapper(name string, ann map[string]string, templates ...runtime.RawExtension) *v1beta2.AppWrapper {
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann}}
	for _, tpl := range templates {
		aw.Spec.Components = append(aw.Spec.Components, v1beta2.AppWrapperComponent{Template: tpl})
	}
	return aw
}

// loadAppWrapper reads an AppWrapper from a YAML file, unchanged.
func loadAppWrapper(t *testing.T, path string) *v1beta2.AppWrapper {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	aw := &v1beta2.AppWrapper{}
	if err := yaml.UnmarshalStrict(b, aw); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return aw
}

// ---- acting ----

func (h *harness) create(aw *v1beta2.AppWrapper) {
	h.t.Helper()
	aw.Namespace = h.ns
	if err := h.c.Create(h.ctx, aw); err != nil {
		h.t.Fatalf("create AppWrapper %s: %v", aw.Name, err)
	}
}

func (h *harness) patchSuspend(name string, suspend bool) {
	h.t.Helper()
	aw := &v1beta2.AppWrapper{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}
	patch := fmt.Appendf(nil, `{"spec":{"suspend":%t}}`, suspend)
	if err := h.c.Patch(h.ctx, aw, client.RawPatch(types.MergePatchType, patch)); err != nil {
		h.t.Fatalf("suspend=%t on %s: %v", suspend, name, err)
	}
}

func (h *harness) fail(pod string, code int32, msg string) {
	h.t.Helper()
	if err := h.kubelet.Fail(h.ctx, pod, code, msg); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) succeed(pod string) {
	h.t.Helper()
	if err := h.kubelet.Succeed(h.ctx, pod); err != nil {
		h.t.Fatal(err)
	}
}

// ---- observing ----

func (h *harness) get(name string) *v1beta2.AppWrapper {
	h.t.Helper()
	aw := &v1beta2.AppWrapper{}
	if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, aw); err != nil {
		h.t.Fatalf("get AppWrapper %s: %v", name, err)
	}
	return aw
}

// eventually polls f until it is true, failing the test with f's last
// detail after waitTimeout.
func (h *harness) eventually(what string, f func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		ok, detail := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %v waiting for %s; last seen: %s", waitTimeout, what, detail)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func describe(aw *v1beta2.AppWrapper) string {
	var cs []string
	for _, c := range aw.Status.Conditions {
		cs = append(cs, fmt.Sprintf("%s=%s/%s", c.Type, c.Status, c.Reason))
	}
	return fmt.Sprintf("phase=%q retries=%d %s", aw.Status.Phase, aw.Status.Retries, strings.Join(cs, " "))
}

func (h *harness) waitPhase(name string, phase v1beta2.AppWrapperPhase) *v1beta2.AppWrapper {
	h.t.Helper()
	var aw *v1beta2.AppWrapper
	h.eventually(fmt.Sprintf("AppWrapper %s in phase %s", name, phase), func() (bool, string) {
		aw = h.get(name)
		return aw.Status.Phase == phase, describe(aw)
	})
	return aw
}

// waitFor waits until the AppWrapper satisfies ok.
func (h *harness) waitFor(name, what string, ok func(*v1beta2.AppWrapper) bool) *v1beta2.AppWrapper {
	h.t.Helper()
	var aw *v1beta2.AppWrapper
	h.eventually(fmt.Sprintf("AppWrapper %s: %s", name, what), func() (bool, string) {
		aw = h.get(name)
		return ok(aw), describe(aw)
	})
	return aw
}

func cond(aw *v1beta2.AppWrapper, t v1beta2.AppWrapperCondition) metav1.Condition {
	if c := meta.FindStatusCondition(aw.Status.Conditions, string(t)); c != nil {
		return *c
	}
	return metav1.Condition{Type: string(t), Status: "absent"}
}

// expectCond checks a condition's status and reason.
func (h *harness) expectCond(aw *v1beta2.AppWrapper, t v1beta2.AppWrapperCondition, status metav1.ConditionStatus, reason string) {
	h.t.Helper()
	c := cond(aw, t)
	if c.Status != status || c.Reason != reason {
		h.t.Errorf("AppWrapper %s: condition %s = %s/%s, want %s/%s (%s)", aw.Name, t, c.Status, c.Reason, status, reason, describe(aw))
	}
}

// pods lists the AppWrapper's pods (uncached).
func (h *harness) pods(name string) []corev1.Pod {
	h.t.Helper()
	var l corev1.PodList
	if err := h.c.List(h.ctx, &l, client.InNamespace(h.ns), client.MatchingLabels{v1beta2.AppWrapperLabel: name}); err != nil {
		h.t.Fatalf("list pods: %v", err)
	}
	slices.SortFunc(l.Items, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return l.Items
}

func runningPods(pods []corev1.Pod) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range pods {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && p.Spec.NodeName != "" {
			out = append(out, p)
		}
	}
	return out
}

// waitRunning waits for n running pods of the AppWrapper and returns them.
func (h *harness) waitRunning(name string, n int) []corev1.Pod {
	h.t.Helper()
	var run []corev1.Pod
	h.eventually(fmt.Sprintf("%d running pods of %s", n, name), func() (bool, string) {
		all := h.pods(name)
		run = runningPods(all)
		return len(run) == n && len(all) == n, fmt.Sprintf("%d pods, %d running", len(all), len(run))
	})
	return run
}

func (h *harness) jobExists(name string) bool {
	h.t.Helper()
	err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &batchv1.Job{})
	if err != nil && !apierrors.IsNotFound(err) {
		h.t.Fatalf("get job %s: %v", name, err)
	}
	return err == nil
}

func (h *harness) job(name string) *batchv1.Job {
	h.t.Helper()
	j := &batchv1.Job{}
	if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, j); err != nil {
		h.t.Fatalf("get job %s: %v", name, err)
	}
	return j
}

// events lists the Events about the AppWrapper.
func (h *harness) events(name string) []eventsv1.Event {
	h.t.Helper()
	var l eventsv1.EventList
	if err := h.c.List(h.ctx, &l, client.InNamespace(h.ns)); err != nil {
		h.t.Fatalf("list events: %v", err)
	}
	var out []eventsv1.Event
	for _, e := range l.Items {
		if e.Regarding.Kind == "AppWrapper" && e.Regarding.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitEvent waits for an Event of type typ and reason whose note contains
// every one of parts.
func (h *harness) waitEvent(name, typ, reason string, parts ...string) eventsv1.Event {
	h.t.Helper()
	var found eventsv1.Event
	h.eventually(fmt.Sprintf("%s Event %s on %s containing %q", typ, reason, name, parts), func() (bool, string) {
		var seen []string
		for _, e := range h.events(name) {
			seen = append(seen, e.Type+"/"+e.Reason+": "+e.Note)
			if e.Type != typ || e.Reason != reason {
				continue
			}
			all := true
			for _, p := range parts {
				all = all && strings.Contains(e.Note, p)
			}
			if all {
				found = e
				return true, ""
			}
		}
		return false, strings.Join(seen, " | ")
	})
	return found
}

// phaseCount reads the phase counter of this test's namespace from
// controller-runtime's registry, where NewReconciler registers it.
func (h *harness) phaseCount(phase v1beta2.AppWrapperPhase) float64 {
	h.t.Helper()
	mfs, err := ctrlmetrics.Registry.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "appwrapper_phase_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["namespace"] == h.ns && labels["phase"] == string(phase) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// history watches one AppWrapper and keeps every version the API server
// reports, in order, calling each hook on each; start it before creating
// the AppWrapper.
type history struct {
	mu       sync.Mutex
	versions []*v1beta2.AppWrapper
}

func (h *harness) watch(name string, hooks ...func(*v1beta2.AppWrapper)) *history {
	h.t.Helper()
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Scheme})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	w, err := wc.Watch(ctx, &v1beta2.AppWrapperList{}, client.InNamespace(h.ns), client.MatchingFields{"metadata.name": name})
	if err != nil {
		cancel()
		h.t.Fatalf("watch AppWrapper %s: %v", name, err)
	}
	hist := &history{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Added && ev.Type != watch.Modified {
				continue
			}
			aw, ok := ev.Object.(*v1beta2.AppWrapper)
			if !ok {
				continue
			}
			hist.mu.Lock()
			hist.versions = append(hist.versions, aw.DeepCopy())
			hist.mu.Unlock()
			for _, f := range hooks {
				f(aw)
			}
		}
	}()
	h.t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return hist
}

// phases is the sequence of phases seen, consecutive repeats folded.
func (hi *history) phases() []v1beta2.AppWrapperPhase {
	hi.mu.Lock()
	defer hi.mu.Unlock()
	var out []v1beta2.AppWrapperPhase
	for _, v := range hi.versions {
		if len(out) == 0 || out[len(out)-1] != v.Status.Phase {
			out = append(out, v.Status.Phase)
		}
	}
	return out
}

// expectPhases waits until the watch has delivered the phase sequence want
// (a GET can be ahead of the watch), failing with what it saw.
func (h *harness) expectPhases(hist *history, want ...v1beta2.AppWrapperPhase) {
	h.t.Helper()
	h.eventually(fmt.Sprintf("phases %v", want), func() (bool, string) {
		got := hist.phases()
		return slices.Equal(got, want), fmt.Sprint(got)
	})
}

// phasesThrough waits until the watch has delivered phase p and returns the
// sequence up to then.
func (h *harness) phasesThrough(hist *history, p v1beta2.AppWrapperPhase) []v1beta2.AppWrapperPhase {
	h.t.Helper()
	var got []v1beta2.AppWrapperPhase
	h.eventually(fmt.Sprintf("phase %s in the watch", p), func() (bool, string) {
		got = hist.phases()
		return slices.Contains(got, p), fmt.Sprint(got)
	})
	return got
}

// all returns the versions seen so far.
func (hi *history) all() []*v1beta2.AppWrapper {
	hi.mu.Lock()
	defer hi.mu.Unlock()
	return slices.Clone(hi.versions)
}

// verdictMessage is the termination message ft-launcher writes for v.
func verdictMessage(t *testing.T, v verdict.Verdict) string {
	t.Helper()
	b, err := verdict.Compact(v, verdict.TerminationMessageLimit)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func uids(pods []corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, p := range pods {
		out[string(p.UID)] = true
	}
	return out
}
