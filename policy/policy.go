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
	// Mode is the job's --restart-mode: ModeFull ("" too) or ModeInProcess.
	Mode string
	// AllInProcessCapable: every surviving rank that this decision would
	// keep registered as able to restart in process (ft_launcher_client's
	// inprocess API). One that did not means the full restart.
	AllInProcessCapable bool
	// DuringInProcess: the failure came while an in-process restart was
	// still under way (a survivor had not rejoined yet); it escalates to
	// the full restart.
	DuringInProcess bool
	// SurvivorSilent: at a hang, a survivor had been silent (no
	// heartbeat) for over half its heartbeat timeout, or was found hung
	// itself. In a job whose ranks wait on each other in collectives, a
	// hung rank's peers fall silent with it, so heartbeats cannot tell the
	// hung rank from the ranks waiting for it: keeping a silent survivor
	// could keep the hung rank, which then never rejoins. Only a hang
	// with every survivor recently heartbeating restarts in process.
	SurvivorSilent bool
}

// Restart modes (configs.RestartFull, configs.RestartInProcess).
const (
	ModeFull      = "full"
	ModeInProcess = "in-process"
)

// Action is what the job does next.
type Action string

// Actions.
const (
	RestartInPlace Action = "restart_in_place" // every node restarts its ranks in a new round
	SwapSpare      Action = "swap_spare"       // a standby takes the lost node's group rank in a new round
	CloseJob       Action = "close_job"        // the job ends on every node with Close
	// RestartInProcess: only the failed ranks are replaced; the survivors
	// keep their processes and rejoin the new round (--restart-mode
	// in-process). It spends a restart like RestartInPlace.
	RestartInProcess Action = "restart_in_process"
)

// Decision is the policy's answer.
type Decision struct {
	Action Action
	// CountsRestart is true when the new round spends one restart of the
	// budget (RestartsUsed+1 afterwards).
	CountsRestart bool
	// Close is the outcome kind when Action is CloseJob.
	Close verdict.Kind
	// Why says, for logs and close records, how the decision was reached.
	Why string
	// InProcess is true when the surviving ranks stay in their processes
	// and rejoin the new round (RestartInProcess, or a SwapSpare or
	// RestartInPlace after a node failure whose other nodes' ranks stay);
	// false: every rank of the new round starts fresh.
	InProcess bool
}

// Mode names how a restart decided by d restarts the ranks: "in-process"
// or "full" ("" for a close).
func (d Decision) Mode() string {
	switch {
	case d.Action == CloseJob:
		return ""
	case d.InProcess:
		return ModeInProcess
	}
	return ModeFull
}

// Decide applies the restart policy:
//
//   - a no-restart request closes the job (NoRestart) whatever the budget;
//   - a lost, excluded or stopped node is replaced by a spare when one is available,
//     without spending a restart (so --max-restarts 0 with a standby still
//     survives a node loss); with no spare, the job restarts in place and
//     waits for MIN nodes, which spends a restart;
//   - a rank crash or hang restarts in place and spends a restart: a
//     process-level failure never consumes a spare;
//   - a restart that the budget does not allow closes the job
//     (RestartBudgetExhausted);
//   - with Mode in-process, a restart keeps the survivors in their
//     processes when every one of them registered as able to
//     (AllInProcessCapable) and the failure did not come during an
//     in-process restart (DuringInProcess escalates to the full restart)
//     and, for a hang, no survivor was silent as well (SurvivorSilent):
//     a rank failure becomes RestartInProcess (same budget), a node
//     failure keeps its SwapSpare or RestartInPlace with InProcess set
//     (the spare's ranks start fresh, the other nodes' ranks stay).
func Decide(in Input) Decision {
	d := decideFull(in)
	if d.Action == CloseJob || in.Mode != ModeInProcess {
		return d
	}
	if blocked := inProcessBlocked(in.Failure, in.DuringInProcess, in.AllInProcessCapable, in.SurvivorSilent); blocked != "" {
		d.Why += "; " + blocked
		return d
	}
	d.InProcess = true
	if d.Action == RestartInPlace && (in.Failure != NodeLost && in.Failure != NodeExcluded && in.Failure != NodeStopped) {
		d.Action = RestartInProcess
		d.Why = replacingFailed(in.Failure, in.RestartsUsed, in.MaxRestarts)
	} else {
		d.Why += "; the other ranks restart in process"
	}
	return d
}

// replacingFailed is the reason of an in-process restart after a rank
// failure (the survivors' notice carries it).
func replacingFailed(f Failure, used, max int) string {
	return fmt.Sprintf("%s: replacing the failed rank; the survivors restart in process (restart %d of %d)", f, used+1, max)
}

// decideFull is the decision of --restart-mode full.
func decideFull(in Input) Decision {
	switch in.Failure {
	case NoRestartRequest:
		return Decision{Action: CloseJob, Close: verdict.NoRestart, Why: "a rank asked not to restart the workload"}
	case NodeLost, NodeExcluded, NodeStopped:
		if in.SparesAvailable > 0 {
			return Decision{Action: SwapSpare, Why: fmt.Sprintf("%s: a spare takes its place (%d available; no restart spent)",
				in.Failure, in.SparesAvailable)}
		}
		if in.NodesPresent < in.MinNodes {
			return restart(in, fmt.Sprintf("%s: no spare; %d of %d nodes present, waiting for a node", in.Failure, in.NodesPresent, in.MinNodes))
		}
		return restart(in, fmt.Sprintf("%s: no spare; restarting on the %d nodes present", in.Failure, in.NodesPresent))
	default: // RankCrash, RankHang and anything unknown count as a process failure
		return restart(in, string(in.Failure)+": restarting every rank in place")
	}
}

func restart(in Input, why string) Decision {
	if !budgetLeft(in.RestartsUsed, in.MaxRestarts) {
		return Decision{Action: CloseJob, Close: verdict.RestartBudgetExhausted, Why: budgetExhausted(in.RestartsUsed, in.MaxRestarts)}
	}
	return Decision{Action: RestartInPlace, CountsRestart: true,
		Why: fmt.Sprintf("%s (restart %d of %d)", why, in.RestartsUsed+1, in.MaxRestarts)}
}

// budgetLeft reports whether the budget allows one more restart.
func budgetLeft(used, max int) bool { return used < max }

func budgetExhausted(used, max int) string {
	return fmt.Sprintf("restart budget exhausted (%d of %d restarts used)", used, max)
}
