package agent

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/straggler"
	"golang.org/x/sys/unix"
)

// cycleEnd says how one supervised cycle ended.
type cycleEnd struct {
	kind     endKind
	hang     bool // the failing rank was killed by its monitor
	failures []ranklogs.Failure
	reason   string
	// byExit: reason is local rank exitLR's exit (explainFailure adds its
	// cause to it).
	byExit    bool
	exitLR    int
	rdzvEnd   rendezvous.RoundEnd
	sig       os.Signal
	sigAt     time.Time           // when sig was received (the repeat window starts there)
	exitCodes map[int]int         // local rank -> torch exit code
	straggler straggler.NodeSpeed // endStraggler: the judgement that named this node
}

// clean reports whether every rank of the cycle exited 0.
func (e cycleEnd) clean() bool {
	for _, c := range e.exitCodes {
		if c != 0 {
			return false
		}
	}
	return true
}

type endKind int

const (
	endSuccess endKind = iota + 1
	endRankFailure
	endRoundEnded // another node failed, node lost, or job closed
	endSignal
	endWorkload  // a rank's ShutdownWorkload request
	endWalltime  // a rank exited after the pre-walltime warning
	endFenced    // this node's lease could not be renewed: its ranks are killed at once
	endStraggler // this node is a straggler, swapped for a spare (--ft-straggler swap)
)

func (k endKind) String() string {
	switch k {
	case endSuccess:
		return "success"
	case endRankFailure:
		return "rank_failure"
	case endRoundEnded:
		return "round_ended"
	case endSignal:
		return "signal"
	case endWorkload:
		return "workload_request"
	case endWalltime:
		return "walltime"
	case endFenced:
		return "fenced"
	case endStraggler:
		return "straggler"
	}
	return "unknown"
}

// prepareCycle serves this round's agent store and prepares its logs and
// the specs of its ranks (before running or rejoining starts them).
func (a *Agent) prepareCycle() ([]spawn.Spec, *ranklogs.Attempt, error) {
	cfg := a.cfg
	asg := a.run.asg
	n := cfg.NProcPerNode
	if a.d.Store != nil {
		// Before any rank of this node starts: group rank 0's store was
		// bound before the round could close (the rendezvous advertised
		// its port), so no rank anywhere waits on a connect retry.
		if err := a.d.Store.Round(asg); err != nil {
			return nil, nil, fmt.Errorf("serve the agent store at %s:%d: %w", asg.MasterAddr, asg.MasterPort, err)
		}
	}
	infos := make([]ranklogs.RankInfo, n)
	for i := range infos {
		infos[i] = ranklogs.RankInfo{LocalRank: i, GlobalRank: asg.RankBase + i}
	}
	att, err := a.d.Logs.Attempt(asg.Round, infos)
	if err != nil {
		return nil, nil, fmt.Errorf("prepare logs for attempt %d: %w", asg.Round, err)
	}
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
	a.run.ip.newRound()
	return specs, att, nil
}

// startCycle starts every rank of this round afresh (startRejoin starts a
// round for kept survivors).
func (a *Agent) startCycle() error {
	specs, att, err := a.prepareCycle()
	if err != nil {
		return err
	}
	asg := a.run.asg
	a.run.ip.allFresh() // every rank starts afresh: no survivor to follow
	a.run.cycle.spawnStart = time.Now()
	g, err := a.d.Ranks.StartGroup(specs)
	att.CloseParentEnds() // the ranks hold their ends of the log pipes now
	if err != nil {
		att.Close()
		return fmt.Errorf("start ranks: %w", err)
	}
	a.run.cycle.spawned = time.Now()
	a.run.group, a.run.att = g, att
	a.swapDone()
	pids := g.PIDs()
	if a.d.Monitors != nil {
		a.d.Monitors.BeginCycle(asg.Round, pids)
	}
	a.ev.Emit(eventlog.CycleStartedEvent{Round: asg.Round, GroupRank: asg.GroupRank,
		WorldSize: asg.WorldSize, PIDs: pidList(pids), MasterAddr: asg.MasterAddr, MasterPort: asg.MasterPort,
		RestartsUsed: asg.RestartsUsed})
	return nil
}

// stopCycle stops whatever still runs of the cycle. On a signal the
// received signal is forwarded and TermTimeout applies; otherwise SIGTERM
// and WorkersStopTimeout. Handled signals during the stop follow
// stopSignals (signals.go): the first is remembered (the node then does
// not restart), a repeat of the same signal within the window is ignored
// (Slurm's double SIGTERM at a time limit), and a distinct request
// SIGKILLs every rank at once instead of waiting out the grace.
func (a *Agent) stopCycle() {
	cfg := a.cfg
	asg := a.run.asg
	end := &a.run.end
	g, att := a.run.group, a.run.att
	defer att.Close()
	defer a.run.ip.closeKeptLogs() // logs of survivors of an in-process restart
	a.run.cycle.stopStart = time.Now()
	sig, grace := syscall.SIGTERM, cfg.WorkersStopTimeout
	rule := stopSignals{window: a.d.SignalRepeatWindow}
	if end.kind == endFenced {
		// No grace: the lease may expire at etcd within the fence margin,
		// and then a new round may start without this node.
		sig, grace = syscall.SIGKILL, 0
	}
	if end.kind == endSignal {
		if s, ok := end.sig.(syscall.Signal); ok {
			sig = s
		}
		grace = cfg.TermTimeout
		rule.first, rule.firstAt = end.sig, end.sigAt
	}
	done := make(chan spawn.StopResult, 1)
	go func() { done <- g.Stop(sig, grace) }()
	var res spawn.StopResult
wait:
	for {
		select {
		case res = <-done:
			break wait
		case s := <-a.d.Signals:
			if a.isWalltime(s) {
				a.walltimeWarning(s, g)
				continue
			}
			switch rule.take(s, time.Now()) {
			case stopFirst:
				a.run.pendingSignal = s
				a.log.Warn("signal received while stopping ranks; the node will not restart", "signal", s.String())
			case stopRepeat:
				a.log.Warn("the same signal again within the repeat window: taken as a repeat delivery (Slurm sends SIGTERM more than once at a time limit); the ranks keep their grace",
					"signal", s.String(), "since_first", time.Since(rule.firstAt), "window", rule.window, "grace", grace)
				a.ev.Emit(eventlog.SignalReceivedEvent{Round: eventlog.Opt(asg.Round), Signal: sigName(s), State: eventlog.AgentState(StateStopping.String()),
					Repeat: true, Escalated: eventlog.Opt(false), WindowS: eventlog.Opt(rule.window.Seconds())})
			case stopEscalate:
				a.log.Warn("another signal received while stopping ranks; sending SIGKILL now", "signal", s.String(),
					"first", sigName(rule.first), "since_first", time.Since(rule.firstAt))
				a.ev.Emit(eventlog.SignalReceivedEvent{Round: eventlog.Opt(asg.Round), Signal: sigName(s), State: eventlog.AgentState(StateStopping.String()), Escalated: eventlog.Opt(true)})
				g.SignalAll(syscall.SIGKILL)
			}
		}
	}
	for _, e := range res.Exits {
		a.recordExit(e, end)
	}
	for _, lr := range res.Escalated {
		a.log.Warn("rank did not stop within the grace period; sent SIGKILL", "local_rank", lr, "grace", grace)
		a.ev.Emit(eventlog.StopEscalatedEvent{Round: asg.Round, LocalRank: lr, GraceS: grace.Seconds()})
	}
	if len(res.Leftover) > 0 {
		a.log.Error("processes still present after SIGKILL (uninterruptible?)", "pids", res.Leftover)
	}
	if a.d.Monitors != nil {
		a.d.Monitors.EndCycleWith(end.kind == endSuccess)
	}
	if end.kind == endRankFailure || (end.kind == endSignal && len(end.failures) > 0) {
		a.reportFailures(end.failures, att, stderrDrainBound)
	}
	a.run.cycle.stopped = time.Now()
	a.run.group, a.run.att = nil, nil
}

// supervise waits, event-driven, for the first event that ends the cycle.
func (a *Agent) supervise(ctx context.Context) cycleEnd {
	asg := a.run.asg
	g := a.run.group
	end := cycleEnd{exitCodes: map[int]int{}}
	var hangs <-chan monitor.Hang
	var reqs <-chan monitor.WorkloadRequest
	if a.d.Monitors != nil {
		hangs, reqs = a.d.Monitors.Hangs(), a.d.Monitors.Requests()
	}
	hangByRank := map[int]monitor.Hang{}
	ended := a.d.Rdzv.Ended(asg.Round)
	exits := g.Exits()
	ip := &a.run.ip // in-process restarts (inprocess.go)
	ipReps, rejoinC := ip.reports(), ip.rejoinTimer()
	remaining := a.cfg.NProcPerNode
	sw := a.startSpeedWatch(ctx, asg, g) // nil: not measured
	defer sw.stop()
	var swap *stragglerPending
	var swapCheck <-chan time.Time
	for {
		select {
		case me := <-sw.notify():
			if swap = a.onStraggler(me); swap != nil {
				t := time.NewTicker(stragglerPoll)
				defer t.Stop()
				swapCheck = t.C
			}
		case <-swapCheck:
			if when, ok := a.stragglerDue(swap); ok {
				end.kind, end.straggler = endStraggler, swap.me
				end.reason = stragglerReason(swap.me, when, a.cfg.FT.StragglerThreshold)
				return end
			}
		case e := <-exits:
			remaining--
			a.recordExit(e, &end)
			var settle time.Duration
			if remaining == 0 && !e.Failed() && a.run.walltime == nil && len(a.d.WalltimeSignals) > 0 {
				settle = a.d.WalltimeSettle
			}
			if s, ok := a.signalBefore(g, settle); ok {
				a.signalled(s, &end)
				return end
			}
			if e.Failed() {
				a.rankFailed(ctx, e, hangs, hangByRank, &end)
				return end
			}
			if ip.survivorLeft(e, &end, asg) {
				return end
			}
			if remaining == 0 {
				end.kind = endSuccess
				return end
			}
		case h := <-hangs:
			a.recordHang(h, hangByRank)
		case rep := <-ipReps:
			ip.report(ctx, asg.Round, rep)
		case <-rejoinC:
			ip.overdue(g)
			rejoinC = ip.rejoinTimer() // running again when a stuck survivor was replaced
		case r := <-reqs:
			if a.workloadRequest(r, &end) {
				return end
			}
		case e := <-ended:
			end.kind = endRoundEnded
			if e.Kind == rendezvous.EndFenced {
				end.kind = endFenced
			}
			end.rdzvEnd = e
			end.reason = e.Reason
			return end
		case s := <-a.d.Signals:
			if a.isWalltime(s) {
				a.walltimeWarning(s, g)
				continue
			}
			a.signalled(s, &end)
			return end
		case <-ctx.Done():
			end.kind = endSignal
			end.sig, end.sigAt = syscall.SIGTERM, time.Now()
			return end
		}
	}
}

// signalBefore takes the signals already waiting when a rank's exit is
// seen: they came first, and select picks among ready cases at random.
// Under Slurm the pre-walltime warning reaches the ranks as it reaches the
// launcher (slurmstepd signals every process of the step), so a rank that
// saves and exits 0 on it must end the job by walltime, not as a success;
// settle > 0 also waits that long for a first signal still on its way
// (Deps.WalltimeSettle). Walltime warnings are handled here; another
// signal is returned, to end the cycle (signalled).
func (a *Agent) signalBefore(g RankGroup, settle time.Duration) (os.Signal, bool) {
	var late <-chan time.Time
	if settle > 0 {
		t := time.NewTimer(settle)
		defer t.Stop()
		late = t.C
	}
	for {
		var s os.Signal
		if late != nil {
			select {
			case s = <-a.d.Signals:
			case <-late:
				return nil, false
			}
		} else {
			select {
			case s = <-a.d.Signals:
			default:
				return nil, false
			}
		}
		if !a.isWalltime(s) {
			return s, true
		}
		a.walltimeWarning(s, g)
		late = nil // the warning came: take only what is already waiting
	}
}

// signalled ends the cycle for signal s, which the stop forwards to every
// rank's process group.
func (a *Agent) signalled(s os.Signal, end *cycleEnd) {
	a.log.Warn("signal received; forwarding to every rank's process group", "signal", s.String(), "term_timeout", a.cfg.TermTimeout)
	a.ev.Emit(eventlog.SignalReceivedEvent{Round: eventlog.Opt(a.run.asg.Round), Signal: sigName(s)})
	end.kind = endSignal
	end.sig, end.sigAt = s, time.Now()
}

// walltimeWarning forwards the scheduler's pre-walltime signal to every
// rank so it can checkpoint; from now on rank exits end the job by
// walltime instead of counting as failures.
func (a *Agent) walltimeWarning(s os.Signal, g RankGroup) {
	if a.run.walltime == s && time.Since(a.run.walltimeAt) < a.d.SignalRepeatWindow {
		// The same warning delivered twice (under srun, slurmstepd signals
		// every process of the step, and ft-resumer node forwards it too):
		// the ranks were told once.
		a.log.Info("pre-walltime signal again within the repeat window: a repeat delivery, not forwarded again", "signal", sigName(s))
		return
	}
	a.run.walltime, a.run.walltimeAt = s, time.Now()
	a.log.Warn("pre-walltime signal received; forwarding it to every rank (not a failure)", "signal", sigName(s))
	a.ev.Emit(eventlog.WalltimeWarningEvent{Round: a.run.asg.Round, Signal: sigName(s)})
	if ss, ok := s.(syscall.Signal); ok {
		g.SignalAll(ss)
	}
}

// rankFailed fills end for a rank that exited with a failure, attributing
// it to a hang when its monitor killed it.
func (a *Agent) rankFailed(ctx context.Context, e spawn.Exit, hangs <-chan monitor.Hang, hangByRank map[int]monitor.Hang, end *cycleEnd) {
	asg := a.run.asg
	if _, ok := hangByRank[e.LocalRank]; !ok && a.d.Monitors != nil {
		if _, fired := a.d.Monitors.FiredHang(asg.Round, e.LocalRank); fired {
			// The monitor killed this rank; its report follows at once
			// (or after the termination grace).
			a.awaitHang(hangs, e.LocalRank, hangByRank)
		}
	}
	end.kind = endRankFailure
	if a.run.walltime != nil {
		// After the walltime warning an exit is the job's time running out
		// (a rank that does not handle the signal dies of it).
		end.kind = endWalltime
		end.reason = fmt.Sprintf("local rank %d (rank %d) %s after the pre-walltime signal %s",
			e.LocalRank, asg.RankBase+e.LocalRank, exitText(e), sigName(a.run.walltime))
		return
	}
	if h, ok := hangByRank[e.LocalRank]; ok {
		end.hang = true
		end.reason = hangReason(h)
		a.recordRankFailure(e, true)
		return
	}
	if j, ok := a.bystanderOf(ctx, e.LocalRank); ok {
		// It waited for a rank that hung, named by the stacks, and left
		// the collective when that rank was killed: the hang is the
		// cause, whichever node reports first.
		end.hang = true
		end.reason = fmt.Sprintf("%s; local rank %d (rank %d) %s waiting for it", j.Finding.Text, e.LocalRank, asg.RankBase+e.LocalRank, exitText(e))
		a.recordStacksOf(j)
		a.recordRankFailure(e, false)
		a.run.rankFailures[len(a.run.rankFailures)-1].Bystander = true
		return
	}
	end.reason = fmt.Sprintf("local rank %d (rank %d) %s", e.LocalRank, asg.RankBase+e.LocalRank, exitText(e))
	end.byExit, end.exitLR = true, e.LocalRank
	a.recordRankFailure(e, false)
}

// workloadRequest records a rank's request; it reports whether the
// request ends the cycle now.
func (a *Agent) workloadRequest(r monitor.WorkloadRequest, end *cycleEnd) bool {
	a.log.Warn("workload control request from a rank", "rank", r.GlobalRank, "action", r.Action, "description", r.Description)
	a.ev.Emit(eventlog.WorkloadRequestEvent{Round: a.run.asg.Round, Rank: r.GlobalRank,
		Action: r.Action, Description: r.Description})
	if r.Action == monitor.ActionContinue {
		return false
	}
	rr := r
	a.run.pendingReq = &rr
	if r.Action == monitor.ActionShutdownWorkload {
		end.kind = endWorkload
		end.reason = r.Description
		return true
	}
	return false // ExcludeThisNode acts when the cycle ends
}

// recordHang logs a hang report of this cycle and remembers it per rank.
func (a *Agent) recordHang(h monitor.Hang, hangByRank map[int]monitor.Hang) {
	asg := a.run.asg
	if h.Cycle != asg.Round {
		return
	}
	hangByRank[h.LocalRank] = h
	a.recordStacks(h)
	a.met.HangKilled(h.Kind.String())
	a.log.Error("rank hang detected; rank killed", "local_rank", h.LocalRank, "rank", h.GlobalRank,
		"timeout_kind", h.Kind, "section", h.Section, "timeout", h.Timeout, "default_timeout", h.DefaultTimeout, "elapsed", h.Elapsed,
		"signal", h.Signal.String(), "latency", h.SignalledAt.Sub(h.ExpiredAt))
	a.ev.Emit(eventlog.RankHangEvent{Round: asg.Round, LocalRank: h.LocalRank,
		Rank: h.GlobalRank, TimeoutKind: h.Kind, Section: h.Section,
		TimeoutS: h.Timeout.Seconds(), ElapsedS: h.Elapsed.Seconds(), Signal: sigName(h.Signal),
		DetectLatencyMS:    float64(h.SignalledAt.Sub(h.ExpiredAt).Microseconds()) / 1000,
		SignalledAt:        h.SignalledAt.UTC(), // the stall began elapsed_s before it
		EscalatedToSIGKILL: h.Escalated, DefaultTimeout: h.DefaultTimeout,
		Judged: h.Judged, Finding: findingText(h)})
}

// awaitHang waits, bounded, for the hang report of a rank its monitor killed.
func (a *Agent) awaitHang(hangs <-chan monitor.Hang, localRank int, hangByRank map[int]monitor.Hang) {
	grace := time.Duration(a.cfg.FT.TerminationGrace*float64(time.Second)) + 2*time.Second
	timeout := time.NewTimer(grace)
	defer timeout.Stop()
	for {
		select {
		case h := <-hangs:
			a.recordHang(h, hangByRank)
			if _, ok := hangByRank[localRank]; ok {
				return
			}
		case <-timeout.C:
			a.log.Warn("the monitor killed a rank but its hang report did not arrive", "local_rank", localRank)
			return
		}
	}
}

func (a *Agent) recordExit(e spawn.Exit, end *cycleEnd) {
	asg := a.run.asg
	if _, seen := end.exitCodes[e.LocalRank]; seen {
		return
	}
	end.exitCodes[e.LocalRank] = e.TorchExitCode()
	a.met.RankExited(e.Failed())
	rec := eventlog.RankExitedEvent{Round: asg.Round, LocalRank: e.LocalRank, Rank: asg.RankBase + e.LocalRank,
		PID: e.PID, ExitCode: e.TorchExitCode()}
	if e.Signal != 0 {
		rec.Signal = sigName(e.Signal)
	}
	a.ev.Emit(rec)
	if e.Failed() {
		a.log.Warn("rank failed", "local_rank", e.LocalRank, "rank", asg.RankBase+e.LocalRank, "pid", e.PID, "how", exitText(e))
		end.failures = append(end.failures, ranklogs.Failure{LocalRank: e.LocalRank, GlobalRank: asg.RankBase + e.LocalRank,
			PID: e.PID, ExitCode: e.TorchExitCode(), Time: e.At})
	}
}

// reportFailures summarizes, hints at and explains the failures of a
// cycle. drain bounds the wait for each failed rank's stderr to reach its
// log (WaitStderr).
func (a *Agent) reportFailures(failures []ranklogs.Failure, att *ranklogs.Attempt, drain time.Duration) {
	if len(failures) == 0 {
		return
	}
	for i := range failures {
		f := &failures[i]
		// Its last lines (a faulthandler dump written as it died) may
		// still be in the copier's pipe: its log is read below.
		if !att.WaitStderr(f.LocalRank, drain) {
			a.log.Debug("the rank's stderr is still open (a process that inherited it lives on); reading its log as it is", "local_rank", f.LocalRank)
		}
		f.ErrorFile = att.ErrorFile(f.LocalRank)
		if f.ErrorFile != "" {
			if rec, err := ranklogs.ReadErrorFile(f.ErrorFile); err == nil {
				f.Record = &rec
			}
		}
	}
	summary := ranklogs.Summary(scriptName(a.cfg), a.d.Hostname, failures)
	fmt.Fprintln(os.Stderr, summary)
	a.hintFailures(failures, att)
	a.explainFailures(failures, att)
	if path := a.envValue("TORCHELASTIC_ERROR_FILE"); path != "" {
		root := failures[ranklogs.RootCause(failures)]
		if err := ranklogs.WriteLauncherErrorFile(path, root); err != nil {
			a.log.Warn("could not write the launcher error file", "path", path, "err", err)
		}
	}
}

// hintFailures logs, once per run and cause, what to do about a failure
// whose rank's message does not say it (ranklogs.FailureHint).
func (a *Agent) hintFailures(failures []ranklogs.Failure, att *ranklogs.Attempt) {
	for _, f := range failures {
		_, stderrPath := att.LogPaths(f.LocalRank)
		h, ok := ranklogs.FailureHint(ranklogs.FailureText(f, stderrPath), a.cfg.AgentStore)
		if !ok || a.run.hinted[h.Kind] {
			continue
		}
		if a.run.hinted == nil {
			a.run.hinted = map[eventlog.HintCause]bool{}
		}
		a.run.hinted[h.Kind] = true
		a.log.Error("hint: "+h.Text, "local_rank", f.LocalRank, "rank", f.GlobalRank, "cause", h.Kind)
		a.ev.Emit(eventlog.RankFailureHintEvent{LocalRank: f.LocalRank, Rank: f.GlobalRank, Cause: h.Kind, Hint: h.Text})
	}
}

func (a *Agent) envValue(k string) string {
	return lookupEnv(a.d.Environ, k)
}

func lookupEnv(environ []string, k string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if len(environ[i]) > len(k) && environ[i][len(k)] == '=' && environ[i][:len(k)] == k {
			return environ[i][len(k)+1:]
		}
	}
	return ""
}

func hangReason(h monitor.Hang) string {
	what := h.Kind.String()
	if h.Section != "" {
		what += " '" + h.Section + "'"
	}
	if h.DefaultTimeout {
		what = "default " + what
	}
	j := h.Judgement
	if j == nil {
		return fmt.Sprintf("local rank %d (rank %d) hung: %s timeout %s expired (elapsed %s)",
			h.LocalRank, h.GlobalRank, what, h.Timeout, h.Elapsed.Round(time.Millisecond))
	}
	verb := "hung"
	if !j.Finding.Known {
		verb = "first silent" // the stacks single no rank out: not said to be the one that hung
	}
	clock := fmt.Sprintf("%s timeout %s expired (elapsed %s)", what, h.Timeout, h.Elapsed.Round(time.Millisecond))
	if h.Judged {
		clock = fmt.Sprintf("named by the stacks, silent %s", h.Elapsed.Round(time.Millisecond))
	}
	return fmt.Sprintf("local rank %d (rank %d) %s: %s; stacks: %s", h.LocalRank, h.GlobalRank, verb, clock, j.Finding.Text)
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
	if s == nil {
		return ""
	}
	return s.String()
}

func pidList(p map[int]int) []int {
	keys := make([]int, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	out := make([]int, len(keys))
	for i, k := range keys {
		out[i] = p[k]
	}
	return out
}

func scriptName(cfg *configs.Config) string {
	return filepath.Base(cfg.Script)
}
