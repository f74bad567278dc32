package appwrapper

import (
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestAssess walks every rung of the Running ladder with the facts a pass
// gathers, and checks the step: the action, its cause, the retry
// arguments, the conditions, Unhealthy, upstream's Event and the wait. No
// API server: the reconciler tests (envtest) check that the steps are
// applied.
func TestAssess(t *testing.T) {
	at := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	now := at.Add(10 * time.Millisecond)
	p := Params{
		AdmissionGracePeriod: time.Minute,
		WarmupGracePeriod:    5 * time.Minute,
		FailureGracePeriod:   time.Minute,
		RetryLimit:           3,
	}
	cond := func(typ v1beta2.AppWrapperCondition, status bool, ago time.Duration) metav1.Condition {
		return metav1.Condition{Type: string(typ), Status: conditionStatus(status), Reason: "r",
			LastTransitionTime: metav1.NewTime(at.Add(-ago))}
	}
	twoComps := componentHealthSummary{expected: 2, deployed: 2}
	running := func(n int32) PodSummary { return PodSummary{Running: n} }
	healthy := condition{v1beta2.Unhealthy, false, ReasonFoundNoFailedPods, ""}
	noRestart := PodSummary{Running: 3, Failed: 1, NoRestart: true, TerminalFailure: true,
		Verdicts: []PodVerdict{{Pod: "w-1", Node: "n1", Verdict: verdict.Verdict{Kind: verdict.NoRestart, Reason: "ShutdownWorkload"}}}}

	for _, tc := range []struct {
		name string
		f    facts
		want step
	}{{
		name: "1 suspension first, even with a component missing",
		f:    facts{suspend: true, comps: componentHealthSummary{expected: 2, deployed: 1}},
		want: step{act: actSuspend, why: "suspend requested while running",
			upstreamReason: "Suspending", upstreamNote: "Externally suspended while in the Running phase"},
	}, {
		name: "3 a missing component fails without grace, before a no_restart verdict",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 1, missing: []string{"Job j"}},
			pods: noRestart, expected: 4},
		want: step{act: actFail,
			why:             "MissingComponent: Only found 1 deployed components, but was expecting 2 (missing: Job j)",
			unhealthyReason: ReasonMissingComponent, unhealthyMsg: "Only found 1 deployed components, but was expecting 2 (missing: Job j)",
			upstreamReason: ReasonUnhealthy, upstreamNote: "MissingComponent: Only found 1 deployed components, but was expecting 2"},
	}, {
		name: "3a a no_restart verdict fails at once, before a failed component",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 2, failed: 1, failedNames: []string{"Job j"}},
			pods: noRestart, expected: 4},
		want: step{act: actFail,
			why:             "NoRestartVerdict: ft-launcher verdict no_restart: pod w-1 on n1: ShutdownWorkload",
			unhealthyReason: ReasonNoRestartVerdict, unhealthyMsg: "ft-launcher verdict no_restart: pod w-1 on n1: ShutdownWorkload"},
	}, {
		name: "3a a no_restart verdict fails at once, before a failing Job",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 2, failing: 1, failedNames: []string{"Job j"}},
			pods: noRestart, expected: 4},
		want: step{act: actFail,
			why:             "NoRestartVerdict: ft-launcher verdict no_restart: pod w-1 on n1: ShutdownWorkload",
			unhealthyReason: ReasonNoRestartVerdict, unhealthyMsg: "ft-launcher verdict no_restart: pod w-1 on n1: ShutdownWorkload"},
	}, {
		name: "4 a failing Job (FailureTarget) resets without grace once its failed pod is seen",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 2, failing: 1, failedNames: []string{"Job j"}},
			pods: PodSummary{Running: 3, Failed: 1}, expected: 4, p: p},
		want: step{act: actReset, inc: 1, why: "FailedComponent: Found 1 failed components: Job j",
			unhealthyReason: ReasonFailedComponent, unhealthyMsg: "Found 1 failed components: Job j",
			upstreamReason: ReasonUnhealthy, upstreamNote: "FailedComponent: Found 1 failed components"},
	}, {
		name: "4 a failing Job whose failed pod is not seen yet (or with none: a deadline) waits",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 2, failing: 1, failedNames: []string{"Job j"}},
			pods: running(4), expected: 4, p: p},
		want: step{act: actDone, conditions: []condition{
			{v1beta2.Unhealthy, false, ReasonFoundNoFailedPods, ""}, {v1beta2.PodsReady, true, ReasonSufficientPodsReady, "4 pods running; 0 pods succeeded"}}},
	}, {
		name: "4 a failed component resets without grace, terminal passed on",
		f: facts{comps: componentHealthSummary{expected: 2, deployed: 2, failed: 1, failedNames: []string{"Job j"}},
			pods: PodSummary{Failed: 1, TerminalFailure: true}, expected: 4, p: p},
		want: step{act: actReset, terminal: true, inc: 1, why: "FailedComponent: Found 1 failed components: Job j",
			unhealthyReason: ReasonFailedComponent, unhealthyMsg: "Found 1 failed components: Job j",
			upstreamReason: ReasonUnhealthy, upstreamNote: "FailedComponent: Found 1 failed components"},
	}, {
		name: "5 success when every pod succeeded and none is left",
		f:    facts{comps: twoComps, pods: PodSummary{Succeeded: 4}, expected: 4},
		want: step{act: actSucceed, why: "4 pods succeeded; none pending, running or failed", conditions: []condition{
			{v1beta2.QuotaReserved, false, ReasonSucceeded, "4 pods succeeded; none pending, running or failed"},
			{v1beta2.ResourcesDeployed, true, ReasonSucceeded, "4 pods succeeded; none pending, running or failed"}}},
	}, {
		name: "6 failed pods first seen: the whole failure grace from now",
		f: facts{comps: twoComps, pods: PodSummary{Running: 3, Failed: 1}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.Unhealthy, false, time.Hour)}},
		want: step{act: actWait, wait: time.Minute - 10*time.Millisecond, unhealthyReason: ReasonFoundFailedPods},
	}, {
		name: "6 failed pods seen before: the grace runs from Unhealthy's transition",
		f: facts{comps: twoComps, pods: PodSummary{Running: 3, Failed: 1}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.Unhealthy, true, 40*time.Second)}},
		want: step{act: actWait, wait: 20*time.Second - 10*time.Millisecond, unhealthyReason: ReasonFoundFailedPods},
	}, {
		name: "6 failed pods past the grace reset, with the terminal reason",
		f: facts{comps: twoComps, pods: PodSummary{Running: 3, Failed: 1, TerminalFailure: true, TerminalReason: "pod w-0 exited 42"},
			expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.Unhealthy, true, 2*time.Minute)}},
		want: step{act: actReset, terminal: true, inc: 1, why: "FoundFailedPods: 1 failed pods (terminal: pod w-0 exited 42)",
			unhealthyReason: ReasonFoundFailedPods, upstreamReason: ReasonUnhealthy, upstreamNote: "FoundFailedPods: 1 failed pods"},
	}, {
		name: "6 the reset names what the failed pods' launchers said",
		f: facts{comps: twoComps, pods: PodSummary{Running: 3, Failed: 1, Succeeded: 1, Verdicts: []PodVerdict{
			{Pod: "w-0", Node: "n1", Verdict: verdict.Verdict{Kind: verdict.RestartBudgetExhausted, Reason: "rank 0 exited with code 1"}},
			{Pod: "w-1", Node: "n2", Verdict: verdict.Verdict{Kind: verdict.Succeeded}}}},
			expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.Unhealthy, true, 2*time.Minute)}},
		want: step{act: actReset, inc: 1, why: "FoundFailedPods: 1 failed pods; ft-launcher: pod w-0 on n1: restart_budget_exhausted: rank 0 exited with code 1",
			unhealthyReason: ReasonFoundFailedPods, upstreamReason: ReasonUnhealthy, upstreamNote: "FoundFailedPods: 1 failed pods"},
	}, {
		name: "7 an Autopilot NoExecute node migrates at once, uncounted",
		f:    facts{comps: twoComps, pods: PodSummary{Running: 4, NoExecuteNodes: []string{"n1", "n2"}}, expected: 4, p: p},
		want: step{act: actReset, inc: 0, why: "AutopilotNoExecute: Workload contains pods using NoExecute resources on Nodes: n1, n2",
			unhealthyReason: ReasonAutopilotNoExecute, unhealthyMsg: "Workload contains pods using NoExecute resources on Nodes: n1, n2",
			upstreamReason: ReasonUnhealthy, upstreamNote: "Workload contains pods using NoExecute resources on Nodes: [n1 n2]"},
	}, {
		name: "8+9 healthy with enough pods: PodsReady, then wait for events",
		f:    facts{comps: twoComps, pods: PodSummary{Running: 3, Succeeded: 1}, expected: 4, p: p},
		want: step{act: actDone, conditions: []condition{healthy,
			{v1beta2.PodsReady, true, ReasonSufficientPodsReady, "3 pods running; 1 pods succeeded"}}},
	}, {
		name: "10 every pod exists but not all run: the warmup grace from deployment",
		f: facts{comps: twoComps, pods: PodSummary{Pending: 1, Running: 3}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.ResourcesDeployed, true, 2*time.Minute), cond(v1beta2.PodsReady, false, 2*time.Minute)}},
		want: step{act: actWait, wait: 3*time.Minute - 10*time.Millisecond,
			conditions: []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, "1 pods pending; 3 pods running; 0 pods succeeded"}},
			detail:     "1 pods pending; 3 pods running; 0 pods succeeded", rule: "from deployment"},
	}, {
		name: "10 pods missing: the admission grace from deployment, then a reset",
		f: facts{comps: twoComps, pods: running(3), expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.ResourcesDeployed, true, 2*time.Minute), cond(v1beta2.PodsReady, false, 2*time.Minute)}},
		want: step{act: actReset, inc: 1, why: "InsufficientPodsReady: 0 pods pending; 3 pods running; 0 pods succeeded (timed from deployment)",
			conditions:      []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, "0 pods pending; 3 pods running; 0 pods succeeded"}},
			unhealthyReason: ReasonInsufficientPodsReady, unhealthyMsg: "0 pods pending; 3 pods running; 0 pods succeeded",
			upstreamReason: ReasonUnhealthy, upstreamNote: "InsufficientPodsReady: 0 pods pending; 3 pods running; 0 pods succeeded",
			detail: "0 pods pending; 3 pods running; 0 pods succeeded", rule: "from deployment"},
	}, {
		name: "10 a pod lost after the workload was ready: the failure grace from now, though warmup is long over",
		f: facts{comps: twoComps, pods: PodSummary{Pending: 1, Running: 3}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.ResourcesDeployed, true, time.Hour), cond(v1beta2.PodsReady, true, 50*time.Minute)}},
		want: step{act: actWait, wait: time.Minute - 10*time.Millisecond,
			conditions: []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, "1 pods pending; 3 pods running; 0 pods succeeded"}},
			detail:     "1 pods pending; 3 pods running; 0 pods succeeded", rule: "from PodsReady turning False"},
	}, {
		name: "10 a replacement still pending: the failure grace keeps running from PodsReady's earlier transition",
		f: facts{comps: twoComps, pods: PodSummary{Pending: 1, Running: 3}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.ResourcesDeployed, true, time.Hour), cond(v1beta2.PodsReady, false, 30*time.Second),
				cond(v1beta2.Unhealthy, false, time.Hour)}},
		want: step{act: actWait, wait: 30*time.Second - 10*time.Millisecond,
			conditions: []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, "1 pods pending; 3 pods running; 0 pods succeeded"}},
			detail:     "1 pods pending; 3 pods running; 0 pods succeeded", rule: "from PodsReady turning False"},
	}, {
		name: "10 past the failure grace after PodsReady turned False: reset",
		f: facts{comps: twoComps, pods: PodSummary{Pending: 1, Running: 3, TerminalFailure: false}, expected: 4, p: p, at: at, now: now,
			conditions: []metav1.Condition{cond(v1beta2.ResourcesDeployed, true, time.Hour), cond(v1beta2.PodsReady, false, 2*time.Minute)}},
		want: step{act: actReset, inc: 1,
			why:             "InsufficientPodsReady: 1 pods pending; 3 pods running; 0 pods succeeded (timed from PodsReady turning False)",
			conditions:      []condition{healthy, {v1beta2.PodsReady, false, ReasonInsufficientPodsReady, "1 pods pending; 3 pods running; 0 pods succeeded"}},
			unhealthyReason: ReasonInsufficientPodsReady, unhealthyMsg: "1 pods pending; 3 pods running; 0 pods succeeded",
			upstreamReason: ReasonUnhealthy, upstreamNote: "InsufficientPodsReady: 1 pods pending; 3 pods running; 0 pods succeeded",
			detail: "1 pods pending; 3 pods running; 0 pods succeeded", rule: "from PodsReady turning False"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := assess(tc.f)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("assess:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// TestAssessOrder: each rung wins over every later one that the same facts
// would also trigger, so the ladder's order is the contract.
func TestAssessOrder(t *testing.T) {
	worst := facts{
		comps: componentHealthSummary{expected: 2, deployed: 1, failed: 1},
		pods: PodSummary{Pending: 1, Running: 1, Failed: 1, NoRestart: true,
			NoExecuteNodes: []string{"n"}},
		expected: 4,
	}
	// Each fix removes what triggered the rung named, exposing the next.
	for _, tc := range []struct {
		fix    func(*facts)
		act    action
		prefix string
	}{
		{func(f *facts) { f.suspend = true }, actSuspend, "suspend"},
		{func(f *facts) { f.suspend = false }, actFail, ReasonMissingComponent},
		{func(f *facts) { f.comps.deployed = 2 }, actFail, ReasonNoRestartVerdict},
		{func(f *facts) { f.pods.NoRestart = false }, actReset, ReasonFailedComponent},
		{func(f *facts) { f.comps.failed = 0 }, actReset, ReasonFoundFailedPods},
		{func(f *facts) { f.pods.Failed = 0 }, actReset, ReasonAutopilotNoExecute},
		{func(f *facts) { f.pods.NoExecuteNodes = nil }, actReset, ReasonInsufficientPodsReady},
		{func(f *facts) { f.pods.Running = 4; f.pods.Pending = 0 }, actDone, ""},
	} {
		tc.fix(&worst)
		got := assess(worst)
		if got.act != tc.act || !strings.HasPrefix(got.why, tc.prefix) {
			t.Errorf("after fixing the earlier rungs: %v %q, want %v %q...", got.act, got.why, tc.act, tc.prefix)
		}
	}
}
