package agent

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// State is a node-agent state.
//
//	joining ──► running ───┬───────────────────► stopping ──► deciding ──► joining (restart)
//	 │ │  ▲    rejoining ──┤                         ▲           │  └────► escalating ──► done
//	 │ ▼  │                └──► keeping ───(stop)────┘           └───────► done
//	 │ standby                     └───(survivors stay)───► deciding
//	 └──► rejoining (survivors were kept for this round)
//	any state ──► done (signal, job closed, rendezvous lost, fatal error)
//
// keeping and rejoining are the in-process restart (--restart-mode
// in-process, inprocess.go). A cycle that may keep its survivors
// (policy.MaySurvive) goes to keeping, which settles the failure and asks
// policy.Survivors whether this node's surviving ranks stay: they stay
// (on to deciding), or every rank stops (stopping). After a round closes,
// a node with kept survivors goes to rejoining instead of running: it
// starts only the missing ranks, sends the survivors their notice, and
// then supervises the cycle as running does.
type State int

// Node-agent states.
const (
	StateJoining    State = iota + 1 // waiting for a rendezvous round to close
	StateStandby                     // parked beyond --nnodes MIN; rejoins for a later round
	StateRunning                     // ranks started; waiting for the first event that ends the cycle
	StateStopping                    // stopping whatever still runs of this cycle
	StateDeciding                    // reporting the cycle's end; the restart policy decides
	StateEscalating                  // carrying out a rank's request (ExcludeThisNode, ShutdownWorkload)
	StateDone                        // the outcome is decided
	// StateKeeping settles a failure under --restart-mode in-process and
	// decides (policy.Survivors) whether this node's survivors stay.
	StateKeeping
	// StateRejoining starts a round for kept survivors (the missing ranks,
	// the survivors' notices) and waits, as running, for what ends it.
	StateRejoining
)

func (s State) String() string {
	switch s {
	case StateJoining:
		return "joining"
	case StateStandby:
		return "standby"
	case StateRunning:
		return "running"
	case StateStopping:
		return "stopping"
	case StateDeciding:
		return "deciding"
	case StateEscalating:
		return "escalating"
	case StateDone:
		return "done"
	case StateKeeping:
		return "keeping"
	case StateRejoining:
		return "rejoining"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// allowed is the whole transition table; anything else is a bug.
var allowed = map[State][]State{
	StateJoining:    {StateStandby, StateRunning, StateRejoining, StateDone},
	StateStandby:    {StateJoining, StateDone},
	StateRunning:    {StateStopping, StateKeeping, StateDone},
	StateRejoining:  {StateStopping, StateKeeping, StateDone},
	StateKeeping:    {StateDeciding, StateStopping},
	StateStopping:   {StateDeciding},
	StateDeciding:   {StateJoining, StateEscalating, StateDone},
	StateEscalating: {StateDone},
	StateDone:       {},
}

func transitionOK(from, to State) bool {
	if from == to && from != StateDone {
		return false // every handler moves on; staying would spin
	}
	for _, s := range allowed[from] {
		if s == to {
			return true
		}
	}
	return false
}

// handle runs the handler of state s.
func (a *Agent) handle(ctx context.Context, s State) State {
	switch s {
	case StateJoining:
		return a.joining(ctx)
	case StateStandby:
		return a.standby(ctx)
	case StateRunning:
		return a.running(ctx)
	case StateRejoining:
		return a.rejoining(ctx)
	case StateKeeping:
		return a.keeping()
	case StateStopping:
		return a.stopping()
	case StateDeciding:
		return a.deciding(ctx)
	case StateEscalating:
		return a.escalating(ctx)
	}
	a.run.setOutcome(verdict.FatalError, "internal error: no handler for agent state "+s.String())
	return StateDone
}

// joining waits for the next round. A signal ends the wait (no ranks run
// then, so there is nothing to forward it to).
func (a *Agent) joining(ctx context.Context) State {
	t0 := time.Now()
	var asg rendezvous.Assignment
	sig, err := a.call(ctx, 0, func(ctx context.Context) error {
		if err := a.run.waitRestartDelay(ctx, a.log); err != nil {
			return err
		}
		var err error
		asg, err = a.d.Rdzv.Next(ctx)
		return err
	})
	if sig != nil && a.isWalltime(sig) {
		a.run.walltime = sig
	}
	if sig != nil {
		a.log.Warn("signal received while waiting for a round; exiting", "signal", sig.String())
		a.ev.Emit(eventlog.SignalReceivedEvent{Signal: sigName(sig), State: eventlog.AgentState(StateJoining.String())})
		a.run.signaled(sig, false)
		return StateDone
	}
	if err != nil {
		a.joinFailed(ctx, err)
		return StateDone
	}
	a.run.asg = asg
	a.run.lastRound = asg.Round
	a.run.restartsUsed = asg.RestartsUsed
	a.run.maxRestarts = asg.MaxRestarts
	// A spare waits in Next long before its round opens: its rendezvous
	// phase starts when the round opened.
	start := t0
	if asg.OpenedAt.After(start) {
		start = asg.OpenedAt
	}
	a.run.cycle = cycleTiming{round: asg.Round, start: start, joined: time.Now(), detection: asg.Detection}
	if asg.Standby {
		return StateStandby
	}
	if a.d.Spare != nil {
		if err := a.reclaimSpare(ctx); err != nil {
			return StateDone
		}
	}
	a.promoted(ctx, a.run.cycle.reclaim)
	a.log.Info("round closed", "round", asg.Round, "group_rank", asg.GroupRank,
		"group_world_size", asg.GroupWorldSize, "world_size", asg.WorldSize,
		"master", fmt.Sprintf("%s:%d", asg.MasterAddr, asg.MasterPort),
		"restarts_used", asg.RestartsUsed, "max_restarts", asg.MaxRestarts,
		"rendezvous_ms", time.Since(t0).Milliseconds())
	if a.run.ip.phase() == ipKept {
		return StateRejoining // survivors of the last cycle wait for this round
	}
	return StateRunning
}

// joinFailed turns a failed Next into the outcome.
func (a *Agent) joinFailed(ctx context.Context, err error) {
	var closed *rendezvous.JobClosedError
	switch {
	case errors.As(err, &closed):
		// A standby (or a late node) learns the job's end here and exits
		// with the same kind and code as every other node; a quarantined
		// node parked until then says why it took no part.
		kind, reason := closed.Kind, closed.Reason
		if q := closed.Quarantine; q != nil {
			ev := verdict.EvidenceExcluded
			if q.Cause == policy.NodeLost {
				ev = verdict.EvidenceLost
				// Lost and replaced by a spare (a loss without a spare
				// quarantines nothing): the job went on without this node,
				// which says so instead of the job's kind.
				kind = verdict.NodeReplaced
				reason = fmt.Sprintf("this node was replaced by a spare in round %d (%s); the job went on without it and closed with kind %s: %s",
					q.Round, q.Reason, closed.Kind, closed.Reason)
			}
			a.run.quarantine(a.d.NodeID, a.d.Hostname, ev, q.Error(), q.Round)
			a.log.Warn("this node was quarantined and parked until the job ended", "why", q.Error())
		}
		a.log.Info("job closed while waiting for a round", "kind", string(closed.Kind), "exit_code", closed.Code, "reason", closed.Reason)
		a.ev.Emit(eventlog.RoundEndedEvent{JobClosed: true, CloseKind: eventlog.Opt(closed.Kind), Reason: closed.Reason, ExitCode: eventlog.Opt(closed.Code)})
		a.run.closedBy(kind, closed.Code, reason)
	case ctx.Err() != nil:
		a.log.Warn("interrupted while waiting for a rendezvous round")
		a.run.signaled(nil, false)
	default:
		kind := classifyRdzvErr(err)
		if kind == verdict.NodeExcluded {
			a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceHealthCheck, err.Error(), a.run.lastRound)
		}
		a.log.Error("rendezvous failed", "kind", string(kind), "err", err)
		a.ev.Emit(eventlog.JobFailedEvent{CloseKind: eventlog.Opt(kind), Reason: err.Error()})
		a.run.setOutcome(kind, err.Error())
	}
}

// classifyRdzvErr maps a rendezvous error to an outcome kind.
func classifyRdzvErr(err error) verdict.Kind {
	switch {
	case errors.Is(err, rendezvous.ErrRendezvousLost), errors.Is(err, context.DeadlineExceeded):
		// A call that outlived its bound: the rendezvous is not answering.
		return verdict.RendezvousLost
	case errors.Is(err, rendezvous.ErrJoinTimeout):
		return verdict.NotEnoughNodes
	case errors.Is(err, rendezvous.ErrHealthCheck):
		return verdict.NodeExcluded
	case errors.Is(err, rendezvous.ErrClosed):
		return verdict.FatalError
	}
	return verdict.FatalError
}

// standby: this node is parked for a later round; its filler (if any)
// runs meanwhile.
func (a *Agent) standby(ctx context.Context) State {
	asg := a.run.asg
	// Survivors kept for an in-process restart have no round to rejoin
	// here: this node's slot went to another node. They must not hold the
	// node (its GPUs) while the filler runs.
	a.run.ip.stopKept("this node is a standby in round " + strconv.Itoa(asg.Round))
	if a.d.Store != nil {
		_ = a.d.Store.Round(asg) // a standby serves no store: only closes one
	}
	a.log.Info("standby: this node is parked for a later round", "round", asg.Round)
	a.ev.Emit(eventlog.StandbyEvent{Round: asg.Round})
	a.parked(ctx)
	if a.d.SpareStandbys != nil {
		a.d.SpareStandbys.Park(a.spareSpecs())
	}
	return StateJoining
}

// reclaimSpare takes the node back from its filler before its ranks start.
// A node whose filler (or GPUs) cannot be reclaimed in time leaves the job
// quarantined, so the next spare takes its place.
func (a *Agent) reclaimSpare(ctx context.Context) error {
	took, err := a.d.Spare.Reclaim(ctx)
	a.run.cycle.reclaim = took
	if err == nil {
		return nil
	}
	round := a.run.asg.Round
	reason := "filler could not be reclaimed: " + err.Error()
	a.log.Error("this spare cannot run the job; leaving it", "err", err)
	if _, lerr := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error { return a.d.Rdzv.Leave(ctx, reason) }); lerr != nil {
		a.log.Warn("leaving the rendezvous", "err", lerr)
	}
	a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(round), CloseKind: eventlog.Opt(verdict.NodeExcluded), Reason: reason})
	a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceFillerReclaim, reason, round)
	a.run.setOutcome(verdict.NodeExcluded, reason)
	return err
}

// running starts the cycle's ranks and waits for what ends the cycle.
func (a *Agent) running(ctx context.Context) State { return a.runCycle(ctx, a.startCycle) }

// runCycle starts the cycle's ranks with start and waits for what ends
// the cycle (running, rejoining).
func (a *Agent) runCycle(ctx context.Context, start func() error) State {
	if err := start(); err != nil {
		a.log.Error("cycle failed to start", "round", a.run.asg.Round, "err", err)
		reason := "node " + a.d.Hostname + ": " + err.Error()
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(a.run.asg.Round), CloseKind: eventlog.Opt(verdict.FatalError), Reason: reason})
		// Close the job everywhere: the other nodes' ranks cannot make
		// progress without this node's.
		if _, cerr := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error {
			return a.d.Rdzv.Shutdown(ctx, verdict.FatalError, 1, reason)
		}); cerr != nil {
			a.log.Warn("closing the job after a start failure", "err", cerr)
		}
		a.run.setOutcome(verdict.FatalError, reason)
		return StateDone
	}
	a.run.end = a.supervise(ctx)
	if a.d.Monitors != nil {
		// A hang anywhere in the job had this node's stacks taken too:
		// recorded whichever way the cycle ended here, also when another
		// node ended it while this node's stacks were still being shared.
		if j, ok := a.d.Monitors.Judged(ctx, a.run.asg.Round); ok {
			a.recordStacksOf(j)
		}
	}
	if policy.MaySurvive(a.survivorFacts()) { // --restart-mode in-process (inprocess.go)
		return StateKeeping
	}
	return StateStopping
}

// stopping stops what is still running; a distinct second signal
// escalates to SIGKILL (signals.go).
func (a *Agent) stopping() State {
	a.stopCycle()
	return StateDeciding
}

// deciding reports the cycle's end to the rendezvous and follows its
// decision.
func (a *Agent) deciding(ctx context.Context) State {
	end := a.run.end
	asg := a.run.asg
	a.run.finishCycle(end)
	if a.run.pendingSignal != nil {
		return a.signalDuringStop()
	}
	switch end.kind {
	case endSuccess:
		return a.decideSuccess(ctx)
	case endRankFailure:
		if a.run.pendingReq != nil {
			return StateEscalating
		}
		return a.decideFailure(ctx, end)
	case endRoundEnded:
		return a.decideRoundEnded(ctx, end)
	case endFenced:
		return a.decideFenced(ctx, end)
	case endStraggler:
		return a.swapOutStraggler(ctx, end)
	case endWorkload:
		return StateEscalating
	case endWalltime:
		a.log.Warn("job ended by walltime", "reason", end.reason)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(verdict.Walltime), Reason: end.reason})
		a.run.walltimeEnded(end.reason, end.clean())
		return StateDone
	case endSignal:
		clean := end.clean()
		a.log.Warn("stopped by signal", "signal", end.sig.String(), "ranks_clean", clean)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(verdict.Signaled),
			Reason: "signal " + end.sig.String(), RanksClean: eventlog.Opt(clean)})
		a.run.signaled(end.sig, clean)
		return StateDone
	}
	a.run.setOutcome(verdict.FatalError, "internal error: cycle ended without a kind")
	return StateDone
}

// signalDuringStop: a signal arrived while this node was stopping its
// ranks for a restart; the node does not restart.
func (a *Agent) signalDuringStop() State {
	sig := a.run.pendingSignal
	a.log.Warn("signal received while stopping ranks; not restarting", "signal", sig.String())
	a.ev.Emit(eventlog.SignalReceivedEvent{Round: eventlog.Opt(a.run.asg.Round), Signal: sigName(sig), State: eventlog.AgentState(StateStopping.String())})
	a.run.signaled(sig, a.run.end.clean())
	return StateDone
}

func (a *Agent) decideSuccess(ctx context.Context) State {
	asg := a.run.asg
	var code int
	sig, err := a.call(ctx, 0, func(ctx context.Context) error {
		var err error
		code, err = a.d.Rdzv.Succeed(ctx, asg.Round)
		return err
	})
	switch {
	case sig != nil:
		a.log.Warn("signal received while waiting for the other nodes to finish", "signal", sig.String())
		a.run.signaled(sig, true)
		return StateDone
	case errors.Is(err, rendezvous.ErrRoundRestarted):
		// Another node failed the round after our ranks finished: the
		// job restarts from its last checkpoint, here too.
		a.log.Warn("ranks finished but another node failed the round; restarting", "round", asg.Round)
		a.ev.Emit(eventlog.RestartEvent{AfterRound: asg.Round, Reason: "another node failed the round"})
		a.met.Restarted()
		return StateJoining
	case err != nil:
		kind := classifyRdzvErr(err)
		a.log.Error("waiting for the other nodes failed", "kind", string(kind), "err", err)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(kind), Reason: err.Error()})
		a.run.setOutcome(kind, err.Error())
		return StateDone
	}
	if code != 0 {
		reason := "ranks of another node failed"
		a.log.Error("job failed on another node", "exit_code", code)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), ExitCode: eventlog.Opt(code), Reason: reason})
		a.run.closedBy("", code, reason)
		return StateDone
	}
	if a.run.walltime != nil {
		// The ranks stopped themselves after the pre-walltime signal.
		a.run.walltimeEnded("every rank exited 0 after the pre-walltime signal "+sigName(a.run.walltime), true)
		return StateDone
	}
	a.log.Info("all ranks succeeded", "round", asg.Round)
	a.run.setOutcome(verdict.Succeeded, "all ranks of every node succeeded")
	a.ev.Emit(eventlog.JobSucceededEvent{Round: asg.Round})
	return StateDone
}

// HangQuarantineThreshold is the number of hang verdicts on one node within
// one job after which the node leaves, quarantined (policy.QuarantineForHangs).
const HangQuarantineThreshold = policy.HangQuarantineThreshold

func (a *Agent) decideFailure(ctx context.Context, end cycleEnd) State {
	asg := a.run.asg
	f := policy.RankCrash
	if end.hang {
		f = policy.RankHang
		a.run.hangs++
		if policy.QuarantineForHangs(a.run.hangs, a.cfg.NNodes.Min, a.cfg.NNodes.Max) {
			return a.quarantineForHangs(ctx, end)
		}
	}
	if why, ok := a.run.repeatedFailure(a.cfg.FT.SameFailureLimit); ok {
		return a.stopRepeated(ctx, why)
	}
	var dec rendezvous.Decision
	sig, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error {
		var err error
		dec, err = a.d.Rdzv.Fail(ctx, asg.Round, f, end.reason)
		return err
	})
	switch {
	case sig != nil:
		a.log.Warn("signal received while reporting a failure", "signal", sig.String())
		a.run.signaled(sig, false)
		return StateDone
	case err != nil:
		kind := classifyRdzvErr(err)
		a.log.Error("reporting the failure to the rendezvous failed", "kind", string(kind), "err", err)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(kind), Reason: err.Error()})
		a.run.setOutcome(kind, err.Error())
		return StateDone
	}
	a.run.restartsUsed = max(a.run.restartsUsed, dec.RestartsUsed)
	if st, out := a.checkFailingNode(ctx, dec); out {
		return st
	}
	if !dec.Restart {
		a.log.Error("not restarting", "kind", string(dec.Close), "reason", dec.Reason, "exit_code", dec.Code)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(dec.Close), Reason: dec.Reason, ExitCode: eventlog.Opt(dec.Code)})
		a.run.closedBy(dec.Close, dec.Code, dec.Reason)
		return StateDone
	}
	a.run.delayNextRound(dec.Delay)
	action := a.restartAction(dec.Action)
	msg := "restarting all ranks"
	if action == policy.RestartInProcess {
		msg = "restarting the failed ranks; the survivors stay in process"
	}
	a.log.Warn(msg, "after_round", asg.Round, "action", string(action), "reason", end.reason,
		"restarts_used", dec.RestartsUsed)
	a.ev.Emit(eventlog.RestartEvent{AfterRound: asg.Round, Action: eventlog.Opt(action), Reason: end.reason,
		RestartsUsed: eventlog.Opt(dec.RestartsUsed), Mode: eventlog.Opt(a.restartMode())})
	a.restarted(ctx)
	return StateJoining
}

func (a *Agent) decideRoundEnded(ctx context.Context, end cycleEnd) State {
	asg := a.run.asg
	e := end.rdzvEnd
	a.ev.Emit(eventlog.RoundEndedEvent{Round: eventlog.Opt(asg.Round), Reason: e.Reason, Node: eventlog.Opt(e.Node),
		Cause: eventlog.Opt(e.Cause), JobClosed: e.Kind == rendezvous.EndJobClosed})
	switch e.Cause {
	case policy.NodeLost:
		a.run.quarantine(e.Node, "", verdict.EvidenceLost, e.Reason, asg.Round)
	case policy.NodeExcluded:
		a.run.quarantine(e.Node, "", verdict.EvidenceExcluded, e.Reason, asg.Round)
	}
	a.peerEnded(ctx, e)
	if e.Kind == rendezvous.EndJobClosed {
		a.log.Warn("job closed", "kind", string(e.Close), "reason", e.Reason, "exit_code", e.Code)
		if e.Code == 0 {
			a.ev.Emit(eventlog.JobSucceededEvent{Round: asg.Round})
		} else {
			a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(e.Close), Reason: e.Reason, ExitCode: eventlog.Opt(e.Code)})
		}
		a.run.closedBy(e.Close, e.Code, e.Reason)
		return StateDone
	}
	a.run.delayNextRound(e.Delay)
	action := a.restartAction(e.Action)
	a.log.Warn("round ended by the job; restarting", "round", asg.Round, "reason", e.Reason, "action", string(action))
	rec := eventlog.RestartEvent{AfterRound: asg.Round, Reason: e.Reason, Mode: eventlog.Opt(a.restartMode())}
	if action != "" {
		rec.Action = eventlog.Opt(action)
	}
	a.ev.Emit(rec)
	a.restarted(ctx)
	return StateJoining
}

// decideFenced follows a fence (rendezvous.EndFenced): this node's lease
// could not be renewed, so its ranks were killed (stopCycle, no grace)
// before the lease could expire at etcd and peers start a round without
// it. It then reports that it stopped (policy.NodeStopped: no evidence
// against the node), which waits until etcd answers (or the etcd loss bound
// closes the job here): when its lease expired first, a peer has already
// ended the round for its loss and the report only learns how.
func (a *Agent) decideFenced(ctx context.Context, end cycleEnd) State {
	asg := a.run.asg
	stopped := a.run.cycle.stopped
	a.log.Error("fenced: ranks killed because this node's lease could not be renewed", "round", asg.Round,
		"reason", end.reason, "ranks_stopped_at", stopped.UTC().Format(time.RFC3339Nano))
	a.ev.Emit(eventlog.FencedEvent{Round: asg.Round, Reason: end.reason,
		RanksStoppedAt: stopped.UTC().Format(time.RFC3339Nano)})
	var dec rendezvous.Decision
	sig, err := a.call(ctx, 0, func(ctx context.Context) error {
		var err error
		dec, err = a.d.Rdzv.Fail(ctx, asg.Round, policy.NodeStopped, end.reason)
		return err
	})
	switch {
	case sig != nil:
		a.log.Warn("signal received while reporting the fence", "signal", sig.String())
		a.run.signaled(sig, false)
		return StateDone
	case err != nil:
		kind := classifyRdzvErr(err)
		a.log.Error("reporting the fence to the rendezvous failed", "kind", string(kind), "err", err)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(kind), Reason: err.Error()})
		a.run.setOutcome(kind, err.Error())
		return StateDone
	}
	a.run.restartsUsed = max(a.run.restartsUsed, dec.RestartsUsed)
	a.ev.Emit(eventlog.RoundEndedEvent{Round: eventlog.Opt(asg.Round), Reason: dec.Reason, Node: eventlog.Opt(a.d.NodeID),
		Fenced: true, JobClosed: !dec.Restart})
	if !dec.Restart {
		a.log.Error("not restarting", "kind", string(dec.Close), "reason", dec.Reason, "exit_code", dec.Code)
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(dec.Close), Reason: dec.Reason, ExitCode: eventlog.Opt(dec.Code)})
		a.run.closedBy(dec.Close, dec.Code, dec.Reason)
		return StateDone
	}
	a.log.Warn("fenced round is over; rejoining", "round", asg.Round, "reason", dec.Reason, "action", string(dec.Action))
	a.run.delayNextRound(dec.Delay)
	a.restarted(ctx)
	return StateJoining
}

// restartAction names the restart for this node's records: the
// rendezvous decides for the job (restart in place, swap a spare), and
// whether this node's survivors stay is the node's in-process decision
// (policy.Survivors, in keeping), which turns a restart in place into
// restart_in_process.
func (a *Agent) restartAction(job policy.Action) policy.Action {
	if job == policy.RestartInPlace && a.restartMode() == policy.ModeInProcess {
		return policy.RestartInProcess
	}
	return job
}

// quarantineForHangs takes this node out of the job after repeated hang
// verdicts on it: the peers see it excluded and swap in a spare.
func (a *Agent) quarantineForHangs(ctx context.Context, end cycleEnd) State {
	round := a.run.asg.Round
	reason := fmt.Sprintf("%d hang verdicts on this node in this job (threshold %d); last: %s", a.run.hangs, HangQuarantineThreshold, end.reason)
	a.log.Error("quarantining this node: repeated hangs", "hangs", a.run.hangs, "last", end.reason)
	if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error { return a.d.Rdzv.Leave(ctx, "quarantined: "+reason) }); err != nil {
		a.log.Warn("leaving the rendezvous", "err", err)
	}
	a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(round), CloseKind: eventlog.Opt(verdict.NodeExcluded), Reason: reason})
	a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceHang, reason, round)
	a.run.setOutcome(verdict.NodeExcluded, reason)
	return StateDone
}

// escalating carries out a rank's workload-control request at the end of
// a cycle, as nvrx does at the next rendezvous join.
func (a *Agent) escalating(ctx context.Context) State {
	req := *a.run.pendingReq
	round := a.run.asg.Round
	reason := fmt.Sprintf("rank %d requested %s: %s", req.GlobalRank, req.Action, req.Description)
	if req.Action == monitor.ActionExcludeThisNode {
		a.log.Warn("leaving the job", "reason", reason)
		if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error { return a.d.Rdzv.Leave(ctx, reason) }); err != nil {
			a.log.Warn("leaving the rendezvous", "err", err)
		}
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(round), CloseKind: eventlog.Opt(verdict.NodeExcluded), Reason: reason, ExitCode: eventlog.Opt(1)})
		a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceExcluded, reason, round)
		a.run.setOutcome(verdict.NodeExcluded, reason)
		return StateDone
	}
	a.log.Warn("shutting the workload down", "reason", reason, "exit_code", a.cfg.FT.NoRestartExitCode)
	return a.closeNoRestart(ctx, reason)
}

// closeNoRestart closes the job for every node with the no-restart exit
// code: restarting cannot help (a rank's ShutdownWorkload, the same
// failure again).
func (a *Agent) closeNoRestart(ctx context.Context, reason string) State {
	code := a.cfg.FT.NoRestartExitCode
	if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error {
		return a.d.Rdzv.Shutdown(ctx, verdict.NoRestart, code, reason)
	}); err != nil {
		a.log.Warn("closing the job in the rendezvous", "err", err)
	}
	a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(a.run.asg.Round), CloseKind: eventlog.Opt(verdict.NoRestart), Reason: reason, ExitCode: eventlog.Opt(code)})
	a.run.closedBy(verdict.NoRestart, code, reason)
	return StateDone
}
