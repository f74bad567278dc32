package rendezvous

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// The round-closing rule (docs/rendezvous.md, "When a round closes") as a
// pure function of what the closer knows, so that every case is a table
// test: a round closes as soon as every node that is alive has joined and
// MIN is met; it waits only for nodes that may still come, each for a
// bounded time.

// peerState is what the closer knows of a node of the job that has not
// joined the round yet.
type peerState int

const (
	// peerDead: confirmed gone (its lease expired, or a peer recorded its
	// death: a closed connection confirmed by a refused dial, or gossip).
	// Never waited for.
	peerDead peerState = iota
	// peerAlive: its lease is held and nobody suspects it. It is on its
	// way (stopping its ranks, registering) and is waited for: a previous
	// active up to RejoinWait after the round opened (it keeps its group
	// rank), any other node up to LastCall after MIN was met.
	peerAlive
	// peerSuspect: gossip suspects it but has not confirmed it dead. It is
	// waited for at most the detection bound from when it was suspected.
	peerSuspect
)

func (s peerState) String() string {
	switch s {
	case peerDead:
		return "dead"
	case peerAlive:
		return "alive"
	case peerSuspect:
		return "suspect"
	}
	return "unknown"
}

// missingPeer is a node of the job that has not joined the round.
type missingPeer struct {
	ID         string
	State      peerState
	PrevActive bool      // active in the previous round
	Since      time.Time // peerSuspect: when it was first seen suspected
}

// closeInput is everything the rule looks at.
type closeInput struct {
	Min, Max int
	Present  int // nodes registered in the round (quarantined ones left out)
	// FirstRound: round 0, whose population is not known yet (launchers
	// start at different times); the nodes not seen yet are of unknown
	// state and get the last call.
	FirstRound  bool
	Missing     []missingPeer
	Now         time.Time
	Opened      time.Time     // when the round opened (the previous one ended)
	MinMetAt    time.Time     // when Present first reached Min
	LastCall    time.Duration // wait for nodes of unknown state
	RejoinWait  time.Duration // wait for a previous active that is alive
	DetectBound time.Duration // wait for a suspected node
}

// closeDecision is the rule's answer: close now, or wait for an event or
// until Until (zero: no deadline, only an event can change the answer).
type closeDecision struct {
	Close   bool
	Until   time.Time
	Waiting []string // "id (state)" of the nodes still waited for
	Why     string
}

// decideClose applies the round-closing rule.
func decideClose(in closeInput) closeDecision {
	if in.Present < in.Min {
		return closeDecision{Why: fmt.Sprintf("%d of MIN %d nodes present", in.Present, in.Min)}
	}
	var until time.Time
	var waiting []string
	wait := func(id string, s string, deadline time.Time) {
		if !in.Now.Before(deadline) {
			return // its bound has passed: not waited for any more
		}
		waiting = append(waiting, id+" ("+s+")")
		if until.IsZero() || deadline.Before(until) {
			until = deadline
		}
	}
	// A previous active keeps its group rank, even when MAX nodes are
	// there without it (a spare registers at once): it is waited for first.
	for _, p := range in.Missing {
		switch {
		case !p.PrevActive:
		case p.State == peerAlive:
			wait(p.ID, "alive, previous active", in.Opened.Add(in.RejoinWait))
		case p.State == peerSuspect:
			wait(p.ID, "suspect, previous active", p.Since.Add(in.DetectBound))
		}
	}
	if len(waiting) == 0 && in.Present >= in.Max {
		return closeDecision{Close: true, Why: fmt.Sprintf("MAX %d nodes present", in.Max)}
	}
	if in.Present < in.Max {
		lastCall := in.MinMetAt.Add(in.LastCall)
		if in.FirstRound {
			wait("nodes not seen yet", "unknown", lastCall)
		}
		for _, p := range in.Missing {
			switch {
			case p.PrevActive:
			case p.State == peerSuspect:
				wait(p.ID, p.State.String(), p.Since.Add(in.DetectBound))
			case p.State == peerAlive:
				wait(p.ID, p.State.String(), lastCall)
			}
		}
	}
	if len(waiting) == 0 {
		return closeDecision{Close: true, Why: fmt.Sprintf("every live node joined (%d present, MIN %d)", in.Present, in.Min)}
	}
	sort.Strings(waiting)
	return closeDecision{Until: until, Waiting: waiting,
		Why: fmt.Sprintf("%d present, MIN %d met; waiting for %s", in.Present, in.Min, strings.Join(waiting, ", "))}
}
