package agent

import (
	"context"
	"fmt"
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
	a.log.Error("stopping the job: the same failure again", "reason", reason, "exit_code", a.cfg.FT.NoRestartExitCode)
	return a.closeNoRestart(ctx, reason)
}
