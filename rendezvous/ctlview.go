package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/policy"
)

// ctlView is this node's view of the job's control state (<gen>/ctl/, which
// it reads and watches: the current round, the last rounds' end records, the close record, or a
// local close: etcd lost, Leave, Depart) and of its subscribers: the
// waiters woken on every change (changed) and the Ended channels, which it
// fires once their round is over (superseded, closed, or fenced, which the
// façade tells it). It also keeps the ledger leases this node's end txn of
// a round closed, which go with that round's RoundEnd.
//
// Its state only moves forward: the round only grows, a close record once
// set stays, so a snapshot read is never contradicted later, only
// outdated.
//
// Lock: mu guards every field below it and is a leaf: the view calls
// nothing outside itself while holding it (neither react nor etcd). The
// façade calls it with or without Etcd.mu held (lock order: Etcd.mu, then
// ctlView.mu; never the reverse): its react applies a batch of changes to
// the view and moves the node's state along under Etcd.mu, as one step.
type ctlView struct {
	self   string        // this node's id (EndFenced, the ledger handed over)
	margin time.Duration // the fence margin, for EndFenced's reason
	k      keys          // set at start (joinGeneration), before any apply

	mu       sync.Mutex
	cur      int        // the job's current round, as last seen from etcd; -1 none
	closed   *closeInfo // the job's close record, or a local close
	lastEnds map[int]endInfo
	changed  chan struct{} // closed and replaced on every change
	ends     map[int]*endSub
	// fenced is the round this node fenced itself out of (-1 none) and
	// until when its lease was last proven valid then.
	fenced      int
	fencedUntil time.Time
	// floor is the last round this node was assigned (-1 none): with cur
	// it decides what the per-round maps keep.
	floor int
	// ledgerClosed are the ledger leases this node's end txn of round r
	// closed (set before the txn commits: the ctl watch may deliver the
	// end first), handed to the agent with round r's RoundEnd.
	ledgerClosed map[int]map[string][]ledger.Record // round -> lost node -> its leases
	// rounds are the rounds' assignment and closer keys (ctl/rounds/<N>/),
	// kept for the current and the previous round, and rev the revision
	// the view has seen up to: a node waiting for a round reads them here,
	// where its one ctl watch delivers them (no watch per round).
	rounds map[int]roundKeys
	rev    int64
}

// roundKeys are one round's keys under ctl/rounds/<N>/ as last seen.
type roundKeys struct {
	assignment []byte // the round's summary, once its closer wrote it
	closerHeld bool   // the closer key exists
	// released counts the closer key's deletions seen: a claim and its
	// holder's death may come in one watch response, which leaves the
	// key as it was but must still wake a claimant.
	released int
}

type endSub struct {
	ch    chan RoundEnd
	fired bool
}

func newCtlView(self string, margin time.Duration) *ctlView {
	return &ctlView{self: self, margin: margin, cur: -1, fenced: -1, floor: -1, lastEnds: map[int]endInfo{},
		changed: make(chan struct{}), ends: map[int]*endSub{}, ledgerClosed: map[int]map[string][]ledger.Record{},
		rounds: map[int]roundKeys{}}
}

// ctlEvent is one change of a ctl key.
type ctlEvent struct {
	key     string
	val     []byte
	deleted bool
	rev     int64 // the revision of the read or watch response it came in
}

// load reads the ctl keys and hands them to react (nil: applyAll), the
// end record first so that a round change finds its reason; it returns the
// revision to watch from.
func (v *ctlView) load(ctx context.Context, cli *clientv3.Client, react func([]ctlEvent)) (int64, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := cli.Get(actx, v.k.ctl(), clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	rev := resp.Header.Revision
	evs := make([]ctlEvent, 0, len(resp.Kvs))
	read := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		read[string(kv.Key)] = true
		if string(kv.Key) == v.k.lastEnd() {
			evs = append(evs, ctlEvent{key: string(kv.Key), val: kv.Value, rev: rev})
		}
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != v.k.lastEnd() {
			evs = append(evs, ctlEvent{key: string(kv.Key), val: kv.Value, rev: rev})
		}
	}
	// A closer key seen held and gone meanwhile (the watch broke while its
	// holder died) is a deletion the watch did not deliver.
	v.mu.Lock()
	for r, rk := range v.rounds {
		if rk.closerHeld && !read[v.k.closer(r)] {
			evs = append(evs, ctlEvent{key: v.k.closer(r), deleted: true, rev: rev})
		}
	}
	v.mu.Unlock()
	v.react(react, evs)
	return resp.Header.Revision, nil
}

// watch follows the ctl keys from revision rev+1 and hands each batch of
// changes to react (nil: applyAll) until ctx ends. clientv3 resumes the
// watch after reconnects, so an etcd outage alone never ends a round; when
// the stream breaks (no leader, compaction) it reads the keys again
// (load) and watches on.
func (v *ctlView) watch(ctx context.Context, cli *clientv3.Client, rev int64, log *slog.Logger, react func([]ctlEvent)) {
	for ctx.Err() == nil {
		wch := cli.Watch(clientv3.WithRequireLeader(ctx), v.k.ctl(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				log.Debug("ctl watch interrupted", "err", err)
				break
			}
			evs := make([]ctlEvent, 0, len(wr.Events))
			for _, ev := range wr.Events {
				evs = append(evs, ctlEvent{key: string(ev.Kv.Key), val: ev.Kv.Value, deleted: ev.Type == clientv3.EventTypeDelete,
					rev: wr.Header.Revision})
			}
			v.react(react, evs)
			rev = wr.Header.Revision
		}
		if ctx.Err() != nil || !sleepCtx(ctx, retryPause) {
			return
		}
		if r, err := v.load(ctx, cli, react); err == nil {
			rev = r
		}
	}
}

func (v *ctlView) react(react func([]ctlEvent), evs []ctlEvent) {
	if react != nil {
		react(evs)
		return
	}
	v.applyAll(evs)
}

// applyAll applies a batch of changes and broadcasts: what the view does
// alone, with no node state to move along.
func (v *ctlView) applyAll(evs []ctlEvent) {
	for _, ev := range evs {
		v.apply(ev)
	}
	v.broadcast()
}

// ctlChange is what one applied ctl key changed.
type ctlChange struct {
	round  int        // the new round, when it moved forward; -1 otherwise
	closed *closeInfo // the close record, when it is the first one seen
}

// apply records one ctl key's value (a deletion changes nothing but a
// round's keys); the caller calls broadcast after a batch.
func (v *ctlView) apply(ev ctlEvent) ctlChange {
	ch := ctlChange{round: -1}
	key, val := ev.key, ev.val
	v.mu.Lock()
	defer v.mu.Unlock()
	v.rev = max(v.rev, ev.rev)
	if strings.HasPrefix(key, v.k.ctlRounds()) {
		v.applyRoundKeyLocked(ev)
		return ch
	}
	if ev.deleted {
		return ch
	}
	switch key {
	case v.k.round():
		if r, err := strconv.Atoi(string(val)); err == nil && r > v.cur {
			v.cur = r // restarts are counted by the agent, which acts on them
			ch.round = r
		}
	case v.k.lastEnd():
		var le endInfo
		if json.Unmarshal(val, &le) == nil {
			v.lastEnds[le.Round] = le
		}
	case v.k.closed():
		if v.closed == nil {
			ci := decodeClose(val)
			v.closed = &ci
			ch.closed = &ci
		}
	}
	return ch
}

// applyRoundKeyLocked records a change of a round's assignment or closer
// key. Rounds older than the view keeps are not recorded (the closer of
// round N deletes round N-2's keys).
func (v *ctlView) applyRoundKeyLocked(ev ctlEvent) {
	rest := strings.TrimPrefix(ev.key, v.k.ctlRounds())
	rs, name, ok := strings.Cut(rest, "/")
	r, err := strconv.Atoi(rs)
	if !ok || err != nil || r < v.oldestRoundLocked() {
		return
	}
	rk := v.rounds[r]
	switch name {
	case "assignment":
		rk.assignment = nil
		if !ev.deleted {
			rk.assignment = ev.val
		}
	case "closer":
		rk.closerHeld = !ev.deleted
		if ev.deleted {
			rk.released++
		}
	default:
		return
	}
	v.rounds[r] = rk
}

// oldestRoundLocked is the oldest round whose keys the view keeps: the
// one before the previous (the closer of a round deletes it).
func (v *ctlView) oldestRoundLocked() int { return max(v.cur, v.floor) - 2 }

// roundKeys is round r's keys as the view last saw them, and the revision
// the view has seen up to.
func (v *ctlView) roundKeys(r int) (roundKeys, int64) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.rounds[r], v.rev
}

// closeLocal records a local close (etcd lost, Leave, Depart) unless the job
// is closed already; it reports whether ci was taken. The caller broadcasts.
func (v *ctlView) closeLocal(ci closeInfo) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed != nil {
		return false
	}
	v.closed = &ci
	return true
}

// atLeast moves the current round to r if it is behind (a job whose
// config this node just checked is at round 0 at least).
func (v *ctlView) atLeast(r int) {
	v.mu.Lock()
	v.cur = max(v.cur, r)
	v.mu.Unlock()
}

// snapshot is the current change channel, close record and round together.
func (v *ctlView) snapshot() (<-chan struct{}, *closeInfo, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.changed, v.closed, v.cur
}

// round is the job's round as last seen from etcd.
func (v *ctlView) round() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.cur
}

// closedInfo is the close record (nil while the job runs).
func (v *ctlView) closedInfo() *closeInfo {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.closed
}

// lastEnd is round r's end record, if seen.
func (v *ctlView) lastEnd(r int) (endInfo, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	le, ok := v.lastEnds[r]
	return le, ok
}

// assigned tells the view the last round this node was assigned.
func (v *ctlView) assigned(r int) {
	v.mu.Lock()
	v.floor = r
	v.pruneLocked()
	v.mu.Unlock()
}

// keep is the oldest round the per-round state is kept for, less one.
func (v *ctlView) keep() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return max(v.cur, v.floor) - 1
}

// stashLedger keeps (recs != nil) or drops the ledger records this node's
// end txn of round r writes for subject.
func (v *ctlView) stashLedger(r int, subject string, recs []ledger.Record) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m := v.ledgerClosed[r]
	if recs == nil {
		delete(m, subject)
		return
	}
	if m == nil {
		m = map[string][]ledger.Record{}
		v.ledgerClosed[r] = m
	}
	m[subject] = recs
}

// subscribe returns the channel that receives once when round ends.
func (v *ctlView) subscribe(round int) <-chan RoundEnd {
	v.mu.Lock()
	defer v.mu.Unlock()
	s, ok := v.ends[round]
	if !ok {
		s = &endSub{ch: make(chan RoundEnd, 1)}
		v.ends[round] = s
		v.fireLocked(round, s)
		v.pruneLocked() // a long-gone round fired at once: not kept
	}
	return s.ch
}

// fence records that this node fenced itself out of round r (its lease
// was proven valid until validUntil) and fires r's Ended channel.
func (v *ctlView) fence(r int, validUntil time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.fenced, v.fencedUntil = r, validUntil
	if s, ok := v.ends[r]; ok {
		v.fireLocked(r, s)
	}
}

// broadcast wakes every waiter and fires due Ended channels.
func (v *ctlView) broadcast() {
	v.mu.Lock()
	defer v.mu.Unlock()
	close(v.changed)
	v.changed = make(chan struct{})
	for r, s := range v.ends {
		v.fireLocked(r, s)
	}
	v.pruneLocked()
}

// pruneLocked keeps the per-round maps to what can still be asked for: the
// current and the previous round (a job may restart tens of thousands of
// times). An Ended channel is dropped once it fired; asking again for an
// old round gets a new one that fires at once.
func (v *ctlView) pruneLocked() {
	keep := max(v.cur, v.floor) - 1
	for r, s := range v.ends {
		if r < keep && s.fired {
			delete(v.ends, r)
		}
	}
	for r := range v.lastEnds {
		if r < keep-1 {
			delete(v.lastEnds, r)
		}
	}
	for r := range v.ledgerClosed {
		if r < keep-1 {
			delete(v.ledgerClosed, r)
		}
	}
	for r := range v.rounds {
		if r < v.oldestRoundLocked() {
			delete(v.rounds, r)
		}
	}
}

func (v *ctlView) fireLocked(r int, s *endSub) {
	if s.fired {
		return
	}
	var end RoundEnd
	switch {
	case v.closed != nil:
		end = RoundEnd{Kind: EndJobClosed, Round: r, Code: v.closed.Code, Reason: v.closed.Reason, Node: v.closed.Node, Close: v.closed.Kind, Cause: v.closed.Cause,
			LedgerBy: v.closed.LedgerBy}
	case v.cur > r:
		le := v.lastEnds[r]
		reason := le.Reason
		if reason == "" {
			reason = fmt.Sprintf("round %d superseded by round %d", r, v.cur)
		}
		end = RoundEnd{Kind: EndRestart, Round: r, Reason: reason, Node: le.Node, Cause: le.Cause, Action: le.Action, LedgerBy: le.LedgerBy,
			Delay: time.Duration(le.DelayMS * float64(time.Millisecond))}
	case v.fenced >= 0 && v.fenced == r:
		end = RoundEnd{Kind: EndFenced, Round: r, Node: v.self, Cause: policy.NodeStopped,
			Reason: fmt.Sprintf("fenced: this node's lease could not be renewed (certainly valid at etcd until %s; fence margin %v): its ranks must stop before peers may replace it",
				v.fencedUntil.UTC().Format(time.RFC3339Nano), v.margin)}
	default:
		return
	}
	if end.LedgerBy == v.self && end.LedgerBy != "" {
		end.Ledger = v.ledgerClosed[r][end.Node]
	}
	s.fired = true
	s.ch <- end
}
