// Package policy is ft-launcher's restart policy, as pure functions: this
// is where the restart decisions live. Decide says what the job does after
// a failure (restart, swap a spare, close; what it spends). Every
// rendezvous backend calls it with the job-wide facts it holds, so the
// single-node and the etcd rendezvous can never disagree on a decision.
// Survivors (survivors.go) says what one node does with its ranks under
// --restart-mode in-process (do its survivors stay?), and
// QuarantineForHangs whether repeated hangs take a node out of the job;
// the node agent calls those with the facts only it holds.
package policy

import (
	"fmt"
	"time"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// Failure is what went wrong.
type Failure string

// Failure kinds.
const (
	RankCrash        Failure = "rank_crash"    // a rank exited non-zero or died of a signal
	RankHang         Failure = "rank_hang"     // a rank monitor killed a hung rank
	NodeLost         Failure = "node_lost"     // gossip or lease expiry: an active node is gone
	NodeExcluded     Failure = "node_excluded" // an active node left (ExcludeThisNode, health check)
	NoRestartRequest Failure = "no_restart"    // a rank asked ShutdownWorkload
	// NodeStopped: an active node's launcher was stopped by a signal
	// (scancel, preemption, a person) and left the job gracefully. It is
	// handled like a loss, but it is no evidence against the node.
	NodeStopped Failure = "node_stopped"
)

// Failures lists every failure kind (tests, docs).
var Failures = []Failure{RankCrash, RankHang, NodeLost, NodeExcluded, NodeStopped, NoRestartRequest}

// Input is everything the decision depends on.
type Input struct {
	Failure      Failure
	RestartsUsed int // restarts the job has already spent (not the round number)
	MaxRestarts  int // the job's agreed budget (--max-restarts)
	// SparesAvailable is the number of parked standby nodes still alive
	// that could take a lost node's place.
	SparesAvailable int
	// NodesPresent is the number of nodes still in the job after the
	// failure (active and standby), MinNodes is --nnodes MIN.
	NodesPresent int
	MinNodes     int
	// Window, when set, is the job's restart window (--restart-window):
	// only restarts within it count against MaxRestarts, and
	// RecentRestarts are the times of the job's counted restarts (the
	// newest MaxRestarts suffice). Zero: RestartsUsed counts.
	Window         time.Duration
	RecentRestarts []time.Time
	// Now is when the decision is taken (for Window); zero: time.Now.
	Now time.Time
	// Delay is the job's --restart-delay: a counted restart waits it
	// before the next round starts.
	Delay time.Duration
}

// Mode is how a node's ranks restarted, as its records name it
// (configs.RestartFull, configs.RestartInProcess).
type Mode string

// Restart modes.
const (
	ModeFull      Mode = "full"
	ModeInProcess Mode = "in-process"
)

// Action is what the job does next.
type Action string

// Actions.
const (
	RestartInPlace Action = "restart_in_place" // every node restarts its ranks in a new round
	SwapSpare      Action = "swap_spare"       // a standby takes the lost node's group rank in a new round
	CloseJob       Action = "close_job"        // the job ends on every node with Close
	// RestartInProcess names, in a node's records, a RestartInPlace in
	// which that node's survivors stayed in their processes (Survivors):
	// the job's decision is RestartInPlace; only the failed ranks were
	// replaced. It spends a restart like RestartInPlace.
	RestartInProcess Action = "restart_in_process"
)

// Reason is why a decision came out as it did, as a constant that
// records, the report and metrics can switch on (as Nomad's restart
// tracker answers with its Reason constants); Why beside it is the prose
// for people, never parsed.
type Reason string

// The job's reasons (Decide).
const (
	ReasonNoRestartRequested Reason = "no_restart_requested" // a rank asked not to restart: close
	ReasonSpareSwap          Reason = "spare_swap"           // a spare takes the failed node's place
	ReasonWaitForNodes       Reason = "wait_for_nodes"       // no spare, fewer than MIN nodes: restart and wait
	ReasonRestartOnPresent   Reason = "restart_on_present"   // no spare, MIN nodes present: restart on them
	ReasonProcessFailure     Reason = "process_failure"      // a rank failed: restart every rank
	ReasonBudgetExhausted    Reason = "budget_exhausted"     // the restart budget is spent: close
)

// Reasons lists the job's reasons (tests, docs).
var Reasons = []Reason{ReasonNoRestartRequested, ReasonSpareSwap, ReasonWaitForNodes,
	ReasonRestartOnPresent, ReasonProcessFailure, ReasonBudgetExhausted}

// Decision is the policy's answer.
type Decision struct {
	Action Action
	// CountsRestart is true when the new round spends one restart of the
	// budget (RestartsUsed+1 afterwards).
	CountsRestart bool
	// Close is the outcome kind when Action is CloseJob.
	Close verdict.Kind
	// Reason is the rule that decided; Why says it for logs and close
	// records.
	Reason Reason
	Why    string
	// Delay is how long a counted restart waits before its round starts
	// (the job's --restart-delay; 0 for a spare swap or a close).
	Delay time.Duration
}

// Decide applies the job's restart policy:
//
//   - a no-restart request closes the job (NoRestart) whatever the budget;
//   - a lost, excluded or stopped node is replaced by a spare when one is available,
//     without spending a restart (so --max-restarts 0 with a standby still
//     survives a node loss); with no spare, the job restarts in place and
//     waits for MIN nodes, which spends a restart;
//   - a rank crash or hang restarts in place and spends a restart: a
//     process-level failure never consumes a spare;
//   - a restart that the budget does not allow closes the job
//     (RestartBudgetExhausted): MaxRestarts restarts in all, or, with a
//     Window, within the window.
//
// Whether a node's surviving ranks stay in their processes is that node's
// question (Survivors), not the job's: the job's decision and what it
// spends are the same in either restart mode.
func Decide(in Input) Decision {
	switch in.Failure {
	case NoRestartRequest:
		return Decision{Action: CloseJob, Close: verdict.NoRestart, Reason: ReasonNoRestartRequested,
			Why: "a rank asked not to restart the workload"}
	case NodeLost, NodeExcluded, NodeStopped:
		if in.SparesAvailable > 0 {
			return Decision{Action: SwapSpare, Reason: ReasonSpareSwap,
				Why: fmt.Sprintf("%s: a spare takes its place (%d available; no restart spent)", in.Failure, in.SparesAvailable)}
		}
		if in.NodesPresent < in.MinNodes {
			return restart(in, ReasonWaitForNodes, fmt.Sprintf("%s: no spare; %d of %d nodes present, waiting for a node", in.Failure, in.NodesPresent, in.MinNodes))
		}
		return restart(in, ReasonRestartOnPresent, fmt.Sprintf("%s: no spare; restarting on the %d nodes present", in.Failure, in.NodesPresent))
	default: // RankCrash, RankHang and anything unknown count as a process failure
		return restart(in, ReasonProcessFailure, string(in.Failure)+": restarting every rank in place")
	}
}

// replacingFailed is the reason of an in-process restart after a rank
// failure (the survivors' notice carries it).
func replacingFailed(f Failure, used, max int) string {
	return fmt.Sprintf("%s: replacing the failed rank; the survivors restart in process (restart %d of %d)", f, used+1, max)
}

func restart(in Input, r Reason, why string) Decision {
	b := in.Budget()
	now := in.Now
	if now.IsZero() {
		now = time.Now()
	}
	used := b.Used(in.RecentRestarts, in.RestartsUsed, now)
	within := ""
	if b.Window > 0 {
		within = " within " + b.Window.String()
	}
	if !b.Allows(used) {
		return Decision{Action: CloseJob, Close: verdict.RestartBudgetExhausted, Reason: ReasonBudgetExhausted,
			Why: fmt.Sprintf("restart budget exhausted (%d of %d restarts used%s)", used, in.MaxRestarts, within)}
	}
	return Decision{Action: RestartInPlace, CountsRestart: true, Reason: r, Delay: b.Wait(0),
		Why: fmt.Sprintf("%s (restart %d of %d%s)", why, used+1, in.MaxRestarts, within)}
}

// Budget is the job's restart budget: --max-restarts within
// --restart-window, each restart after --restart-delay.
func (in Input) Budget() RestartBudget {
	return RestartBudget{Limit: in.MaxRestarts, Window: in.Window, Delay: in.Delay}
}

// budgetLeft reports whether the budget allows one more restart.
func budgetLeft(used, max int) bool { return used < max }

func budgetExhausted(used, max int) string {
	return fmt.Sprintf("restart budget exhausted (%d of %d restarts used)", used, max)
}
