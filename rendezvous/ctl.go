package rendezvous

import (
	"context"
	"fmt"
	"strconv"

	"google.golang.org/grpc/metadata"
)

// watchCtl follows <gen>/ctl/ through the view (ctlview.go) until etcd
// is lost or Close; each batch of changes moves this node's state too.
func (e *Etcd) watchCtl(rev int64) {
	defer e.wg.Done()
	ctx := e.lost
	if e.o.ctlStream != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "ftl-ctl-stream", e.o.ctlStream)
	}
	e.view.watch(ctx, e.cli, rev, e.log, e.reactCtl)
}

// loadCtl reads the job's round, end and close records; it returns the
// revision to watch from.
func (e *Etcd) loadCtl(ctx context.Context) (int64, error) {
	rev, err := e.view.load(ctx, e.cli, e.reactCtl)
	if err != nil {
		return 0, fmt.Errorf("read job state from etcd at %s: %w", e.endpoints(), err)
	}
	return rev, nil
}

// reactCtl applies a batch of ctl changes to the view and to this node's
// state at once (under mu), then wakes the waiters and fires Ended.
func (e *Etcd) reactCtl(evs []ctlEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, ev := range evs {
		e.applyCtlLocked(ev)
	}
	e.broadcastLocked()
}

// applyCtlLocked records a ctl key in the view and moves this node's state
// with it: a node active in an older round sees its round end; a close
// record closes it.
func (e *Etcd) applyCtlLocked(ev ctlEvent) {
	ch := e.view.apply(ev)
	if r := ch.round; r >= 0 && e.lastRound >= 0 && e.lastRound < r && (e.state == stateActive || e.state == stateFenced) {
		e.setStateLocked(stateRoundEnded, "round "+strconv.Itoa(r)+" opened")
		if e.roundStop != nil {
			e.roundStop()
			e.roundStop = nil
		}
	}
	if ch.closed != nil {
		e.closeLocally("job closed: " + ch.closed.Reason)
		e.dropAliveLocked()
	}
}

// broadcastLocked wakes every waiter and fires due Ended channels (the
// view's), and prunes this node's per-round state.
func (e *Etcd) broadcastLocked() {
	e.view.broadcast()
	e.pruneLocked()
}

// pruneLocked keeps this node's per-round assignments to the current and
// the previous round (the view prunes its own maps).
func (e *Etcd) pruneLocked() {
	keep := e.view.keep()
	for r := range e.assigned {
		if r < keep {
			delete(e.assigned, r)
		}
	}
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

// registered is a round's roundNode report: this node is registered in
// round r and waits for it.
func (e *Etcd) registered(r int) {
	e.mu.Lock()
	e.setStateLocked(stateWaiting, "registered in round "+strconv.Itoa(r))
	e.mu.Unlock()
}

// currentCtlRound is the job's round as last seen from etcd.
func (e *Etcd) currentCtlRound() int { return e.view.round() }
