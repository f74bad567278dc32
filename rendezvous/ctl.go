package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
)

// watchCtl follows <run>/ctl/ (round, end record, close record) and turns
// changes into Ended events. clientv3 resumes the watch after reconnects,
// so an etcd outage alone never ends a round; it stops once etcd is lost.
func (e *Etcd) watchCtl(rev int64) {
	defer e.wg.Done()
	for e.lost.Err() == nil {
		wch := e.cli.Watch(clientv3.WithRequireLeader(e.lost), e.k.ctl(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				e.log.Debug("ctl watch interrupted", "err", err)
				break
			}
			e.mu.Lock()
			for _, ev := range wr.Events {
				e.applyCtlLocked(string(ev.Kv.Key), ev.Kv.Value, ev.Type == clientv3.EventTypeDelete)
			}
			e.broadcastLocked()
			e.mu.Unlock()
			rev = wr.Header.Revision
		}
		// The stream broke (no leader, compaction): re-read, then re-watch.
		if e.lost.Err() != nil || !sleepCtx(e.lost, retryPause) {
			return
		}
		if r, err := e.loadCtl(e.lost); err == nil {
			rev = r
		}
	}
}

// loadCtl reads the job's round and close record; it returns the revision
// to watch from.
func (e *Etcd) loadCtl(ctx context.Context) (int64, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := e.cli.Get(actx, e.k.ctl(), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read job state from etcd at %s: %w", e.endpoints(), err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// The end record first, so a round change finds its reason.
	for _, kv := range resp.Kvs {
		if string(kv.Key) == e.k.lastEnd() {
			e.applyCtlLocked(string(kv.Key), kv.Value, false)
		}
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != e.k.lastEnd() {
			e.applyCtlLocked(string(kv.Key), kv.Value, false)
		}
	}
	e.broadcastLocked()
	return resp.Header.Revision, nil
}

// applyCtlLocked records the job's round, last end and close record.
func (e *Etcd) applyCtlLocked(key string, val []byte, deleted bool) {
	if deleted {
		return
	}
	switch key {
	case e.k.round():
		e.applyRoundLocked(val)
	case e.k.lastEnd():
		var le endInfo
		if json.Unmarshal(val, &le) == nil {
			e.lastEnds[le.Round] = le
		}
	case e.k.closed():
		e.applyCloseLocked(val)
	}
}

// applyRoundLocked follows ctl/round forward; a node active in an older
// round sees its round end.
func (e *Etcd) applyRoundLocked(val []byte) {
	r, err := strconv.Atoi(string(val))
	if err != nil || r <= e.ctlRound {
		return
	}
	e.ctlRound = r // restarts are counted by the agent, which acts on them
	if e.lastRound >= 0 && e.lastRound < r && (e.state == stateActive || e.state == stateFenced) {
		e.setStateLocked(stateRoundEnded, "round "+strconv.Itoa(r)+" opened")
		if e.roundStop != nil {
			e.roundStop()
			e.roundStop = nil
		}
	}
}

// applyCloseLocked takes the job's close record (the first one seen wins).
func (e *Etcd) applyCloseLocked(val []byte) {
	if e.closed != nil {
		return
	}
	ci := decodeClose(val)
	e.closed = &ci
	e.closeLocally("job closed: " + ci.Reason)
	e.dropAliveLocked()
}

// broadcastLocked wakes every waiter and fires due Ended channels.
func (e *Etcd) broadcastLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
	for r, s := range e.ends {
		e.fireLocked(r, s)
	}
	e.pruneLocked()
}

// pruneLocked keeps the per-round maps to what can still be asked for: the
// current and the previous round (a job may restart tens of thousands of
// times). An Ended channel is dropped once it fired; asking again for an
// old round gets a new one that fires at once.
func (e *Etcd) pruneLocked() {
	keep := max(e.ctlRound, e.lastRound) - 1
	for r, s := range e.ends {
		if r < keep && s.fired {
			delete(e.ends, r)
		}
	}
	for r := range e.lastEnds {
		if r < keep-1 {
			delete(e.lastEnds, r)
		}
	}
	for r := range e.assigned {
		if r < keep {
			delete(e.assigned, r)
		}
	}
	for r := range e.ledgerClosed {
		if r < keep-1 {
			delete(e.ledgerClosed, r)
		}
	}
}

func (e *Etcd) fireLocked(r int, s *endSub) {
	if s.fired {
		return
	}
	var end RoundEnd
	switch {
	case e.closed != nil:
		end = RoundEnd{Kind: EndJobClosed, Round: r, Code: e.closed.Code, Reason: e.closed.Reason, Node: e.closed.Node, Close: e.closed.Kind, Cause: e.closed.Cause,
			LedgerBy: e.closed.LedgerBy}
	case e.ctlRound > r:
		le := e.lastEnds[r]
		reason := le.Reason
		if reason == "" {
			reason = fmt.Sprintf("round %d superseded by round %d", r, e.ctlRound)
		}
		end = RoundEnd{Kind: EndRestart, Round: r, Reason: reason, Node: le.Node, Cause: le.Cause, Action: le.Action, LedgerBy: le.LedgerBy}
	case e.fence.round == r && !e.fence.at.IsZero():
		end = RoundEnd{Kind: EndFenced, Round: r, Node: e.o.NodeID, Cause: policy.NodeStopped,
			Reason: fmt.Sprintf("fenced: this node's lease could not be renewed (certainly valid at etcd until %s; fence margin %v): its ranks must stop before peers may replace it",
				e.fence.validUntil.UTC().Format(time.RFC3339Nano), e.o.FenceMargin)}
	default:
		return
	}
	if end.LedgerBy == e.o.NodeID && end.LedgerBy != "" {
		end.Ledger = e.ledgerClosed[r][end.Node]
	}
	s.fired = true
	s.ch <- end
}

func (e *Etcd) setStateLocked(to nodeState, why string) {
	if e.state == to {
		return
	}
	if !transitionOK(e.state, to) {
		e.log.Error("rendezvous: unexpected state transition", "from", e.state, "to", to, "why", why)
	}
	e.log.Debug("rendezvous state", "from", e.state, "to", to, "why", why)
	e.state = to
}

// closeLocally moves to closed and stops round watchers (mu held).
func (e *Etcd) closeLocally(why string) {
	e.setStateLocked(stateClosed, why)
	if e.roundStop != nil {
		e.roundStop()
		e.roundStop = nil
	}
}

// currentCtlRound is the job's round as last seen from etcd.
func (e *Etcd) currentCtlRound() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ctlRound
}
