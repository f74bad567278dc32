package prewarm

import (
	"strconv"
	"sync"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// cycleReady tracks which ranks of the cycle being started have reached
// training (their first heartbeat: Starter.RankTraining). The refill delay
// exists so that the new standbys' imports do not compete for CPU with
// the ranks on their way to their first step; once every rank got there
// it has served, and the refill starts at once. That matters when the
// next failure comes soon: a standby started 2 s into a cycle that
// crashes 4 s in is still importing when the restart needs it.
//
// It has its own lock, not Starter.mu: the rank monitor reports first
// heartbeats from its own goroutines, and the Starter calls into the
// monitor (Options.Started) with Starter.mu held.
type cycleReady struct {
	mu      sync.Mutex
	round   string       // TORCHELASTIC_RESTART_COUNT of the cycle
	pending map[int]bool // local ranks not yet training
	done    chan struct{}
}

func newCycleReady(specs []spawn.Spec) *cycleReady {
	c := &cycleReady{round: envValue(specs, "TORCHELASTIC_RESTART_COUNT"),
		pending: make(map[int]bool, len(specs)), done: make(chan struct{})}
	for _, sp := range specs {
		c.pending[sp.LocalRank] = true
	}
	// A cycle that starts no rank (every rank survived in process) never
	// closes done: nothing of it trains, and its refill keeps the delay.
	return c
}

// training marks localRank of round as training; the last one closes done.
func (c *cycleReady) training(round, localRank int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.round != strconv.Itoa(round) || !c.pending[localRank] {
		return
	}
	delete(c.pending, localRank)
	if len(c.pending) == 0 { // only a rank's mark gets here: done is closed once
		close(c.done)
	}
}

// RankTraining tells the Starter that localRank of round (the job-wide
// round, TORCHELASTIC_RESTART_COUNT) sent its first heartbeat. When every
// rank the current cycle started has, that cycle's refill does not wait
// out the rest of RefillDelay nor the cold ranks' imports. Ranks that
// never heartbeat (no monitor client) leave the delay as it is. Safe to
// call from any goroutine, at any time; a round other than the current
// cycle's is ignored.
func (st *Starter) RankTraining(round, localRank int) {
	if c := st.ready.Load(); c != nil {
		c.training(round, localRank)
	}
}
