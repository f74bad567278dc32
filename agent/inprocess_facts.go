package agent

// The facts policy.Survivors decides on (policy.SurvivorsInput): those of
// the cycle's end, known before the ranks are counted (survivorFacts, also
// policy.MaySurvive's), those of this node's surviving ranks (survivorsOf)
// and those of the restart the failure interrupted (watchFacts).

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
)

// survivorFacts are the facts of the cycle's end that the survivors'
// decision needs and that are known before the ranks are counted.
func (a *Agent) survivorFacts() policy.SurvivorsInput {
	end := a.run.end
	in := policy.SurvivorsInput{InProcess: a.run.ip.monitors() != nil,
		NodeEnding:   a.run.pendingSignal != nil || a.run.pendingReq != nil || a.run.walltime != nil,
		RestartsUsed: a.run.asg.RestartsUsed, MaxRestarts: a.run.asg.MaxRestarts}
	switch {
	case end.kind == endRankFailure:
		in.Failure = policy.RankCrash
		if end.hang {
			in.Failure = policy.RankHang
		}
	case end.kind == endRoundEnded && end.rdzvEnd.Kind == rendezvous.EndRestart:
		// The rendezvous has already decided to restart the job: what
		// is decided here is only how this node's ranks restart.
		in.Failure, in.JobRestarts, in.RoundEndReason = end.rdzvEnd.Cause, true, end.rdzvEnd.Reason
		if in.Failure == "" {
			in.Failure = policy.RankCrash
		}
	}
	return in
}

// survivorsOf fills in the facts of this node's surviving ranks after the
// settle: the ranks neither exited nor ending, whether each can take a
// notice, and, after a hang, whether one of them may be the hung rank
// (silent names it; "" when none). It returns the survivors.
func (p *inProcess) survivorsOf(in *policy.SurvivorsInput, ipm InProcessMonitors, end cycleEnd, round int,
	ending map[int]bool) (survivors []int, silent string) {
	// Survivors rebuild their process group against the launcher's
	// store (policy.SurvivorsInput.AgentStore).
	in.AgentStore, in.AllCapable = p.d.agentStore, true
	for lr := 0; lr < p.d.nproc; lr++ {
		if _, exited := end.exitCodes[lr]; exited || ending[lr] {
			continue
		}
		survivors = append(survivors, lr)
		in.AllCapable = in.AllCapable && ipm.InProcessCapable(lr)
	}
	in.Survivors = len(survivors)
	if in.Failure == policy.RankHang && in.AgentStore && in.AllCapable {
		silent = silentSurvivor(ipm, survivors, p.hungStopped(end, round))
	}
	in.SurvivorSilent = silent != ""
	return survivors, silent
}

// watchFacts fills in the facts of the in-process restart that the
// failure interrupted (w; nil when the round started every rank afresh).
func (p *inProcess) watchFacts(in *policy.SurvivorsInput, w *rejoinWatch, round int) {
	in.KeptIntoRound, in.RejoinOverdue = w != nil, w != nil && w.overdue
	in.FirstStepsTaken = w != nil && w.completed || w == nil && !p.freshRoundUnstepped(round)
}

// freshRoundUnstepped reports, for a node whose ranks all started afresh
// in a round that a restart opened (a promoted spare, a node that
// restarted fully while other nodes' survivors stayed), whether a failure
// now comes during the job's restart: before each of its ranks took its
// first step of the round. The survivors on other nodes have not stepped
// either (a step is collective), so this node escalates to the full
// restart as theirs do, and the whole job decides alike. Ranks that never
// report a step (no API) are never kept anyway.
func (p *inProcess) freshRoundUnstepped(round int) bool {
	if round == 0 || !p.d.on {
		return false
	}
	return len(p.freshSteps) < p.d.nproc
}

// hungStopped returns, for a hang that ended the cycle, when the hung rank
// last showed progress as seen from a survivor with heartbeat timeout
// timeout: its last heartbeat when this node's monitor found it; for
// another node's hang (only the round's end is known here) the moment it
// was seen less the survivor's own timeout, which is exact when the nodes
// share their heartbeat timeouts.
func (p *inProcess) hungStopped(end cycleEnd, round int) func(timeout time.Duration) time.Time {
	seen := time.Now()
	if end.kind == endRankFailure && p.d.mons != nil {
		for lr := range end.exitCodes {
			h, fired := p.d.mons.FiredHang(round, lr)
			if !fired {
				continue
			}
			at := h.LastHeartbeat
			if at.IsZero() {
				at = h.ExpiredAt.Add(-h.Timeout)
			}
			return func(time.Duration) time.Time { return at }
		}
	}
	return func(timeout time.Duration) time.Time { return seen.Add(-timeout) }
}

// silentSurvivor names the first survivor that may be the hung rank
// itself, or is indistinguishable from it (policy.SurvivorsInput.SurvivorSilent):
// found hung by its own monitor, or whose last heartbeat did not come
// clearly (one heartbeat interval, at least a tenth of its timeout) after
// the hung rank's last one. In a job whose ranks meet in collectives every
// rank falls silent within milliseconds of a hang, so heartbeats cannot
// tell which one hung; a survivor that heartbeated later progressed after
// the hung rank stopped. "" when every survivor did.
func silentSurvivor(ipm InProcessMonitors, survivors []int, hungStopped func(timeout time.Duration) time.Time) string {
	for _, lr := range survivors {
		s, ok := ipm.Silence(lr)
		switch {
		case !ok: // no session: nothing says it progressed
			return fmt.Sprintf("local rank %d has no monitor session", lr)
		case s.Hung:
			return fmt.Sprintf("local rank %d was found hung too", lr)
		case s.Waiting:
			continue // the stacks found it waiting for the rank that hung: a bystander
		}
		margin := max(s.MaxInterval, s.Timeout/10)
		if after := s.Last.Sub(hungStopped(s.Timeout)); after < margin {
			return fmt.Sprintf("local rank %d's last heartbeat came %s after the hung rank's (under %s): it may be the hung rank or wait for it",
				lr, after.Round(time.Millisecond), margin.Round(time.Millisecond))
		}
	}
	return ""
}

// failureTime is when the cycle's first failure was seen.
func failureTime(end cycleEnd, now time.Time) time.Time {
	for _, f := range end.failures {
		if !f.Time.IsZero() && f.Time.Before(now) {
			now = f.Time
		}
	}
	return now
}

// failedRanks are the local ranks a kept cycle replaces: those that
// exited and those still ending after the settle's bound.
func failedRanks(end cycleEnd, ending map[int]bool) []int {
	failed := slices.Sorted(maps.Keys(end.exitCodes))
	for lr := range ending {
		failed = append(failed, lr)
	}
	slices.Sort(failed)
	return failed
}
