// Package agent is the per-node agent loop of ft-launcher. It ties the other
// packages together: it asks the rendezvous for a round, starts this node's
// ranks (spawn) with their logs (ranklogs) and monitors (monitor), waits for
// the first thing that ends the cycle, stops the ranks and decides what comes
// next. The node-agent failure level is the state machine in Run: one place
// that says what every event does in every state.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
	"golang.org/x/sys/unix"
)

// State is a node agent state. The names appear in logs and the event log.
type State string

// Node agent states.
const (
	StateRendezvous State = "rendezvous" // waiting for a round to close
	StateStandby    State = "standby"    // parked beyond MIN nodes
	StateRunning    State = "running"    // ranks started, supervising
	StateStopping   State = "stopping"   // ranks being stopped
	StateDone       State = "done"       // exit code decided
)

// Deps are the parts the agent drives. The caller owns their lifetimes.
type Deps struct {
	Config   *configs.Config
	Logger   *slog.Logger
	Events   *eventlog.Log
	Reaper   *spawn.Reaper
	Logs     *ranklogs.Logs
	Monitors *monitor.Manager
	Rdzv     rendezvous.Rendezvous
	Signals  <-chan os.Signal // signals to forward to ranks (SignalsToHandle)
	Hostname string
	// Getenv and Environ give the launcher's environment (os.Getenv and
	// os.Environ in production).
	Environ []string
}

// Agent runs the ranks of one node.
type Agent struct {
	d     Deps
	cfg   *configs.Config
	log   *slog.Logger
	ev    *eventlog.Log
	state State
}

// New returns an Agent.
func New(d Deps) *Agent {
	return &Agent{d: d, cfg: d.Config, log: d.Logger, ev: d.Events}
}

func (a *Agent) setState(s State) {
	if a.state != s {
		a.log.Debug("agent state", "from", string(a.state), "to", string(s))
	}
	a.state = s
}

// cycleEnd says how one supervised cycle ended.
type cycleEnd struct {
	kind      endKind
	failures  []ranklogs.Failure
	reason    string
	rdzvEnd   rendezvous.RoundEnd
	sig       os.Signal
	exitCodes map[int]int // local rank -> torch exit code
}

type endKind int

const (
	endSuccess endKind = iota + 1
	endRankFailure
	endRoundEnded // another node failed, node lost, or job closed
	endSignal
	endWorkload // a rank's ShutdownWorkload / ExcludeThisNode request
)

// Run runs cycles until the job ends and returns the launcher's exit code.
func (a *Agent) Run(ctx context.Context) int {
	cfg := a.cfg
	a.ev.Emit(eventlog.LauncherStarted, map[string]any{
		"pid": os.Getpid(), "nproc_per_node": cfg.NProcPerNode, "max_restarts": cfg.MaxRestarts,
		"nnodes": fmt.Sprintf("%d:%d", cfg.NNodes.Min, cfg.NNodes.Max), "script": cfg.Script,
	})
	var pendingReq *monitor.WorkloadRequest
	for {
		a.setState(StateRendezvous)
		t0 := time.Now()
		asg, sig, err := a.next(ctx)
		if sig != nil {
			a.log.Warn("signal received while waiting for a round; exiting", "signal", sig.String())
			a.ev.Emit(eventlog.SignalReceived, map[string]any{"signal": sigName(sig), "state": string(StateRendezvous)})
			return configs.ExitFailure
		}
		if err != nil {
			if ctx.Err() != nil {
				a.log.Warn("interrupted while waiting for a rendezvous round")
				return configs.ExitFailure
			}
			var closed *rendezvous.JobClosedError
			if errors.As(err, &closed) {
				// A standby (or a late node) learns the job's end here and
				// exits with the same code as every other node.
				a.log.Info("job closed while waiting for a round", "exit_code", closed.Code, "reason", closed.Reason)
				a.ev.Emit(eventlog.RoundEnded, map[string]any{"job_closed": true, "reason": closed.Reason, "exit_code": closed.Code})
				return closed.Code
			}
			if errors.Is(err, rendezvous.ErrClosed) {
				a.log.Info("rendezvous closed; exiting")
				return configs.ExitFailure
			}
			a.log.Error("rendezvous failed", "err", err)
			a.ev.Emit(eventlog.JobFailed, map[string]any{"reason": err.Error()})
			return configs.ExitFailure
		}
		if asg.Standby {
			a.setState(StateStandby)
			a.log.Info("standby: this node is parked for a later round", "round", asg.Round)
			continue
		}
		a.log.Info("round closed", "round", asg.Round, "group_rank", asg.GroupRank,
			"group_world_size", asg.GroupWorldSize, "world_size", asg.WorldSize,
			"master", fmt.Sprintf("%s:%d", asg.MasterAddr, asg.MasterPort),
			"rendezvous_ms", time.Since(t0).Milliseconds())

		end, err := a.cycle(ctx, asg, &pendingReq)
		if err != nil {
			a.log.Error("cycle failed to start", "round", asg.Round, "err", err)
			a.ev.Emit(eventlog.JobFailed, map[string]any{"round": asg.Round, "reason": err.Error()})
			_ = a.d.Rdzv.Shutdown(context.Background(), verdict.FatalError, configs.ExitFailure, "node "+a.d.Hostname+": "+err.Error())
			return configs.ExitFailure
		}
		a.setState(StateDone)
		switch end.kind {
		case endSuccess:
			code, err := a.d.Rdzv.Succeed(ctx, asg.Round)
			if errors.Is(err, rendezvous.ErrRoundRestarted) {
				// Another node failed the round after our ranks finished:
				// the job restarts from its last checkpoint, here too.
				a.log.Warn("ranks finished but another node failed the round; restarting", "round", asg.Round)
				a.ev.Emit(eventlog.Restart, map[string]any{"after_round": asg.Round, "reason": "another node failed the round"})
				continue
			}
			if err != nil {
				a.log.Error("waiting for the other nodes failed", "err", err)
				code = configs.ExitFailure
			}
			a.finished(asg.Round, code)
			return code
		case endRankFailure:
			if pendingReq != nil {
				return a.applyWorkloadRequest(*pendingReq, asg.Round)
			}
			dec, err := a.d.Rdzv.Fail(ctx, asg.Round, policy.RankCrash, end.reason)
			if err != nil {
				a.log.Error("reporting the failure to the rendezvous failed", "err", err)
				a.ev.Emit(eventlog.JobFailed, map[string]any{"round": asg.Round, "reason": err.Error()})
				return configs.ExitFailure
			}
			if !dec.Restart {
				a.log.Error("not restarting", "reason", dec.Reason, "exit_code", dec.Code)
				a.ev.Emit(eventlog.JobFailed, map[string]any{"round": asg.Round, "reason": dec.Reason, "exit_code": dec.Code})
				return dec.Code
			}
			a.log.Warn("restarting all ranks", "after_round", asg.Round, "reason", end.reason)
			a.ev.Emit(eventlog.Restart, map[string]any{"after_round": asg.Round, "reason": end.reason})
		case endRoundEnded:
			e := end.rdzvEnd
			a.ev.Emit(eventlog.RoundEnded, map[string]any{"round": asg.Round, "reason": e.Reason, "node": e.Node,
				"job_closed": e.Kind == rendezvous.EndJobClosed})
			if e.Kind == rendezvous.EndJobClosed {
				a.log.Warn("job closed", "reason", e.Reason, "exit_code", e.Code)
				if e.Code == 0 {
					a.ev.Emit(eventlog.JobSucceeded, map[string]any{"round": asg.Round})
				} else {
					a.ev.Emit(eventlog.JobFailed, map[string]any{"round": asg.Round, "reason": e.Reason, "exit_code": e.Code})
				}
				return e.Code
			}
			a.log.Warn("round ended by the job; restarting", "round", asg.Round, "reason", e.Reason)
			a.ev.Emit(eventlog.Restart, map[string]any{"after_round": asg.Round, "reason": e.Reason})
		case endWorkload:
			return a.applyWorkloadRequest(*pendingReq, asg.Round)
		case endSignal:
			code := configs.ExitSuccess
			for _, c := range end.exitCodes {
				if c != 0 {
					code = configs.ExitFailure
				}
			}
			a.log.Warn("stopped by signal", "signal", end.sig.String(), "exit_code", code)
			a.ev.Emit(eventlog.JobFailed, map[string]any{"round": asg.Round, "reason": "signal " + end.sig.String(), "exit_code": code})
			return code
		}
	}
}

// next waits for the next round; a handled signal interrupts the wait (no
// ranks run then, so there is nothing to forward it to).
func (a *Agent) next(ctx context.Context) (rendezvous.Assignment, os.Signal, error) {
	nctx, cancel := context.WithCancel(ctx)
	defer cancel()
	got := make(chan os.Signal, 1)
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case s := <-a.d.Signals:
			got <- s
			cancel()
		case <-done:
		}
	}()
	asg, err := a.d.Rdzv.Next(nctx)
	close(done)
	<-exited // a signal taken by the goroutine is in got now, never lost
	select {
	case s := <-got:
		return asg, s, err
	default:
		return asg, nil, err
	}
}

// applyWorkloadRequest carries out a rank's workload-control request at the
// end of a cycle, as nvrx does at the next rendezvous join.
func (a *Agent) applyWorkloadRequest(req monitor.WorkloadRequest, round int) int {
	reason := fmt.Sprintf("rank %d requested %s: %s", req.GlobalRank, req.Action, req.Description)
	switch req.Action {
	case "ExcludeThisNode":
		a.log.Warn("leaving the job", "reason", reason)
		_ = a.d.Rdzv.Leave(context.Background(), reason)
		a.ev.Emit(eventlog.JobFailed, map[string]any{"round": round, "reason": reason, "exit_code": configs.ExitFailure})
		return configs.ExitFailure
	default: // ShutdownWorkload
		code := a.cfg.FT.NoRestartExitCode
		a.log.Warn("shutting the workload down", "reason", reason, "exit_code", code)
		_ = a.d.Rdzv.Shutdown(context.Background(), verdict.NoRestart, code, reason)
		a.ev.Emit(eventlog.JobFailed, map[string]any{"round": round, "reason": reason, "exit_code": code})
		return code
	}
}

func (a *Agent) finished(round, code int) {
	if code != 0 {
		a.log.Error("job failed on another node", "exit_code", code)
		a.ev.Emit(eventlog.JobFailed, map[string]any{"round": round, "exit_code": code, "reason": "another node failed"})
		return
	}
	if flag := a.envValue("FAULT_TOL_FINISHED_FLAG_FILE"); flag != "" {
		if _, err := os.Stat(flag); err == nil {
			a.log.Info("training finished: finished flag present", "flag", flag)
			a.ev.Emit(eventlog.TrainingFinished, map[string]any{"round": round, "flag": flag})
		}
	}
	a.log.Info("all ranks succeeded", "round", round)
	a.ev.Emit(eventlog.JobSucceeded, map[string]any{"round": round})
}

func (a *Agent) envValue(k string) string {
	for i := len(a.d.Environ) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(a.d.Environ[i], k+"="); ok {
			return v
		}
	}
	return ""
}

// cycle starts the ranks of one round and supervises them until something
// ends the cycle; the ranks are stopped when it returns.
func (a *Agent) cycle(ctx context.Context, asg rendezvous.Assignment, pendingReq **monitor.WorkloadRequest) (cycleEnd, error) {
	cfg := a.cfg
	n := cfg.NProcPerNode
	infos := make([]ranklogs.RankInfo, n)
	for i := range infos {
		infos[i] = ranklogs.RankInfo{LocalRank: i, GlobalRank: asg.RankBase + i}
	}
	att, err := a.d.Logs.Attempt(asg.Round, infos)
	if err != nil {
		return cycleEnd{}, fmt.Errorf("prepare logs for attempt %d: %w", asg.Round, err)
	}
	defer att.Close()

	specs := make([]spawn.Spec, n)
	for lr := 0; lr < n; lr++ {
		out, errw := att.Files(lr)
		specs[lr] = spawn.Spec{
			LocalRank: lr,
			Argv:      WorkerArgv(cfg, lr),
			Env:       WorkerEnv(a.d.Environ, cfg, asg, lr, att.ErrorFile(lr), a.d.Monitors),
			Stdout:    out,
			Stderr:    errw,
		}
	}
	a.setState(StateRunning)
	started := time.Now()
	g, err := a.d.Reaper.StartGroup(specs)
	att.CloseParentEnds() // the ranks hold their ends of the log pipes now
	if err != nil {
		return cycleEnd{}, fmt.Errorf("start ranks: %w", err)
	}
	pids := g.PIDs()
	if a.d.Monitors != nil {
		a.d.Monitors.BeginCycle(asg.Round, pids)
	}
	a.ev.Emit(eventlog.CycleStarted, map[string]any{"round": asg.Round, "group_rank": asg.GroupRank,
		"world_size": asg.WorldSize, "pids": pidList(pids), "master_addr": asg.MasterAddr, "master_port": asg.MasterPort})

	end := a.supervise(ctx, g, asg, pendingReq)

	// Stop whatever is still running. On a signal the received signal is
	// forwarded and TermTimeout applies; otherwise SIGTERM and WorkersStopTimeout.
	a.setState(StateStopping)
	sig, grace := syscall.SIGTERM, cfg.WorkersStopTimeout
	if end.kind == endSignal {
		if s, ok := end.sig.(syscall.Signal); ok {
			sig = s
		}
		grace = cfg.TermTimeout
	}
	res := g.Stop(sig, grace)
	for _, e := range res.Exits {
		a.recordExit(asg, e, &end)
	}
	for _, lr := range res.Escalated {
		a.log.Warn("rank did not stop within the grace period; sent SIGKILL", "local_rank", lr, "grace", grace)
		a.ev.Emit(eventlog.StopEscalated, map[string]any{"round": asg.Round, "local_rank": lr, "grace_s": grace.Seconds()})
	}
	if len(res.Leftover) > 0 {
		a.log.Error("processes still present after SIGKILL (uninterruptible?)", "pids", res.Leftover)
	}
	if a.d.Monitors != nil {
		a.d.Monitors.EndCycleWith(end.kind == endSuccess)
	}
	if end.kind == endRankFailure || (end.kind == endSignal && len(end.failures) > 0) {
		a.reportFailures(asg, end.failures, att)
	}
	a.log.Debug("cycle ended", "round", asg.Round, "ran", time.Since(started))
	return end, nil
}

// supervise waits, event-driven, for the first event that ends the cycle.
func (a *Agent) supervise(ctx context.Context, g *spawn.Group, asg rendezvous.Assignment, pendingReq **monitor.WorkloadRequest) cycleEnd {
	end := cycleEnd{exitCodes: map[int]int{}}
	var hangs <-chan monitor.Hang
	var reqs <-chan monitor.WorkloadRequest
	if a.d.Monitors != nil {
		hangs, reqs = a.d.Monitors.Hangs(), a.d.Monitors.Requests()
	}
	hangByRank := map[int]monitor.Hang{}
	ended := a.d.Rdzv.Ended(asg.Round)
	exits := g.Exits()
	remaining := a.cfg.NProcPerNode
	for {
		select {
		case e := <-exits:
			remaining--
			a.recordExit(asg, e, &end)
			if e.Failed() {
				if _, ok := hangByRank[e.LocalRank]; !ok && a.d.Monitors != nil {
					if _, fired := a.d.Monitors.FiredHang(asg.Round, e.LocalRank); fired {
						// The monitor killed this rank; its report follows at
						// once (or after the termination grace).
						a.awaitHang(hangs, asg, e.LocalRank, hangByRank)
					}
				}
				end.kind = endRankFailure
				if h, ok := hangByRank[e.LocalRank]; ok {
					end.reason = hangReason(h)
				} else {
					end.reason = fmt.Sprintf("local rank %d (rank %d) %s", e.LocalRank, asg.RankBase+e.LocalRank, exitText(e))
				}
				return end
			}
			if remaining == 0 {
				end.kind = endSuccess
				return end
			}
		case h := <-hangs:
			a.recordHang(asg, h, hangByRank)
		case r := <-reqs:
			a.log.Warn("workload control request from a rank", "rank", r.GlobalRank, "action", r.Action, "description", r.Description)
			a.ev.Emit(eventlog.WorkloadRequest, map[string]any{"round": asg.Round, "rank": r.GlobalRank,
				"action": r.Action, "description": r.Description})
			if r.Action == "Continue" {
				continue
			}
			rr := r
			*pendingReq = &rr
			if r.Action == "ShutdownWorkload" {
				end.kind = endWorkload
				end.reason = r.Description
				return end
			}
		case e := <-ended:
			end.kind = endRoundEnded
			end.rdzvEnd = e
			end.reason = e.Reason
			return end
		case s := <-a.d.Signals:
			a.log.Warn("signal received; forwarding to every rank's process group", "signal", s.String(), "term_timeout", a.cfg.TermTimeout)
			a.ev.Emit(eventlog.SignalReceived, map[string]any{"round": asg.Round, "signal": sigName(s)})
			end.kind = endSignal
			end.sig = s
			return end
		case <-ctx.Done():
			end.kind = endSignal
			end.sig = syscall.SIGTERM
			return end
		}
	}
}

// recordHang logs a hang report of this cycle and remembers it per rank.
func (a *Agent) recordHang(asg rendezvous.Assignment, h monitor.Hang, hangByRank map[int]monitor.Hang) {
	if h.Cycle != asg.Round {
		return
	}
	hangByRank[h.LocalRank] = h
	a.log.Error("rank hang detected; rank killed", "local_rank", h.LocalRank, "rank", h.GlobalRank,
		"timeout_kind", h.Kind, "section", h.Section, "timeout", h.Timeout, "elapsed", h.Elapsed,
		"signal", h.Signal.String(), "latency", h.SignalledAt.Sub(h.ExpiredAt))
	a.ev.Emit(eventlog.RankHang, map[string]any{"round": asg.Round, "local_rank": h.LocalRank,
		"rank": h.GlobalRank, "timeout_kind": h.Kind, "section": h.Section,
		"timeout_s": h.Timeout.Seconds(), "elapsed_s": h.Elapsed.Seconds(), "signal": sigName(h.Signal),
		"detect_latency_ms":    float64(h.SignalledAt.Sub(h.ExpiredAt).Microseconds()) / 1000,
		"escalated_to_sigkill": h.Escalated})
}

// awaitHang waits, bounded, for the hang report of a rank its monitor killed.
func (a *Agent) awaitHang(hangs <-chan monitor.Hang, asg rendezvous.Assignment, localRank int, hangByRank map[int]monitor.Hang) {
	grace := time.Duration(a.cfg.FT.TerminationGrace*float64(time.Second)) + 2*time.Second
	timeout := time.After(grace)
	for {
		select {
		case h := <-hangs:
			a.recordHang(asg, h, hangByRank)
			if _, ok := hangByRank[localRank]; ok {
				return
			}
		case <-timeout:
			a.log.Warn("the monitor killed a rank but its hang report did not arrive", "local_rank", localRank)
			return
		}
	}
}

func (a *Agent) recordExit(asg rendezvous.Assignment, e spawn.Exit, end *cycleEnd) {
	if _, seen := end.exitCodes[e.LocalRank]; seen {
		return
	}
	end.exitCodes[e.LocalRank] = e.TorchExitCode()
	fields := map[string]any{"round": asg.Round, "local_rank": e.LocalRank, "rank": asg.RankBase + e.LocalRank,
		"pid": e.PID, "exit_code": e.TorchExitCode()}
	if e.Signal != 0 {
		fields["signal"] = sigName(e.Signal)
	}
	a.ev.Emit(eventlog.RankExited, fields)
	if e.Failed() {
		a.log.Warn("rank failed", "local_rank", e.LocalRank, "rank", asg.RankBase+e.LocalRank, "pid", e.PID, "how", exitText(e))
		end.failures = append(end.failures, ranklogs.Failure{LocalRank: e.LocalRank, GlobalRank: asg.RankBase + e.LocalRank,
			PID: e.PID, ExitCode: e.TorchExitCode(), Time: e.At})
	}
}

func (a *Agent) reportFailures(asg rendezvous.Assignment, failures []ranklogs.Failure, att *ranklogs.Attempt) {
	if len(failures) == 0 {
		return
	}
	for i := range failures {
		f := &failures[i]
		f.ErrorFile = att.ErrorFile(f.LocalRank)
		if f.ErrorFile != "" {
			if rec, err := ranklogs.ReadErrorFile(f.ErrorFile); err == nil {
				f.Record = &rec
			}
		}
	}
	summary := ranklogs.Summary(scriptName(a.cfg), a.d.Hostname, failures)
	fmt.Fprintln(os.Stderr, summary)
	if path := a.envValue("TORCHELASTIC_ERROR_FILE"); path != "" {
		root := failures[ranklogs.RootCause(failures)]
		if err := ranklogs.WriteLauncherErrorFile(path, root); err != nil {
			a.log.Warn("could not write the launcher error file", "path", path, "err", err)
		}
	}
}

func hangReason(h monitor.Hang) string {
	what := h.Kind
	if h.Section != "" {
		what += " '" + h.Section + "'"
	}
	return fmt.Sprintf("local rank %d (rank %d) hung: %s timeout %s expired (elapsed %s)",
		h.LocalRank, h.GlobalRank, what, h.Timeout, h.Elapsed.Round(time.Millisecond))
}

func exitText(e spawn.Exit) string {
	if e.Signal != 0 {
		return "was killed by " + sigName(e.Signal)
	}
	return "exited with code " + strconv.Itoa(e.Code)
}

// sigName is the SIGXXX name of a signal, for logs and the event log.
func sigName(s os.Signal) string {
	if ss, ok := s.(syscall.Signal); ok {
		if n := unix.SignalName(ss); n != "" {
			return n
		}
	}
	return s.String()
}

func pidList(p map[int]int) []int {
	out := make([]int, len(p))
	keys := make([]int, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	for i, k := range keys {
		out[i] = p[k]
	}
	return out
}

func scriptName(cfg *configs.Config) string {
	return filepath.Base(cfg.Script)
}
