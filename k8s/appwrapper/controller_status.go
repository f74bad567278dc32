package appwrapper

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Condition reasons. All but ReasonNoRestartVerdict and
// ReasonInvalidAnnotation are upstream's vocabulary (upstream's appwrapper_types.go and
// appwrapper_controller.go), kept so that tools written for it read ours.
const (
	// Unhealthy=True.
	ReasonCreateFailed          = "CreateFailed"
	ReasonMissingComponent      = "MissingComponent"
	ReasonFailedComponent       = "FailedComponent"
	ReasonFoundFailedPods       = "FoundFailedPods"
	ReasonAutopilotNoExecute    = "AutopilotNoExecute"
	ReasonInsufficientPodsReady = "InsufficientPodsReady"
	// ReasonNoRestartVerdict (ours): a pod's ft-launcher verdict was
	// no_restart; the AppWrapper fails without grace or retry.
	ReasonNoRestartVerdict = "NoRestartVerdict"

	// Unhealthy=False.
	ReasonFoundNoFailedPods = "FoundNoFailedPods"

	// Phase-named reasons, on QuotaReserved, ResourcesDeployed, PodsReady
	// and Unhealthy.
	ReasonResuming    = "Resuming"
	ReasonResetting   = "Resetting"
	ReasonSuspended   = "Suspended"
	ReasonSucceeded   = "Succeeded"
	ReasonFailed      = "Failed"
	ReasonTerminating = "Terminating"

	// PodsReady.
	ReasonSufficientPodsReady = "SufficientPodsReady"

	// DeletingResources.
	ReasonDeletionInitiated = "DeletionInitiated"
	ReasonDeletionComplete  = "DeletionComplete"
	ReasonDeletionPaused    = "DeletionPaused"

	// The per-component ResourcesDeployed condition.
	ReasonComponentCreationInitiated   = "ComponentCreationInitiated"
	ReasonComponentCreatedSuccessfully = "ComponentCreatedSuccessfully"
	ReasonComponentCreationErrored     = "ComponentCreationErrored"
	// ReasonComponentDeleted keeps upstream's misspelling: the reason is
	// part of the status API that Kueue-side tooling and dashboards match
	// on, and an AppWrapper moved between the two controllers must keep
	// meaning the same thing.
	ReasonComponentDeleted = "CompononetDeleted"

	// Events only.
	ReasonUnhealthy         = "Unhealthy"
	ReasonInvalidAnnotation = "InvalidAnnotation"
	// ReasonAvoidNodes: hosts quarantined by ft-launcher were recorded in
	// AvoidNodesAnnotation.
	ReasonAvoidNodes = "AvoidNodes"
	// ReasonLostPodsForced (ours): during a deletion, pods of a dead node
	// were deleted with grace 0 before ForcefulDeletionGracePeriod.
	ReasonLostPodsForced = "LostPodsForced"
)

const noRestartKind = verdict.NoRestart

// setCondition sets an AppWrapper condition. As with every condition here,
// lastTransitionTime moves only when the status flips, which is what makes
// it usable as the start of a grace period (upstream's appwrapper_types.go).
func (s *pass) setCondition(t v1beta2.AppWrapperCondition, status bool, reason, msg string) {
	meta.SetStatusCondition(&s.aw.Status.Conditions, metav1.Condition{
		Type:               string(t),
		Status:             conditionStatus(status),
		Reason:             reason,
		Message:            msg,
		ObservedGeneration: s.aw.Generation,
		// One time for every condition a pass flips, so that the order of
		// the writes within a pass cannot put one a second after another
		// (the shortfall rule compares PodsReady's and ResourcesDeployed's).
		LastTransitionTime: s.at,
	})
}

func conditionStatus(b bool) metav1.ConditionStatus {
	if b {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// since is the lastTransitionTime of condition t, the clock of every grace
// period; a missing condition counts as starting now.
func (s *pass) since(t v1beta2.AppWrapperCondition) metav1.Time {
	if c := meta.FindStatusCondition(s.aw.Status.Conditions, string(t)); c != nil && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime
	}
	return metav1.NewTime(s.r.now())
}

// markUnhealthy sets Unhealthy=True and, when the reason is new, emits the
// Normal Event "Unhealthy" upstream emits (docs/kubernetes.md, "Events"); repeating it
// on every pass of a grace period would only bury the others.
func (s *pass) markUnhealthy(reason, msg string) {
	c := meta.FindStatusCondition(s.aw.Status.Conditions, string(v1beta2.Unhealthy))
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != reason {
		note := reason
		if msg != "" {
			note += ": " + msg
		}
		s.r.recorder.Eventf(s.aw, nil, corev1.EventTypeNormal, ReasonUnhealthy, "Evaluate", "%s", truncate(note))
	}
	s.setCondition(v1beta2.Unhealthy, true, reason, msg)
}

// transition writes the new phase with the status built so far, counts it
// and records it as an Event whose reason is the phase entered and whose
// note says why and how many retries were spent. The Event is emitted after
// the write, so it refers to the new resourceVersion: the events API folds
// Events whose object reference, reason and action are equal into one
// series with the first note, and the version keeps two resets' Events
// (attempt 1, attempt 2) apart.
func (s *pass) transition(ctx context.Context, to v1beta2.AppWrapperPhase, why string) (ctrl.Result, error) {
	from := s.aw.Status.Phase
	s.aw.Status.Phase = to
	if err := s.save(ctx); err != nil {
		s.aw.Status.Phase = from
		return ctrl.Result{}, err
	}
	s.r.phases.WithLabelValues(s.aw.Namespace, string(to)).Inc()
	typ := corev1.EventTypeNormal
	if to == v1beta2.AppWrapperFailed || to == v1beta2.AppWrapperResetting {
		typ = corev1.EventTypeWarning
	}
	fromName := string(from)
	if fromName == "" {
		fromName = "Empty"
	}
	note := fmt.Sprintf("%s -> %s: %s", fromName, to, why)
	if to != v1beta2.AppWrapperResetting {
		note += fmt.Sprintf(" (retries used %d of %d)", s.aw.Status.Retries, s.p.RetryLimit)
	}
	s.r.recorder.Eventf(s.aw, nil, typ, string(to), "Transition", "%s", truncate(note))
	s.log.Info("phase transition", "from", fromName, "to", string(to), "why", why, "retries", s.aw.Status.Retries)
	return ctrl.Result{}, nil
}

// resetOrFail is the one retry decision (docs/kubernetes.md, "The contract"): reset when the
// failure is not terminal and the retries spent so far, compared before
// adding inc, are below the limit; fail otherwise. inc is 0 for an
// Autopilot migration, which is still refused once the limit is reached.
func (s *pass) resetOrFail(ctx context.Context, terminal bool, inc int32, cause string) (ctrl.Result, error) {
	limit := s.p.RetryLimit
	if !terminal && s.aw.Status.Retries < limit {
		s.aw.Status.Retries += inc
		why := fmt.Sprintf("attempt %d of %d: %s", s.aw.Status.Retries, limit, cause)
		if inc == 0 {
			why = fmt.Sprintf("uncounted reset (retries used %d of %d): %s", s.aw.Status.Retries, limit, cause)
		}
		return s.transition(ctx, v1beta2.AppWrapperResetting, why)
	}
	why := fmt.Sprintf("retry limit reached (%d of %d used): %s", s.aw.Status.Retries, limit, cause)
	if terminal {
		why = "terminal failure, not retried: " + cause
	}
	return s.transition(ctx, v1beta2.AppWrapperFailed, why)
}

// truncate keeps an Event note within the 1 KiB the events API accepts.
func truncate(s string) string {
	const limit = 1000
	if len(s) <= limit {
		return s
	}
	return s[:limit-3] + "..."
}

// UpstreamEventSource is the source.component of the Events written in
// upstream's form (the recorder name of project-codeflare/appwrapper 1.2.1,
// pkg/controller/setup.go), so alerts and event exporters written for it
// match ours unchanged.
const UpstreamEventSource = "appwrappers"

// The note prefixes of upstream's Unhealthy Events (all type Normal,
// reason "Unhealthy", through the core/v1 Events API).
const (
	upstreamCreateFailed          = "CreateFailed: "
	upstreamMissingComponent      = "MissingComponent: "
	upstreamFailedComponent       = "FailedComponent: "
	upstreamInsufficientPodsReady = "InsufficientPodsReady: "
)

// upstreamEvent emits, in addition to our own Events, the Normal Event
// "Unhealthy" that upstream emits at the same decision with the same
// message (appwrapper_controller.go, Running and Resuming phases): a core/v1
// Event from component "appwrappers". Ours are events.k8s.io/v1 Events from
// "appwrapper", with more detail and at detection time; tooling written for
// upstream matches these.
func (s *pass) upstreamEvent(msg string) {
	s.upstreamEventReason(ReasonUnhealthy, msg)
}

// upstreamEventReason is upstreamEvent with another reason (upstream's
// "Suspending" Events).
func (s *pass) upstreamEventReason(reason, msg string) {
	if s.r.upstream == nil {
		return
	}
	s.r.upstream.Event(s.aw, corev1.EventTypeNormal, reason, msg)
}
