package report

import (
	"fmt"
	"sort"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
)

// lanes builds the timeline's rows: one per node (its rounds, standby,
// spare and filler leases, swaps, reclaims, losses, restarts) and one per
// global rank (start-up, training, first step, checkpoints, how it ended).
func lanes(rec *records, r *Report) (nodes, ranks []Lane) {
	nodeIdx := map[string]int{}
	node := func(name string) *Lane {
		if i, ok := nodeIdx[name]; ok {
			return &nodes[i]
		}
		nodeIdx[name] = len(nodes)
		nodes = append(nodes, Lane{Name: name, Spans: []Span{}, Marks: []Mark{}})
		return &nodes[len(nodes)-1]
	}
	rankIdx := map[int]int{}
	rank := func(n int) *Lane {
		if i, ok := rankIdx[n]; ok {
			return &ranks[i]
		}
		rankIdx[n] = len(ranks)
		ranks = append(ranks, Lane{Name: fmt.Sprintf("rank %d", n), Spans: []Span{}, Marks: []Mark{}})
		return &ranks[len(ranks)-1]
	}
	type key struct {
		job   string
		node  string
		round int
		local int
	}
	nproc := map[string]int{}
	base := map[key]int{}          // job/node/round → global rank of local rank 0
	started := map[key]time.Time{} // job/node/round → ranks started
	ready := map[key]time.Time{}   // job/node/round/local → first heartbeat
	stopped := map[key]time.Time{} // job/node/round → restart or end
	exited := map[key]bool{}       // job/node/round/local → the rank process ended that round
	firstStep := map[key]bool{}    // job/node/round/local → a rank_first_step
	kept := map[key]bool{}         // job/node/round/local → kept in its process into the next round
	var rounds []key               // job/node/round with ranks started, in order
	for _, e := range rec.events {
		job := e.Job
		round, _ := roundOf(e.Rec)
		k := key{job: job, node: e.Node, round: round, local: -1}
		switch ev := e.Rec.(type) {
		case eventlog.LauncherStartedEvent:
			node(e.Node)
			nproc[e.Node] = ev.NProcPerNode
		case eventlog.CycleStartedEvent:
			n := nproc[e.Node]
			if n == 0 {
				n = len(ev.PIDs)
			}
			if _, ok := started[k]; !ok {
				rounds = append(rounds, k)
			}
			base[k], started[k] = ev.GroupRank*n, e.TS
			nproc[k.node+"/round"] = len(ev.PIDs)
			for l := range ev.PIDs {
				rank(ev.GroupRank*n + l)
			}
			for _, l := range ev.Survivors {
				kept[key{job, e.Node, round - 1, l}] = true
			}
		case eventlog.RankExitedEvent:
			exited[key{job, e.Node, round, ev.LocalRank}] = true
		case eventlog.RankFirstStepEvent:
			firstStep[key{job, e.Node, round, ev.LocalRank}] = true
		case eventlog.RankFirstHeartbeatEvent:
			ready[key{job, e.Node, round, ev.LocalRank}] = orTS(ev.At, e.TS)
		case eventlog.RestartEvent:
			k.round = ev.AfterRound
			stopped[k] = later(stopped[k], e.TS)
		case eventlog.JobSucceededEvent, eventlog.JobFailedEvent:
			stopped[k] = later(stopped[k], e.TS)
		}
	}
	// globalRank is a rank record's global rank: its own, or its local
	// rank's on its node that round.
	globalRank := func(k key, global, local int) (int, bool) {
		if global >= 0 {
			return global, true
		}
		b, ok := base[k]
		return b + local, ok
	}
	for _, e := range rec.events {
		round, _ := roundOf(e.Rec)
		k := key{job: e.Job, node: e.Node, round: round, local: -1}
		switch ev := e.Rec.(type) {
		case eventlog.CycleStartedEvent:
			end := stopped[k]
			if end.IsZero() {
				end = r.End
			}
			node(e.Node).Spans = append(node(e.Node).Spans, Span{Kind: "running", Start: e.TS, End: end, Label: fmt.Sprintf("round %d", round)})
		case eventlog.StandbyEvent:
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "standby", At: e.TS, Label: fmt.Sprintf("standby in round %d", round)})
		case eventlog.RestartEvent:
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "restart", At: e.TS, Label: "restart: " + ev.Reason})
		case eventlog.SpareSwapEvent:
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "swap", At: e.TS, Label: fmt.Sprintf("spare promoted in round %d", round)})
		case eventlog.FillerReclaimedEvent:
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "filler_reclaim", At: e.TS, Label: fmt.Sprintf("filler reclaimed in %vms", ev.TookMS)})
		case eventlog.RoundEndedEvent:
			// Its node field names the node that ended the round (several
			// launchers may share one event log).
			l := node(laneName(nodeIdx, e.Node))
			l.Marks = append(l.Marks, Mark{Kind: "round_ended", At: e.TS, Label: ev.Reason})
		case eventlog.RankExitedEvent:
			g, ok := globalRank(k, ev.Rank, ev.LocalRank)
			if !ok {
				continue
			}
			lk := key{e.Job, e.Node, round, ev.LocalRank}
			st := ready[lk]
			if st.IsZero() {
				st = started[k]
			}
			lane := rank(g)
			if !started[k].IsZero() {
				lane.Spans = append(lane.Spans, Span{Kind: "startup", Start: started[k], End: later(started[k], minTime(st, e.TS)), Label: fmt.Sprintf("round %d start-up on %s", round, e.Node)})
			}
			if !ready[lk].IsZero() {
				lane.Spans = append(lane.Spans, Span{Kind: "running", Start: st, End: later(st, e.TS), Label: fmt.Sprintf("round %d on %s", round, e.Node)})
			}
			kind := "exit"
			if ev.Signal == "" && ev.ExitCode != 0 {
				kind = "crash"
			}
			label := fmt.Sprintf("round %d: exit code %d", round, ev.ExitCode)
			if ev.Signal != "" {
				label += " " + ev.Signal
			}
			lane.Marks = append(lane.Marks, Mark{Kind: kind, At: e.TS, Label: label})
		case eventlog.RankHangEvent:
			if g, ok := globalRank(k, ev.Rank, ev.LocalRank); ok {
				label := fmt.Sprintf("hang: %s after %.1fs", hangWhat(ev), ev.ElapsedS)
				if ev.Judged {
					label += ", killed on the stacks' finding before its own clock ran out"
				}
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "hang", At: orTS(ev.SignalledAt, e.TS), Label: label})
			}
		case eventlog.RankCheckpointEvent:
			if g, ok := globalRank(k, ev.Rank, ev.LocalRank); ok {
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "checkpoint", At: orTS(ev.At, e.TS),
					Label: fmt.Sprintf("checkpoint after %d steps of round %d (%vms)", ev.Steps, round, ev.DurationMS)})
			}
		case eventlog.RankFirstStepEvent:
			if g, ok := globalRank(k, ev.Rank, ev.LocalRank); ok && round > 0 {
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "first_step", At: orTS(ev.At, e.TS),
					Label: fmt.Sprintf("first step after the restart (round %d)", round)})
			}
		case eventlog.InProcessFirstStepEvent:
			// Without "step" sections the survivor's own report is the
			// only record of its first step after the rejoin (written
			// when the launcher received it, just after the step).
			if firstStep[key{e.Job, e.Node, round, ev.LocalRank}] {
				continue
			}
			if g, ok := globalRank(k, -1, ev.LocalRank); ok {
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "first_step", At: e.TS,
					Label: fmt.Sprintf("first step after the in-process rejoin (round %d, %.2fs after the failure)", round, ev.SinceFailureS)})
			}
		}
	}
	for _, lr := range rec.ledger {
		lane := node(laneName(nodeIdx, lr.Node))
		end := r.End
		if lr.End != nil {
			end = *lr.End
		}
		switch lr.Role {
		case ledger.Spare:
			lane.Spans = append(lane.Spans, Span{Kind: "spare", Start: lr.Start, End: end, Label: "spare"})
		case ledger.Filler:
			lane.Spans = append(lane.Spans, Span{Kind: "filler", Start: lr.Start, End: end, Label: "filler"})
		}
		if lr.End == nil {
			continue
		}
		switch lr.Reason {
		case ledger.NodeFailure:
			lane.Marks = append(lane.Marks, Mark{Kind: "node_loss", At: *lr.End, Label: "node lost: " + lr.Detail})
		case ledger.Quarantined, ledger.Excluded:
			lane.Marks = append(lane.Marks, Mark{Kind: "node_loss", At: *lr.End, Label: string(lr.Reason) + ": " + lr.Detail})
		}
	}
	// A lost node's spans end with its loss (it wrote nothing after).
	for i := range nodes {
		for _, m := range nodes[i].Marks {
			if m.Kind != "node_loss" {
				continue
			}
			for s := range nodes[i].Spans {
				if sp := &nodes[i].Spans[s]; sp.Start.Before(m.At) && sp.End.After(m.At) {
					sp.End = m.At
				}
			}
		}
	}
	// A rank process that did not end with its round (a survivor of an
	// in-process restart, or a rank whose exit the log does not hold)
	// ran until the round was stopped on its node (its loss, for a lost
	// node), or to the end.
	for _, k := range rounds {
		end := stopped[k]
		if end.IsZero() {
			end = r.End
		}
		for _, m := range node(k.node).Marks {
			if m.Kind == "node_loss" && m.At.After(started[k]) && m.At.Before(end) {
				end = m.At // a lost node's ranks ended with it
			}
		}
		for l := range nproc[k.node+"/round"] {
			lk := key{k.job, k.node, k.round, l}
			if exited[lk] {
				continue
			}
			lane := rank(base[k] + l)
			st := ready[lk]
			label := fmt.Sprintf("round %d on %s", k.round, k.node)
			if kept[lk] {
				label += ", kept in its process for the next round"
			}
			if st.IsZero() {
				lane.Spans = append(lane.Spans, Span{Kind: "startup", Start: started[k], End: later(started[k], end), Label: label + " (no heartbeat)"})
				continue
			}
			lane.Spans = append(lane.Spans, Span{Kind: "startup", Start: started[k], End: later(started[k], minTime(st, end)), Label: fmt.Sprintf("round %d start-up on %s", k.round, k.node)})
			lane.Spans = append(lane.Spans, Span{Kind: "running", Start: st, End: later(st, end), Label: label})
		}
	}
	for i := range ranks {
		sort.SliceStable(ranks[i].Spans, func(a, b int) bool { return ranks[i].Spans[a].Start.Before(ranks[i].Spans[b].Start) })
	}
	// A survivor's start-up of the round after an in-process restart is its
	// rejoin (new process group, restore), not a new process.
	for _, k := range rounds {
		for l := range nproc[k.node+"/round"] {
			if !kept[key{k.job, k.node, k.round - 1, l}] {
				continue
			}
			for s := range rank(base[k] + l).Spans {
				if sp := &rank(base[k] + l).Spans[s]; sp.Kind == "startup" && sp.Start.Equal(started[k]) {
					sp.Label = fmt.Sprintf("round %d on %s: rejoin in process (process group, restore)", k.round, k.node)
				}
			}
		}
	}
	// Verdict-only nodes get their cycles from the verdicts.
	for _, lv := range rec.verdicts {
		name := shortNode(lv.v.Node)
		if _, ok := nodeIdx[name]; ok {
			continue
		}
		lane := node(name)
		for _, c := range lv.v.Cycles {
			ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
			s := c.StartedAt.Add(ms(c.RendezvousMS + c.FillerReclaimMS + c.SpawnMS))
			lane.Spans = append(lane.Spans, Span{Kind: "running", Start: s, End: s.Add(ms(c.RunMS + c.StopMS)), Label: fmt.Sprintf("round %d (%s)", c.Round, c.End)})
		}
	}
	// What each rank was doing when its stacks were taken at a hang; the
	// culprit (or the first silent rank) has a mark of its own colour.
	for _, h := range r.Hangs {
		for _, hr := range h.Ranks {
			if hr.Rank < 0 {
				continue
			}
			m := Mark{Kind: "stacks", At: hr.at, Label: fmt.Sprintf("round %d: stacks taken: %s", h.Round, hr.what())}
			switch {
			case hr.Culprit && h.Known:
				m.Kind, m.Label = "culprit", fmt.Sprintf("round %d: hung (its stacks): %s", h.Round, hr.what())
			case hr.Culprit:
				m.Kind, m.Label = "culprit", fmt.Sprintf("round %d: first silent, not necessarily the one that hung: %s", h.Round, hr.what())
			}
			if hr.File != "" {
				m.Label += " (" + hr.File + ")"
			}
			rank(hr.Rank).Marks = append(rank(hr.Rank).Marks, m)
		}
	}
	sort.SliceStable(ranks, func(a, b int) bool { return rankNum(ranks[a].Name) < rankNum(ranks[b].Name) })
	if nodes == nil {
		nodes = []Lane{}
	}
	if ranks == nil {
		ranks = []Lane{}
	}
	return nodes, ranks
}

// laneName maps a ledger node id (addr/pid) to the lane of its events.
func laneName(idx map[string]int, id string) string {
	if _, ok := idx[id]; ok {
		return id
	}
	if _, ok := idx[shortNode(id)]; ok {
		return shortNode(id)
	}
	return shortNode(id)
}

func rankNum(name string) int {
	var n int
	fmt.Sscanf(name, "rank %d", &n)
	return n
}

func minTime(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

func workload(rec *records) *Workload {
	aw := rec.aw
	w := &Workload{Name: aw.Namespace + "/" + aw.Name, Phase: string(aw.Status.Phase), Resets: aw.Status.Retries, Conditions: []Mark{}}
	for _, c := range aw.Status.Conditions {
		w.Conditions = append(w.Conditions, Mark{Kind: "condition", At: c.LastTransitionTime.Time,
			Label: fmt.Sprintf("%s=%s (%s) %s", c.Type, c.Status, c.Reason, c.Message)})
	}
	return w
}
