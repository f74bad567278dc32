package appwrapper

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// This file is the Running phase's health decision, kept apart from the
// reconcile loop as jobset keeps its failure policy (failure_policy.go)
// beside its reconciler: the reconciler gathers the facts (running, in
// controller.go), assess decides, and the reconciler applies the step. The
// decision reads no API server and no clock, so every rung of the ladder is
// table-tested (assess_test.go).

// facts is what one Running pass observed, all assess needs.
type facts struct {
	// suspend is spec.suspend. When set, the other observations are not
	// gathered (rung 1 comes first).
	suspend bool
	// comps is the health of the components (componentHealth).
	comps componentHealthSummary
	// pods is the summary of the workload's pods (SummarizePods).
	pods PodSummary
	// expected is the number of pods the pod sets promise
	// (ExpectedPodCount).
	expected int32
	// conditions are the AppWrapper's status conditions as read; their
	// lastTransitionTimes are the clocks of the grace periods.
	conditions []metav1.Condition
	// at is when the pass started: the lastTransitionTime of every
	// condition it flips. now is the clock when the facts were gathered.
	at, now time.Time
	// p is the AppWrapper's fault-tolerance parameters.
	p Params
}

// action is what the reconciler does with the AppWrapper after a step.
type action int

const (
	// actSuspend moves to Suspending.
	actSuspend action = iota
	// actFail moves to Failed, with no grace and no retry.
	actFail
	// actReset is the retry decision (resetOrFail): Resetting while
	// retries are left and the failure is not terminal, Failed otherwise.
	actReset
	// actSucceed moves to Succeeded.
	actSucceed
	// actWait stays Running and comes back after step.wait.
	actWait
	// actDone stays Running and waits for the next event (or the periodic
	// pass).
	actDone
)

func (a action) String() string {
	switch a {
	case actSuspend:
		return "suspend"
	case actFail:
		return "fail"
	case actReset:
		return "reset"
	case actSucceed:
		return "succeed"
	case actWait:
		return "wait"
	case actDone:
		return "done"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// condition is one status condition a step sets.
type condition struct {
	typ    v1beta2.AppWrapperCondition
	status bool
	reason string
	msg    string
}

// step is the decision of one Running pass, applied in this order:
// conditions set, Unhealthy marked, upstream's Event emitted, then the
// action.
type step struct {
	act action
	// why is the transition's cause (actSuspend, actFail, actSucceed) or
	// the cause handed to the retry decision (actReset).
	why string
	// terminal and inc are the retry decision's arguments (actReset): a
	// terminal failure is not retried; inc is what the reset costs (0 for
	// an Autopilot migration).
	terminal bool
	inc      int32
	// conditions are set first, in order.
	conditions []condition
	// unhealthyReason, when set, marks Unhealthy=True with
	// unhealthyMsg (with our Event when the reason is new).
	unhealthyReason, unhealthyMsg string
	// upstreamReason and upstreamNote, when the note is set, are the Event
	// upstream emits at this decision, in its form.
	upstreamReason, upstreamNote string
	// wait is how long to wait (actWait).
	wait time.Duration
	// detail and rule say, for the log, what a shortfall wait waits for
	// and from when it is timed.
	detail, rule string
}

// assess evaluates a Running workload's health in the order of upstream's
// Running phase (docs/kubernetes.md, "The contract"; upstream
// appwrapper_controller.go), with two additions marked below: a component
// is "missing" only when an uncached read agrees (gathered by
// componentHealth), and an ft-launcher no_restart verdict fails the
// workload at once.
func assess(f facts) step {
	// 1. Suspension.
	if f.suspend {
		return step{act: actSuspend, why: "suspend requested while running",
			upstreamReason: string(v1beta2.AppWrapperSuspending), upstreamNote: "Externally suspended while in the Running phase"}
	}
	comps, sum := f.comps, f.pods
	// (2, gathering the facts, is the reconciler's.)

	// 3. A component deleted by someone else: Failed, no grace, no retry.
	if comps.deployed != comps.expected {
		msg := fmt.Sprintf("Only found %d deployed components, but was expecting %d (missing: %s)",
			comps.deployed, comps.expected, strings.Join(comps.missing, ", "))
		return step{act: actFail, why: ReasonMissingComponent + ": " + msg,
			unhealthyReason: ReasonMissingComponent, unhealthyMsg: msg,
			upstreamReason: ReasonUnhealthy,
			upstreamNote:   fmt.Sprintf("%sOnly found %v deployed components, but was expecting %v", upstreamMissingComponent, comps.deployed, comps.expected)}
	}
	// 3a (ours). A launcher said the workload must not be restarted
	// (verdict no_restart, e.g. a rank's ShutdownWorkload or exit 93):
	// neither FailureGracePeriod nor retries apply. It comes before the
	// failed-component check, which would otherwise reset a Job that the
	// same failure failed.
	if sum.NoRestart {
		msg := noRestartMessage(sum)
		return step{act: actFail, why: ReasonNoRestartVerdict + ": " + msg,
			unhealthyReason: ReasonNoRestartVerdict, unhealthyMsg: msg}
	}
	// 4. A component its own controller declared failed: no grace. A Job
	// declared failing (FailureTarget, ours) counts once a failed pod is
	// seen: the pod cache may lag the Job's, and rung 3 must have read the
	// failed pod's verdict before a reset (a Job that failed on a
	// deadline, with no failed pod, waits for its Failed condition).
	failed := comps.failed
	if sum.Failed > 0 {
		failed += comps.failing
	}
	if failed > 0 {
		msg := fmt.Sprintf("Found %d failed components: %s", failed, strings.Join(comps.failedNames, ", "))
		return step{act: actReset, terminal: sum.TerminalFailure, inc: 1, why: ReasonFailedComponent + ": " + msg + launcherVerdicts(sum),
			unhealthyReason: ReasonFailedComponent, unhealthyMsg: msg,
			upstreamReason: ReasonUnhealthy,
			upstreamNote:   fmt.Sprintf("%sFound %v failed components", upstreamFailedComponent, failed)}
	}
	// 5. Success (checked before failed pods).
	if sum.Succeeded >= f.expected && sum.Pending+sum.Running+sum.Failed == 0 {
		msg := fmt.Sprintf("%d pods succeeded; none pending, running or failed", sum.Succeeded)
		return step{act: actSucceed, why: msg, conditions: []condition{
			{v1beta2.QuotaReserved, false, ReasonSucceeded, msg},
			{v1beta2.ResourcesDeployed, true, ReasonSucceeded, msg},
		}}
	}
	// 6. Failed pods: FailureGracePeriod from Unhealthy's transition. The
	// message stays empty so that it says nothing stale while waiting.
	if sum.Failed > 0 {
		st := step{unhealthyReason: ReasonFoundFailedPods}
		deadline := flippedAt(f, v1beta2.Unhealthy, true).Add(f.p.FailureGracePeriod)
		if left := deadline.Sub(f.now); left > 0 {
			st.act, st.wait = actWait, left
			return st
		}
		cause := fmt.Sprintf("%s: %d failed pods", ReasonFoundFailedPods, sum.Failed)
		// Upstream's Event comes at the decision, not at detection.
		st.upstreamReason, st.upstreamNote = ReasonUnhealthy, cause
		if sum.TerminalFailure && sum.TerminalReason != "" {
			cause += " (terminal: " + sum.TerminalReason + ")"
		}
		st.act, st.terminal, st.inc, st.why = actReset, sum.TerminalFailure, 1, cause+launcherVerdicts(sum)
		return st
	}
	// 7. Autopilot flagged a node a running pod uses: migrate at once, not
	// counted as a retry but still bounded by the retry limit (upstream's
	// docs/fault-tolerance.md, "Autopilot").
	if len(sum.NoExecuteNodes) > 0 {
		msg := "Workload contains pods using NoExecute resources on Nodes: " + strings.Join(sum.NoExecuteNodes, ", ")
		return step{act: actReset, inc: 0, why: ReasonAutopilotNoExecute + ": " + msg,
			unhealthyReason: ReasonAutopilotNoExecute, unhealthyMsg: msg,
			// Upstream's note has no reason prefix and prints the node
			// list as a Go slice.
			upstreamReason: ReasonUnhealthy,
			upstreamNote:   fmt.Sprintf("Workload contains pods using NoExecute resources on Nodes: %v", sum.NoExecuteNodes)}
	}
	// 8. Healthy.
	healthy := condition{v1beta2.Unhealthy, false, ReasonFoundNoFailedPods, ""}
	// 9. Enough pods. Pod, component and node events bring the
	// AppWrapper back; the reconciler adds the periodic safety net.
	if sum.Running+sum.Succeeded >= f.expected {
		return step{act: actDone, conditions: []condition{healthy,
			{v1beta2.PodsReady, true, ReasonSufficientPodsReady, fmt.Sprintf("%d pods running; %d pods succeeded", sum.Running, sum.Succeeded)}}}
	}
	// 10. Too few: Warmup grace when every pod exists, Admission grace
	// otherwise, both from ResourcesDeployed's transition, as upstream.
	// Ours: once the workload has been ready, a shortfall (a pod evicted,
	// drained, preempted or deleted, and its replacement not yet running)
	// also gets FailureGracePeriod from PodsReady turning False, and the
	// later deadline wins. Upstream times it from deploy time only, so
	// after warmup any dip its sample catches resets at once
	// (docs/kubernetes.md, "A pod short after the workload was ready").
	detail := fmt.Sprintf("%d pods pending; %d pods running; %d pods succeeded", sum.Pending, sum.Running, sum.Succeeded)
	wasReady := meta.IsStatusConditionTrue(f.conditions, string(v1beta2.PodsReady))
	st := step{conditions: []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, detail}}, detail: detail}
	grace := f.p.AdmissionGracePeriod
	if sum.Pending+sum.Running+sum.Succeeded >= f.expected {
		grace = f.p.WarmupGracePeriod
	}
	deployed := sinceCondition(f, v1beta2.ResourcesDeployed)
	deadline := deployed.Add(grace)
	st.rule = "from deployment"
	if notReady := flippedAt(f, v1beta2.PodsReady, false); wasReady || notReady.After(deployed) {
		// PodsReady turned False after this deployment began, which only
		// the True -> False flip of a pass like this one does: the
		// suspended and resetting handlers write it False no later than
		// ResourcesDeployed's transition to True.
		if d := notReady.Add(f.p.FailureGracePeriod); d.After(deadline) {
			deadline, st.rule = d, "from PodsReady turning False"
		}
	}
	if left := deadline.Sub(f.now); left > 0 {
		st.act, st.wait = actWait, left
		return st
	}
	st.unhealthyReason, st.unhealthyMsg = ReasonInsufficientPodsReady, detail
	st.upstreamReason, st.upstreamNote = ReasonUnhealthy, upstreamInsufficientPodsReady+detail
	st.act, st.terminal, st.inc = actReset, sum.TerminalFailure, 1
	st.why = ReasonInsufficientPodsReady + ": " + detail + " (timed " + st.rule + ")"
	return st
}

// sinceCondition is the lastTransitionTime of condition t as read, the
// clock of a grace period; a missing one counts as starting now (pass.since).
func sinceCondition(f facts, t v1beta2.AppWrapperCondition) time.Time {
	if c := meta.FindStatusCondition(f.conditions, string(t)); c != nil && !c.LastTransitionTime.IsZero() {
		return c.LastTransitionTime.Time
	}
	return f.now
}

// flippedAt is the lastTransitionTime condition t has once this pass sets
// it to status: unchanged when it already has that status (a condition
// moves only when it flips), the pass's start otherwise.
func flippedAt(f facts, t v1beta2.AppWrapperCondition, status bool) time.Time {
	c := meta.FindStatusCondition(f.conditions, string(t))
	if c != nil && c.Status == conditionStatus(status) {
		return sinceCondition(f, t)
	}
	return f.at
}

// launcherVerdicts (ours) is what the failed pods' ft-launchers said in
// their termination messages ("; ft-launcher: pod w-0 on n1:
// restart_budget_exhausted: ..."), for the reset's Event and log: why the
// pods failed, not just how many. Empty when no launcher left a verdict.
func launcherVerdicts(sum PodSummary) string {
	var parts []string
	for _, v := range sum.Verdicts {
		if v.Verdict.Kind == verdict.Succeeded {
			continue
		}
		part := "pod " + v.Pod
		if v.Node != "" {
			part += " on " + v.Node
		}
		part += ": " + string(v.Verdict.Kind)
		if v.Verdict.Reason != "" {
			part += ": " + v.Verdict.Reason
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return ""
	}
	return "; ft-launcher: " + strings.Join(parts, "; ")
}

// noRestartMessage names the pods whose verdict was no_restart.
func noRestartMessage(sum PodSummary) string {
	var parts []string
	for _, v := range sum.Verdicts {
		if v.Verdict.Kind != noRestartKind {
			continue
		}
		part := "pod " + v.Pod
		if v.Node != "" {
			part += " on " + v.Node
		}
		if v.Verdict.Reason != "" {
			part += ": " + v.Verdict.Reason
		}
		parts = append(parts, part)
	}
	if len(parts) == 0 {
		return "an ft-launcher verdict asked not to restart the workload"
	}
	return "ft-launcher verdict no_restart: " + strings.Join(parts, "; ")
}
