package prewarm

import (
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// Group is the ranks of one cycle: the cold ones in spawn.Groups (those
// started at once, those whose handover failed), each warm one in the
// one-process spawn.Group its standby was started as. It has the methods
// of a *spawn.Group, so the launcher hands it to the agent as its rank
// group (cmd/ft-launcher adapts it; this package does not import agent).
type Group struct {
	parts []*spawn.Group
	exits chan spawn.Exit
}

func newGroup(cold []*spawn.Group, warm []*standby, n int) *Group {
	g := &Group{exits: make(chan spawn.Exit, n)} // one per rank: never blocks
	for _, c := range cold {
		g.parts = append(g.parts, c)
		k := len(c.PIDs())
		go func() {
			for range k {
				g.exits <- <-c.Exits()
			}
		}()
	}
	for _, s := range warm {
		g.parts = append(g.parts, s.g)
		go func() {
			<-s.done // the standby's goroutine took its one Exit
			g.exits <- s.exit
		}()
	}
	return g
}

// PIDs maps local rank to pid (= process group id), warm and cold alike.
func (g *Group) PIDs() map[int]int {
	m := map[int]int{}
	for _, p := range g.parts {
		for lr, pid := range p.PIDs() {
			m[lr] = pid
		}
	}
	return m
}

// Exits delivers one Exit per rank as soon as it is reaped.
func (g *Group) Exits() <-chan spawn.Exit { return g.exits }

// Stop stops every part at once (one grace for all) and merges the results.
func (g *Group) Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult {
	results := make([]spawn.StopResult, len(g.parts))
	var wg sync.WaitGroup
	for i, p := range g.parts {
		wg.Go(func() { results[i] = p.Stop(sig, grace) })
	}
	wg.Wait()
	var res spawn.StopResult
	for _, r := range results {
		res.Exits = append(res.Exits, r.Exits...)
		res.Escalated = append(res.Escalated, r.Escalated...)
		res.Leftover = append(res.Leftover, r.Leftover...)
	}
	sort.Slice(res.Exits, func(i, j int) bool { return res.Exits[i].LocalRank < res.Exits[j].LocalRank })
	slices.Sort(res.Escalated)
	slices.Sort(res.Leftover)
	res.Leftover = slices.Compact(res.Leftover)
	return res
}

// SignalAll signals every live rank's process group.
func (g *Group) SignalAll(sig syscall.Signal) {
	for _, p := range g.parts {
		p.SignalAll(sig)
	}
}
