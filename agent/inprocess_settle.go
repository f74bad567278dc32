package agent

// Settle-and-kill (docs/inprocess.md, "One incident, one restart"): no
// rank that dies with the failure is kept as a survivor (settle, when the
// failure is kept), and no kept survivor that ended, is ending or cannot
// be reached when its round begins is notified (collectGone,
// killUnreachable in inprocess_start.go): those start afresh with the
// failed ranks, and the incident spends one restart.

import (
	"maps"
	"slices"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// inProcessSettle is the reaping window of an in-process restart: after
// the exit of a failed rank, further exits are collected for this long
// before any rank is kept as a survivor, so ranks that die together (one
// kill of several pids, a cascade within milliseconds) are all replaced
// and spend one restart. It delays the report of every failure under
// --restart-mode in-process by as much.
const inProcessSettle = 100 * time.Millisecond

// survivorKillWait bounds the wait for a survivor that could not take its
// notice (or is ending) to end after SIGKILL (milliseconds, unless it is
// stuck in the kernel).
const survivorKillWait = 2 * time.Second

// settle makes sure that no rank that died with the failure is kept as a
// survivor: after a rank failure of this node it collects further exits
// for inProcessSettle; then it checks the process of every rank not known
// to have exited (rankEnding: reaped, a zombie, in its exit, SIGKILL
// pending) and waits, up to survivorKillWait, for the exits of those
// ending. The exits are recorded as the cycle's. It returns the ranks
// still ending at that bound (stuck in their exit): they are not kept
// either, and are started afresh.
func (p *inProcess) settle(c ipCycle) map[int]bool {
	end, g := c.end, c.group
	if g == nil {
		return nil
	}
	if len(end.exitCodes) >= p.d.nproc {
		return nil // no rank left to keep
	}
	exits := g.Exits()
	if end.kind == endRankFailure {
		t := time.NewTimer(inProcessSettle)
	settle:
		for {
			select {
			case e := <-exits:
				p.d.host.recordExit(e, end)
			case <-t.C:
				break settle
			}
		}
	}
	ending := map[int]bool{}
	for lr := 0; lr < p.d.nproc; lr++ {
		if _, exited := end.exitCodes[lr]; !exited && rankEnding(g, lr) {
			ending[lr] = true
		}
	}
	if len(ending) == 0 {
		return nil
	}
	p.d.log.Warn("in-process: ranks are ending with the failed one; they are not kept", "round", c.asg.Round,
		"local_ranks", slices.Sorted(maps.Keys(ending)))
	deadline := time.NewTimer(survivorKillWait)
	defer deadline.Stop()
	for len(ending) > 0 {
		select {
		case e := <-exits:
			p.d.host.recordExit(e, end)
			delete(ending, e.LocalRank)
		case <-deadline.C:
			for lr := range ending {
				_ = signalRank(g, lr, syscall.SIGKILL)
			}
			p.d.log.Warn("in-process: ranks still ending after the bound; started afresh without their exit",
				"local_ranks", slices.Sorted(maps.Keys(ending)), "bound", survivorKillWait)
			return ending
		}
	}
	return nil
}

// survivorsGone collects the exits of kept survivors that have ended:
// those already reaped, and, for wait > 0, those of want that end within
// wait. The exits are consumed: the new round's group does not run them.
func survivorsGone(kept *keptRanks, want []int, wait time.Duration) map[int]spawn.Exit {
	gone := map[int]spawn.Exit{}
	isKept := map[int]bool{}
	for _, lr := range kept.survivors {
		isKept[lr] = true
	}
	missing := func() bool {
		for _, lr := range want {
			if _, ok := gone[lr]; !ok {
				return true
			}
		}
		return false
	}
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	for {
		var e spawn.Exit
		select {
		case e = <-kept.group.Exits():
		default: // nothing reaped now: wait only for a missing one of want
			if deadline == nil || !missing() {
				return gone
			}
			select {
			case e = <-kept.group.Exits():
			case <-deadline:
				return gone
			}
		}
		if isKept[e.LocalRank] {
			gone[e.LocalRank] = e
		}
	}
}
