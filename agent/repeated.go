package agent

import (
	"context"
	"fmt"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// repeatedFailure reports, when the failure that ended this round is the
// limit-th in a row of the same rank failing the same way
// (verdict.RankFailure.SameAs) in consecutive rounds, what to say of it.
// A round this node has no failure of (another node's failure ended it)
// breaks the run. limit 0 never stops.
func (r *runState) repeatedFailure(limit int) (string, bool) {
	fs := r.rankFailures
	if limit <= 0 || len(fs) < limit {
		return "", false
	}
	last := fs[len(fs)-1]
	if last.Round != r.asg.Round {
		return "", false
	}
	round := last.Round
	n := 0
	for ; n < limit; n++ {
		same := false
		for _, f := range fs {
			if f.Round == round-n && f.SameAs(last) {
				same = true
			}
		}
		if !same {
			return "", false
		}
	}
	how := "was killed by " + last.Signal
	if last.Cause != nil {
		how = last.Cause.String()
	}
	return fmt.Sprintf("the same failure %d rounds in a row (rounds %d-%d): rank %d %s; restarting cannot help: fix the cause (--ft-same-failure-limit %d)",
		n, round-n+1, round, last.Rank, how, limit), true
}

// stopRepeated closes the job with the no-restart exit code: its failure
// repeats itself (repeatedFailure).
func (a *Agent) stopRepeated(ctx context.Context, reason string) State {
	code := a.cfg.FT.NoRestartExitCode
	round := a.run.asg.Round
	a.log.Error("stopping the job: the same failure again", "reason", reason, "exit_code", code)
	if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error {
		return a.d.Rdzv.Shutdown(ctx, verdict.NoRestart, code, reason)
	}); err != nil {
		a.log.Warn("closing the job in the rendezvous", "err", err)
	}
	a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(round), CloseKind: eventlog.Opt(verdict.NoRestart), Reason: reason, ExitCode: eventlog.Opt(code)})
	a.run.closedBy(verdict.NoRestart, code, reason)
	return StateDone
}
