package report

import (
	"fmt"
	"sort"
	"time"

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
	for _, e := range rec.events {
		job := e.Job
		round, _ := intField(e.F, "round")
		k := key{job: job, node: e.Node, round: round, local: -1}
		switch e.Kind {
		case "launcher_started":
			node(e.Node)
			if n, ok := intField(e.F, "nproc_per_node"); ok {
				nproc[e.Node] = n
			}
		case "cycle_started":
			gr, _ := intField(e.F, "group_rank")
			pids, _ := e.F["pids"].([]any)
			n := nproc[e.Node]
			if n == 0 {
				n = len(pids)
			}
			base[k], started[k] = gr*n, e.TS
			for l := range pids {
				rank(gr*n + l)
			}
		case "rank_first_heartbeat":
			l, _ := intField(e.F, "local_rank")
			ready[key{job, e.Node, round, l}] = timeField(e.F, "at", e.TS)
		case "restart", "job_succeeded", "job_failed":
			if a, ok := intField(e.F, "after_round"); ok {
				k.round = a
			}
			stopped[k] = later(stopped[k], e.TS)
		}
	}
	globalRank := func(e Event, k key) (int, bool) {
		if g, ok := intField(e.F, "rank"); ok && g >= 0 {
			return g, true
		}
		l, ok := intField(e.F, "local_rank")
		b, okb := base[k]
		return b + l, ok && okb
	}
	for _, e := range rec.events {
		round, _ := intField(e.F, "round")
		k := key{job: e.Job, node: e.Node, round: round, local: -1}
		switch e.Kind {
		case "cycle_started":
			end := stopped[k]
			if end.IsZero() {
				end = r.End
			}
			node(e.Node).Spans = append(node(e.Node).Spans, Span{Kind: "running", Start: e.TS, End: end, Label: fmt.Sprintf("round %d", round)})
		case "standby":
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "standby", At: e.TS, Label: fmt.Sprintf("standby in round %d", round)})
		case "restart":
			reason, _ := e.F["reason"].(string)
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "restart", At: e.TS, Label: "restart: " + reason})
		case "spare_swap":
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "swap", At: e.TS, Label: fmt.Sprintf("spare promoted in round %d", round)})
		case "filler_reclaimed":
			node(e.Node).Marks = append(node(e.Node).Marks, Mark{Kind: "filler_reclaim", At: e.TS, Label: fmt.Sprintf("filler reclaimed in %vms", e.F["took_ms"])})
		case "round_ended":
			reason, _ := e.F["reason"].(string)
			// Its node field names the node that ended the round (several
			// launchers may share one event log).
			l := node(laneName(nodeIdx, e.Node))
			l.Marks = append(l.Marks, Mark{Kind: "round_ended", At: e.TS, Label: reason})
		case "rank_exited":
			g, ok := globalRank(e, k)
			if !ok {
				continue
			}
			l, _ := intField(e.F, "local_rank")
			lk := key{e.Job, e.Node, round, l}
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
			code, _ := intField(e.F, "exit_code")
			kind := "exit"
			if _, sig := e.F["signal"]; !sig && code != 0 {
				kind = "crash"
			}
			lane.Marks = append(lane.Marks, Mark{Kind: kind, At: e.TS, Label: fmt.Sprintf("round %d: exit code %d %v", round, code, strOr(e.F["signal"]))})
		case "rank_hang":
			if g, ok := globalRank(e, k); ok {
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "hang", At: timeField(e.F, "signalled_at", e.TS),
					Label: fmt.Sprintf("hang: %v %v after %.1fs", e.F["timeout_kind"], strOr(e.F["section"]), e.F["elapsed_s"])})
			}
		case "rank_checkpoint":
			if g, ok := globalRank(e, k); ok {
				n, _ := intField(e.F, "steps")
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "checkpoint", At: timeField(e.F, "at", e.TS),
					Label: fmt.Sprintf("checkpoint after %d steps of round %d (%vms)", n, round, e.F["duration_ms"])})
			}
		case "rank_first_step":
			if g, ok := globalRank(e, k); ok && round > 0 {
				rank(g).Marks = append(rank(g).Marks, Mark{Kind: "first_step", At: timeField(e.F, "at", e.TS),
					Label: fmt.Sprintf("first step after the restart (round %d)", round)})
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

func strOr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
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
