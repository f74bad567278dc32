package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// Every etcd call of a node runs under a context that ends when etcd has
// been unreachable past EtcdLossBound (e.lost: the session's Lost(), ended
// by its probe), so no call waits longer than the bound whatever context
// its caller passed: gRPC waits for a connection as long as its context
// lives.

// bounded returns ctx, also cancelled once etcd is lost or the rendezvous
// is closed; call the returned func when done.
func (e *Etcd) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(e.lost, func() { cancel(context.Cause(e.lost)) })
	return bctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// lostTimeout is context.WithTimeout on e.lost: for background calls.
func (e *Etcd) lostTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.lost, d)
}

// lossErr is the error every call returns once etcd is lost, nil before.
func (e *Etcd) lossErr() error {
	if cause := context.Cause(e.lost); errors.Is(cause, ErrRendezvousLost) {
		return cause
	}
	return nil
}

// callErr returns err, or the loss error (naming the endpoints and the
// bound, and err's text) when etcd was lost meanwhile: the call was cut
// short by the loss.
func (e *Etcd) callErr(err error) error {
	if err == nil || errors.Is(err, ErrRendezvousLost) || errors.Is(err, ErrClosed) || errors.Is(err, ErrRoundRestarted) {
		return err // says what happened already
	}
	if lerr := e.lossErr(); lerr != nil {
		return fmt.Errorf("%w (interrupted: %v)", lerr, err)
	}
	return err
}

// declareLostLocked closes the job for this node (kind RendezvousLost,
// code 1, unless it was closed already) and cancels every call in flight.
//
// A node that fenced itself out of its last round says so: it cannot tell
// its own cut from an etcd outage, so its kind stays RendezvousLost, but
// the job may have gone on without it (its lease expired at etcd and a
// spare took its place): only etcd, once reached, says which (Next then
// returns the quarantine, and the agent records NodeReplaced).
func (e *Etcd) declareLostLocked() {
	reason := fmt.Sprintf("etcd at %s unreachable for more than %v (etcd loss bound)", e.endpoints(), e.o.EtcdLossBound)
	kind, code := verdict.RendezvousLost, 1
	if r := e.fence.round; !e.fence.at.IsZero() && r == e.lastRound {
		reason += fmt.Sprintf("; this node fenced itself out of round %d at %s (its lease could not be renewed): if a spare was waiting, the job may have gone on without it",
			r, e.fence.at.UTC().Format(time.RFC3339))
	}
	if e.view.closeLocal(closeInfo{Kind: kind, Code: code, Node: e.o.NodeID, Reason: reason}) {
		e.log.Error("closing: etcd lost", "reason", reason)
		e.closeLocally(reason)
		e.broadcastLocked()
	}
	e.sess.lose(fmt.Errorf("%w: %s", ErrRendezvousLost, reason))
}

// etcdLost is the session's OnLost: its probe found etcd unreachable past
// EtcdLossBound.
func (e *Etcd) etcdLost() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ctx.Err() == nil {
		e.declareLostLocked() // final: this node's job is over
	}
}

// lostErr is the loss error when this node's job was closed because
// etcd was lost, nil for any other close (closed is the view's close record).
func (e *Etcd) lostErr(closed *closeInfo) error {
	if closed.Kind != verdict.RendezvousLost {
		return nil
	}
	if lerr := e.lossErr(); lerr != nil {
		return lerr
	}
	return fmt.Errorf("%w: %s", ErrRendezvousLost, closed.Reason)
}

// retry runs op until it succeeds, fails for a reason other than etcd
// being unavailable, or ctx ends: a call in flight when the connection
// drops fails at once, and only the loss bound (through a bounded ctx)
// decides that etcd is gone. op must be safe to repeat (fenced txns are).
func retry(ctx context.Context, log *slog.Logger, op func(ctx context.Context) error) error {
	return retryUntil(ctx, log, time.Time{}, "etcd unavailable; retrying within the loss bound", op)
}

// retryUntil is retry that also gives up once deadline (zero: none) has
// passed; msg is the debug line of each retry.
func retryUntil(ctx context.Context, log *slog.Logger, deadline time.Time, msg string, op func(ctx context.Context) error) error {
	var warned bool
	for {
		err := op(ctx)
		if !transient(err) || (!deadline.IsZero() && time.Now().After(deadline)) {
			return err
		}
		logRetry(log, err, &warned, msg)
		if !sleepCtx(ctx, retryWait(err)) {
			return err
		}
	}
}

// logRetry logs a retried error: at debug level (an unreachable etcd is
// reported by the reachability probe, once per change), except the first
// "etcd is overloaded or slow" of a retry loop, which nothing else reports:
// a warning, so that an operator sees why a join or a start takes long.
func logRetry(log *slog.Logger, err error, warned *bool, msg string) {
	if !*warned && (overloaded(err) || errors.Is(err, errEtcdSlow)) {
		*warned = true
		log.Warn("etcd is overloaded or slow (too many requests, or no answer within a call's bound); retrying after a random pause of up to 1 s", "err", err)
		return
	}
	log.Debug(msg, "err", err)
}

// retryFor is retry for the start of a node, before its session's loss
// bound runs: op is repeated while it fails transiently, for at most d
// (ConnectTimeout: an etcd that a whole job's launchers overload as they
// start is waited for as one not up yet is, waitReachable), and with ctx.
func retryFor(ctx context.Context, log *slog.Logger, d time.Duration, op func(ctx context.Context) error) error {
	return retryUntil(ctx, log, time.Now().Add(d), "etcd unavailable at start; retrying within ConnectTimeout", op)
}

// transient reports whether err says etcd is unavailable for now (a lost
// connection, no leader, a server-side timeout) or overloaded (too many
// requests).
func transient(err error) bool {
	if errors.Is(err, errEtcdSlow) || overloaded(err) {
		return true
	}
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	code := codes.OK
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	} else if s, ok := status.FromError(err); ok {
		code = s.Code()
	}
	return code == codes.Unavailable || code == codes.DeadlineExceeded
}

// errEtcdSlow marks a call that ran out of its own time bound (not its
// caller's): etcd is slow, not gone, and the call may be repeated.
var errEtcdSlow = errors.New("etcd did not answer within the call's own time bound")

// overloaded reports etcd's backpressure: "too many requests", which a
// member answers to a write while its applied index lags its committed one
// by more than 5,000 entries. It says "later", not "no": seen at 16,000
// simulated nodes, where it failed a node's join and ended the run. The
// same gRPC code also carries "database space exceeded", which is not
// transient (the quota needs an operator: compaction, defragmentation,
// disarming the alarm), so the message decides.
func overloaded(err error) bool {
	desc := ""
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		desc = ee.Error()
	} else if s, ok := status.FromError(err); ok && s.Code() == codes.ResourceExhausted {
		desc = s.Message()
	}
	return desc == rpctypes.ErrTooManyRequests.Error()
}

// retryWait is the pause before retrying after err: retryPause, or for an
// overloaded etcd a random 1 to 5 times that (0.2-1 s), so that the
// thousands of nodes it refused together do not come back together.
func retryWait(err error) time.Duration {
	if overloaded(err) {
		return retryPause + rand.N(4*retryPause)
	}
	return retryPause
}
