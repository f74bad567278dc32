package agent

// The round for kept survivors (StateRejoining's start): inProcess.start
// and its steps, in the order they run.

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// keptRanks are the survivors of a failure between the failure and the
// next round's start.
type keptRanks struct {
	group     RankGroup
	survivors []int // local ranks that stay
	failedAt  time.Time
	why       string
}

// StorePrefix is the c10d store prefix of a round's process group: the one
// torch's env:// rendezvous uses with the agent store, so fresh ranks and
// survivors of an in-process restart meet under it and nothing of an
// older round is visible.
func StorePrefix(round int) string { return "/worker/attempt_" + strconv.Itoa(round) }

// start starts the round c.asg for the kept survivors (kept → rejoining,
// or stepping when no survivor waits for its rejoin): the missing ranks
// start (from a standby when --prewarm has one), every survivor gets the
// round's notice, then the monitors begin the cycle (a survivor that
// reconnects after its notice waits for that, so nothing slow comes
// between the notices and BeginCycle). It returns the round's ranks.
//
// A survivor that ended while the round was forming (it gives up waiting
// for its notice after its notice_wait, e.g. while the round waits for a
// node to come back), or that has no monitor session to take the notice
// and ends when killed, is started afresh with the failed ranks: its end
// is not a failure of the new round and spends nothing more. When none is
// left the round is a full one (idle). When the fresh ranks cannot start,
// the survivors still there stay kept, for stopKept.
func (p *inProcess) start(c ipCycle, specs []spawn.Spec, att *ranklogs.Attempt) (RankGroup, error) {
	kept := p.kept
	p.kept = nil
	asg := c.asg
	gone := p.collectGone(kept)
	stopped, doomed := p.killUnreachable(kept, gone, asg.Round)
	p.reportGone(asg.Round, gone, stopped)
	stay := kept.staying(gone)
	g, fresh, err := p.startMissing(kept, stay, specs, att, c.timing)
	if err != nil {
		return nil, err
	}
	p.d.host.swapDone()
	w := p.notify(asg, kept, stay, doomed, specs, att, g)
	p.begin(asg, g, w, stay, fresh, att)
	return g, nil
}

// collectGone are the kept survivors that ended while the round formed,
// and those ending now (killed while the round formed, their exit not
// delivered yet): they start afresh, not sent a notice. One stuck in its
// exit past survivorKillWait is SIGKILLed and its exit not waited for.
func (p *inProcess) collectGone(kept *keptRanks) map[int]spawn.Exit {
	gone := survivorsGone(kept, nil, 0)
	var ending []int
	for _, lr := range kept.survivors {
		if _, ok := gone[lr]; !ok && rankEnding(kept.group, lr) {
			ending = append(ending, lr)
		}
	}
	if len(ending) == 0 {
		return gone
	}
	maps.Copy(gone, survivorsGone(kept, ending, survivorKillWait))
	for _, lr := range ending {
		if _, ok := gone[lr]; !ok { // stuck in its exit: its exit is not waited for
			gone[lr] = spawn.Exit{LocalRank: lr, PID: kept.group.PIDs()[lr], Code: -1, Signal: syscall.SIGKILL}
			_ = signalRank(kept.group, lr, syscall.SIGKILL)
		}
	}
	return gone
}

// killUnreachable kills the kept survivors, not gone, that cannot take
// their notice: without a monitor session, or stopped by a signal. Those
// that end within survivorKillWait join gone (started afresh); stopped
// are those killed for being stopped. doomed are those still there after
// SIGKILL (stuck in the kernel): their end will be a failure during the
// in-process restart, which escalates to the full restart.
func (p *inProcess) killUnreachable(kept *keptRanks, gone map[int]spawn.Exit, round int) (stopped, doomed map[int]bool) {
	ipm := p.monitors()
	var unreached []int
	stopped = map[int]bool{}
	for _, lr := range kept.survivors {
		if _, ok := gone[lr]; ok {
			continue
		}
		switch {
		case ipm == nil || !ipm.InProcessCapable(lr):
			p.d.log.Warn("in-process: a survivor has no monitor session to take its notice; killing it", "local_rank", lr)
		case rankStopped(kept.group, lr):
			// Stopped by a signal (a SIGSTOP: the fault campaign's hang):
			// it would not take its notice until the rejoin bound, so it
			// starts afresh now, as the ranks without a session do.
			stopped[lr] = true
			p.d.log.Warn("in-process: a survivor is stopped by a signal and cannot take its notice; killing it", "local_rank", lr)
		default:
			continue
		}
		_ = signalRank(kept.group, lr, syscall.SIGKILL)
		unreached = append(unreached, lr)
	}
	doomed = map[int]bool{}
	if len(unreached) == 0 {
		return stopped, doomed
	}
	// No survivor is notified yet: whichever ends now starts afresh.
	maps.Copy(gone, survivorsGone(kept, unreached, survivorKillWait))
	for _, lr := range unreached {
		if _, ok := gone[lr]; !ok {
			doomed[lr] = true
			p.recordFallback(round, "notice_failed", lr, fmt.Sprintf("local rank %d has no monitor session and did not end within %s of SIGKILL",
				lr, survivorKillWait))
		}
	}
	return stopped, doomed
}

// reportGone records each kept survivor that is started afresh.
func (p *inProcess) reportGone(round int, gone map[int]spawn.Exit, stopped map[int]bool) {
	for _, lr := range slices.Sorted(maps.Keys(gone)) {
		e := gone[lr]
		p.d.log.Warn("in-process: a kept survivor ended before its round; starting it afresh", "round", round,
			"local_rank", lr, "exit", e.String())
		rec := eventlog.InProcessReplacedEvent{Round: round, LocalRank: lr, Exit: eventlog.Opt(e.String())}
		if stopped[lr] {
			rec.Why = eventlog.Opt("stopped")
			rec.Reason = eventlog.Opt(fmt.Sprintf("local rank %d was stopped by a signal (process state T) when round %d began; killed and started afresh", lr, round))
		}
		p.d.ev.Emit(rec)
	}
}

// staying are the survivors that stay into the round: those not gone.
func (k *keptRanks) staying(gone map[int]spawn.Exit) []int {
	var stay []int
	for _, lr := range k.survivors {
		if _, ok := gone[lr]; !ok {
			stay = append(stay, lr)
		}
	}
	return stay
}

// startMissing starts the ranks of specs that do not stay and makes them
// and the survivors that stay the round's group; it returns how many
// started. When they cannot start, the round's logs are closed and the
// survivors that stay are kept again (stopped when the agent ends).
func (p *inProcess) startMissing(kept *keptRanks, stay []int, specs []spawn.Spec, att *ranklogs.Attempt,
	t *cycleTiming) (*mixedGroup, int, error) {
	var fresh []spawn.Spec
	for _, s := range specs {
		if !slices.Contains(stay, s.LocalRank) {
			fresh = append(fresh, s)
		}
	}
	t.spawnStart = time.Now()
	g := newMixedGroup()
	g.add(kept.group, stay)
	if len(fresh) > 0 {
		ng, err := p.d.ranks.StartGroup(fresh)
		if err != nil {
			att.CloseParentEnds()
			att.Close()
			kept.survivors = stay
			p.kept = kept // stopped when the agent ends (stopKept)
			return nil, 0, fmt.Errorf("start replacement ranks: %w", err)
		}
		lrs := make([]int, len(fresh))
		for i, s := range fresh {
			lrs[i] = s.LocalRank
		}
		g.add(ng, lrs)
	}
	t.spawned = time.Now()
	return g, len(fresh), nil
}

// notify sends each survivor that stays, but the doomed, the round's
// notice and returns the watch that follows them. A survivor whose notice
// fails (its session went away since killUnreachable: it is ending as
// the ranks start) is killed; its exit is a failure during the in-process
// restart, which escalates to the full restart.
func (p *inProcess) notify(asg rendezvous.Assignment, kept *keptRanks, stay []int, doomed map[int]bool,
	specs []spawn.Spec, att *ranklogs.Attempt, g *mixedGroup) *rejoinWatch {
	w := &rejoinWatch{round: asg.Round, failedAt: kept.failedAt, notices: map[int]time.Time{},
		waiting: map[int]bool{}, stepping: map[int]bool{}, phases: map[string]time.Duration{},
		specs: map[int]spawn.Spec{}, att: att}
	for _, sp := range specs {
		if slices.Contains(stay, sp.LocalRank) {
			w.specs[sp.LocalRank] = sp // the log ends a replacement would take
		}
	}
	ipm := p.monitors()
	for _, lr := range stay {
		if doomed[lr] {
			continue
		}
		n := ftwire.Rejoin{Round: asg.Round, Rank: asg.RankBase + lr, LocalRank: lr, WorldSize: asg.WorldSize,
			MasterAddr: asg.MasterAddr, MasterPort: asg.MasterPort, StorePrefix: StorePrefix(asg.Round),
			Reason: kept.why, DeadlineS: p.d.rejoinTimeout.Seconds()}
		err := fmt.Errorf("no in-process monitors")
		if ipm != nil {
			err = ipm.Notify(lr, n)
		}
		now := time.Now()
		if err != nil {
			p.recordFallback(asg.Round, "notice_failed", lr, "notice to local rank "+strconv.Itoa(lr)+" failed: "+err.Error())
			_ = g.Signal(lr, syscall.SIGKILL)
			continue
		}
		w.notices[lr], w.waiting[lr], w.stepping[lr] = now, true, true
		p.d.met.InProcessPhase("notice", now.Sub(kept.failedAt))
		p.d.ev.Emit(eventlog.InProcessNoticeEvent{Round: asg.Round, LocalRank: lr, Rank: n.Rank,
			WorldSize: n.WorldSize, StorePrefix: n.StorePrefix, NoticeMS: ms(now.Sub(kept.failedAt))})
	}
	return w
}

// begin begins the round's cycle in the monitors and records it: with
// survivors, as an in-process one whose watch w runs (its bound starts
// now); without (every survivor ended), as a full one.
func (p *inProcess) begin(asg rendezvous.Assignment, g *mixedGroup, w *rejoinWatch, stay []int, fresh int,
	att *ranklogs.Attempt) {
	pids := g.PIDs()
	if p.d.mons != nil {
		p.d.mons.BeginCycle(asg.Round, pids)
	}
	rec := eventlog.CycleStartedEvent{Round: asg.Round, GroupRank: asg.GroupRank,
		WorldSize: asg.WorldSize, PIDs: pidList(pids), MasterAddr: asg.MasterAddr, MasterPort: asg.MasterPort,
		RestartsUsed: asg.RestartsUsed}
	if len(stay) == 0 {
		// Every survivor ended: this node's ranks all start afresh.
		att.CloseParentEnds()
		p.cycleMode = policy.ModeFull
		p.d.log.Info("in-process restart: no survivor left on this node; every rank started afresh", "round", asg.Round)
		p.d.ev.Emit(rec)
		return
	}
	p.cycleMode = policy.ModeInProcess
	p.watch = w
	if len(w.waiting) > 0 {
		w.timer = time.NewTimer(p.d.rejoinTimeout)
	} else {
		w.noReplacements()
	}
	p.d.log.Info("in-process restart: survivors notified", "round", asg.Round, "survivors", stay,
		"replaced", fresh, "rejoin_timeout", p.d.rejoinTimeout)
	rec.Mode, rec.Survivors = policy.ModeInProcess, stay
	p.d.ev.Emit(rec)
}
