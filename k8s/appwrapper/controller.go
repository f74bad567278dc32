package appwrapper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/log"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
)

// ControllerName names the controller in logs, metrics and as the Events'
// reporting controller.
const ControllerName = "appwrapper"

// Reconciler drives AppWrappers through the phase machine of
// docs/kubernetes.md, "The contract". Its only state outside the API server is what the
// watches feed it (the Autopilot node map) and bookkeeping that may be lost
// at any time (which dynamic watches run, which annotation problems were
// reported): every decision is taken from the AppWrapper's status, whose
// timers are condition lastTransitionTimes, so a restarted controller
// carries on where the old one stopped.
type Reconciler struct {
	client    client.Client // the manager's: cached reads of AppWrappers and pods
	apiReader client.Reader // uncached: confirms what the cache says is gone
	scheme    *runtime.Scheme
	mapper    meta.RESTMapper
	cache     cache.Cache
	recorder  events.EventRecorder
	upstream  record.EventRecorder // upstream's Events, in its form (upstreamEvent)
	config    Config
	phases    *prometheus.CounterVec
	nodes     *nodeHealth
	now       func() time.Time

	// dropPodEvent, when set, hides the pod and component watch events
	// it returns true for (TestHooks.DropEvent).
	dropPodEvent func(client.Object) bool
	// afterCreate, when set, sees every component Create and its result
	// (TestHooks.AfterCreate).
	afterCreate func(client.Object, error)

	mu      sync.Mutex
	ctrl    controller.Controller
	watched map[schema.GroupVersionKind]bool
	// refused are the kinds the controller may not list and watch, with
	// when that was last checked (ensureWatch).
	refused  map[schema.GroupVersionKind]time.Time
	reported map[types.NamespacedName]string // annotation problems last reported
}

// TestHooks are faults a test injects into a reconciler that runs against
// a real API server (the tests in k8s/appwrapper/envtests). A production
// reconciler has none.
type TestHooks struct {
	// DropEvent hides the pod and component watch events it returns true
	// for: tests lose events on purpose with it, to show that the periodic
	// pass catches what the watches missed.
	DropEvent func(client.Object) bool
	// AfterCreate is called after every Create of a component, with the
	// object as sent (named, when the Create succeeded) and the error:
	// tests count attempts with it, or change the AppWrapper at that
	// moment to make the status write that follows conflict.
	AfterCreate func(obj client.Object, err error)
}

// SetTestHooks installs h. Call it before SetupWithManager.
func (r *Reconciler) SetTestHooks(h TestHooks) {
	r.dropPodEvent = h.DropEvent
	r.afterCreate = h.AfterCreate
}

// NewReconciler builds the reconciler for mgr with the operator
// configuration cfg, and registers its phase counter on controller-runtime's
// metrics registry (a second reconciler in the same process shares the
// counter). SetupWithManager is the usual entry point; this one is for
// callers that want the reconciler before it is set up.
func NewReconciler(mgr ctrl.Manager, cfg Config) (*Reconciler, error) {
	for _, gvk := range []schema.GroupVersionKind{
		v1beta2.GroupVersion.WithKind("AppWrapper"),
		corev1.SchemeGroupVersion.WithKind("Pod"),
	} {
		if !mgr.GetScheme().Recognizes(gvk) {
			return nil, fmt.Errorf("appwrapper: the manager's scheme lacks %v (add v1beta2.AddToScheme and client-go's scheme)", gvk)
		}
	}
	phases, err := registerPhaseCounter()
	if err != nil {
		return nil, err
	}
	return &Reconciler{
		client:    mgr.GetClient(),
		apiReader: mgr.GetAPIReader(),
		scheme:    mgr.GetScheme(),
		mapper:    mgr.GetRESTMapper(),
		cache:     mgr.GetCache(),
		recorder:  mgr.GetEventRecorder(ControllerName),
		// The core/v1 recorder is deprecated in controller-runtime, but
		// upstream's Events are core/v1 Events and alerts match on their
		// source.component.
		upstream: mgr.GetEventRecorderFor(UpstreamEventSource), //nolint:staticcheck
		config:   cfg,
		phases:   phases,
		nodes:    newNodeHealth(),
		now:      time.Now,
		watched:  map[schema.GroupVersionKind]bool{},
		refused:  map[schema.GroupVersionKind]time.Time{},
		reported: map[types.NamespacedName]string{},
	}, nil
}

// SetupWithManager is the one entry point of the package for a command:
// it builds the reconciler for cfg and registers it, with its watches, on
// mgr. The manager's scheme must hold the AppWrapper types and client-go's;
// ConfigureCache is the cache setting that goes with it.
func SetupWithManager(mgr ctrl.Manager, cfg Config) error {
	r, err := NewReconciler(mgr, cfg)
	if err != nil {
		return err
	}
	return r.SetupWithManager(mgr)
}

// registerPhaseCounter registers the counter of phase transitions
// (upstream's appwrapper_controller.go, transitionToPhase) on controller-runtime's registry,
// or returns the one already registered.
func registerPhaseCounter() (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "appwrapper_phase_total",
		Help: "AppWrapper phase transitions, by namespace and the phase entered.",
	}, []string{"namespace", "phase"})
	if err := ctrlmetrics.Registry.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, fmt.Errorf("appwrapper: register the phase counter: %w", err)
	}
	return c, nil
}

// conflictRetry is when a pass that lost a status write to a newer version
// runs again, if no watch event has queued it before.
const conflictRetry = time.Second

// pass is one reconciliation of one AppWrapper: the object, the status as
// last written (to skip writes that change nothing) and its parameters.
type pass struct {
	r    *Reconciler
	aw   *v1beta2.AppWrapper
	orig v1beta2.AppWrapperStatus
	p    Params
	log  logr.Logger
	// at is when the pass started: the lastTransitionTime of every
	// condition it flips.
	at metav1.Time
}

// Reconcile runs the handler of the AppWrapper's phase.
func (r *Reconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	res, err := r.reconcile(ctx, req)
	if err != nil && apierrors.IsConflict(err) {
		// Our copy was stale. The newer version's watch event usually
		// queues the AppWrapper again, so retrying now would only repeat
		// the conflict; but an update of the component status alone
		// queues nothing (statusOnlyComponents), so a retry after the
		// cache has caught up is kept as well.
		log.FromContext(ctx).V(1).Info("stale AppWrapper, waiting for the newer version", "error", err.Error())
		return ctrl.Result{RequeueAfter: conflictRetry}, nil
	}
	return res, err
}

func (r *Reconciler) reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	aw := &v1beta2.AppWrapper{}
	if err := r.client.Get(ctx, req.NamespacedName, aw); err != nil {
		if apierrors.IsNotFound(err) {
			r.forget(req.NamespacedName)
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("get AppWrapper %s: %w", req.NamespacedName, err)
	}
	// Another controller owns it (upstream's appwrapper_types.go).
	if aw.Spec.ManagedBy != nil && *aw.Spec.ManagedBy != v1beta2.ControllerName {
		return ctrl.Result{}, nil
	}
	p, problems := ParamsFor(aw, r.config.FaultTolerance)
	r.reportProblems(aw, problems)
	s := &pass{r: r, aw: aw, orig: *aw.Status.DeepCopy(), p: p, at: metav1.NewTime(r.now()),
		log: log.FromContext(ctx).WithValues("phase", string(aw.Status.Phase))}
	r.ensureComponentWatches(ctx, aw)

	if !aw.DeletionTimestamp.IsZero() {
		return s.terminating(ctx)
	}
	switch aw.Status.Phase {
	case v1beta2.AppWrapperEmpty:
		return s.empty(ctx)
	case v1beta2.AppWrapperSuspended:
		return s.suspended(ctx)
	case v1beta2.AppWrapperResuming:
		return s.resuming(ctx)
	case v1beta2.AppWrapperRunning:
		return s.reevaluateLater(s.running(ctx))
	case v1beta2.AppWrapperResetting:
		return s.resetting(ctx)
	case v1beta2.AppWrapperSuspending:
		return s.suspending(ctx)
	case v1beta2.AppWrapperFailed:
		return s.failed(ctx)
	case v1beta2.AppWrapperSucceeded:
		return s.succeeded(ctx)
	case v1beta2.AppWrapperTerminating:
		// Only reached with a deletionTimestamp, handled above; a phase
		// left behind without one (an undone deletion cannot happen, but a
		// hand-edited status can) has nothing to act on.
		return ctrl.Result{}, nil
	}
	s.log.Info("unknown phase; leaving the AppWrapper alone")
	return ctrl.Result{}, nil
}

// forget drops the bookkeeping kept for a deleted AppWrapper.
func (r *Reconciler) forget(key types.NamespacedName) {
	r.mu.Lock()
	delete(r.reported, key)
	r.mu.Unlock()
}

// reportProblems emits one Warning Event "InvalidAnnotation" naming every
// malformed annotation, once for each distinct set of problems (so an edit
// that introduces a new mistake is reported again, and a steady one is not
// repeated on every reconciliation). Upstream only logs them
// (docs/kubernetes.md, "The contract"); the default is used either way. One Event, not one
// per problem: the events API folds Events of the same object, reason and
// action into one series and keeps only the first note.
func (r *Reconciler) reportProblems(aw *v1beta2.AppWrapper, problems []string) {
	key := types.NamespacedName{Namespace: aw.Namespace, Name: aw.Name}
	joined := strings.Join(problems, "\n")
	r.mu.Lock()
	last, seen := r.reported[key]
	if joined != "" {
		r.reported[key] = joined
	} else {
		delete(r.reported, key)
	}
	r.mu.Unlock()
	if joined == "" || (seen && last == joined) {
		return
	}
	r.recorder.Eventf(aw, nil, corev1.EventTypeWarning, ReasonInvalidAnnotation, "Validate", "%s",
		truncate(fmt.Sprintf("%d malformed annotation(s), defaults used: %s", len(problems), strings.Join(problems, "; "))))
}

// save writes the status if it changed since it was read or last written.
func (s *pass) save(ctx context.Context) error {
	if equality.Semantic.DeepEqual(s.aw.Status, s.orig) {
		return nil
	}
	if err := s.r.client.Status().Update(ctx, s.aw); err != nil {
		return &statusWriteError{fmt.Errorf("update status of AppWrapper %s/%s: %w", s.aw.Namespace, s.aw.Name, err)}
	}
	s.orig = *s.aw.Status.DeepCopy()
	return nil
}

// statusWriteError is a failed status write: the pass ends with it,
// whatever it was doing.
type statusWriteError struct{ err error }

func (e *statusWriteError) Error() string { return e.err.Error() }
func (e *statusWriteError) Unwrap() error { return e.err }

// wait saves the status and asks to be run again after d: the remaining
// time of a grace period, measured from a condition's lastTransitionTime.
func (s *pass) wait(ctx context.Context, d time.Duration) (ctrl.Result, error) {
	if err := s.save(ctx); err != nil {
		return ctrl.Result{}, err
	}
	return ctrl.Result{RequeueAfter: max(d, time.Millisecond)}, nil
}

// done saves the status and waits for the next watch event.
func (s *pass) done(ctx context.Context) (ctrl.Result, error) {
	return ctrl.Result{}, s.save(ctx)
}

// ---- the phase handlers (docs/kubernetes.md, "The contract") ----

// empty fixes the effective pod sets of every component in
// status.componentStatus, so later spec edits do not change what is
// counted (upstream's pkg/utils/utils.go), and moves to Suspended.
func (s *pass) empty(ctx context.Context) (ctrl.Result, error) {
	statuses, err := initialComponentStatus(s.aw)
	if err != nil {
		// The admission webhook refuses such AppWrappers; without it, the
		// same error would come back on every retry, so fail it now.
		s.markUnhealthy(ReasonCreateFailed, err.Error())
		return s.transition(ctx, v1beta2.AppWrapperFailed, err.Error())
	}
	s.aw.Status.ComponentStatus = statuses
	return s.transition(ctx, v1beta2.AppWrapperSuspended, "component status initialised")
}

// suspended waits for admission (spec.suspend false), then takes the
// finalizer and reserves quota.
func (s *pass) suspended(ctx context.Context) (ctrl.Result, error) {
	if s.aw.Spec.Suspend {
		return ctrl.Result{}, nil
	}
	if controllerutil.AddFinalizer(s.aw, v1beta2.Finalizer) {
		// A real update before anything is created, so the resources
		// cannot outlive the AppWrapper. The response replaces s.aw; the
		// status is not touched by it.
		if err := s.r.client.Update(ctx, s.aw); err != nil {
			return ctrl.Result{}, fmt.Errorf("add finalizer to AppWrapper %s/%s: %w", s.aw.Namespace, s.aw.Name, err)
		}
		s.orig = *s.aw.Status.DeepCopy()
	}
	const msg = "Suspend is false"
	s.setCondition(v1beta2.QuotaReserved, true, ReasonResuming, msg)
	s.setCondition(v1beta2.ResourcesDeployed, true, ReasonResuming, msg)
	s.setCondition(v1beta2.PodsReady, false, ReasonResuming, "")
	s.setCondition(v1beta2.Unhealthy, false, ReasonResuming, "")
	return s.transition(ctx, v1beta2.AppWrapperResuming, "admitted")
}

// resuming creates the components. A fatal error fails the AppWrapper at
// once; any other is retried until AdmissionGracePeriod after
// ResourcesDeployed's transition (the start of Resuming), then counts as an
// unhealthy verdict.
func (s *pass) resuming(ctx context.Context) (ctrl.Result, error) {
	if s.aw.Spec.Suspend {
		s.upstreamEventReason(string(v1beta2.AppWrapperSuspending), "Externally suspended while in the Resuming phase")
		return s.transition(ctx, v1beta2.AppWrapperSuspending, "suspend requested while resuming")
	}
	fatal, err := s.createComponents(ctx)
	if err == nil {
		return s.transition(ctx, v1beta2.AppWrapperRunning, fmt.Sprintf("%d components created", len(s.aw.Spec.Components)))
	}
	var swe *statusWriteError
	if errors.As(err, &swe) {
		return ctrl.Result{}, err
	}
	msg := fmt.Sprintf("error creating components: %v", err)
	if !fatal {
		deadline := s.since(v1beta2.ResourcesDeployed).Add(s.p.AdmissionGracePeriod)
		if left := deadline.Sub(s.r.now()); left > 0 {
			s.log.Info("component creation failed; retrying within the admission grace period", "error", err.Error(), "left", left)
			// A short retry interval for a transient API error, bounded by
			// the grace period's end.
			return s.wait(ctx, min(left, time.Second))
		}
	}
	s.markUnhealthy(ReasonCreateFailed, msg)
	s.upstreamEvent(upstreamCreateFailed + msg)
	if fatal {
		return s.transition(ctx, v1beta2.AppWrapperFailed, "fatal: "+msg)
	}
	return s.resetOrFail(ctx, false, 1, ReasonCreateFailed+": "+msg)
}

// running gathers the facts of a Running workload, lets assess decide
// (assess.go) and applies the step. Suspension is decided before anything
// is read.
func (s *pass) running(ctx context.Context) (ctrl.Result, error) {
	f := facts{suspend: s.aw.Spec.Suspend, p: s.p, at: s.at.Time}
	if !f.suspend {
		comps, err := s.componentHealth(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		pods, err := s.listPods(ctx)
		if err != nil {
			return ctrl.Result{}, err
		}
		var noExecute map[string][]string
		if s.r.config.Autopilot.MonitorNodes {
			noExecute = s.r.nodes.snapshot()
		}
		f.comps, f.pods = comps, SummarizePods(pods, s.p, noExecute)
		f.expected = ExpectedPodCount(s.aw)
		// ft-launcher's quarantines are recorded before any decision, so
		// a reset decided below recreates the pods away from those hosts.
		if err := s.recordQuarantine(ctx, f.pods.QuarantinedHosts); err != nil {
			return ctrl.Result{}, err
		}
	}
	f.conditions = s.aw.Status.Conditions
	f.now = s.r.now()
	return s.apply(ctx, assess(f))
}

// apply carries out a step of assess: the conditions, Unhealthy, upstream's
// Event, then the phase change or the wait.
func (s *pass) apply(ctx context.Context, st step) (ctrl.Result, error) {
	for _, c := range st.conditions {
		s.setCondition(c.typ, c.status, c.reason, c.msg)
	}
	if st.unhealthyReason != "" {
		s.markUnhealthy(st.unhealthyReason, st.unhealthyMsg)
	}
	if st.upstreamNote != "" {
		s.upstreamEventReason(st.upstreamReason, st.upstreamNote)
	}
	switch st.act {
	case actSuspend:
		return s.transition(ctx, v1beta2.AppWrapperSuspending, st.why)
	case actFail:
		return s.transition(ctx, v1beta2.AppWrapperFailed, st.why)
	case actReset:
		return s.resetOrFail(ctx, st.terminal, st.inc, st.why)
	case actSucceed:
		return s.transition(ctx, v1beta2.AppWrapperSucceeded, st.why)
	case actWait:
		if st.detail != "" {
			s.log.V(1).Info("too few pods ready; waiting", "detail", st.detail, "left", st.wait, "timed", st.rule)
		}
		return s.wait(ctx, st.wait)
	case actDone:
		return s.done(ctx)
	}
	return ctrl.Result{}, fmt.Errorf("appwrapper %s/%s: unknown step %v", s.aw.Namespace, s.aw.Name, st.act)
}

// reevaluateLater bounds the wait of a pass that leaves the AppWrapper
// Running by Config.ReevaluatePeriod: the safety net for a watch event
// that never came. Events still queue the AppWrapper at once.
func (s *pass) reevaluateLater(res ctrl.Result, err error) (ctrl.Result, error) {
	period := s.r.config.ReevaluatePeriod.Duration
	if err != nil || period <= 0 || s.aw.Status.Phase != v1beta2.AppWrapperRunning {
		return res, err
	}
	if res.RequeueAfter == 0 || res.RequeueAfter > period {
		res.RequeueAfter = period
	}
	return res, nil
}

// resetting deletes everything, keeping the quota (QuotaReserved stays
// true), then pauses until RetryPausePeriod after Unhealthy's transition
// (the detection, so a slow deletion eats the pause) and resumes.
func (s *pass) resetting(ctx context.Context) (ctrl.Result, error) {
	if s.aw.Spec.Suspend {
		// Suspension wins over a reset in progress.
		s.upstreamEventReason(string(v1beta2.AppWrapperSuspending), "Externally suspended while in the Resetting phase")
		return s.transition(ctx, v1beta2.AppWrapperSuspending, "suspend requested while resetting")
	}
	s.setCondition(v1beta2.PodsReady, false, ReasonResetting, "")
	if meta.IsStatusConditionTrue(s.aw.Status.Conditions, string(v1beta2.ResourcesDeployed)) {
		gone, left, err := s.deleteComponents(ctx)
		if err != nil || !gone {
			return s.afterDelete(ctx, left, err)
		}
		s.setCondition(v1beta2.ResourcesDeployed, false, ReasonResetting, "Resources deleted for the reset")
	}
	deadline := s.since(v1beta2.Unhealthy).Add(s.p.RetryPausePeriod)
	if left := deadline.Sub(s.r.now()); left > 0 {
		return s.wait(ctx, left)
	}
	s.setCondition(v1beta2.ResourcesDeployed, true, ReasonResuming, "Reset complete; resuming")
	// transition adds the retries used.
	return s.transition(ctx, v1beta2.AppWrapperResuming, "reset complete")
}

// suspending finishes deleting whatever the suspend bit says now, then
// releases the quota.
func (s *pass) suspending(ctx context.Context) (ctrl.Result, error) {
	const msg = "Suspend is true"
	if meta.IsStatusConditionTrue(s.aw.Status.Conditions, string(v1beta2.ResourcesDeployed)) {
		gone, left, err := s.deleteComponents(ctx)
		if err != nil || !gone {
			return s.afterDelete(ctx, left, err)
		}
		s.setCondition(v1beta2.ResourcesDeployed, false, ReasonSuspended, msg)
	}
	s.setCondition(v1beta2.QuotaReserved, false, ReasonSuspended, msg)
	s.setCondition(v1beta2.PodsReady, false, ReasonSuspended, "")
	s.setCondition(v1beta2.Unhealthy, false, ReasonSuspended, "")
	return s.transition(ctx, v1beta2.AppWrapperSuspended, "resources deleted, quota released")
}

// failed optionally holds the resources for DeletionOnFailureGracePeriod
// (for debugging; a suspension cuts it short), then deletes them and
// releases the quota.
func (s *pass) failed(ctx context.Context) (ctrl.Result, error) {
	deployed := meta.IsStatusConditionTrue(s.aw.Status.Conditions, string(v1beta2.ResourcesDeployed))
	delay := s.p.DeletionOnFailureGracePeriod
	if deployed && delay > 0 && !s.aw.Spec.Suspend && !s.deletionStarted() {
		c := meta.FindStatusCondition(s.aw.Status.Conditions, string(v1beta2.DeletingResources))
		if c == nil || c.Reason != ReasonDeletionPaused {
			// The hold starts now. Upstream keeps an older
			// lastTransitionTime when the condition is already False
			// from an earlier reset, shortening the hold
			// (docs/kubernetes.md, "What it does better than the
			// upstream controller"); dropping the condition first
			// gives a fresh one.
			meta.RemoveStatusCondition(&s.aw.Status.Conditions, string(v1beta2.DeletingResources))
		}
		s.setCondition(v1beta2.DeletingResources, false, ReasonDeletionPaused,
			fmt.Sprintf("%s is %v", v1beta2.DeletionOnFailureGracePeriodAnnotation, delay))
		deadline := s.since(v1beta2.DeletingResources).Add(delay)
		if left := deadline.Sub(s.r.now()); left > 0 {
			return s.wait(ctx, left)
		}
	}
	if deployed {
		gone, left, err := s.deleteComponents(ctx)
		if err != nil || !gone {
			return s.afterDelete(ctx, left, err)
		}
		msg := "Resources deleted for the failed AppWrapper"
		if delay > 0 && s.aw.Spec.Suspend {
			msg = "Kueue forced resource deletion by suspending AppWrapper"
		}
		s.setCondition(v1beta2.ResourcesDeployed, false, ReasonFailed, msg)
	}
	s.setCondition(v1beta2.QuotaReserved, false, ReasonFailed, "No resources deployed")
	return s.done(ctx)
}

// deletionStarted reports whether deleteComponents has run since the last
// completed deletion, which ends a DeletionOnFailure hold for good.
func (s *pass) deletionStarted() bool {
	c := meta.FindStatusCondition(s.aw.Status.Conditions, string(v1beta2.DeletingResources))
	return c != nil && c.Status == "True"
}

// succeeded deletes the resources SuccessTTL after ResourcesDeployed's
// transition. That is deploy time, not success time (upstream's docs say
// success time; its code uses deploy time), kept for compatibility.
func (s *pass) succeeded(ctx context.Context) (ctrl.Result, error) {
	if !meta.IsStatusConditionTrue(s.aw.Status.Conditions, string(v1beta2.ResourcesDeployed)) {
		return ctrl.Result{}, nil
	}
	deadline := s.since(v1beta2.ResourcesDeployed).Add(s.p.SuccessTTL)
	if left := deadline.Sub(s.r.now()); left > 0 {
		return s.wait(ctx, left)
	}
	gone, left, err := s.deleteComponents(ctx)
	if err != nil || !gone {
		return s.afterDelete(ctx, left, err)
	}
	s.setCondition(v1beta2.ResourcesDeployed, false, ReasonSucceeded,
		fmt.Sprintf("Resources deleted %v after deployment (successTTL)", s.p.SuccessTTL))
	return s.done(ctx)
}

// terminating deletes the resources of an AppWrapper being deleted, then
// lets it go by removing the finalizer.
func (s *pass) terminating(ctx context.Context) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(s.aw, v1beta2.Finalizer) {
		return ctrl.Result{}, nil
	}
	if meta.IsStatusConditionTrue(s.aw.Status.Conditions, string(v1beta2.ResourcesDeployed)) {
		gone, left, err := s.deleteComponents(ctx)
		if err != nil || !gone {
			if s.aw.Status.Phase != v1beta2.AppWrapperTerminating {
				if _, terr := s.transition(ctx, v1beta2.AppWrapperTerminating, "AppWrapper deleted; deleting its resources"); terr != nil {
					return ctrl.Result{}, terr
				}
			}
			return s.afterDelete(ctx, left, err)
		}
	}
	const msg = "AppWrapper deleted"
	s.setCondition(v1beta2.ResourcesDeployed, false, ReasonTerminating, msg)
	s.setCondition(v1beta2.QuotaReserved, false, ReasonTerminating, msg)
	if err := s.save(ctx); err != nil {
		return ctrl.Result{}, err
	}
	if controllerutil.RemoveFinalizer(s.aw, v1beta2.Finalizer) {
		if err := s.r.client.Update(ctx, s.aw); err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, fmt.Errorf("remove finalizer of AppWrapper %s/%s: %w", s.aw.Namespace, s.aw.Name, err)
		}
	}
	return ctrl.Result{}, nil
}

// afterDelete saves the progress of an unfinished deletion. The watches on
// pods and components bring the AppWrapper back as things go away; left is
// the time until forced deletion starts, the one timer involved.
func (s *pass) afterDelete(ctx context.Context, left time.Duration, err error) (ctrl.Result, error) {
	if serr := s.save(ctx); serr != nil {
		return ctrl.Result{}, serr
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if left > 0 {
		return ctrl.Result{RequeueAfter: left}, nil
	}
	return ctrl.Result{}, nil
}
