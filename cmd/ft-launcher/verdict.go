package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/prewarm"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/state"
	"github.com/ftlauncher/ft-launcher/verdict"
	"golang.org/x/sys/unix"
)

// verdictRecorder writes the verdict file and the termination log for every
// exit of launch.
type verdictRecorder struct {
	cfg     *configs.Config
	log     *slog.Logger
	ev      *eventlog.Log
	host    string
	node    string
	logDir  string         // the run's log directory, once known
	logs    *ranklogs.Logs // counts the rank output lost, once set up
	started time.Time

	etcdMember *memberFailures             // deaths of the hosted etcd member (etcdmember.go)
	fence      *fenceRecord                // deaths of the fence watchdog (fence.go)
	state      *state.Store                // --state-dir (state.go); nil when off
	prewarm    func() *prewarm.AutoSummary // --prewarm auto's list, once set up
}

// path is --verdict-file (or $FT_LAUNCHER_VERDICT_FILE), else verdict.json
// in the run's log directory.
func (r *verdictRecorder) path() string {
	if r.cfg.VerdictFile != "" {
		return r.cfg.VerdictFile
	}
	if r.logDir != "" {
		return filepath.Join(r.logDir, "verdict.json")
	}
	return ""
}

// setupFailed records a failure before the agent ran.
func (r *verdictRecorder) setupFailed(what string, err error) int {
	r.log.Error(what, "err", err)
	kind := verdict.FatalError
	if errors.Is(err, rendezvous.ErrRendezvousLost) {
		kind = verdict.RendezvousLost
	}
	reason := what + ": " + err.Error()
	r.ev.Emit(eventlog.JobFailedEvent{CloseKind: eventlog.Opt(kind), Reason: reason})
	return r.write(agent.Outcome{Kind: kind, Reason: reason, MaxRestarts: r.cfg.MaxRestarts, LastRound: -1,
		StartedAt: r.started.UTC(), EndedAt: time.Now().UTC()})
}

// signaled records a signal that ended the launcher during its set-up,
// before any rank was started.
func (r *verdictRecorder) signaled(sig os.Signal) int {
	name := sig.String()
	if s, ok := sig.(syscall.Signal); ok && unix.SignalName(s) != "" {
		name = unix.SignalName(s)
	}
	reason := "stopped by " + name + " during set-up, before any rank started"
	r.log.Warn("signal received during set-up; exiting", "signal", name)
	r.ev.Emit(eventlog.SignalReceivedEvent{Signal: name, State: eventlog.StateSetup})
	o := agent.Outcome{Kind: verdict.Signaled, Reason: reason, Signal: sig, MaxRestarts: r.cfg.MaxRestarts, LastRound: -1,
		StartedAt: r.started.UTC(), EndedAt: time.Now().UTC()}
	r.ev.Emit(eventlog.VerdictEvent{VerdictKind: o.Kind, ExitCode: o.ExitCode(), Reason: reason,
		RestartsUsed: 0, LastRound: -1, Finished: false, Quarantined: 0})
	return r.write(o)
}

// write stores the outcome's verdict in the verdict file and, compacted,
// in the termination log (--termination-log: in a pod the kubelet puts it
// in the pod's status), and returns the exit code.
//
// A verdict that cannot be written must not leave an earlier run's in its
// place for an outer loop to act on: the old file is removed (or emptied),
// and the exit code becomes ExitVerdictLost where it would have been 0 or
// 1. A no-restart code stays: it carries the decision by itself.
func (r *verdictRecorder) write(o agent.Outcome) int {
	code := o.ExitCode()
	v := o.Verdict(r.cfg.RdzvID, r.node, r.host)
	lost := verdict.RecordsLost{RankOutputBytes: r.logs.LostBytes()}
	lost.EventLogEvents, lost.EventLogBytes = r.ev.Lost()
	if lost.Any() {
		v.RecordsLost = &lost
	}
	recordLost := func() {
		if code == configs.ExitSuccess || code == configs.ExitFailure {
			code = configs.ExitVerdictLost
			v.ExitCode = code
		}
	}
	v.EtcdMemberFailures = r.etcdMember.snapshot()
	if v.FenceWatchdog = r.fence.snapshot(); v.FenceWatchdog != nil {
		r.log.Warn("the fence watchdog died during the run (see fence_watchdog in the verdict)",
			"deaths", len(v.FenceWatchdog.Deaths), "restarts", v.FenceWatchdog.Restarts, "gave_up", v.FenceWatchdog.GaveUp)
	}
	if r.state != nil {
		// The ranks are stopped: the final write-out, before the verdict
		// that a continuation job reads.
		if err := r.state.Close(context.Background()); err != nil {
			r.log.Warn("state: final write-out", "err", err)
		}
		v.StateWarnings = r.state.Warnings()
		for _, b := range r.state.BuddyRestores() {
			v.StateRestoredFromBuddy = append(v.StateRestoredFromBuddy, verdict.BuddyRestore{Round: b.Round,
				LocalRank: b.LocalRank, Rank: int(b.Rank), Step: b.Step, Sender: b.Sender})
		}
	}
	if r.prewarm != nil {
		if a := r.prewarm(); a != nil {
			v.PrewarmAuto = &verdict.PrewarmAuto{Command: a.Command, Modules: a.Modules, Default: a.Default,
				Cycles: a.Cycles, Unsafe: a.Unsafe, Failed: a.Failed, StateFile: a.StateFile}
		}
	}
	if path := r.path(); path != "" {
		if err := verdict.Write(path, v); err != nil {
			recordLost()
			attrs := []any{"path", path, "err", err, "kind", string(o.Kind), "exit_code", code}
			if rmErr := verdict.Remove(path); rmErr != nil {
				r.log.Error("could not write the verdict file, and an earlier verdict there stays: outer loops may act on it", append(attrs, "remove_err", rmErr)...)
			} else {
				r.log.Error("could not write the verdict file; no earlier verdict is left there", attrs...)
			}
			r.ev.Emit(eventlog.VerdictLostEvent{Path: path, Err: err.Error(), ExitCode: code})
		} else {
			r.log.Info("verdict written", "path", path, "kind", string(o.Kind), "exit_code", code)
		}
	}
	if path := r.cfg.TerminationLog; path != "" {
		if err := verdict.WriteTerminationMessage(path, v); err != nil {
			recordLost()
			// It was opened with O_TRUNC: what is left is empty or cut,
			// and no reader takes it for a verdict.
			r.log.Error("could not write the termination log", "path", path, "err", err, "exit_code", code)
		} else {
			r.log.Debug("termination log written", "path", path)
		}
	}
	if lost.Any() {
		r.log.Warn("records were lost during the run (see records_lost in the verdict)", "event_log_events", lost.EventLogEvents,
			"event_log_bytes", lost.EventLogBytes, "rank_output_bytes", lost.RankOutputBytes)
	}
	return code
}
