package rendezvous

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/ftlauncher/ft-launcher/policy"
)

// A job may restart tens of thousands of times; the per-round
// maps must keep only the current and the previous round.
const manyRounds = 10000

func TestLocalKeepsNoPerRoundState(t *testing.T) {
	l := NewLocal("run", 1, manyRounds, "127.0.0.1", 29500)
	ctx := context.Background()
	for r := 0; r < manyRounds; r++ {
		a, err := l.Next(ctx)
		if err != nil || a.Round != r {
			t.Fatalf("round %d: Next = %+v, %v", r, a, err)
		}
		l.Ended(r)
		if d, err := l.Fail(ctx, r, policy.RankCrash, "boom"); err != nil || !d.Restart {
			t.Fatalf("round %d: Fail = %+v, %v", r, d, err)
		}
		l.Ended(r + 1)
	}
	l.Ended(3) // a long-gone round is answered but not kept
	if n := len(l.ends); n > 2 {
		t.Fatalf("after %d rounds Local keeps %d Ended channels, want at most 2", manyRounds, n)
	}
}

// TestEtcdKeepsNoPerRoundState drives one node's view of the job (the ctl
// watch's events) through many rounds without etcd.
func TestEtcdKeepsNoPerRoundState(t *testing.T) {
	view := newCtlView("", 0)
	view.k, view.cur = keys{base: "/t/g0/"}, 0
	e := &Etcd{log: testLogger(t), k: view.k, view: view, assigned: map[int]roundSummary{}, lastRound: -1}
	for r := 0; r < manyRounds; r++ {
		e.mu.Lock()
		e.lastRound, e.state = r, stateActive
		e.assigned[r] = roundSummary{Round: r}
		e.view.assigned(r)
		e.pruneLocked()
		e.mu.Unlock()
		ch := e.Ended(r)
		end, _ := json.Marshal(endInfo{Round: r, Reason: "boom " + strconv.Itoa(r)})
		e.mu.Lock()
		e.applyCtlLocked(ctlEvent{key: e.k.lastEnd(), val: end})
		e.applyCtlLocked(ctlEvent{key: e.k.round(), val: []byte(strconv.Itoa(r + 1))})
		e.broadcastLocked()
		e.mu.Unlock()
		if got := <-ch; got.Kind != EndRestart || got.Round != r || got.Reason != "boom "+strconv.Itoa(r) {
			t.Fatalf("round %d ended with %+v", r, got)
		}
		e.mu.Lock()
		e.setStateLocked(stateJoining, "next")
		e.mu.Unlock()
	}
	if got := <-e.Ended(2); got.Kind != EndRestart { // an old round still answers
		t.Fatalf("Ended(2) long after: %+v", got)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.view.mu.Lock()
	defer e.view.mu.Unlock()
	if len(e.view.ends) > 2 || len(e.view.lastEnds) > 3 || len(e.assigned) > 2 || len(e.view.ledgerClosed) > 2 {
		t.Fatalf("after %d rounds: %d Ended subscriptions, %d end records, %d assignments, %d ledger stashes; want O(1)",
			manyRounds, len(e.view.ends), len(e.view.lastEnds), len(e.assigned), len(e.view.ledgerClosed))
	}
}
