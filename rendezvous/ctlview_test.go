package rendezvous

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// notFired fails when ch already holds a round end.
func notFired(t *testing.T, what string, ch <-chan RoundEnd) {
	t.Helper()
	select {
	case end := <-ch:
		t.Fatalf("%s: fired early with %+v", what, end)
	default:
	}
}

// TestCtlViewFollowsTheJob drives the control view alone (no rendezvous,
// no gossip) with ctl keys written to the embedded etcd: it loads the
// round, follows a restart with the end record's reason and the ledger
// leases this node closed, fires a fence only for the fenced round, takes
// the first close record and ignores a later one, wakes its waiters on
// every change, and answers an old round's subscription at once.
func TestCtlViewFollowsTheJob(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	cli := testClient(t, m.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	k := keys{base: "/ctlview-test/g0/"}
	put := func(key string, v any) {
		t.Helper()
		b, ok := v.([]byte)
		if !ok {
			b, _ = json.Marshal(v)
		}
		if _, err := cli.Put(ctx, key, string(b)); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	put(k.round(), []byte("0"))

	v := newCtlView("n1", 500*time.Millisecond)
	v.k = k
	rev, err := v.load(ctx, cli, nil)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if v.round() != 0 || v.closedInfo() != nil {
		t.Fatalf("after load: round %d closed %+v, want round 0 and open", v.round(), v.closedInfo())
	}
	wctx, wcancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		v.watch(wctx, cli, rev, testLogger(t), nil)
	}()
	defer func() {
		wcancel()
		<-done
	}()

	// A restart: round 0's end record, then round 1. This node's end txn
	// closed n2's ledger leases (stashed before the txn), so they go with
	// the end.
	end0 := v.subscribe(0)
	notFired(t, "round 0 while current", end0)
	changed, _, _ := v.snapshot()
	recs := []ledger.Record{{Job: "job", Node: "n2", GroupRank: 1, Cycle: 0}}
	v.stashLedger(0, "n2", recs)
	put(k.lastEnd(), endInfo{Round: 0, Reason: "node n2 lost", Node: "n2", Cause: policy.NodeLost, Action: policy.SwapSpare, LedgerBy: "n1"})
	put(k.round(), []byte("1"))
	got := waitEnd(t, end0, 20*time.Second)
	if got.Kind != EndRestart || got.Round != 0 || got.Reason != "node n2 lost" || got.Node != "n2" || got.Cause != policy.NodeLost ||
		len(got.Ledger) != 1 || got.Ledger[0].Node != "n2" {
		t.Fatalf("round 0 ended with %+v, want a restart for n2's loss with its ledger lease", got)
	}
	select {
	case <-changed:
	case <-time.After(20 * time.Second):
		t.Fatalf("the waiters were not woken by the round change")
	}
	if v.round() != 1 {
		t.Fatalf("round %d after the change, want 1", v.round())
	}

	// The fence fires its own round only.
	end1, end2 := v.subscribe(1), v.subscribe(2)
	until := time.Now().Add(time.Second)
	v.fence(1, until)
	got = waitEnd(t, end1, 20*time.Second)
	if got.Kind != EndFenced || got.Node != "n1" || got.Cause != policy.NodeStopped {
		t.Fatalf("round 1 ended with %+v, want fenced", got)
	}
	notFired(t, "round 2 after round 1's fence", end2)

	// A round number that goes backwards is ignored; round 2 opens.
	put(k.round(), []byte("0"))
	put(k.round(), []byte("2"))
	waitFor(t, "round 2", func() bool { return v.round() == 2 })

	// The first close record wins; every open subscription fires with it.
	put(k.closed(), closeInfo{Kind: verdict.Succeeded, Code: 0, Reason: "all done", Node: "n3"})
	got = waitEnd(t, end2, 20*time.Second)
	if got.Kind != EndJobClosed || got.Close != verdict.Succeeded || got.Reason != "all done" || got.Node != "n3" {
		t.Fatalf("round 2 ended with %+v, want the job's close", got)
	}
	put(k.closed(), closeInfo{Kind: verdict.FatalError, Code: 1, Reason: "late"})
	if v.closeLocal(closeInfo{Kind: verdict.RendezvousLost, Code: 1, Reason: "local"}) {
		t.Fatalf("a local close after the job's close was taken")
	}
	time.Sleep(200 * time.Millisecond) // let the late record arrive, if it were taken
	if ci := v.closedInfo(); ci == nil || ci.Reason != "all done" {
		t.Fatalf("close record %+v, want the first one (all done)", ci)
	}
	if got := waitEnd(t, v.subscribe(3), 20*time.Second); got.Kind != EndJobClosed {
		t.Fatalf("a subscription after the close got %+v, want the job's close at once", got)
	}
}

// TestCtlViewLocalCloseAndPruning: a local close (etcd lost) fires every
// subscription after broadcast, and the per-round state stays bounded over
// many rounds; an old round's subscription is answered at once.
func TestCtlViewLocalCloseAndPruning(t *testing.T) {
	v := newCtlView("n1", time.Second)
	v.k = keys{base: "/t/g0/"}
	for r := 0; r < manyRounds; r++ {
		v.assigned(r)
		ch := v.subscribe(r)
		v.stashLedger(r, "n2", []ledger.Record{{Node: "n2", Cycle: r}})
		b, _ := json.Marshal(endInfo{Round: r, Reason: "boom " + strconv.Itoa(r)})
		v.applyAll([]ctlEvent{{key: v.k.lastEnd(), val: b}, {key: v.k.round(), val: []byte(strconv.Itoa(r + 1))}})
		if got := waitEnd(t, ch, 20*time.Second); got.Kind != EndRestart || got.Reason != "boom "+strconv.Itoa(r) {
			t.Fatalf("round %d ended with %+v", r, got)
		}
	}
	v.mu.Lock()
	ends, lastEnds, ledgers := len(v.ends), len(v.lastEnds), len(v.ledgerClosed)
	v.mu.Unlock()
	if ends > 2 || lastEnds > 3 || ledgers > 3 {
		t.Fatalf("after %d rounds: %d subscriptions, %d end records, %d ledger stashes; want O(1)", manyRounds, ends, lastEnds, ledgers)
	}
	if got := waitEnd(t, v.subscribe(2), 20*time.Second); got.Kind != EndRestart {
		t.Fatalf("Ended(2) long after: %+v", got)
	}
	open := v.subscribe(manyRounds)
	if !v.closeLocal(closeInfo{Kind: verdict.RendezvousLost, Code: 1, Reason: "etcd lost"}) {
		t.Fatalf("the first local close was not taken")
	}
	v.broadcast()
	if got := waitEnd(t, open, 20*time.Second); got.Kind != EndJobClosed || got.Close != verdict.RendezvousLost {
		t.Fatalf("open round ended with %+v, want the local close", got)
	}
}

// waitFor polls cond (generously: the machine is loaded).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCtlViewRoundKeys: the view keeps each round's assignment and closer
// key from ctl events, counts the closer key's deletions even when its
// claim and its holder's death arrive in one batch (the key then looks as
// before, but a waiting node must still claim), treats a held key that a
// re-read no longer finds as deleted, and drops rounds older than the one
// before the current.
func TestCtlViewRoundKeys(t *testing.T) {
	k := keys{base: "/roundkeys-test/g0/"}
	v := newCtlView("n1", 500*time.Millisecond)
	v.k = k
	v.applyAll([]ctlEvent{{key: k.round(), val: []byte("3"), rev: 10}})
	v.applyAll([]ctlEvent{
		{key: k.closer(3), val: []byte("n7"), rev: 11},
		{key: k.closer(3), deleted: true, rev: 12},
	})
	rk, rev := v.roundKeys(3)
	if rk.closerHeld || rk.released != 1 || rk.assignment != nil || rev != 12 {
		t.Fatalf("after a claim and its holder's death in one batch: %+v at %d; want not held, 1 release, at 12", rk, rev)
	}
	v.applyAll([]ctlEvent{{key: k.closer(3), val: []byte("n2"), rev: 13}, {key: k.assignment(3), val: []byte(`{"world_size":8}`), rev: 14}})
	if rk, _ = v.roundKeys(3); !rk.closerHeld || string(rk.assignment) != `{"world_size":8}` {
		t.Fatalf("after a claim and the assignment: %+v", rk)
	}
	// Round 4's closer was seen held; the watch breaks while its holder
	// dies, and the re-read (a load) finds no key: a deletion.
	v.applyAll([]ctlEvent{{key: k.round(), val: []byte("4"), rev: 15}, {key: k.closer(4), val: []byte("n5"), rev: 16}})
	m := startEmbedded(t)
	cli := testClient(t, m.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, k.round(), "4"); err != nil {
		t.Fatal(err)
	}
	if _, err := v.load(ctx, cli, nil); err != nil {
		t.Fatal(err)
	}
	if rk, _ = v.roundKeys(4); rk.closerHeld || rk.released != 1 {
		t.Fatalf("round 4 after a re-read without its closer key: %+v; want not held, 1 release", rk)
	}
	// Round 6: rounds before 5 are dropped, and later events of them are
	// not recorded.
	v.applyAll([]ctlEvent{{key: k.round(), val: []byte("6"), rev: 30}})
	v.applyAll([]ctlEvent{{key: k.closer(3), deleted: true, rev: 31}})
	if rk, _ = v.roundKeys(3); rk.released != 0 || rk.assignment != nil {
		t.Fatalf("round 3 kept at round 6: %+v", rk)
	}
}
