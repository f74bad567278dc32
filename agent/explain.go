package agent

import (
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// outputTail bounds how much of a rank's stderr log is read for its last
// traceback.
const outputTail = 64 << 10

// stderrDrainBound bounds the wait for a failed rank's stderr to reach its
// log once the cycle's ranks are stopped: a process that inherited the
// rank's stderr (a child it left behind) keeps the pipe open.
// stderrDrainInProcess is the bound in an in-process restart, where the
// survivors wait for it: copying the last few KiB takes microseconds.
const (
	stderrDrainBound     = time.Second
	stderrDrainInProcess = 100 * time.Millisecond
)

// explainFailures reads why each failed rank failed from what it left
// (ranklogs.Explain): the cause goes into the rank's failure record (the
// verdict's rank_failures), a rank_failure_cause event, and the cycle's
// reason when that rank's failure is the reason.
func (a *Agent) explainFailures(failures []ranklogs.Failure, att *ranklogs.Attempt) {
	for _, f := range failures {
		ev := ranklogs.Evidence{Record: f.Record}
		if f.ExitCode < 0 {
			ev.Signal = syscall.Signal(-f.ExitCode)
		}
		if e := a.d.Evidence; e != nil {
			ev.Exception = e.Exception(f.PID)
			ev.Fatal, _ = e.Fatal(f.PID, 0)
			e.Forget(f.PID)
		}
		if att != nil {
			_, stderrPath := att.LogPaths(f.LocalRank)
			ev.Output = ranklogs.Tail(stderrPath, outputTail)
		}
		c, ok := ranklogs.Explain(ev)
		if !ok {
			continue
		}
		a.log.Error("why the rank failed", "local_rank", f.LocalRank, "rank", f.GlobalRank, "cause", c.String(), "source", c.Source)
		a.ev.Emit(eventlog.RankFailureCauseEvent{Round: a.run.asg.Round, LocalRank: f.LocalRank, Rank: f.GlobalRank, Cause: c})
		a.run.explainFailure(a.run.asg.Round, f.LocalRank, c)
	}
}

// explainFailure adds cause c to the rank failure it explains, and to
// the cycle's reason when that failure is it.
func (r *runState) explainFailure(round, lr int, c verdict.FailureCause) {
	for i := len(r.rankFailures) - 1; i >= 0; i-- {
		f := &r.rankFailures[i]
		if f.Round == round && f.LocalRank == lr && f.Kind == verdict.FailureCrash {
			cc := c
			f.Cause = &cc
			if r.end.byExit && r.end.exitLR == lr && !r.end.hang {
				r.end.reason += ": " + c.String()
			}
			return
		}
	}
}
