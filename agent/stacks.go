package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/stacks"
)

// stacksFile is the name of a rank's stacks beside its logs, frFile of
// its NCCL flight recorder (torch's pickle, as torch's fr_trace tool reads
// it).
const (
	stacksFile = "stacks.txt"
	frFile     = "flight_recorder.pkl"
)

// recordStacks writes, once per round, the stacks the monitor took at a
// hang beside each rank's logs (attempt_<n>/<local_rank>/stacks.txt) and
// records them and the finding (rank_stacks).
func (a *Agent) recordStacks(h monitor.Hang) {
	if h.Judgement != nil {
		a.recordStacksOf(h.Judgement)
	}
}

// bystanderOf returns the round's hang judgement when it names a culprit
// other than local rank lr: lr's failure followed from that hang. A
// judgement still being made is waited for (bounded): the culprit on
// another node may be killed, and lr leave its collective, before this
// node's stacks are shared.
func (a *Agent) bystanderOf(ctx context.Context, lr int) (*monitor.Judgement, bool) {
	if a.d.Monitors == nil {
		return nil, false
	}
	j, ok := a.d.Monitors.Judged(ctx, a.run.asg.Round)
	if !ok || !j.Finding.Known || slices.Contains(j.Finding.Culprits, a.run.asg.RankBase+lr) {
		return nil, false
	}
	return j, true
}

// recordStacksOf writes j's stacks and records them, once per round.
func (a *Agent) recordStacksOf(j *monitor.Judgement) {
	if a.run.stacksSaved[j.Cycle] {
		return
	}
	if a.run.stacksSaved == nil {
		a.run.stacksSaved = map[int]bool{}
	}
	a.run.stacksSaved[j.Cycle] = true
	ev := eventlog.RankStacksEvent{Round: j.Cycle, Known: j.Finding.Known, Culprits: j.Finding.Culprits,
		Why: j.Finding.Why, Text: j.Finding.Text, TookMS: float64(j.Took.Microseconds()) / 1000}
	now := time.Now().UTC()
	for i, r := range j.Ranks {
		s := j.Summary[i]
		rec := eventlog.RankStacksRank{LocalRank: r.LocalRank, Rank: s.Rank, PID: r.PID, State: string(s.State),
			Activity: string(s.Activity), Place: s.Place, Collective: s.Collective, FlightRecorder: string(r.FRState),
			FlightRecorderText: s.FRText} // read once, by stacks.Summarize
		if a.run.att != nil {
			if ef := a.run.att.ErrorFile(r.LocalRank); ef != "" {
				path := filepath.Join(filepath.Dir(ef), stacksFile)
				if err := atomicfile.WriteVolatile(path, stacksText(r, s, rec.FlightRecorderText, now), 0o644); err != nil {
					a.log.Warn("could not write a rank's stacks", "path", path, "err", err)
				} else {
					rec.File = path
				}
				if len(r.FR) > 0 {
					path := filepath.Join(filepath.Dir(ef), frFile)
					if err := atomicfile.WriteVolatile(path, r.FR, 0o644); err != nil {
						a.log.Warn("could not write a rank's flight recorder", "path", path, "err", err)
					} else {
						rec.FlightRecorderFile = path
					}
				}
			}
		}
		ev.Ranks = append(ev.Ranks, rec)
	}
	a.log.Error("rank hang: what every rank was doing", "round", j.Cycle, "finding", j.Finding.Text,
		"known", j.Finding.Known, "took", j.Took)
	a.ev.Emit(ev)
}

// stacksText is a rank's stacks file: a header, then faulthandler's dump.
func stacksText(r stacks.Rank, s stacks.Summary, fr string, at time.Time) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# ft-launcher: stacks of local rank %d (rank %d, pid %d), taken %s before it or a peer was killed\n",
		r.LocalRank, s.Rank, r.PID, at.Format(time.RFC3339Nano))
	fmt.Fprintf(&b, "# state: %s (process state %q, kernel wait %q)", r.State, string(r.Proc), r.WChan)
	if r.DumpedPID != 0 && r.DumpedPID != r.PID {
		fmt.Fprintf(&b, ", dumped by its descendant %d", r.DumpedPID)
	}
	b.WriteString("\n")
	if s.Place != "" {
		fmt.Fprintf(&b, "# at: %s (%s)\n", s.Place, s.Activity)
	}
	switch {
	case fr != "":
		fmt.Fprintf(&b, "# NCCL flight recorder (%s): %s\n", frFile, fr)
	case r.FRState != "" && r.FRState != stacks.FRTaken:
		fmt.Fprintf(&b, "# NCCL flight recorder: %s\n", r.FRState)
	}
	b.WriteString("\n")
	b.Write(r.Dump)
	return []byte(b.String())
}

// findingText is what the stacks said of h's hang ("" without stacks).
func findingText(h monitor.Hang) string {
	if h.Judgement == nil {
		return ""
	}
	return h.Judgement.Finding.Text
}
