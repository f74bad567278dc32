package report

// One job's account: its records grouped by job, each round's facts merged
// across nodes, and the phases the job's wall time splits into.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/policy"
)

// jobRecords are the records of one launch.
type jobRecords struct {
	id       string
	events   []Event
	verdicts []loadedVerdict
	start    time.Time // from the chain, when known
	end      time.Time
	outcome  string
}

func groupByJob(rec *records) []*jobRecords {
	byID := map[string]*jobRecords{}
	var order []string
	get := func(id string) *jobRecords {
		if g, ok := byID[id]; ok {
			return g
		}
		g := &jobRecords{id: id}
		byID[id] = g
		order = append(order, id)
		return g
	}
	if rec.chain != nil {
		for _, cj := range rec.chain.Jobs {
			if cj.Began.IsZero() {
				continue // never ran: its time is the queue's
			}
			g := get(cj.ID)
			g.start, g.end, g.outcome = cj.Began, cj.ScriptEnded, string(cj.Outcome)
			if g.end.IsZero() && cj.Slurm != nil && !cj.Slurm.End.IsZero() {
				g.end = cj.Slurm.End
			}
		}
	}
	for _, e := range rec.events {
		id := e.Job
		if rec.chain == nil {
			id = ""
		}
		get(id).events = append(get(id).events, e)
	}
	for _, lv := range rec.verdicts {
		id := lv.job
		if rec.chain == nil {
			id = ""
		}
		get(id).verdicts = append(get(id).verdicts, lv)
	}
	var out []*jobRecords
	for _, id := range order {
		g := byID[id]
		if len(g.events) > 0 || len(g.verdicts) > 0 || !g.start.IsZero() {
			out = append(out, g)
		}
	}
	return out
}

// roundFacts are one round's instants, merged across nodes.
type roundFacts struct {
	round                   int
	start, ready, firstStep time.Time
	readyRanks              map[int]time.Time
	fault, detected         time.Time
	stopped                 time.Time
	lastExit                time.Time
	end, reason             string
	ckpts                   []time.Time
	sections                bool // the ranks reported steps or checkpoints this round
	stepCounts              bool // a rank_steps record: the ranks counted "step" sections
	stepsLost               int
	healed                  bool      // the next round healed from the survivors' live state (peer heal)
	healedAt                time.Time // when the survivors completed the healed step (zero: not known)
	killedAt                time.Time // the first rank death by a signal (an outside kill, or the launcher's stop)
	killed                  string
	nodes                   map[string]bool
	world                   int
	hangs                   []hungRank // every rank of the round whose timeout expired
}

// hungRank is one rank_hang record of a round.
type hungRank struct {
	rank int
	at   time.Time // signalled
}

// hangReason names every rank whose timeout expired in the round, in the
// order they expired, when there is more than one: a rank waiting in a
// collective for a hung peer stops heartbeating too, so the first timeout
// to expire is not necessarily the rank that caused the hang.
func (f *roundFacts) hangReason() string {
	if f.end != "hang" || len(f.hangs) < 2 {
		return f.reason
	}
	hs := slices.Clone(f.hangs)
	slices.SortStableFunc(hs, func(a, b hungRank) int { return a.at.Compare(b.at) })
	var later []string
	seen := map[int]bool{hs[0].rank: true}
	for _, h := range hs[1:] {
		if seen[h.rank] {
			continue
		}
		seen[h.rank] = true
		later = append(later, fmt.Sprintf("rank %d (+%d ms)", h.rank, h.at.Sub(hs[0].at).Milliseconds()))
	}
	if len(later) == 0 {
		return f.reason
	}
	return f.reason + ", then " + strings.Join(later, ", ")
}

// hangWhat is which timeout expired: "heartbeat", or "section step".
func hangWhat(ev eventlog.RankHangEvent) string {
	if ev.Section == "" {
		return ev.TimeoutKind.String()
	}
	return ev.TimeoutKind.String() + " " + ev.Section
}

func (f *roundFacts) failAt(detected, fault time.Time, end, reason string) {
	if f.detected.IsZero() || detected.Before(f.detected) {
		f.detected, f.end, f.reason = detected, end, reason
	}
	if f.fault.IsZero() || fault.Before(f.fault) {
		f.fault = fault
	}
}

func computeJob(g *jobRecords, r *Report, acc *categoryAcc) (Job, error) {
	j := Job{ID: g.id, Outcome: g.outcome, PhasesS: zeroPhases()}
	rounds := map[int]*roundFacts{}
	get := func(n int) *roundFacts {
		if f, ok := rounds[n]; ok {
			return f
		}
		f := &roundFacts{round: n, readyRanks: map[int]time.Time{}, nodes: map[string]bool{}}
		rounds[n] = f
		return f
	}
	var start, end time.Time
	nodesWithEvents := map[string]bool{}
	restarts := map[int]Restart{}
	heals := map[int]time.Time{}  // round that healed from live state → when its survivors completed the step
	works := map[int]*roundWork{} // round → its ranks' restores and saves (the badput categories)
	work := func(n int) *roundWork {
		if w, ok := works[n]; ok {
			return w
		}
		w := &roundWork{restoreRanks: map[int]bool{}}
		works[n] = w
		return w
	}
	for _, e := range g.events {
		if e.Kind != eventlog.RoundEnded { // its node is the one that ended the round
			nodesWithEvents[e.Node] = true
		}
		start, end = earlier(start, e.TS), later(end, e.TS)
		if j.RunID == "" {
			j.RunID = e.RunID
		}
		round, hasRound := roundOf(e.Rec)
		switch ev := e.Rec.(type) {
		case eventlog.CycleStartedEvent:
			f := get(round)
			f.start = earlier(f.start, e.TS)
			f.nodes[e.Node] = true
			f.world = max(f.world, ev.WorldSize)
		case eventlog.RankFirstHeartbeatEvent:
			f := get(round)
			f.readyRanks[ev.Rank] = later(f.readyRanks[ev.Rank], orTS(ev.At, e.TS))
		case eventlog.RankFirstStepEvent:
			f := get(round)
			f.firstStep = earlier(f.firstStep, orTS(ev.At, e.TS))
			f.sections = true
		case eventlog.RankCheckpointEvent:
			f := get(round)
			at := orTS(ev.At, e.TS)
			f.ckpts = append(f.ckpts, at)
			f.sections = true
			w, opened := work(round), ev.OpenedAt
			if opened.IsZero() && ev.DurationMS > 0 {
				opened = at.Add(-time.Duration(ev.DurationMS * float64(time.Millisecond)))
			}
			if opened.IsZero() {
				w.untimedSaves = true // an older launcher's record: when the save began is unknown
			} else {
				w.saves = append(w.saves, span{opened, at})
			}
		case eventlog.InProcessFirstStepEvent:
			// A survivor's first step after an in-process rejoin, reported
			// by the client even without "step" sections.
			f := get(round)
			f.firstStep = earlier(f.firstStep, e.TS)
		case eventlog.RankStepsEvent:
			f := get(round)
			f.sections, f.stepCounts = true, true
			f.stepsLost = max(f.stepsLost, int(ev.StepsSinceCheckpoint))
		case eventlog.StateRestoreEvent:
			// at is when load() returned (the client notes it after).
			w, at := work(ev.Round), orTS(ev.At, e.TS)
			w.restores = append(w.restores, span{at.Add(-time.Duration(ev.LoadMS * float64(time.Millisecond))), at})
			w.restoreRanks[ev.Rank] = true
			if ev.Heal == "peer" || ev.Heal == "kept" {
				at := heals[ev.Round]
				if ev.StepAt != nil {
					at = later(at, *ev.StepAt)
				}
				heals[ev.Round] = at
			}
		case eventlog.RankExitedEvent:
			f := get(round)
			f.lastExit = later(f.lastExit, e.TS)
			if ev.ExitCode != 0 && ev.Signal == "" {
				f.failAt(e.TS, e.TS, "crash", fmt.Sprintf("rank %d exited with code %d", ev.Rank, ev.ExitCode))
			}
			if ev.Signal != "" && (f.killedAt.IsZero() || e.TS.Before(f.killedAt)) {
				f.killedAt, f.killed = e.TS, fmt.Sprintf("rank %d was killed by %s", ev.Rank, ev.Signal)
			}
		case eventlog.RankHangEvent:
			f := get(round)
			at := orTS(ev.SignalledAt, e.TS)
			f.failAt(at, at.Add(-time.Duration(ev.ElapsedS*float64(time.Second))), "hang",
				fmt.Sprintf("rank %d hung (%s)", ev.Rank, hangWhat(ev)))
			f.hangs = append(f.hangs, hungRank{rank: ev.Rank, at: at})
		case eventlog.RoundEndedEvent:
			if hasRound {
				f := get(round)
				kind := "round_ended"
				if ev.Cause != nil && *ev.Cause == policy.NodeLost {
					kind = "node_loss"
				}
				f.failAt(e.TS, e.TS, kind, ev.Reason)
			}
		case eventlog.SignalReceivedEvent:
			if hasRound {
				get(round).failAt(e.TS, e.TS, "signal", "signal "+ev.Signal)
			}
		case eventlog.WalltimeWarningEvent:
			get(round).failAt(e.TS, e.TS, "signal", "signal "+ev.Signal)
		case eventlog.RestartEvent:
			after := ev.AfterRound
			f := get(after)
			f.stopped = later(f.stopped, e.TS)
			if old, ok := restarts[after]; !ok || e.TS.Before(old.At) {
				restarts[after] = Restart{Job: g.id, AfterRound: after, At: e.TS, Action: string(deref(ev.Action)), Reason: ev.Reason}
			}
		case eventlog.JobSucceededEvent, eventlog.JobFailedEvent:
			if hasRound {
				f := get(round)
				f.stopped = later(f.stopped, e.TS)
			}
		}
	}
	// Verdict cycles fill in what no event log recorded (a node whose log
	// was not given, or no logs at all).
	for _, lv := range g.verdicts {
		v := lv.v
		if j.RunID == "" {
			j.RunID = v.RunID
		}
		start, end = earlier(start, v.StartedAt), later(end, v.EndedAt)
		if j.Outcome == "" {
			j.Outcome = string(v.Kind)
		}
		if nodesWithEvents[shortNode(v.Node)] || nodesWithEvents[v.Node] {
			continue
		}
		for _, c := range v.Cycles {
			f := get(c.Round)
			ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
			s := c.StartedAt.Add(ms(c.RendezvousMS + c.FillerReclaimMS + c.SpawnMS))
			f.start = earlier(f.start, s)
			f.nodes[shortNode(v.Node)] = true
			runEnd := s.Add(ms(c.RunMS))
			f.stopped = later(f.stopped, runEnd.Add(ms(c.StopMS)))
			f.lastExit = later(f.lastExit, runEnd)
			if c.End != "success" {
				kind := map[string]string{"rank_failure": "crash", "hang": "hang", "signal": "signal"}[c.End]
				if kind == "" {
					kind = c.End
				}
				f.failAt(runEnd, runEnd, kind, c.Reason)
			}
		}
	}
	if start.IsZero() {
		start = g.start
	}
	if !g.start.IsZero() && g.start.Before(start) {
		start = g.start
	}
	if !g.end.IsZero() {
		end = later(end, g.end)
	}
	if start.IsZero() || !end.After(start) {
		return j, fmt.Errorf("job %q: its records span no time", g.id)
	}
	j.Start, j.End = start, end

	ns := make([]int, 0, len(rounds))
	for n := range rounds {
		ns = append(ns, n)
	}
	sort.Ints(ns)
	// A round that was restarted with nothing else to explain it ended
	// when a rank was killed from outside (SIGKILL by the OOM killer or a
	// user): the launcher's own stops come after a failure it detected.
	for n := range restarts {
		if f := rounds[n]; f != nil && f.detected.IsZero() && !f.killedAt.IsZero() {
			f.failAt(f.killedAt, f.killedAt, "crash", f.killed)
		}
	}
	// A round healed from its survivors' live state lost only the failed
	// step of the round before it (docs/state.md, "Peer heal").
	for i, n := range ns {
		if at, ok := heals[n]; ok && i > 0 {
			f := rounds[ns[i-1]]
			f.healed, f.healedAt = true, at
		}
	}
	cursor := start
	add := func(p string, to time.Time, rp map[string]float64) time.Time {
		to = clamp(to, cursor, end)
		d := to.Sub(cursor).Seconds()
		j.PhasesS[p] += d
		rp[p] += d
		cursor = to
		return to
	}
	firstRound := len(r.Rounds) // this job's rounds are appended from here
	noSections := []string{}
	noStepCounts := []string{}
	noHeartbeat := []string{}
	neverReady := []string{}
	// heartbeats: some round's ranks heartbeated, so the ranks run a
	// rank-monitor client and a failed round in which none did never got
	// to training (a rank frozen or stuck in start-up): all start-up.
	heartbeats := false
	for _, f := range rounds {
		heartbeats = heartbeats || len(f.readyRanks) > 0
	}
	leadIn := true // the job's first round: its rendezvous is the launcher's start
	for i, n := range ns {
		f := rounds[n]
		if f.start.IsZero() {
			continue // a round this job never started ranks in (standby only)
		}
		rp := zeroPhases()
		rd := Round{Job: g.id, Round: n, WorldSize: f.world, Nodes: sortedKeys(f.nodes), PhasesS: rp}
		if f.detected.IsZero() {
			// No failure: the round ran until its ranks exited.
			done := f.lastExit
			if done.IsZero() {
				done = later(f.stopped, end)
			}
			f.detected, f.fault, f.end = done, done, "success"
			if f.stopped.IsZero() {
				f.stopped = done
			}
		}
		if f.stopped.Before(f.detected) {
			f.stopped = later(f.detected, f.lastExit)
		}
		if i+1 < len(ns) {
			if next := rounds[ns[i+1]]; !next.start.IsZero() && next.start.Before(f.stopped) {
				f.stopped = next.start
			}
		}
		ready := f.start
		if len(f.readyRanks) > 0 {
			for _, t := range f.readyRanks {
				ready = later(ready, t)
			}
			rd.Ready = timePtr(ready)
		}
		silent := len(f.readyRanks) == 0 && heartbeats && f.end != "success"
		switch {
		case silent:
			ready = f.fault
			neverReady = append(neverReady, fmt.Sprint(n))
		case len(f.readyRanks) == 0:
			noHeartbeat = append(noHeartbeat, fmt.Sprint(n))
		}
		ready = clamp(ready, f.start, f.fault)
		keep := f.fault
		if silent {
			keep = ready // nothing trained: no steps to lose
		} else if f.end != "success" && f.healed {
			// Kept work ends where the survivors completed the healed
			// step; the failed step is recomputed (1 step lost).
			keep = ready
			if !f.healedAt.IsZero() && !f.healedAt.After(f.fault) {
				keep = later(keep, f.healedAt)
			}
			one := 1
			rd.StepsLost = &one
		} else if f.end != "success" {
			if f.sections {
				keep = ready
				for _, c := range f.ckpts {
					if !c.After(f.fault) {
						keep = later(keep, c)
					}
				}
				if f.stepCounts {
					lost := f.stepsLost
					rd.StepsLost = &lost
				} else {
					noStepCounts = append(noStepCounts, fmt.Sprint(n))
				}
			} else {
				noSections = append(noSections, fmt.Sprint(n))
			}
		}
		if len(f.ckpts) > 0 {
			last := f.ckpts[0]
			for _, c := range f.ckpts {
				last = later(last, c)
			}
			rd.LastCkpt = timePtr(last)
		}
		if !f.firstStep.IsZero() {
			rd.FirstStep = timePtr(f.firstStep)
		}
		rd.Start = add(Rendezvous, f.start, rp)
		b := roundBounds{start: rd.Start, ready: add(Startup, ready, rp)}
		b.keep = add(Productive, keep, rp)
		add(Recompute, f.fault, rp)
		rd.Fault = cursor
		rd.Detected = add(Detection, f.detected, rp)
		rd.Stopped = add(Stop, f.stopped, rp)
		rd.End, rd.Reason = f.end, f.hangReason()
		r.Rounds = append(r.Rounds, rd)
		rc := roundCase{name: fmt.Sprint(n), leadIn: leadIn, failed: f.end != "success", world: f.world,
			heartbeat: len(f.readyRanks) > 0 || silent, lostKnown: f.end == "success" || f.sections || silent || f.healed,
			sections: f.sections}
		if g.id != "" {
			rc.name = fmt.Sprintf("%d (job %s)", n, g.id)
		}
		if leadIn {
			j.leadInS = rp[Rendezvous]
		}
		acc.addRound(rc, rp, b, works[n])
		leadIn = false
	}
	shutdown := map[string]float64{}
	add(Shutdown, end, shutdown)
	acc.s[CatIdle] += shutdown[Shutdown]
	if len(noHeartbeat) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%sround(s) %s: no rank reported a heartbeat (no rank-monitor client): start-up cannot be told from training and is counted as productive",
			jobPrefix(g.id), strings.Join(noHeartbeat, ", ")))
	}
	if len(neverReady) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%sfailed round(s) %s: no rank heartbeated although the ranks of other rounds did: the round never got to training and is counted as start-up",
			jobPrefix(g.id), strings.Join(neverReady, ", ")))
	}
	if len(noSections) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%sfailed round(s) %s: no 'step'/'checkpointing' sections recorded: the steps lost since the last checkpoint are unknown and counted as productive",
			jobPrefix(g.id), strings.Join(noSections, ", ")))
	}
	if len(noStepCounts) > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%sfailed round(s) %s: checkpoints recorded but no 'step' sections: the number of steps lost is unknown (recompute still counts the time since the last checkpoint)",
			jobPrefix(g.id), strings.Join(noStepCounts, ", ")))
	}
	if len(restarts) == 0 {
		// No event log: each failed round followed by another was a restart
		// (the verdicts' cycles).
		for i := firstRound; i+1 < len(r.Rounds); i++ {
			if rd := r.Rounds[i]; rd.End != "success" {
				restarts[rd.Round] = Restart{Job: g.id, AfterRound: rd.Round, At: rd.Stopped, Reason: rd.Reason}
			}
		}
	}
	rs := make([]int, 0, len(restarts))
	for n := range restarts {
		rs = append(rs, n)
	}
	sort.Ints(rs)
	for _, n := range rs {
		r.Restarts = append(r.Restarts, restarts[n])
	}
	return j, nil
}

func jobPrefix(id string) string {
	if id == "" {
		return ""
	}
	return "job " + id + ": "
}

// roundOf is the round a record names, and whether it names one.
func roundOf(r eventlog.Record) (int, bool) {
	switch r := r.(type) {
	case eventlog.CycleStartedEvent:
		return r.Round, true
	case eventlog.RankFirstHeartbeatEvent:
		return r.Round, true
	case eventlog.RankFirstStepEvent:
		return r.Round, true
	case eventlog.RankCheckpointEvent:
		return r.Round, true
	case eventlog.RankStepsEvent:
		return r.Round, true
	case eventlog.RankExitedEvent:
		return r.Round, true
	case eventlog.RankHangEvent:
		return r.Round, true
	case eventlog.StopEscalatedEvent:
		return r.Round, true
	case eventlog.WalltimeWarningEvent:
		return r.Round, true
	case eventlog.WorkloadRequestEvent:
		return r.Round, true
	case eventlog.SpareSwapEvent:
		return r.Round, true
	case eventlog.JobSucceededEvent:
		return r.Round, true
	case eventlog.StandbyEvent:
		return r.Round, true
	case eventlog.FencedEvent:
		return r.Round, true
	case eventlog.TrainingFinishedEvent:
		return r.Round, true
	case eventlog.InProcessFirstStepEvent:
		return r.Round, true
	case eventlog.InProcessRejoinedEvent:
		return r.Round, true
	case eventlog.RoundEndedEvent:
		return optRound(r.Round)
	case eventlog.JobFailedEvent:
		return optRound(r.Round)
	case eventlog.SignalReceivedEvent:
		return optRound(r.Round)
	}
	return 0, false
}

func optRound(r *int) (int, bool) {
	if r == nil {
		return 0, false
	}
	return *r, true
}
