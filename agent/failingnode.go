package agent

import (
	"context"
	"fmt"
	"strings"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// failingNodeRecord applies the failing-node rule (policy.FailingNode) to
// this node's latest rounds: nil when its ranks do not keep failing in
// ways that point at the node.
func (r *runState) failingNodeRecord(limit int) *verdict.FailingNode {
	ran := make([]int, 0, len(r.cycles))
	for _, c := range r.cycles {
		ran = append(ran, c.Round)
	}
	evidence := map[int]bool{}
	why := map[int][]string{}
	for _, f := range r.rankFailures {
		if f.NodeEvidence() {
			evidence[f.Round] = true
			why[f.Round] = append(why[f.Round], f.Text())
		}
	}
	counted, window, ok := policy.FailingNode(ran, evidence, limit)
	if !ok {
		return nil
	}
	parts := make([]string, 0, len(counted))
	for _, rd := range counted {
		parts = append(parts, fmt.Sprintf("round %d: %s", rd, strings.Join(why[rd], ", ")))
	}
	return &verdict.FailingNode{Rounds: counted, Window: window,
		Detail: verdict.TruncateDetail(fmt.Sprintf("this node's ranks failed in ways that point at the node in %d of its latest %d rounds (%s)",
			len(counted), window, strings.Join(parts, "; ")), verdict.MaxFailingNodeDetail)}
}

// hostsEtcdWhy is why a node that hosts the job's embedded etcd never
// leaves on its own: the job's rendezvous would leave with it.
const hostsEtcdWhy = "this node hosts the job's embedded etcd: leaving would take the job's rendezvous with it"

// hostsJobEtcd says whether this launcher hosts the job's embedded etcd.
func (a *Agent) hostsJobEtcd() bool {
	return a.cfg.Rdzv.Mode == configs.RdzvEmbedded && a.cfg.Rdzv.HostsEtcd
}

// checkFailingNode runs after this node reported a rank failure and got
// dec. When its ranks keep failing in ways that point at the node, the
// node leaves for a spare when one stood by in the round and this report
// ended it (policy.SwapOutFailingNode): quarantined with the evidence,
// which the Slurm chain and the AppWrapper controller read. Otherwise it
// keeps its place and the verdict's failing_node names it. out is true
// when the node left (st is then the next state).
func (a *Agent) checkFailingNode(ctx context.Context, dec rendezvous.Decision) (st State, out bool) {
	fn := a.run.failingNodeRecord(a.cfg.FT.NodeFailureLimit)
	if fn == nil {
		return 0, false
	}
	asg := a.run.asg
	first := a.run.failingNode == nil
	a.run.failingNode = fn
	if dec.Restart && !a.hostsJobEtcd() && policy.SwapOutFailingNode(true, dec.Ended, asg.Standbys) {
		fn.SwappedOut = true
		reason := "quarantined: " + fn.Detail + " (--ft-node-failure-limit " + fmt.Sprint(a.cfg.FT.NodeFailureLimit) + ")"
		a.log.Error("this node keeps failing: leaving the job for a spare", "rounds", fn.Rounds, "window", fn.Window, "detail", fn.Detail)
		a.ev.Emit(eventlog.NodeFailingEvent{Round: asg.Round, Rounds: fn.Rounds, Window: fn.Window, Detail: fn.Detail, SwappedOut: true})
		if _, err := a.call(ctx, a.d.CallTimeout, func(ctx context.Context) error { return a.d.Rdzv.Leave(ctx, reason) }); err != nil {
			a.log.Warn("leaving the rendezvous", "err", err)
		}
		a.ev.Emit(eventlog.JobFailedEvent{Round: eventlog.Opt(asg.Round), CloseKind: eventlog.Opt(verdict.NodeExcluded), Reason: reason})
		a.run.quarantine(a.d.NodeID, a.d.Hostname, verdict.EvidenceRankFailures, fn.Detail, asg.Round)
		a.run.setOutcome(verdict.NodeExcluded, reason)
		return StateDone, true
	}
	why := "no spare stood by in the round"
	switch {
	case !dec.Restart:
		why = "the job is not restarted"
	case !dec.Ended:
		why = "another node's report ended the round"
	case a.hostsJobEtcd():
		why = hostsEtcdWhy
	}
	if first {
		a.log.Warn("this node keeps failing; it keeps its place", "why", why, "rounds", fn.Rounds, "detail", fn.Detail)
	}
	a.ev.Emit(eventlog.NodeFailingEvent{Round: asg.Round, Rounds: fn.Rounds, Window: fn.Window, Detail: fn.Detail, Why: why})
	return 0, false
}
