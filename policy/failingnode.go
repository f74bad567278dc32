package policy

import "slices"

// FailingNode applies the failing-node rule (docs/spares.md, "A node that
// keeps failing"): a node whose own ranks failed with node evidence
// (verdict.RankFailure.NodeEvidence) in limit of the latest limit+1
// rounds it ran ranks in keeps failing. ran are those rounds, in any
// order; evidence holds the rounds with such a failure. It returns the
// rounds that counted, oldest first, and the window; limit 0 turns the
// rule off.
//
// Rounds, not failures, are counted: four ranks of one node that die
// together (one GPU's fault takes its neighbours' collectives down) are
// one piece of evidence, not four.
func FailingNode(ran []int, evidence map[int]bool, limit int) (counted []int, window int, ok bool) {
	if limit <= 0 {
		return nil, 0, false
	}
	window = limit + 1
	rounds := slices.Clone(ran)
	slices.Sort(rounds)
	rounds = slices.Compact(rounds)
	if len(rounds) > window {
		rounds = rounds[len(rounds)-window:]
	}
	for _, r := range rounds {
		if evidence[r] {
			counted = append(counted, r)
		}
	}
	return counted, window, len(counted) >= limit
}

// SwapOutFailingNode reports whether a node that keeps failing
// (FailingNode) leaves the job for a spare now: only when a spare stood
// by in the round, and only the node whose report ended the round. Both
// bound what a wrong accusation costs: a failure of the code that every
// node hits at once (each node's ranks die, one report wins) takes out at
// most the node that won, once per spare, and the same-failure rule stops
// the job after it.
func SwapOutFailingNode(failing, endedRound bool, standbys int) bool {
	return failing && endedRound && standbys > 0
}
