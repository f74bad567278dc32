package agent

import (
	"context"
	"strconv"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The agent's side of spares: the node's leases in the ledger (Active,
// Spare, Filler), the spare metrics and the timing of a swap.

// swapTiming is a promotion of this spare, timed from the round's opening
// to its ranks' start.
type swapTiming struct {
	opened, assigned time.Time
	reclaim          time.Duration
	preempted        bool // a filler was running and was reclaimed
}

// parked records this node parked as a spare (and its filler started).
func (a *Agent) parked(ctx context.Context) {
	asg := a.run.asg
	if a.d.Ledger != nil {
		a.d.Ledger.End(ctx, ledger.Active, ledger.Reassigned, "parked as a spare in round "+itoa(asg.Round))
	}
	isNew := true
	if a.d.Ledger != nil {
		_, isNew = a.d.Ledger.Begin(ctx, ledger.Spare, -1, asg.Round)
	}
	if !a.run.isSpare {
		a.met.SpareParked(isNew)
	}
	a.run.isSpare = true
	if a.d.Spare != nil {
		a.d.Spare.Park()
		if a.d.Ledger != nil {
			a.d.Ledger.Begin(ctx, ledger.Filler, -1, asg.Round)
		}
		a.run.fillerOn = true
	}
}

// promoted records this spare taking an active place (after its filler
// was reclaimed), and the node's Active lease.
func (a *Agent) promoted(ctx context.Context, reclaim time.Duration) {
	asg := a.run.asg
	if a.run.isSpare {
		detail := "promoted to group rank " + itoa(asg.GroupRank) + " in round " + itoa(asg.Round)
		if a.d.Ledger != nil {
			if a.run.fillerOn {
				a.d.Ledger.End(ctx, ledger.Filler, ledger.ReclaimedBySpare, detail)
			}
			a.d.Ledger.End(ctx, ledger.Spare, ledger.Swap, detail)
		}
		a.met.SpareLeft()
		a.run.swap = &swapTiming{opened: asg.OpenedAt, assigned: time.Now(), reclaim: reclaim, preempted: a.run.fillerOn}
		a.run.isSpare, a.run.fillerOn = false, false
	}
	if a.d.Ledger == nil {
		return
	}
	if cur, ok := a.d.Ledger.Current(ledger.Active); ok && cur.GroupRank != asg.GroupRank {
		a.d.Ledger.End(ctx, ledger.Active, ledger.Reassigned, "group rank "+itoa(asg.GroupRank)+" in round "+itoa(asg.Round))
	}
	a.d.Ledger.Begin(ctx, ledger.Active, asg.GroupRank, asg.Round)
}

// swapDone observes a swap's phases once the promoted spare's ranks run.
func (a *Agent) swapDone() {
	s := a.run.swap
	if s == nil {
		return
	}
	a.run.swap = nil
	c := a.run.cycle
	phases := map[string]time.Duration{"detection": a.run.asg.Detection, "filler_reclaim": s.reclaim, "spawn": c.spawned.Sub(c.spawnStart)}
	if !s.opened.IsZero() {
		phases["rendezvous"] = s.assigned.Sub(s.opened) - s.reclaim
		phases["total"] = c.spawned.Sub(s.opened)
	}
	a.met.SpareSwapped(s.preempted, phases)
	rec := eventlog.SpareSwapEvent{Round: a.run.asg.Round, GroupRank: a.run.asg.GroupRank, FillerPreempted: s.preempted,
		DetectionMS: ms(phases["detection"]), FillerReclaimMS: ms(phases["filler_reclaim"]), SpawnMS: ms(phases["spawn"])}
	if !s.opened.IsZero() {
		rec.RendezvousMS, rec.TotalMS = eventlog.Opt(ms(phases["rendezvous"])), eventlog.Opt(ms(phases["total"]))
	}
	a.ev.Emit(rec)
}

// peerEnded records another node's lease ended by its loss or departure.
// The rendezvous normally did it already, in the txn that ended the round
// (e.LedgerBy): only that node keeps the records; else (an end written by
// an older launcher) each survivor tries, and one wins.
func (a *Agent) peerEnded(ctx context.Context, e rendezvous.RoundEnd) {
	if a.d.Ledger == nil {
		return
	}
	if e.LedgerBy != "" {
		a.d.Ledger.Closed(ctx, e.Ledger)
		return
	}
	node, reason := e.Node, e.Reason
	switch e.Cause {
	case policy.NodeLost:
		a.d.Ledger.CloseOther(ctx, node, ledger.NodeFailure, reason)
	case policy.NodeExcluded:
		a.d.Ledger.CloseOther(ctx, node, ledger.Excluded, reason)
	case policy.NodeStopped:
		a.d.Ledger.CloseOther(ctx, node, ledger.Stopped, reason)
	}
}

// closeLedger ends this node's open leases with the outcome's reason.
func (a *Agent) closeLedger(o *Outcome) {
	if a.run.isSpare {
		a.met.SpareLeft()
	}
	if a.d.Ledger == nil {
		return
	}
	reason := ledger.JobFailed
	switch o.Kind {
	case verdict.Succeeded:
		reason = ledger.JobSucceeded
	case verdict.NodeExcluded:
		reason = ledger.Excluded
		for _, q := range o.Quarantined {
			if q.Node == a.d.NodeID && (q.Evidence == verdict.EvidenceFillerReclaim || q.Evidence == verdict.EvidenceHang) {
				reason = ledger.Quarantined
			}
		}
	case verdict.Signaled, verdict.Walltime:
		reason = ledger.Stopped
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	a.d.Ledger.EndAll(ctx, reason, o.Reason)
	o.Ledger = a.d.Ledger.Records()
}

func itoa(i int) string { return strconv.Itoa(i) }
