// Package agent is the per-node agent of ft-launcher. It ties the other
// packages together: it asks the rendezvous for a round, starts this node's
// ranks (spawn) with their logs (ranklogs) and monitors (monitor), waits for
// the first thing that ends the cycle, stops the ranks and lets the
// rendezvous's restart policy decide what comes next.
//
// The node-agent failure level is one explicit state machine (states.go):
// every State has one handler that does that state's work and returns the
// next state; the legal transitions are listed in one table. Run returns a
// typed Outcome (outcome.go), which the caller turns into the exit code and
// the verdict file.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// RankStarter starts the ranks of one cycle (SpawnRanks in production).
type RankStarter interface {
	StartGroup(specs []spawn.Spec) (RankGroup, error)
}

// RankGroup is the running ranks of one cycle (*spawn.Group in production).
type RankGroup interface {
	PIDs() map[int]int // local rank -> pid (= process group id)
	Exits() <-chan spawn.Exit
	// Stop signals every live rank, waits up to grace, then SIGKILLs.
	Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult
	// SignalAll signals every live rank's process group at once (used to
	// escalate a stop when a second signal arrives).
	SignalAll(sig syscall.Signal)
}

// Monitors is the rank monitors' side the agent uses (*monitor.Manager in
// production).
type Monitors interface {
	BeginCycle(cycle int, pids map[int]int)
	EndCycleWith(completed bool)
	Hangs() <-chan monitor.Hang
	Requests() <-chan monitor.WorkloadRequest
	FiredHang(cycle, localRank int) (monitor.Hang, bool)
	// Judged is the judgement of cycle's hang (the stacks taken at its
	// first expired clock; monitor.Options.Stacks), waiting (bounded) for
	// one still being made.
	Judged(ctx context.Context, cycle int) (*monitor.Judgement, bool)
	RankSocket(localRank int) string
	LauncherSocket() string
}

// FailureEvidence is what the launcher's hook in a Python rank wrote as
// it died (*stacks.Collector).
type FailureEvidence interface {
	Exception(pid int) []byte
	Fatal(pid int, from int64) ([]byte, int64)
	Forget(pid int)
}

// Spare is the filler work of a spare node (*filler.Filler): started when
// the node parks as a standby, reclaimed before the node's ranks start.
type Spare interface {
	Park()
	// Reclaim kills the filler's tree and waits, bounded, until it and
	// the GPUs are free; an error means this node must not run ranks.
	Reclaim(ctx context.Context) (time.Duration, error)
	Close()
}

// SpareStandbys keeps standby interpreters for the ranks of a parked
// spare (*prewarm.Starter.Park), so that its promotion starts them warm,
// and for the first cycle's ranks (Launch).
type SpareStandbys interface {
	// Park is given the ranks the node would start, without the values
	// of an assignment (SpareEnv); it must not block.
	Park(specs []spawn.Spec)
	// Launch is given the same at the agent's start, before its first
	// round: standbys that the first cycle's ranks may start on, where
	// the starter sees a gain (--prewarm auto with a known command
	// line); it must not block.
	Launch(specs []spawn.Spec)
}

// Store is the agent store (*agentstore.Host): the c10d TCPStore that the
// launcher of group rank 0 serves to every rank of the round.
type Store interface {
	// Round makes the store follow asg before its ranks start: serving,
	// emptied for the round, at asg's MASTER_ADDR:MASTER_PORT when this
	// node is group rank 0; closed when it is not (or is a standby).
	Round(asg rendezvous.Assignment) error
}

// SpawnRanks adapts *spawn.Reaper to RankStarter.
type SpawnRanks struct{ Reaper *spawn.Reaper }

// StartGroup starts the ranks with spawn.
func (s SpawnRanks) StartGroup(specs []spawn.Spec) (RankGroup, error) {
	g, err := s.Reaper.StartGroup(specs)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// Deps are the parts the agent drives. The caller owns their lifetimes.
type Deps struct {
	Config   *configs.Config
	Logger   *slog.Logger
	Events   *eventlog.Log
	Metrics  *metrics.Metrics // nil: no metrics
	Ranks    RankStarter
	Logs     *ranklogs.Logs
	Monitors Monitors // nil: no rank monitors
	// Evidence is what the launcher's hook in Python ranks wrote of their
	// ends (*stacks.Collector): read to explain a failure; nil: none.
	Evidence FailureEvidence
	Rdzv     rendezvous.Rendezvous
	Signals  <-chan os.Signal // signals to forward to ranks (SignalsToHandle and WalltimeSignals)
	// WalltimeSignals are the scheduler's pre-walltime warnings (Slurm's
	// --signal=USR1@N): forwarded to the ranks so they can checkpoint,
	// never counted as a failure; the outcome is then Walltime.
	WalltimeSignals []os.Signal
	// WalltimeSettle is how long a node whose last rank exited 0 waits for
	// a pre-walltime warning already on its way before it calls the job a
	// success (0: not at all). Under Slurm the warning reaches the ranks as
	// it reaches the launcher (slurmstepd signals every process of the
	// step): a rank that saves and exits on it can be reaped before the
	// launcher reads its own copy of the signal.
	WalltimeSettle time.Duration
	Hostname       string
	// NodeID names this node in quarantine records (the rendezvous node
	// id where there is one, else the host).
	NodeID string
	// Environ is the launcher's environment (os.Environ in production).
	Environ []string
	// Store is the agent store; nil when the ranks' rank 0 hosts the
	// store itself (--agent-store off).
	Store Store
	// Spare runs filler work while this node is a standby; nil for none.
	Spare Spare
	// SpareStandbys keeps --prewarm standbys for this node's ranks while
	// it is a parked spare (*prewarm.Starter); nil for none.
	SpareStandbys SpareStandbys
	// Ledger is this node's book of leases (Active, Spare, Filler); nil
	// keeps no ledger.
	Ledger *ledger.Book
	// CallTimeout bounds the short rendezvous calls (Fail, Shutdown,
	// Leave) on top of the rendezvous's own loss bound; 0 means 2 minutes.
	CallTimeout time.Duration
	// Speed exchanges the ranks' measured speed job-wide (the etcd
	// rendezvous; straggler.go); nil: no straggler measurement.
	Speed SpeedExchange
	// SpeedInterval is how often the ranks' speed is sampled and
	// published; 0 means DefaultSpeedInterval.
	SpeedInterval time.Duration
	// Demand reads a process group's cumulative CPU demand (running or
	// waiting to run); nil means procfs.GroupDemand.
	Demand func(pgid int) (time.Duration, bool)
	// SignalRepeatWindow is how long after the signal that began a stop
	// the same signal again counts as a repeat delivery, not as a request
	// to SIGKILL the ranks now (rule in signals.go); 0 means
	// DefaultSignalRepeatWindow.
	SignalRepeatWindow time.Duration
}

// Agent runs the ranks of one node.
type Agent struct {
	d   Deps
	cfg *configs.Config
	log *slog.Logger
	ev  *eventlog.Log
	met *metrics.Metrics

	state atomic.Int32 // a State; atomic so that State() may be read from any goroutine
	run   runState
}

// New returns an Agent.
func New(d Deps) *Agent {
	if d.CallTimeout <= 0 {
		d.CallTimeout = 2 * time.Minute
	}
	if d.SignalRepeatWindow <= 0 {
		d.SignalRepeatWindow = DefaultSignalRepeatWindow
	}
	if d.NodeID == "" {
		d.NodeID = d.Hostname
	}
	return &Agent{d: d, cfg: d.Config, log: d.Logger, ev: d.Events, met: d.Metrics}
}

// State is the agent's current state (for tests and diagnostics; only the
// agent's own goroutine changes it, others may read it at any time).
func (a *Agent) State() State { return State(a.state.Load()) }

// isWalltime reports whether s is a pre-walltime warning signal.
func (a *Agent) isWalltime(s os.Signal) bool {
	for _, w := range a.d.WalltimeSignals {
		if w == s {
			return true
		}
	}
	return false
}

// Run runs the node agent until the job ends for this node and returns
// why it ended. It never blocks past a signal: every state reads Signals.
func (a *Agent) Run(ctx context.Context) Outcome {
	cfg := a.cfg
	a.run = newRunState(time.Now(), cfg.MaxRestarts)
	a.run.ip = a.newInProcess()
	a.ev.Emit(eventlog.LauncherStartedEvent{
		PID: os.Getpid(), NProcPerNode: cfg.NProcPerNode, MaxRestarts: cfg.MaxRestarts,
		NNodes: fmt.Sprintf("%d:%d", cfg.NNodes.Min, cfg.NNodes.Max), Script: cfg.Script,
	})
	if a.d.SpareStandbys != nil {
		a.d.SpareStandbys.Launch(a.spareSpecs()) // imports during the first rendezvous
	}
	a.state.Store(int32(StateJoining))
	for State(a.state.Load()) != StateDone {
		next := a.handle(ctx, State(a.state.Load()))
		a.transition(next)
	}
	a.run.ip.stopKept("the job does not go on") // survivors kept for an in-process restart that never came
	if !a.aborted(ctx) {
		a.departIfSignaled()
	}
	if a.d.Spare != nil {
		a.d.Spare.Close()
	}
	return a.finish()
}

// Abort is the cause (context.WithCancelCause) with which the launcher
// cancels Run's context when a part that the node must not run without has
// failed for good (the fence watchdog could not be restarted). The
// cancellation stops the ranks and ends Run as a signal would; the node
// then departs the rendezvous with Reason (its peers go on without it, a
// spare takes its place) and the outcome is FatalError with Reason.
type Abort struct{ Reason string }

func (e *Abort) Error() string { return e.Reason }

// aborted applies an Abort that ended Run (see Abort); false when none did.
func (a *Agent) aborted(ctx context.Context) bool {
	var ab *Abort
	if !errors.As(context.Cause(ctx), &ab) {
		return false
	}
	a.log.Error("this node ends: " + ab.Reason)
	a.ev.Emit(eventlog.JobFailedEvent{CloseKind: eventlog.Opt(verdict.FatalError), Reason: ab.Reason})
	a.run.outcome = nil // the cancellation's outcome (signaled, or a failed call) says nothing of why
	a.run.setOutcome(verdict.FatalError, ab.Reason)
	a.depart("node " + a.d.NodeID + " ended: " + ab.Reason)
	return true
}

// departTimeout bounds the departure of a node stopped by a signal.
const departTimeout = 3 * time.Second

// departIfSignaled tells the rendezvous that this node was stopped by a
// signal (scancel, preemption, walltime, a person), so that its peers
// record a departure with the reason rather than a node loss, and a spare
// takes its place without waiting for its lease to expire.
func (a *Agent) departIfSignaled() {
	o := a.run.outcome
	if o == nil || (o.Kind != verdict.Signaled && o.Kind != verdict.Walltime) {
		return
	}
	a.depart(fmt.Sprintf("node %s %s", a.d.NodeID, o.Reason))
}

// depart tells the rendezvous that this node leaves, with reason.
func (a *Agent) depart(reason string) {
	// A courtesy to the peers, never a reason to linger: a few seconds at
	// most (their gossip and the lease notice the node's absence anyway).
	ctx, cancel := context.WithTimeout(context.Background(), min(a.d.CallTimeout, departTimeout))
	defer cancel()
	if err := a.d.Rdzv.Depart(ctx, reason); err != nil {
		a.log.Warn("leaving the rendezvous", "reason", reason, "err", err)
	}
}

// transition moves to next; an illegal move is a bug, logged loudly, and
// the agent ends rather than run in a state nobody designed.
func (a *Agent) transition(next State) {
	from := State(a.state.Load())
	if !transitionOK(from, next) {
		a.log.Error("agent: illegal state transition; ending", "from", from.String(), "to", next.String())
		if a.run.outcome == nil {
			a.run.setOutcome(verdict.FatalError, fmt.Sprintf("internal error: illegal agent transition %s -> %s", from, next))
		}
		next = StateDone
	}
	if from != next {
		a.log.Debug("agent state", "from", from.String(), "to", next.String())
	}
	a.state.Store(int32(next))
}
