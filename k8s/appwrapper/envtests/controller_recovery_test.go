package envtests

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/k8s/appwrapper"
)

// Recovery tests: a shortfall after the workload was ready, the
// periodic pass while Running, pods of a dead node forced during a reset,
// and upstream's Events. Same harness as controller_test.go: a real API
// server, Job controller and garbage collector, the stand-in kubelet.

// coreEvents lists the core/v1 Events about the AppWrapper (upstream's
// form: involvedObject, message, source.component).
func (h *harness) coreEvents(name string) []corev1.Event {
	h.t.Helper()
	var l corev1.EventList
	if err := h.c.List(h.ctx, &l, client.InNamespace(h.ns)); err != nil {
		h.t.Fatalf("list events: %v", err)
	}
	var out []corev1.Event
	for _, e := range l.Items {
		if e.InvolvedObject.Kind == "AppWrapper" && e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// waitUpstreamEvent waits for the Event upstream would emit: type Normal,
// the reason, a message matching the regular expression message (anchored),
// from component "appwrappers".
func (h *harness) waitUpstreamEvent(name, reason, message string) corev1.Event {
	re := regexp.MustCompile("^" + message + "$")
	h.t.Helper()
	var found corev1.Event
	h.eventually(fmt.Sprintf("upstream Event %s %q on %s", reason, message, name), func() (bool, string) {
		var seen []string
		for _, e := range h.coreEvents(name) {
			seen = append(seen, fmt.Sprintf("%s/%s/%s: %s", e.Source.Component, e.Type, e.Reason, e.Message))
			if e.Source.Component == appwrapper.UpstreamEventSource && e.Type == corev1.EventTypeNormal && e.Reason == reason && re.MatchString(e.Message) {
				found = e
				return true, ""
			}
		}
		return false, strings.Join(seen, " | ")
	})
	return found
}

func (h *harness) deletePod(name string) {
	h.t.Helper()
	if err := h.c.Delete(h.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}); err != nil {
		h.t.Fatalf("delete pod %s: %v", name, err)
	}
}

// firstNotReady is when the watch first saw PodsReady False with reason
// InsufficientPodsReady after it had been True: the dip.
func firstNotReady(hist *history) (metav1.Time, bool) {
	ready := false
	for _, v := range hist.all() {
		c := cond(v, v1beta2.PodsReady)
		switch {
		case c.Status == True:
			ready = true
		case ready && c.Status == False && c.Reason == appwrapper.ReasonInsufficientPodsReady:
			return c.LastTransitionTime, true
		}
	}
	return metav1.Time{}, false
}

// TestShortfallAfterReady: once the workload has been ready, a pod that
// goes away (deleted, as a drain or preemption does) and whose replacement
// is not running is timed from PodsReady turning False plus
// FailureGracePeriod, not from deployment. The dip comes after warmup and
// admission have passed, so upstream's rule would reset at the first pass
// that sees it.
//   - back in time: the replacement runs within the grace; no reset, no
//     retry spent, PodsReady True again.
//   - too late: it does not; the workload resets as before
//     (InsufficientPodsReady, one retry), no earlier than the grace after
//     PodsReady turned False, with upstream's Event.
func TestShortfallAfterReady(t *testing.T) {
	for _, tc := range []struct {
		name    string
		grace   string
		comesUp bool
	}{
		{name: "back in time", grace: "2m", comesUp: true},
		{name: "too late", grace: "3s", comesUp: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 2, nil)
			const name = "dip"
			hist := h.watch(name)
			h.create(appWrapper(name, ann(
				v1beta2.AdmissionGracePeriodDurationAnnotation, "10s",
				v1beta2.WarmupGracePeriodDurationAnnotation, "10s",
				v1beta2.FailureGracePeriodDurationAnnotation, tc.grace,
				v1beta2.RetryPausePeriodDurationAnnotation, "0s",
			), jobTemplate(t, name, 2, nil)))
			pods := h.waitRunning(name, 2)
			aw := h.waitFor(name, "PodsReady True", func(aw *v1beta2.AppWrapper) bool {
				return cond(aw, v1beta2.PodsReady).Status == True
			})
			// Past warmup and admission (10s each, long enough for a
			// loaded machine to start the pods): upstream's rule would now
			// reset on any dip.
			time.Sleep(time.Until(cond(aw, v1beta2.ResourcesDeployed).LastTransitionTime.Add(12 * time.Second)))

			h.kubelet.Pause() // the replacement is not started
			h.deletePod(pods[0].Name)
			aw = h.waitFor(name, "PodsReady False (InsufficientPodsReady)", func(aw *v1beta2.AppWrapper) bool {
				return cond(aw, v1beta2.PodsReady).Reason == appwrapper.ReasonInsufficientPodsReady
			})
			if aw.Status.Phase != v1beta2.AppWrapperRunning {
				t.Fatalf("the dip was not tolerated: %s", describe(aw))
			}

			if tc.comesUp {
				time.Sleep(3 * time.Second) // several passes' worth: still Running
				if aw := h.get(name); aw.Status.Phase != v1beta2.AppWrapperRunning || aw.Status.Retries != 0 {
					t.Fatalf("reset within the failure grace: %s", describe(aw))
				}
				h.kubelet.Resume()
				aw = h.waitFor(name, "PodsReady True again", func(aw *v1beta2.AppWrapper) bool {
					return cond(aw, v1beta2.PodsReady).Status == True
				})
				h.waitRunning(name, 2)
				if aw.Status.Phase != v1beta2.AppWrapperRunning || aw.Status.Retries != 0 {
					t.Errorf("after the replacement ran: %s, want Running with 0 retries", describe(aw))
				}
				if slices.Contains(hist.phases(), v1beta2.AppWrapperResetting) {
					t.Errorf("phases %v: a replaced pod reset the workload", hist.phases())
				}
				h.expectCond(aw, v1beta2.Unhealthy, False, appwrapper.ReasonFoundNoFailedPods)
				return
			}

			aw = h.waitPhase(name, v1beta2.AppWrapperResetting)
			if aw.Status.Retries != 1 {
				t.Errorf("retries %d, want 1", aw.Status.Retries)
			}
			h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonInsufficientPodsReady)
			dip, ok := firstNotReady(hist)
			if !ok {
				t.Fatalf("the watch never saw PodsReady turn False after True")
			}
			// lastTransitionTimes have one-second resolution.
			unhealthy := cond(aw, v1beta2.Unhealthy).LastTransitionTime
			if earliest := dip.Add(3*time.Second - time.Second); unhealthy.Time.Before(earliest) {
				t.Errorf("reset decided at %v, before PodsReady False (%v) + the 3s failure grace", unhealthy, dip)
			}
			h.waitEvent(name, corev1.EventTypeWarning, "Resetting", "attempt 1 of 3", appwrapper.ReasonInsufficientPodsReady, "timed from PodsReady turning False")
			h.waitUpstreamEvent(name, appwrapper.ReasonUnhealthy, `InsufficientPodsReady: [01] pods pending; 1 pods running; 0 pods succeeded`)
			h.kubelet.Resume()
			h.waitPhase(name, v1beta2.AppWrapperRunning)
			h.waitRunning(name, 2)
		})
	}
}

// TestReevaluateWhileRunning: a pod failure whose watch events are lost
// (dropped on purpose: the pod's and the Job's) is still acted on by the
// periodic pass (reevaluatePeriod); with the pass disabled it is not (the
// control: the drop really hides it); and with events flowing and a long
// period the failure is acted on at once (the event-driven latency kept).
func TestReevaluateWhileRunning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		period time.Duration
		drop   bool
		resets bool
	}{
		{name: "missed event caught by the periodic pass", period: 2 * time.Second, drop: true, resets: true},
		{name: "missed event without the pass", period: 0, drop: true, resets: false},
		{name: "event-driven with a long period", period: time.Hour, drop: false, resets: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var dropping atomic.Bool
			h := newHarnessWith(t, 1, func(c *appwrapper.Config) { c.ReevaluatePeriod = appwrapper.Duration{Duration: tc.period} }, func(r *appwrapper.Reconciler) {
				r.SetTestHooks(appwrapper.TestHooks{DropEvent: func(o client.Object) bool {
					if !dropping.Load() {
						return false
					}
					switch o.(type) {
					case *corev1.Pod:
						return true
					case *metav1.PartialObjectMetadata: // the Job component
						return true
					}
					return false
				}})
			})
			const name = "periodic"
			h.create(appWrapper(name, ann(
				v1beta2.FailureGracePeriodDurationAnnotation, "0s",
				v1beta2.RetryPausePeriodDurationAnnotation, "1h",
			), jobTemplate(t, name, 1, nil)))
			pods := h.waitRunning(name, 1)
			h.waitFor(name, "PodsReady True", func(aw *v1beta2.AppWrapper) bool {
				return cond(aw, v1beta2.PodsReady).Status == True
			})
			time.Sleep(500 * time.Millisecond) // let the watch deliver what came before
			dropping.Store(tc.drop)
			failed := time.Now()
			h.fail(pods[0].Name, 1, "")
			if !tc.resets {
				time.Sleep(6 * time.Second)
				if aw := h.get(name); aw.Status.Phase != v1beta2.AppWrapperRunning {
					t.Fatalf("acted on a dropped event without the periodic pass: %s (the control is broken)", describe(aw))
				}
				return
			}
			aw := h.waitPhase(name, v1beta2.AppWrapperResetting)
			h.expectCond(aw, v1beta2.Unhealthy, True, appwrapper.ReasonFoundFailedPods)
			took := time.Since(failed)
			t.Logf("pod failure -> Resetting in %v (period %v, events dropped %v)", took.Round(time.Millisecond), tc.period, tc.drop)
			if !tc.drop && took > time.Minute {
				t.Errorf("with events flowing the failure took %v, the watch did not drive it", took)
			}
			h.waitUpstreamEvent(name, appwrapper.ReasonUnhealthy, "FoundFailedPods: 1 failed pods")
		})
	}
}

// markNode changes a Node as the node controller or an administrator
// would: f edits it, status and spec are both written.
func (h *harness) markNode(name string, f func(n *corev1.Node)) {
	h.t.Helper()
	n, err := env.Clientset.CoreV1().Nodes().Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	f(n)
	spec, err := env.Clientset.CoreV1().Nodes().Update(h.ctx, n, metav1.UpdateOptions{})
	if err != nil {
		h.t.Fatalf("update node %s: %v", name, err)
	}
	spec.Status = n.Status
	if _, err := env.Clientset.CoreV1().Nodes().UpdateStatus(h.ctx, spec, metav1.UpdateOptions{}); err != nil {
		h.t.Fatalf("update node %s status: %v", name, err)
	}
}

// setReady sets the Ready condition, turned status ago before now.
func setReady(status corev1.ConditionStatus, ago time.Duration) func(*corev1.Node) {
	return func(n *corev1.Node) {
		since := time.Now().Add(-ago)
		for i := range n.Status.Conditions {
			if n.Status.Conditions[i].Type == corev1.NodeReady {
				n.Status.Conditions[i].Status = status
				n.Status.Conditions[i].Reason = "NodeStatusUnknown"
				n.Status.Conditions[i].LastTransitionTime = metav1.NewTime(since)
			}
		}
	}
}

// addTaint adds the NoExecute taint key, added ago before now.
func addTaint(key string, ago time.Duration) func(*corev1.Node) {
	return func(n *corev1.Node) {
		at := metav1.NewTime(time.Now().Add(-ago))
		n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoExecute, TimeAdded: &at})
	}
}

// TestDeadNodePodsForced: a node's kubelet dies (the stand-in stops
// serving it) and the node is marked as the node controller or an
// administrator would; a failure elsewhere resets the workload. The pod
// of the dead node stays Terminating (no kubelet finishes it) until the
// controller deletes it with grace 0: at once past deadNodeGracePeriod
// instead of after forcefulDeletionGracePeriod (10m here), and the
// workload is recreated on the live node. Rows: Ready Unknown or False
// longer than the bound; Ready Unknown for less than it (forced only once
// the bound has passed, from the condition's transition); the unreachable
// taint; the out-of-service taint (no bound); and a node still Ready (not
// forced) that then turns Unknown (the node watch brings the AppWrapper
// back). There is no kubelet: "recreated" is the new pods bound and marked
// Running by the stand-in.
func TestDeadNodePodsForced(t *testing.T) {
	const past = 2 * time.Minute
	for _, tc := range []struct {
		name    string
		bound   time.Duration
		mark    func(*corev1.Node)
		waitFor time.Duration // the bound still to run after marking
		later   func(*corev1.Node)
	}{
		{name: "ready unknown past the bound", bound: time.Minute, mark: setReady(corev1.ConditionUnknown, past)},
		{name: "ready false past the bound", bound: time.Minute, mark: setReady(corev1.ConditionFalse, past)},
		{name: "ready unknown within the bound", bound: 4 * time.Second, mark: setReady(corev1.ConditionUnknown, 0), waitFor: 4 * time.Second},
		{name: "unreachable taint", bound: time.Minute, mark: addTaint(corev1.TaintNodeUnreachable, past)},
		{name: "out of service", bound: time.Hour, mark: addTaint(corev1.TaintNodeOutOfService, 0)},
		{name: "still ready, then unknown", bound: 0, later: setReady(corev1.ConditionUnknown, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 2, func(c *appwrapper.Config) { c.DeadNodeGracePeriod = appwrapper.Duration{Duration: tc.bound} })
			const name = "deadnode"
			h.create(appWrapper(name, ann(
				v1beta2.FailureGracePeriodDurationAnnotation, "0s",
				v1beta2.RetryPausePeriodDurationAnnotation, "0s",
				v1beta2.ForcefulDeletionGracePeriodAnnotation, "10m",
			), jobTemplate(t, name, 2, nil)))
			pods := h.waitRunning(name, 2)
			lost := pods[1]
			deadNode := lost.Spec.NodeName
			h.kubelet.StopNode(deadNode)
			var marked time.Time
			if tc.mark != nil {
				h.markNode(deadNode, tc.mark)
				marked = time.Now()
			}
			failed := time.Now()
			h.fail(pods[0].Name, 1, "")
			h.waitPhase(name, v1beta2.AppWrapperResetting)

			gone := func() (bool, string) {
				p := &corev1.Pod{}
				err := h.c.Get(h.ctx, client.ObjectKeyFromObject(&lost), p)
				if apierrors.IsNotFound(err) {
					return true, ""
				}
				if err != nil {
					return false, err.Error()
				}
				return false, fmt.Sprintf("deletionTimestamp %v grace %v finalizers %v", p.DeletionTimestamp, p.DeletionGracePeriodSeconds, p.Finalizers)
			}
			if tc.later != nil {
				// The node still says Ready: its pod is left to the
				// forceful-deletion grace, Terminating.
				h.eventually("the dead node's pod Terminating", func() (bool, string) {
					p := &corev1.Pod{}
					if err := h.c.Get(h.ctx, client.ObjectKeyFromObject(&lost), p); err != nil {
						return false, err.Error()
					}
					return p.DeletionTimestamp != nil, "not terminating"
				})
				time.Sleep(4 * time.Second)
				if ok, _ := gone(); ok {
					t.Fatalf("the pod of a node still Ready was forced")
				}
				if aw := h.get(name); aw.Status.Phase != v1beta2.AppWrapperResetting {
					t.Fatalf("%s: want Resetting while the pod is Terminating", describe(aw))
				}
				h.markNode(deadNode, tc.later)
				marked = time.Now()
			}
			h.eventually("the dead node's pod deleted", gone)
			forced := time.Now()
			h.waitEvent(name, corev1.EventTypeNormal, appwrapper.ReasonLostPodsForced, lost.Name, deadNode)
			if tc.waitFor > 0 && forced.Sub(marked) < tc.waitFor-time.Second {
				t.Errorf("forced %v after the node turned Unknown, before the %v bound", forced.Sub(marked), tc.waitFor)
			}
			aw := h.waitPhase(name, v1beta2.AppWrapperRunning)
			run := h.waitRunning(name, 2)
			running := time.Now()
			for _, p := range run {
				if p.Spec.NodeName == deadNode {
					t.Errorf("pod %s recreated on the dead node", p.Name)
				}
				if p.UID == lost.UID || p.UID == pods[0].UID {
					t.Errorf("pod %s is not new", p.Name)
				}
			}
			if aw.Status.Retries != 1 {
				t.Errorf("retries %d, want 1", aw.Status.Retries)
			}
			if tc.later == nil {
				t.Logf("failure -> dead node's pod forced %v -> workload Running again %v (forcefulDeletionGracePeriod 10m, deadNodeGracePeriod %v)",
					forced.Sub(failed).Round(time.Millisecond), running.Sub(failed).Round(time.Millisecond), tc.bound)
			}
		})
	}
}

// TestUpstreamEvents: the Events upstream emits, in its form (core/v1,
// component "appwrappers", reason Unhealthy or Suspending, its messages),
// come beside ours: a failed component at once ("FailedComponent: Found 1
// failed components"), and a suspension during the reset.
func TestUpstreamEvents(t *testing.T) {
	h := newHarness(t, 1, nil)
	const name = "upstream"
	backoff := int32(0)
	h.create(appWrapper(name, ann(
		v1beta2.FailureGracePeriodDurationAnnotation, "1h",
		v1beta2.RetryPausePeriodDurationAnnotation, "1h",
	), jobTemplate(t, name, 1, func(j *batchv1.Job) { j.Spec.BackoffLimit = &backoff })))
	pods := h.waitRunning(name, 1)
	h.fail(pods[0].Name, 1, "")
	h.waitPhase(name, v1beta2.AppWrapperResetting)
	h.waitUpstreamEvent(name, appwrapper.ReasonUnhealthy, "FailedComponent: Found 1 failed components")
	h.waitEvent(name, corev1.EventTypeNormal, appwrapper.ReasonUnhealthy, appwrapper.ReasonFailedComponent) // ours, kept
	h.patchSuspend(name, true)
	h.waitPhase(name, v1beta2.AppWrapperSuspended)
	h.waitUpstreamEvent(name, string(v1beta2.AppWrapperSuspending), "Externally suspended while in the Resetting phase")
}
