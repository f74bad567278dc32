package main

import (
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// watchdogMargin is how long before its lease can expire at etcd the fence
// watchdog kills this node's ranks: half the rendezvous's fence margin
// (--rdzv-conf fence_margin, default a fifth of the TTL: 1.2 s of the
// default 6 s), so 0.6 s by default. A launcher that runs fences its own
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
//
// A watchdog that dies later is restarted at once with the state
// (fence.DefaultBudget); each restart is logged, written to the event log
// (fence_watchdog_restarted), counted (ftlauncher_fence_watchdog_restarts_total)
// and listed in the verdict (fence_watchdog). When it cannot be restarted,
// the ranks it guarded have been SIGKILLed and abort ends this node: it
// does not run ranks unprotected.
func startFence(reaper *spawn.Reaper, ev *eventlog.Log, met *metrics.Metrics, rec *fenceRecord, abort func(reason string), log *slog.Logger) *fence.Watchdog {
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
		},
		OnRestart: func(r fence.Restart) {
			ev.Emit(eventlog.FenceWatchdogRestartedEvent{OldPID: r.OldPID, NewPID: r.NewPID, Exit: r.Exit, ExitCode: r.Code,
				Signal: r.Signal, ServedS: r.Served.Seconds(), RestartMS: ms(r.Downtime), Attempts: r.Attempts,
				Guarded: r.Guarded, Armed: r.Armed, Restarts: r.Restarts})
			met.FenceWatchdogRestarted()
			rec.restarted(r)
		},
		OnGiveUp: func(g fence.GiveUp) {
			reason := "its fence watchdog could not be restarted (" + g.Reason + "): its ranks were killed rather than run unprotected"
			log.Error("this node stops: "+reason, "watchdog_pid", g.OldPID, "exit", g.Exit, "killed_pgids", g.Killed)
			ev.Emit(eventlog.FenceWatchdogGaveUpEvent{OldPID: g.OldPID, Exit: g.Exit, Reason: g.Reason, PGIDs: g.Killed})
			met.FenceWatchdogUp(false)
			rec.gaveUp(g)
			abort("the fence watchdog could not be restarted (" + g.Reason + "): this node's ranks were killed rather than run unprotected")
		}})
	if err != nil {
		log.Error("no fence watchdog: a frozen launcher's ranks would not be stopped", "err", err)
		return nil
	}
	met.FenceWatchdogUp(true)
	log.Debug("fence watchdog running", "pid", wd.PID(), "start", time.Since(started))
	return wd
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fenceRecord collects the fence watchdog's deaths for the verdict; safe
// for concurrent use and on nil.
type fenceRecord struct {
	mu sync.Mutex
	v  *verdict.FenceWatchdog // nil until the watchdog died
}

func (f *fenceRecord) add(d verdict.FenceWatchdogDeath) *verdict.FenceWatchdog {
	if f.v == nil {
		f.v = &verdict.FenceWatchdog{}
	}
	f.v.Deaths = append(f.v.Deaths, d)
	if n := len(f.v.Deaths); n > verdict.MaxFenceWatchdogDeaths {
		f.v.Deaths = f.v.Deaths[n-verdict.MaxFenceWatchdogDeaths:]
	}
	return f.v
}

func (f *fenceRecord) restarted(r fence.Restart) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.add(verdict.FenceWatchdogDeath{PID: r.OldPID, Exit: r.Exit, At: time.Now().Add(-r.Downtime).UTC(),
		NewPID: r.NewPID, RestartMS: ms(r.Downtime)}).Restarts = r.Restarts
}

func (f *fenceRecord) gaveUp(g fence.GiveUp) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.add(verdict.FenceWatchdogDeath{PID: g.OldPID, Exit: g.Exit, At: time.Now().UTC()}).GaveUp = g.Reason
}

// snapshot is the verdict's fence_watchdog: nil when the watchdog never died.
func (f *fenceRecord) snapshot() *verdict.FenceWatchdog {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.v == nil {
		return nil
	}
	v := *f.v
	v.Deaths = append([]verdict.FenceWatchdogDeath(nil), v.Deaths...)
	return &v
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
