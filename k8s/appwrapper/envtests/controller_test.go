package envtests

// This file is long on purpose: it is the AppWrapper controller's scenario
// list against one envtest API server (resets, retry limit, grace periods,
// forced deletion, autopilot, suspension), each scenario a short test
// over the same helpers; read together they are the controller's
// behaviour as users see it, in the order of docs/kubernetes.md.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Every test below runs the reconciler in a real manager against a real
// API server (see harness_test.go): pods are run by the k8stest stand-in
// kubelet (no container runtime here), while the Job controller and the
// garbage collector are the real kube-controller-manager.

const (
	True  = metav1.ConditionTrue
	False = metav1.ConditionFalse
)

func ann(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// TestResetOnFailedPods: a failed pod, FailureGracePeriod from Unhealthy's
// transition, Resetting (quota kept, ResourcesDeployed True until every
// component and labelled pod is gone), RetryPausePeriod, Resuming, Running
// with new pods, one retry spent; every step an Event, every transition
// counted. Also shows failure detection is event-driven: after PodsReady
// the controller asks for no requeue, so only the pod watch can notice the
// failure within the wait.
func TestResetOnFailedPods(t *testing.T) {
	h := newHarness(t, 2, nil)
	const name = "train"

	var mu sync.Mutex
	old := map[string]bool{} // UIDs of the first incarnation's pods and Job
	var sawDeployedFalse bool
	var violations []string
	hist := h.watch(name, func(aw *v1beta2.AppWrapper) {
		if p := aw.Status.Phase; (p == v1beta2.AppWrapperResetting || p == v1beta2.AppWrapperResuming) && cond(aw, v1beta2.QuotaReserved).Status != True {
			mu.Lock()
			violations = append(violations, "quota released during the reset: "+describe(aw))
			mu.Unlock()
		}
		if aw.Status.Phase != v1beta2.AppWrapperResetting || cond(aw, v1beta2.ResourcesDeployed).Status != False {
			return
		}
		// ResourcesDeployed just went False: nothing of the first
		// incarnation may exist any more (it never comes back, so a read
		// after the event is as good as one at it).
		var pods corev1.PodList
		var jobs batchv1.JobList
		errP := env.Client.List(context.Background(), &pods, client.InNamespace(h.ns))
		errJ := env.Client.List(context.Background(), &jobs, client.InNamespace(h.ns))
		mu.Lock()
		defer mu.Unlock()
		sawDeployedFalse = true
		if errP != nil || errJ != nil {
			violations = append(violations, fmt.Sprintf("list: %v %v", errP, errJ))
			return
		}
		for _, p := range pods.Items {
			if old[string(p.UID)] {
				violations = append(violations, "pod "+p.Name+" still exists with ResourcesDeployed False")
			}
		}
		for _, j := range jobs.Items {
			if old[string(j.UID)] {
				violations = append(violations, "job "+j.Name+" still exists with ResourcesDeployed False")
			}
		}
	})

	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "2s",
		// Both periods run from Unhealthy's transition: a pause longer
		// than the grace leaves ResourcesDeployed False for a while.
		v1beta2.RetryPausePeriodDurationAnnotation, "5s",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 2, nil)))

	aw := h.waitFor(name, "PodsReady", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
	})
	h.expectCond(aw, v1beta2.QuotaReserved, True, appwrapper.ReasonResuming)
	h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonResuming)
	h.expectCond(aw, v1beta2.Unhealthy, False, appwrapper.ReasonFoundNoFailedPods)
	h.expectCond(aw, v1beta2.PodsReady, True, appwrapper.ReasonSufficientPodsReady)
	if len(aw.Finalizers) != 1 || aw.Finalizers[0] != v1beta2.Finalizer {
		t.Errorf("finalizers = %v, want [%s]", aw.Finalizers, v1beta2.Finalizer)
	}
	if n := len(aw.Status.ComponentStatus); n != 1 || aw.Status.ComponentStatus[0].Name != name ||
		cond2(aw.Status.ComponentStatus[0].Conditions).Reason != appwrapper.ReasonComponentCreatedSuccessfully {
		t.Errorf("componentStatus = %+v", aw.Status.ComponentStatus)
	}
	first := h.waitRunning(name, 2)
	mu.Lock()
	for u := range uids(first) {
		old[u] = true
	}
	old[string(h.job(name).UID)] = true
	mu.Unlock()

	h.fail(first[0].Name, 1, "rank 0 exited with code 1")
	aw = h.waitFor(name, "a reset spent and the workload ready again", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
	})
	second := h.waitRunning(name, 2)
	for _, p := range second {
		if old[string(p.UID)] {
			t.Errorf("pod %s survived the reset", p.Name)
		}
	}
	if old[string(h.job(name).UID)] {
		t.Errorf("the Job was not recreated")
	}
	h.expectCond(aw, v1beta2.QuotaReserved, True, appwrapper.ReasonResuming)
	h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonResuming)
	h.expectCond(aw, v1beta2.Unhealthy, False, appwrapper.ReasonFoundNoFailedPods)
	h.expectCond(aw, v1beta2.DeletingResources, False, appwrapper.ReasonDeletionComplete)
	if c := cond(aw, v1beta2.ResourcesDeployed); c.Message != "Reset complete; resuming" {
		t.Errorf("ResourcesDeployed message %q", c.Message)
	}

	h.expectPhases(hist, "", v1beta2.AppWrapperSuspended, v1beta2.AppWrapperResuming, v1beta2.AppWrapperRunning,
		v1beta2.AppWrapperResetting, v1beta2.AppWrapperResuming, v1beta2.AppWrapperRunning)
	// Each creation was recorded as initiated before it was recorded done.
	var created []string
	for _, v := range hist.all() {
		if len(v.Status.ComponentStatus) == 1 {
			if r := cond2(v.Status.ComponentStatus[0].Conditions).Reason; r != "" && (len(created) == 0 || created[len(created)-1] != r) {
				created = append(created, r)
			}
		}
	}
	if !slices.Equal(created[:min(len(created), 2)], []string{appwrapper.ReasonComponentCreationInitiated, appwrapper.ReasonComponentCreatedSuccessfully}) {
		t.Errorf("component condition reasons in order: %v", created)
	}
	// The failure was seen as FoundFailedPods and waited for: the reset
	// came no earlier than FailureGracePeriod after Unhealthy's transition.
	var unhealthy metav1.Condition
	for _, v := range hist.all() {
		if c := cond(v, v1beta2.Unhealthy); c.Status == True && c.Reason == appwrapper.ReasonFoundFailedPods {
			unhealthy = c
			break
		}
	}
	if unhealthy.Status != True {
		t.Errorf("never saw Unhealthy True/FoundFailedPods")
	}
	ev := h.waitEvent(name, corev1.EventTypeWarning, "Resetting", "attempt 1 of 3", "FoundFailedPods: 1 failed pods")
	if at := ev.EventTime.Time; at.Before(unhealthy.LastTransitionTime.Add(2 * time.Second)) {
		t.Errorf("reset at %v, before Unhealthy's transition %v + 2s", at, unhealthy.LastTransitionTime)
	}
	h.waitEvent(name, corev1.EventTypeNormal, appwrapper.ReasonUnhealthy, appwrapper.ReasonFoundFailedPods)
	// RetryPausePeriod also runs from Unhealthy's transition.
	ev = h.waitEvent(name, corev1.EventTypeNormal, "Resuming", "Resetting -> Resuming", "retries used 1 of 3")
	if n := strings.Count(ev.Note, "retries used"); n != 1 {
		t.Errorf("Resuming note %q says the retries used %d times, want once", ev.Note, n)
	}
	if at := ev.EventTime.Time; at.Before(unhealthy.LastTransitionTime.Add(5 * time.Second)) {
		t.Errorf("resumed at %v, before Unhealthy's transition %v + 5s", at, unhealthy.LastTransitionTime)
	}
	for _, p := range []v1beta2.AppWrapperPhase{v1beta2.AppWrapperSuspended, v1beta2.AppWrapperResuming, v1beta2.AppWrapperRunning} {
		h.waitEvent(name, corev1.EventTypeNormal, string(p), "->")
	}

	mu.Lock()
	if !sawDeployedFalse {
		t.Errorf("never saw ResourcesDeployed False during the reset")
	}
	for _, v := range violations {
		t.Error(v)
	}
	mu.Unlock()
	if got := h.phaseCount(v1beta2.AppWrapperResetting); got != 1 {
		t.Errorf("phase counter Resetting = %v, want 1", got)
	}
	if got := h.phaseCount(v1beta2.AppWrapperRunning); got != 2 {
		t.Errorf("phase counter Running = %v, want 2", got)
	}
}

func cond2(cs []metav1.Condition) metav1.Condition {
	for _, c := range cs {
		if c.Type == string(v1beta2.ResourcesDeployed) {
			return c
		}
	}
	return metav1.Condition{}
}

// TestResetOnInsufficientPods: too few pods when the grace period ends
// resets at once (no FailureGracePeriod), and with retryLimit 1 the second
// time fails. Admission grace applies while pods are missing (a suspended
// Job creates none); Warmup grace once they all exist but do not run (the
// stand-in kubelet is paused). The other grace is set to 10 minutes, so a
// reset within the wait shows which one was used.
func TestResetOnInsufficientPods(t *testing.T) {
	for _, tc := range []struct {
		name              string
		admission, warmup string
		suspendJob, pause bool
		detail            string
	}{
		{name: "admission", admission: "1s", warmup: "10m", suspendJob: true, detail: "0 pods pending; 0 pods running"},
		{name: "warmup", admission: "10m", warmup: "1s", pause: true, detail: "2 pods pending; 0 pods running"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			if tc.pause {
				h.kubelet.Pause()
			}
			const name = "slow"
			hist := h.watch(name)
			h.create(appWrapper(name, ann(
				v1beta2.AdmissionGracePeriodDurationAnnotation, tc.admission,
				v1beta2.WarmupGracePeriodDurationAnnotation, tc.warmup,
				v1beta2.RetryPausePeriodDurationAnnotation, "0s",
				v1beta2.RetryLimitAnnotation, "1",
			), jobTemplate(t, name, 2, func(j *batchv1.Job) { j.Spec.Suspend = &tc.suspendJob })))

			aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
			if aw.Status.Retries != 1 {
				t.Errorf("retries %d, want 1", aw.Status.Retries)
			}
			h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonInsufficientPodsReady)
			if c := cond(aw, v1beta2.Unhealthy); !strings.Contains(c.Message, tc.detail) {
				t.Errorf("Unhealthy message %q, want %q", c.Message, tc.detail)
			}
			h.expectPhases(hist, "", v1beta2.AppWrapperSuspended, v1beta2.AppWrapperResuming, v1beta2.AppWrapperRunning,
				v1beta2.AppWrapperResetting, v1beta2.AppWrapperResuming, v1beta2.AppWrapperRunning, v1beta2.AppWrapperFailed)
			h.waitEvent(name, corev1.EventTypeWarning, "Resetting", "attempt 1 of 1", appwrapper.ReasonInsufficientPodsReady)
			h.waitEvent(name, corev1.EventTypeWarning, "Failed", "retry limit reached (1 of 1 used)")
			aw = h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
				return cond(aw, v1beta2.ResourcesDeployed).Status == False
			})
			h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonFailed)
			h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonFailed)
			if h.jobExists(name) || len(h.pods(name)) != 0 {
				t.Errorf("resources left after ResourcesDeployed False")
			}
		})
	}
}

// TestExternallyDeletedComponentFails: a component deleted by someone else
// fails the AppWrapper at once, whatever retries are left.
func TestExternallyDeletedComponentFails(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "lost"
	hist := h.watch(name)
	h.create(appWrapper(name, ann(v1beta2.RetryLimitAnnotation, "3"), jobTemplate(t, name, 1, nil)))
	h.waitFor(name, "PodsReady", func(aw *v1beta2.AppWrapper) bool { return cond(aw, v1beta2.PodsReady).Status == True })

	if err := h.c.Delete(h.ctx, h.job(name), client.PropagationPolicy(metav1.DeletePropagationBackground)); err != nil {
		t.Fatal(err)
	}
	aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
	h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonMissingComponent)
	if aw.Status.Retries != 0 {
		t.Errorf("retries %d, want 0", aw.Status.Retries)
	}
	if ph := h.phasesThrough(hist, v1beta2.AppWrapperFailed); slices.Contains(ph, v1beta2.AppWrapperResetting) {
		t.Errorf("reset before failing: %v", ph)
	}
	aw = h.waitFor(name, "quota released", func(aw *v1beta2.AppWrapper) bool {
		return cond(aw, v1beta2.QuotaReserved).Status == False && cond(aw, v1beta2.ResourcesDeployed).Status == False
	})
	h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonFailed)
	if got := cond2(aw.Status.ComponentStatus[0].Conditions); got.Status != False || got.Reason != appwrapper.ReasonComponentDeleted {
		t.Errorf("component condition %s/%s, want False/%s", got.Status, got.Reason, appwrapper.ReasonComponentDeleted)
	}
}

// TestRetryLimitExhausted: each reset spends a retry and says which
// attempt it is; once they are spent the next failure fails the AppWrapper,
// and its resources are deleted (quota released).
func TestRetryLimitExhausted(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "flaky"
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "0s",
		v1beta2.RetryPausePeriodDurationAnnotation, "0s",
		v1beta2.RetryLimitAnnotation, "2",
	), jobTemplate(t, name, 1, nil)))

	for retries := int32(1); retries <= 2; retries++ {
		pods := h.waitRunning(name, 1)
		h.fail(pods[0].Name, 1, "")
		h.waitFor(name, fmt.Sprintf("running again after reset %d", retries), func(aw *v1beta2.AppWrapper) bool {
			return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == retries && cond(aw, v1beta2.PodsReady).Status == True
		})
		h.waitEvent(name, corev1.EventTypeWarning, "Resetting", fmt.Sprintf("attempt %d of 2", retries), appwrapper.ReasonFoundFailedPods)
	}
	pods := h.waitRunning(name, 1)
	h.fail(pods[0].Name, 1, "")
	aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
	if aw.Status.Retries != 2 {
		t.Errorf("retries %d, want 2", aw.Status.Retries)
	}
	h.waitEvent(name, corev1.EventTypeWarning, "Failed", "retry limit reached (2 of 2 used)", appwrapper.ReasonFoundFailedPods)
	aw = h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
		return cond(aw, v1beta2.ResourcesDeployed).Status == False && cond(aw, v1beta2.QuotaReserved).Status == False
	})
	h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonFailed)
	h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonFailed)
	h.expectCond(aw, v1beta2.DeletingResources, False, appwrapper.ReasonDeletionComplete)
	if h.jobExists(name) || len(h.pods(name)) != 0 {
		t.Errorf("resources left: job %v, pods %d", h.jobExists(name), len(h.pods(name)))
	}
}

// TestTerminalExitCode: an exit code made terminal by the AppWrapper's
// annotations fails it after FailureGracePeriod without spending a retry.
func TestTerminalExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		ann  map[string]string
		code int32
	}{
		{"terminalExitCodes", ann(v1beta2.TerminalExitCodesAnnotation, "42, 43"), 42},
		{"not in retryableExitCodes", ann(v1beta2.RetryableExitCodesAnnotation, "1,2"), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			const name = "terminal"
			hist := h.watch(name)
			a := ann(v1beta2.FailureGracePeriodDurationAnnotation, "1s", v1beta2.RetryLimitAnnotation, "3")
			for k, v := range tc.ann {
				a[k] = v
			}
			h.create(appWrapper(name, a, jobTemplate(t, name, 1, nil)))
			pods := h.waitRunning(name, 1)
			h.fail(pods[0].Name, tc.code, "")
			aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
			if aw.Status.Retries != 0 {
				t.Errorf("retries %d, want 0", aw.Status.Retries)
			}
			if ph := h.phasesThrough(hist, v1beta2.AppWrapperFailed); slices.Contains(ph, v1beta2.AppWrapperResetting) {
				t.Errorf("reset: %v", ph)
			}
			h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonFoundFailedPods)
			h.waitEvent(name, corev1.EventTypeWarning, "Failed", "terminal failure", fmt.Sprintf("exit code %d is terminal", tc.code))
		})
	}
}

// TestForcedDeletionOfStuckPod: a pod that does not go away (a finalizer
// nobody removes) is deleted with grace 0 once ForcefulDeletionGracePeriod
// has passed since DeletingResources turned True, and ResourcesDeployed
// (the quota) stays True until it is really gone.
func TestForcedDeletionOfStuckPod(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "stuck"
	const hold = "test.ft-launcher.dev/hold"
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "0s",
		v1beta2.RetryLimitAnnotation, "0",
		v1beta2.ForcefulDeletionGracePeriodAnnotation, "2s",
	), jobTemplate(t, name, 2, nil)))
	pods := h.waitRunning(name, 2)
	stuck := pods[1]
	patch := fmt.Appendf(nil, `{"metadata":{"finalizers":[%q]}}`, hold)
	if err := h.c.Patch(h.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: stuck.Name}},
		client.RawPatch(types.StrategicMergePatchType, patch)); err != nil {
		t.Fatal(err)
	}
	release := func() {
		p := &corev1.Pod{}
		if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(&stuck), p); err != nil {
			return
		}
		p.Finalizers = slices.DeleteFunc(p.Finalizers, func(f string) bool { return f == hold })
		_ = h.c.Update(h.ctx, p)
	}
	t.Cleanup(release)

	h.fail(pods[0].Name, 1, "")
	h.waitPhase(name, v1beta2.AppWrapperFailed)
	var forced *corev1.Pod
	h.eventually("the stuck pod deleted with grace 0", func() (bool, string) {
		p := &corev1.Pod{}
		if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(&stuck), p); err != nil {
			return false, err.Error()
		}
		forced = p
		g := p.DeletionGracePeriodSeconds
		return g != nil && *g == 0, fmt.Sprintf("deletionTimestamp %v grace %v", p.DeletionTimestamp, g)
	})
	aw := h.get(name)
	h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonResuming)
	h.expectCond(aw, v1beta2.DeletingResources, True, appwrapper.ReasonDeletionInitiated)
	if dr := cond(aw, v1beta2.DeletingResources); forced.DeletionTimestamp.Before(&metav1.Time{Time: dr.LastTransitionTime.Add(2 * time.Second)}) {
		t.Errorf("forced at %v, before DeletingResources' transition %v + 2s", forced.DeletionTimestamp, dr.LastTransitionTime)
	}

	release()
	aw = h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
		return cond(aw, v1beta2.ResourcesDeployed).Status == False
	})
	h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonFailed)
	h.expectCond(aw, v1beta2.DeletingResources, False, appwrapper.ReasonDeletionComplete)
	if len(h.pods(name)) != 0 || h.jobExists(name) {
		t.Errorf("resources left after ResourcesDeployed False")
	}
}

// TestDeletionOnFailureGracePeriod: the resources of a failed AppWrapper
// are kept for the period, then deleted. The first row fails after an
// earlier reset: the hold still lasts the whole period from the failure
// (upstream measures it from the older DeletionComplete, its
// appwrapper_controller.go). The second row shows a suspension cutting it short.
func TestDeletionOnFailureGracePeriod(t *testing.T) {
	t.Run("held then deleted", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		const name = "debug"
		hist := h.watch(name)
		h.create(appWrapper(name, ann(
			v1beta2.FailureGracePeriodDurationAnnotation, "0s",
			v1beta2.RetryPausePeriodDurationAnnotation, "0s",
			v1beta2.RetryLimitAnnotation, "1",
			v1beta2.DeletionOnFailureGracePeriodAnnotation, "4s",
		), jobTemplate(t, name, 1, nil)))
		pods := h.waitRunning(name, 1)
		h.fail(pods[0].Name, 1, "")
		h.waitFor(name, "running after a reset", func(aw *v1beta2.AppWrapper) bool {
			return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
		})
		pods = h.waitRunning(name, 1)
		h.fail(pods[0].Name, 1, "")

		aw := h.waitFor(name, "deletion paused", func(aw *v1beta2.AppWrapper) bool {
			return aw.Status.Phase == v1beta2.AppWrapperFailed && cond(aw, v1beta2.DeletingResources).Reason == appwrapper.ReasonDeletionPaused
		})
		paused := cond(aw, v1beta2.DeletingResources)
		unhealthy := cond(aw, v1beta2.Unhealthy)
		if paused.LastTransitionTime.Before(&unhealthy.LastTransitionTime) {
			t.Errorf("hold started at %v, before the failure at %v", paused.LastTransitionTime, unhealthy.LastTransitionTime)
		}
		h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonResuming)
		h.expectCond(aw, v1beta2.QuotaReserved, True, appwrapper.ReasonResuming)
		if !h.jobExists(name) {
			t.Errorf("the Job is gone during the hold")
		}

		aw = h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
			return cond(aw, v1beta2.ResourcesDeployed).Status == False
		})
		h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonFailed)
		if h.jobExists(name) {
			t.Errorf("the Job is left")
		}
		// Deletion started no earlier than the hold's end.
		h.eventually("the deletion in the watch", func() (bool, string) {
			for _, v := range hist.all() {
				if v.Status.Phase == v1beta2.AppWrapperFailed && cond(v, v1beta2.ResourcesDeployed).Status == False {
					return true, ""
				}
			}
			return false, fmt.Sprint(hist.phases())
		})
		started := false
		for _, v := range hist.all() {
			if c := cond(v, v1beta2.DeletingResources); v.Status.Phase == v1beta2.AppWrapperFailed && c.Status == True {
				if c.LastTransitionTime.Before(&metav1.Time{Time: paused.LastTransitionTime.Add(4 * time.Second)}) {
					t.Errorf("deletion started at %v, hold began %v: shorter than 4s", c.LastTransitionTime, paused.LastTransitionTime)
				}
				started = true
				break
			}
		}
		if !started {
			t.Errorf("never saw DeletingResources True after the failure")
		}
	})
	t.Run("suspend cuts it short", func(t *testing.T) {
		h := newHarness(t, 1, nil)
		const name = "debug"
		h.create(appWrapper(name, ann(
			v1beta2.FailureGracePeriodDurationAnnotation, "0s",
			v1beta2.RetryLimitAnnotation, "0",
			v1beta2.DeletionOnFailureGracePeriodAnnotation, "1h",
		), jobTemplate(t, name, 1, nil)))
		pods := h.waitRunning(name, 1)
		h.fail(pods[0].Name, 1, "")
		h.waitFor(name, "deletion paused", func(aw *v1beta2.AppWrapper) bool {
			return aw.Status.Phase == v1beta2.AppWrapperFailed && cond(aw, v1beta2.DeletingResources).Reason == appwrapper.ReasonDeletionPaused
		})
		h.patchSuspend(name, true)
		aw := h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
			return cond(aw, v1beta2.ResourcesDeployed).Status == False
		})
		if c := cond(aw, v1beta2.ResourcesDeployed); c.Message != "Kueue forced resource deletion by suspending AppWrapper" {
			t.Errorf("ResourcesDeployed message %q", c.Message)
		}
		if aw.Status.Phase != v1beta2.AppWrapperFailed || h.jobExists(name) {
			t.Errorf("phase %s, job left %v", aw.Status.Phase, h.jobExists(name))
		}
	})
}

// TestSuccessTTL: the resources of a succeeded AppWrapper are deleted
// SuccessTTL after ResourcesDeployed's transition (deployment time,
// as upstream's code does; its docs say success time).
func TestSuccessTTL(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "done"
	h.create(appWrapper(name, ann(v1beta2.SuccessTTLAnnotation, "4s"), jobTemplate(t, name, 2, nil)))
	for _, p := range h.waitRunning(name, 2) {
		h.succeed(p.Name)
	}
	aw := h.waitPhase(name, v1beta2.AppWrapperSucceeded)
	h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonSucceeded)
	deployed := cond(aw, v1beta2.ResourcesDeployed)
	if deployed.Status == True {
		h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonSucceeded)
	}
	aw = h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
		return cond(aw, v1beta2.ResourcesDeployed).Status == False
	})
	h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonSucceeded)
	if c := cond(aw, v1beta2.ResourcesDeployed); c.LastTransitionTime.Before(&metav1.Time{Time: deployed.LastTransitionTime.Add(4 * time.Second)}) {
		t.Errorf("deleted at %v, deployed at %v: before the 4s TTL", c.LastTransitionTime, deployed.LastTransitionTime)
	}
	if h.jobExists(name) || len(h.pods(name)) != 0 {
		t.Errorf("resources left")
	}
	if aw.Status.Phase != v1beta2.AppWrapperSucceeded {
		t.Errorf("phase %s", aw.Status.Phase)
	}
}

// TestSuspendDuringReset: a suspension (Kueue preempting) wins over a reset
// in its pause: Suspending, then Suspended with the quota released and the
// retry count kept; resumed, the workload runs again with the same count.
func TestSuspendDuringReset(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "preempted"
	hist := h.watch(name)
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "0s",
		v1beta2.RetryPausePeriodDurationAnnotation, "1h",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 1, nil)))
	pods := h.waitRunning(name, 1)
	h.fail(pods[0].Name, 1, "")
	h.waitFor(name, "reset paused with everything deleted", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperResetting && cond(aw, v1beta2.ResourcesDeployed).Status == False
	})
	h.patchSuspend(name, true)
	aw := h.waitPhase(name, v1beta2.AppWrapperSuspended)
	if aw.Status.Retries != 1 {
		t.Errorf("retries %d, want 1", aw.Status.Retries)
	}
	h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonSuspended)
	h.expectCond(aw, v1beta2.PodsReady, False, appwrapper.ReasonSuspended)
	h.expectCond(aw, v1beta2.Unhealthy, False, appwrapper.ReasonSuspended)
	if cond(aw, v1beta2.ResourcesDeployed).Status != False {
		t.Errorf("ResourcesDeployed %s while suspended", cond(aw, v1beta2.ResourcesDeployed).Status)
	}
	if ph := h.phasesThrough(hist, v1beta2.AppWrapperSuspended); !slices.Contains(ph, v1beta2.AppWrapperSuspending) {
		t.Errorf("phases %v lack Suspending", ph)
	}

	h.patchSuspend(name, false)
	aw = h.waitFor(name, "running again", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
	})
	if aw.Status.Retries != 1 {
		t.Errorf("retries %d after resuming, want 1 (never reset)", aw.Status.Retries)
	}
}

// TestGracePeriodMaximumClamps: an annotated grace period above the
// configured GracePeriodMaximum is cut to it: a one-hour FailureGracePeriod
// under a two-second maximum fails the workload after two seconds.
func TestGracePeriodMaximumClamps(t *testing.T) {
	h := newHarness(t, 1, func(c *appwrapper.Config) {
		c.FaultTolerance.GracePeriodMaximum = appwrapper.Duration{Duration: 2 * time.Second}
	})
	const name = "clamped"
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1h",
		v1beta2.RetryLimitAnnotation, "0",
	), jobTemplate(t, name, 1, nil)))
	pods := h.waitRunning(name, 1)
	h.fail(pods[0].Name, 1, "")
	aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
	unhealthy := cond(aw, v1beta2.Unhealthy)
	if unhealthy.Reason != appwrapper.ReasonFoundFailedPods {
		t.Errorf("Unhealthy reason %s", unhealthy.Reason)
	}
	ev := h.waitEvent(name, corev1.EventTypeWarning, "Failed", appwrapper.ReasonFoundFailedPods)
	if ev.EventTime.Time.Before(unhealthy.LastTransitionTime.Add(2 * time.Second)) {
		t.Errorf("failed at %v, before Unhealthy %v + the 2s maximum", ev.EventTime.Time, unhealthy.LastTransitionTime)
	}
}

// TestMalformedAnnotationsReported: each malformed annotation is a Warning
// Event naming it; the defaults are used and the workload runs.
func TestMalformedAnnotationsReported(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "typos"
	h.create(appWrapper(name, ann(
		v1beta2.RetryLimitAnnotation, "three",
		v1beta2.FailureGracePeriodDurationAnnotation, "soon",
		v1beta2.TerminalExitCodesAnnotation, "x",
	), jobTemplate(t, name, 1, nil)))
	h.waitFor(name, "PodsReady", func(aw *v1beta2.AppWrapper) bool { return cond(aw, v1beta2.PodsReady).Status == True })
	h.waitEvent(name, corev1.EventTypeWarning, appwrapper.ReasonInvalidAnnotation, "3 malformed annotation(s)",
		v1beta2.RetryLimitAnnotation+`="three"`, v1beta2.FailureGracePeriodDurationAnnotation+`="soon"`, v1beta2.TerminalExitCodesAnnotation+`="x"`)
	n := 0
	for _, e := range h.events(name) {
		if e.Reason == appwrapper.ReasonInvalidAnnotation {
			n++
			if e.Series != nil {
				t.Errorf("the problems were reported %d times", e.Series.Count)
			}
		}
	}
	if n != 1 {
		t.Errorf("%d InvalidAnnotation Events, want 1 (not repeated on every pass)", n)
	}
}

// withGPU is a Job whose pods ask for one (fake, the API server accepts
// any extended resource) nvidia.com/gpu.
func withGPU(j *batchv1.Job) {
	j.Spec.Template.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
}

// autopilotExpr is the injected requirement on Autopilot's health label.
func autopilotExpr(p *corev1.Pod) *corev1.NodeSelectorRequirement {
	a := p.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == "autopilot.ibm.com/gpuhealth" {
				return &e
			}
		}
	}
	return nil
}

// TestAutopilotAntiAffinityOnlyForGPUPods: the Autopilot anti-affinity goes
// into the pods that request the resource, not the others.
func TestAutopilotAntiAffinityOnlyForGPUPods(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "mixed"
	h.create(appWrapper(name, nil, jobTemplate(t, "gpu", 1, withGPU), jobTemplate(t, "cpu", 1, nil)))
	for _, p := range h.waitRunning(name, 2) {
		e := autopilotExpr(&p)
		gpu := strings.HasPrefix(p.Name, "gpu-")
		switch {
		case gpu && (e == nil || e.Operator != corev1.NodeSelectorOpNotIn || !slices.Contains(e.Values, "EVICT") || !slices.Contains(e.Values, "TESTING")):
			t.Errorf("GPU pod %s: requirement %+v, want NotIn [TESTING EVICT]", p.Name, e)
		case gpu && (p.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution == nil):
			t.Errorf("GPU pod %s: no preferred term for WARN", p.Name)
		case !gpu && e != nil:
			t.Errorf("CPU pod %s got the Autopilot requirement %+v", p.Name, e)
		}
	}
}

// TestAutopilotNoExecute: a node labelled EVICT under a running GPU pod
// resets the workload at once without spending a retry, and the new pods
// keep off that node; with no retry left the same label fails it.
func TestAutopilotNoExecute(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit string
		want  v1beta2.AppWrapperPhase
	}{
		{"migrated", "3", v1beta2.AppWrapperRunning},
		{"retries exhausted", "0", v1beta2.AppWrapperFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 2, nil)
			const name = "gpu"
			hist := h.watch(name)
			h.create(appWrapper(name, ann(
				v1beta2.RetryLimitAnnotation, tc.limit,
				v1beta2.RetryPausePeriodDurationAnnotation, "0s",
			), jobTemplate(t, name, 1, withGPU)))
			h.waitFor(name, "PodsReady", func(aw *v1beta2.AppWrapper) bool { return cond(aw, v1beta2.PodsReady).Status == True })
			pod := h.waitRunning(name, 1)[0]
			bad := pod.Spec.NodeName
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: bad}}
			if err := h.c.Patch(h.ctx, node, client.RawPatch(types.MergePatchType,
				[]byte(`{"metadata":{"labels":{"autopilot.ibm.com/gpuhealth":"EVICT"}}}`))); err != nil {
				t.Fatal(err)
			}

			if tc.want == v1beta2.AppWrapperFailed {
				aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
				h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonAutopilotNoExecute)
				if aw.Status.Retries != 0 {
					t.Errorf("retries %d", aw.Status.Retries)
				}
				return
			}
			// The watch is read before the GET: a version read after the
			// watch showed Resetting is the reset's outcome, not the
			// Running it left.
			var aw *v1beta2.AppWrapper
			h.eventually("running again off the node", func() (bool, string) {
				reset := slices.Contains(hist.phases(), v1beta2.AppWrapperResetting)
				aw = h.get(name)
				return reset && aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True, describe(aw)
			})
			if aw.Status.Retries != 0 {
				t.Errorf("retries %d, want 0 (an Autopilot migration is not counted)", aw.Status.Retries)
			}
			for _, p := range h.waitRunning(name, 1) {
				if p.UID == pod.UID || p.Spec.NodeName == bad {
					t.Errorf("pod %s on %s: not moved off %s", p.Name, p.Spec.NodeName, bad)
				}
			}
			h.waitEvent(name, corev1.EventTypeNormal, appwrapper.ReasonUnhealthy, appwrapper.ReasonAutopilotNoExecute, bad)
			h.waitEvent(name, corev1.EventTypeWarning, "Resetting", "uncounted reset (retries used 0 of 3)")
		})
	}
}

// TestFailedComponentResets: a Job its own controller declared Failed
// resets the workload with no FailureGracePeriod (one hour here).
func TestFailedComponentResets(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "jobfail"
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1h",
		v1beta2.RetryPausePeriodDurationAnnotation, "0s",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 1, func(j *batchv1.Job) { zero := int32(0); j.Spec.BackoffLimit = &zero })))
	pods := h.waitRunning(name, 1)
	h.fail(pods[0].Name, 1, "")
	aw := h.waitFor(name, "running after one reset", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
	})
	h.expectCond(aw, v1beta2.Unhealthy, False, appwrapper.ReasonFoundNoFailedPods)
	h.waitEvent(name, corev1.EventTypeWarning, "Resetting", "attempt 1 of 3", appwrapper.ReasonFailedComponent)
}

// TestNoRestartVerdictFailsAtOnce: a pod whose ft-launcher verdict is
// no_restart (exit 93, a rank's ShutdownWorkload) fails the workload
// without FailureGracePeriod (one hour here) and with retries left.
func TestNoRestartVerdictFailsAtOnce(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "shutdown"
	hist := h.watch(name)
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1h",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 2, nil)))
	pods := h.waitRunning(name, 2)
	msg := verdictMessage(t, verdict.Verdict{
		Kind: verdict.NoRestart, ExitCode: verdict.DefaultNoRestartExitCode,
		Reason: "rank 3 requested ShutdownWorkload", Hostname: pods[0].Spec.NodeName,
	})
	h.fail(pods[0].Name, verdict.DefaultNoRestartExitCode, msg)
	aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
	h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonNoRestartVerdict)
	if c := cond(aw, v1beta2.Unhealthy); !strings.Contains(c.Message, "ShutdownWorkload") || !strings.Contains(c.Message, pods[0].Name) {
		t.Errorf("Unhealthy message %q names neither the pod nor the reason", c.Message)
	}
	if ph := h.phasesThrough(hist, v1beta2.AppWrapperFailed); aw.Status.Retries != 0 || slices.Contains(ph, v1beta2.AppWrapperResetting) {
		t.Errorf("retries %d, phases %v: want a failure without reset", aw.Status.Retries, ph)
	}
	h.waitFor(name, "resources deleted", func(aw *v1beta2.AppWrapper) bool {
		return cond(aw, v1beta2.ResourcesDeployed).Status == False
	})
}

// TestQuarantinedHostAvoided: a verdict that quarantined a host is recorded
// on the AppWrapper, and the pods recreated by the reset carry a NotIn on
// kubernetes.io/hostname for it (the stand-in kubelet honours it).
func TestQuarantinedHostAvoided(t *testing.T) {
	h := newHarness(t, 2, nil)
	const name = "quarantine"
	bad := h.nodes[1]
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "0s",
		v1beta2.RetryPausePeriodDurationAnnotation, "0s",
		v1beta2.RetryLimitAnnotation, "3",
	), jobTemplate(t, name, 2, nil)))
	pods := h.waitRunning(name, 2)
	msg := verdictMessage(t, verdict.Verdict{
		Kind: verdict.RestartBudgetExhausted, ExitCode: 1, Reason: "restart budget exhausted",
		Quarantined: []verdict.Quarantine{{Node: "10.0.0.9/77", Host: bad, Evidence: verdict.EvidenceHang, Detail: "rank hung", At: time.Now()}},
	})
	h.fail(pods[0].Name, 1, msg)
	aw := h.waitFor(name, "running after the reset", func(aw *v1beta2.AppWrapper) bool {
		return aw.Status.Phase == v1beta2.AppWrapperRunning && aw.Status.Retries == 1 && cond(aw, v1beta2.PodsReady).Status == True
	})
	avoid := avoided(t, aw)
	if until, ok := avoid[bad]; !ok || until.Before(time.Now().Add(50*time.Minute)) {
		t.Errorf("annotation %s = %q, want %s avoided for about an hour", appwrapper.AvoidNodesAnnotation, aw.Annotations[appwrapper.AvoidNodesAnnotation], bad)
	}
	for _, p := range h.waitRunning(name, 2) {
		if p.Spec.NodeName == bad {
			t.Errorf("pod %s runs on the quarantined %s", p.Name, bad)
		}
		found := false
		for _, term := range p.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				found = found || (e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpNotIn && slices.Equal(e.Values, []string{bad}))
			}
		}
		if !found {
			t.Errorf("pod %s affinity %+v lacks NotIn [%s]", p.Name, p.Spec.Affinity, bad)
		}
	}
	h.waitEvent(name, corev1.EventTypeNormal, appwrapper.ReasonAvoidNodes, bad)
}

// TestSampleAppWrappers: MLBatch's sample AppWrappers, applied from their
// YAML unchanged, run and succeed.
func TestSampleAppWrappers(t *testing.T) {
	for _, tc := range []struct {
		file string
		pods int
	}{
		{"../testdata/job.yaml", 1},
		{"../testdata/job-with-podgroup.yaml", 2},
	} {
		t.Run(tc.file, func(t *testing.T) {
			h := newHarness(t, 2, nil)
			aw := loadAppWrapper(t, tc.file)
			name := aw.Name
			h.create(aw)
			aw = h.waitFor(name, "PodsReady", func(aw *v1beta2.AppWrapper) bool {
				return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
			})
			for _, cs := range aw.Status.ComponentStatus {
				u := &unstructured.Unstructured{}
				u.SetAPIVersion(cs.APIVersion)
				u.SetKind(cs.Kind)
				if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: cs.Name}, u); err != nil {
					t.Errorf("component %s %s: %v", cs.Kind, cs.Name, err)
				} else if ref := metav1.GetControllerOf(u); ref == nil || ref.UID != aw.UID {
					t.Errorf("component %s %s not controlled by the AppWrapper: %v", cs.Kind, cs.Name, u.GetOwnerReferences())
				}
			}
			for _, p := range h.waitRunning(name, tc.pods) {
				h.succeed(p.Name)
			}
			aw = h.waitPhase(name, v1beta2.AppWrapperSucceeded)
			h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonSucceeded)
			h.expectCond(aw, v1beta2.ResourcesDeployed, True, appwrapper.ReasonSucceeded)
		})
	}
}

// TestDeleteAppWrapper: deleting an AppWrapper deletes its resources before
// the finalizer lets it go.
func TestDeleteAppWrapper(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "bye"
	h.create(appWrapper(name, nil, jobTemplate(t, name, 2, nil)))
	h.waitRunning(name, 2)
	if err := h.c.Delete(h.ctx, h.get(name)); err != nil {
		t.Fatal(err)
	}
	h.eventually("the AppWrapper gone", func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &v1beta2.AppWrapper{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if h.jobExists(name) || len(h.pods(name)) != 0 {
		t.Errorf("resources outlived the AppWrapper: job %v, pods %d", h.jobExists(name), len(h.pods(name)))
	}
}

// TestManagedByAnotherController: an AppWrapper whose spec.managedBy names
// another controller is left alone.
func TestManagedByAnotherController(t *testing.T) {
	h := newHarness(t, 1, nil)
	other := "kueue.x-k8s.io/multikueue"
	foreign := appWrapper("foreign", nil, jobTemplate(t, "foreign", 1, nil))
	foreign.Spec.ManagedBy = &other
	h.create(foreign)
	h.create(appWrapper("ours", nil, jobTemplate(t, "ours", 1, nil)))
	h.waitFor("ours", "PodsReady", func(aw *v1beta2.AppWrapper) bool { return cond(aw, v1beta2.PodsReady).Status == True })
	if aw := h.get("foreign"); aw.Status.Phase != "" || len(aw.Finalizers) != 0 || h.jobExists("foreign") {
		t.Errorf("foreign AppWrapper touched: %s, finalizers %v", describe(aw), aw.Finalizers)
	}
}

// TestCreateErrors: an error that no retry can fix fails the AppWrapper at
// once (CreateFailed, no retry spent); any other is retried within
// AdmissionGracePeriod, here until a quota that forbids the Job is lifted.
func TestCreateErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		template func(t *testing.T) runtime.RawExtension
		before   func(h *harness)
		detail   string
	}{
		{
			name:     "object exists and is not ours",
			template: func(t *testing.T) runtime.RawExtension { return jobTemplate(t, "taken", 1, nil) },
			before: func(h *harness) {
				j := &batchv1.Job{}
				if err := json.Unmarshal(jobTemplate(h.t, "taken", 1, nil).Raw, j); err != nil {
					h.t.Fatal(err)
				}
				j.Namespace = h.ns
				if err := h.c.Create(h.ctx, j); err != nil {
					h.t.Fatal(err)
				}
			},
			detail: "not controlled by this AppWrapper",
		},
		{
			name: "invalid object",
			template: func(t *testing.T) runtime.RawExtension {
				return jobTemplate(t, "bad", 1, func(j *batchv1.Job) { j.Spec.Template.Spec.Containers[0].Name = "Not_A_DNS_Label" })
			},
			detail: "Invalid",
		},
		{
			name: "kind not served",
			template: func(t *testing.T) runtime.RawExtension {
				return runtime.RawExtension{Raw: []byte(`{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"}}`)}
			},
			detail: "no matches for kind",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, nil)
			if tc.before != nil {
				tc.before(h)
			}
			const name = "broken"
			hist := h.watch(name)
			h.create(appWrapper(name, ann(v1beta2.RetryLimitAnnotation, "3"), tc.template(t)))
			aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
			h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonCreateFailed)
			if c := cond(aw, v1beta2.Unhealthy); !strings.Contains(c.Message, tc.detail) {
				t.Errorf("Unhealthy message %q, want it to say %q", c.Message, tc.detail)
			}
			if c := cond2(aw.Status.ComponentStatus[0].Conditions); c.Status != False || c.Reason != appwrapper.ReasonComponentCreationErrored {
				t.Errorf("component condition %s/%s, want False/%s", c.Status, c.Reason, appwrapper.ReasonComponentCreationErrored)
			}
			if ph := h.phasesThrough(hist, v1beta2.AppWrapperFailed); aw.Status.Retries != 0 || slices.Contains(ph, v1beta2.AppWrapperResetting) {
				t.Errorf("retried: retries %d, phases %v", aw.Status.Retries, ph)
			}
			h.waitFor(name, "quota released", func(aw *v1beta2.AppWrapper) bool {
				return cond(aw, v1beta2.QuotaReserved).Status == False && cond(aw, v1beta2.ResourcesDeployed).Status == False
			})
			if tc.before != nil && !h.jobExists("taken") {
				t.Errorf("the Job the AppWrapper does not own was deleted")
			}
		})
	}

	// A quota that forbids Jobs: Forbidden is not fatal. Lifted within
	// AdmissionGracePeriod, the workload runs; kept past it, the error is an
	// unhealthy verdict (here with no retry allowed: Failed).
	for _, lift := range []bool{true, false} {
		t.Run(fmt.Sprintf("transient error, quota lifted %v", lift), func(t *testing.T) {
			h := newHarness(t, 1, nil)
			quota := &corev1.ResourceQuota{
				ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "no-jobs"},
				Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}},
			}
			if err := h.c.Create(h.ctx, quota); err != nil {
				t.Fatal(err)
			}
			// No quota controller runs here: the usage is written by hand.
			quota.Status = corev1.ResourceQuotaStatus{Hard: quota.Spec.Hard, Used: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}}
			if err := h.c.Status().Update(h.ctx, quota); err != nil {
				t.Fatal(err)
			}
			const name = "waits"
			hist := h.watch(name)
			grace := "2s"
			if lift {
				grace = "10m"
			}
			h.create(appWrapper(name, ann(
				v1beta2.AdmissionGracePeriodDurationAnnotation, grace,
				v1beta2.RetryLimitAnnotation, "0",
			), jobTemplate(t, name, 1, nil)))
			if !lift {
				aw := h.waitPhase(name, v1beta2.AppWrapperFailed)
				h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonCreateFailed)
				if c := cond(aw, v1beta2.Unhealthy); !strings.Contains(c.Message, "forbidden") {
					t.Errorf("Unhealthy message %q", c.Message)
				}
				h.waitEvent(name, corev1.EventTypeWarning, "Failed", "retry limit reached (0 of 0 used)", appwrapper.ReasonCreateFailed)
				return
			}
			aw := h.waitFor(name, "the creation refused", func(aw *v1beta2.AppWrapper) bool {
				return len(aw.Status.ComponentStatus) == 1 &&
					cond2(aw.Status.ComponentStatus[0].Conditions).Reason == appwrapper.ReasonComponentCreationErrored
			})
			if aw.Status.Phase != v1beta2.AppWrapperResuming {
				t.Errorf("phase %s while the error is retried, want Resuming", aw.Status.Phase)
			}
			if err := h.c.Delete(h.ctx, quota); err != nil {
				t.Fatal(err)
			}
			aw = h.waitFor(name, "running once the quota is gone", func(aw *v1beta2.AppWrapper) bool {
				return aw.Status.Phase == v1beta2.AppWrapperRunning && cond(aw, v1beta2.PodsReady).Status == True
			})
			if aw.Status.Retries != 0 || slices.Contains(hist.phases(), v1beta2.AppWrapperFailed) {
				t.Errorf("retries %d, phases %v", aw.Status.Retries, hist.phases())
			}
		})
	}
}

// TestSuspendWhileRunning: Kueue preempting a running workload deletes its
// resources and releases the quota; admitted again, it runs again.
func TestSuspendWhileRunning(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "preempt"
	h.create(appWrapper(name, nil, jobTemplate(t, name, 2, nil)))
	first := h.waitRunning(name, 2)
	h.patchSuspend(name, true)
	aw := h.waitPhase(name, v1beta2.AppWrapperSuspended)
	h.expectCond(aw, v1beta2.QuotaReserved, False, appwrapper.ReasonSuspended)
	h.expectCond(aw, v1beta2.ResourcesDeployed, False, appwrapper.ReasonSuspended)
	if h.jobExists(name) || len(h.pods(name)) != 0 {
		t.Errorf("resources left while suspended")
	}
	h.patchSuspend(name, false)
	for _, p := range h.waitRunning(name, 2) {
		if uids(first)[string(p.UID)] {
			t.Errorf("pod %s predates the suspension", p.Name)
		}
	}
	h.waitEvent(name, corev1.EventTypeNormal, "Suspending", "suspend requested while running")
}

// avoided reads the hosts of the AvoidNodes annotation (host -> RFC 3339
// expiry).
func avoided(t *testing.T, aw *v1beta2.AppWrapper) map[string]time.Time {
	t.Helper()
	var m map[string]string
	if err := json.Unmarshal([]byte(aw.Annotations[appwrapper.AvoidNodesAnnotation]), &m); err != nil {
		t.Fatalf("annotation %s: %v", appwrapper.AvoidNodesAnnotation, err)
	}
	out := map[string]time.Time{}
	for host, until := range m {
		at, err := time.Parse(time.RFC3339, until)
		if err != nil {
			t.Fatalf("annotation %s: host %s: %v", appwrapper.AvoidNodesAnnotation, host, err)
		}
		out[host] = at
	}
	return out
}
