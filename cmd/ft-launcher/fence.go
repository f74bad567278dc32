package main

import (
	"log/slog"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// watchdogMargin is how long before its lease can expire at etcd the fence
// watchdog kills this node's ranks: half the rendezvous's fence margin
// (--rdzv-conf fence_margin, default a fifth of the TTL: 1 s of the
// default 5 s), so 0.5 s by default. A launcher that runs fences its own
// ranks first, at the full margin (rendezvous, "Fencing: never two rounds
// at once"), and records why; the watchdog is the backstop for a launcher
// that cannot act (frozen, stalled). The lease's validity is already a
// lower bound (the renewal's send time plus the TTL etcd granted, counted
// on this machine from before the request left); the remaining half margin
// covers the kill itself (SIGKILL is immediate, a rank's exit takes
// milliseconds) and a watchdog scheduled late on a loaded machine, so the
// ranks are gone strictly before the lease can expire and peers can start
// a round without this node.
func watchdogMargin(ttl, fenceMargin time.Duration) time.Duration {
	if fenceMargin <= 0 {
		fenceMargin = ttl / 5 // the rendezvous's default
	}
	return fenceMargin / 2
}

// startFence starts the fence watchdog of a multi-node launcher (single-node
// jobs have no lease and no peers, and pay nothing). It reports a fence in
// the event log and the log when the launcher runs again. A watchdog that
// cannot start is logged and the job runs without it (nil): the node then
// has only the in-process fence, as before.
func startFence(reaper *spawn.Reaper, ev *eventlog.Log, log *slog.Logger) *fence.Watchdog {
	started := time.Now()
	wd, err := fence.Start(reaper, fence.Options{Logger: log.With("component", "fence"),
		OnFence: func(r fence.Report) {
			// Runs when this launcher reads the report: after a freeze,
			// once it was resumed.
			late := time.Duration(fence.Monotonic() - r.AtNs)
			log.Error("the fence watchdog killed this node's ranks: this launcher could not renew its lease in time (frozen or cut off from etcd)",
				"reason", r.Reason, "pgids", r.Killed, "late_ms", r.LateMs, "read_after", late.Round(time.Millisecond))
			ev.Emit(eventlog.FencedByWatchdogEvent{Reason: r.Reason, PGIDs: r.Killed,
				LateMS: r.LateMs, ReadAfterS: late.Seconds()})
		}})
	if err != nil {
		log.Error("no fence watchdog: a frozen launcher's ranks would not be stopped", "err", err)
		return nil
	}
	log.Debug("fence watchdog running", "pid", wd.PID(), "start", time.Since(started))
	return wd
}

// fencedRanks guards every rank process group it starts with the watchdog,
// and unguards them once stopped.
type fencedRanks struct {
	agent.RankStarter
	wd *fence.Watchdog
}

func (f fencedRanks) StartGroup(specs []spawn.Spec) (agent.RankGroup, error) {
	g, err := f.RankStarter.StartGroup(specs)
	if err != nil {
		return nil, err
	}
	for _, pgid := range g.PIDs() {
		f.wd.Guard(pgid)
	}
	return fencedGroup{RankGroup: g, wd: f.wd}, nil
}

type fencedGroup struct {
	agent.RankGroup
	wd *fence.Watchdog
}

func (g fencedGroup) Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult {
	res := g.RankGroup.Stop(sig, grace)
	for _, pgid := range g.PIDs() {
		g.wd.Unguard(pgid)
	}
	return res
}
