package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/stacks"
)

// stackSharer is the rendezvous's side of a job-wide hang judgement
// (rendezvous.Etcd.ShareStacks).
type stackSharer interface {
	ShareStacks(ctx context.Context, round int, mine []byte, wait time.Duration, current func([]byte) bool) ([][]byte, bool, error)
}

// shareStacks adapts x to the monitor: this node's summaries go out as
// JSON, tagged with node; every node's come back. A summary that does not
// parse is left out (and logged): the judgement then lacks that node's
// ranks, which it handles as ranks it could not see.
func shareStacks(x stackSharer, node string, log *slog.Logger) monitor.StackExchange {
	return func(ctx context.Context, cycle int, mine []stacks.Summary, wait time.Duration) ([]stacks.Summary, bool) {
		for i := range mine {
			mine[i].Node = node
		}
		b, err := json.Marshal(mine)
		if err != nil {
			return mine, false
		}
		// Another node takes its stacks within the same second or so
		// (its clocks expire with this node's); one older than that is
		// from an earlier judgement of the round.
		since := time.Now().Add(-2 * time.Second).UnixMilli()
		current := func(b []byte) bool {
			var s []stacks.Summary
			return json.Unmarshal(b, &s) == nil && len(s) > 0 && s[0].At >= since
		}
		got, complete, err := x.ShareStacks(ctx, cycle, b, wait, current)
		if err != nil {
			log.Warn("hang: could not share this node's stacks; judging from this node's alone", "round", cycle, "err", err)
			return mine, false
		}
		var all []stacks.Summary
		for _, g := range got {
			var s []stacks.Summary
			if err := json.Unmarshal(g, &s); err != nil {
				log.Warn("hang: a node's stacks summary does not parse; left out", "round", cycle, "err", err)
				complete = false
				continue
			}
			all = append(all, s...)
		}
		return all, complete
	}
}
