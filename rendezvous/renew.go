package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// renewStream is one LeaseKeepAlive stream of the keep-alive loop. Its
// renewals are messages on one gRPC stream, as clientv3's KeepAlive sends
// them, instead of one stream per renewal (KeepAliveOnce: a stream set up
// and torn down at etcd for every renewal, which at 4,000 nodes made the
// renewals most of etcd's work in a round).
//
// The fence needs each renewal's local send time, which clientv3's stream
// does not give. etcd answers a stream's requests one at a time, in order
// (its handler receives a request, renews, answers, then receives the next),
// so an answer is the oldest unanswered request's, and the lease is valid
// at etcd until that request's send time plus the granted TTL. Were answers
// ever reordered, the oldest send time is still no later than the answered
// request's, so the validity credited stays a lower bound: safe.
//
// Every renewal handed to send gets exactly one renewResult on results:
// its answer, or the error that ended the stream, or errRenewTimeout when
// it was not answered within the timeout (the stream is then closed, with
// every renewal it still carried).
type renewStream struct {
	results chan<- renewResult
	timeout time.Duration
	reqs    chan renewal // to the sender, in send order
	cancel  context.CancelFunc

	mu      sync.Mutex
	pending []renewal // sent or queued, unanswered, oldest first
	seq     uint64
	done    bool // ended: pending were answered with its error
	retired bool // a newer stream took over: close once nothing is pending
}

type renewal struct {
	lease clientv3.LeaseID
	sent  time.Time
	seq   uint64
}

type renewResult struct {
	renewal
	ttl int64 // granted seconds; 0: etcd does not know the lease
	err error
}

var (
	errRenewTimeout     = errors.New("lease renewal not answered in time")
	errRenewStreamEnded = errors.New("lease keep-alive stream ended")
)

// openRenewStream starts a stream on cli's connection; it ends with ctx.
// The stream is opened by its own goroutine, so that a connection being
// re-established does not hold up the keep-alive loop; renewals sent
// meanwhile wait for it (within their timeout).
func openRenewStream(ctx context.Context, cli *clientv3.Client, results chan<- renewResult, timeout time.Duration) *renewStream {
	// WithRequireLeader: a member that loses its leader ends the stream at
	// once instead of leaving the renewals to their timeout.
	sctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	r := &renewStream{results: results, timeout: timeout, reqs: make(chan renewal, maxRenewals+1), cancel: cancel}
	go r.run(sctx, cli)
	return r
}

// send queues a renewal of lease, sent now; false when the stream has
// ended (the caller opens another).
func (r *renewStream) send(lease clientv3.LeaseID) bool {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return false
	}
	r.seq++
	// The send time is taken before the message leaves: earlier than etcd
	// can see it, as the validity requires.
	q := renewal{lease: lease, sent: time.Now(), seq: r.seq}
	r.pending = append(r.pending, q)
	r.mu.Unlock()
	r.reqs <- q // never blocks: at most maxRenewals are unanswered
	time.AfterFunc(r.timeout, func() {
		r.mu.Lock()
		late := len(r.pending) > 0 && r.pending[0].seq <= q.seq
		r.mu.Unlock()
		if late {
			r.fail(errRenewTimeout)
		}
	})
	return true
}

// stale reports whether a new renewal should not go on this stream: it
// ended, or its oldest renewal has waited longer than wait (a member that
// does not answer: the next renewal may reach another).
func (r *renewStream) stale(wait time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done || (len(r.pending) > 0 && time.Since(r.pending[0].sent) > wait)
}

// retire closes the stream once its renewals are answered or timed out
// (late answers still count).
func (r *renewStream) retire() {
	r.mu.Lock()
	r.retired = true
	idle := len(r.pending) == 0
	r.mu.Unlock()
	if idle {
		r.fail(nil)
	}
}

func (r *renewStream) run(ctx context.Context, cli *clientv3.Client) {
	// WaitForReady, as clientv3's own calls: a stream opened while the
	// connection is being re-established waits for it (within the
	// renewal's bound) instead of failing at once. Failing fast, renewals
	// after an etcd restart kept failing past the first report, and a node
	// fenced a second time in the round after (TestRealEtcdHappyPathFailAndRestart).
	st, err := pb.NewLeaseClient(cli.ActiveConnection()).LeaseKeepAlive(ctx, grpc.WaitForReady(true))
	if err != nil {
		r.fail(err)
		return
	}
	go r.receive(st)
	for {
		select {
		case <-ctx.Done():
			r.fail(ctx.Err())
			return
		case q := <-r.reqs:
			if err := st.Send(&pb.LeaseKeepAliveRequest{ID: int64(q.lease)}); err != nil {
				r.fail(err)
				return
			}
		}
	}
}

func (r *renewStream) receive(st pb.Lease_LeaseKeepAliveClient) {
	for {
		resp, err := st.Recv()
		if err != nil {
			r.fail(err)
			return
		}
		r.mu.Lock()
		if len(r.pending) == 0 {
			// The stream failed meanwhile; its renewals were answered
			// with the error.
			r.mu.Unlock()
			continue
		}
		q := r.pending[0]
		// Shifted in place (at most maxRenewals+1 entries): re-slicing
		// would make every later append allocate anew.
		r.pending = append(r.pending[:0], r.pending[1:]...)
		idle := len(r.pending) == 0 && r.retired
		r.mu.Unlock()
		if got := clientv3.LeaseID(resp.ID); got != q.lease {
			// Not the answer the order promises: credit nothing.
			err := fmt.Errorf("lease keep-alive answered lease %x where %x was asked", got, q.lease)
			r.results <- renewResult{renewal: q, err: err}
			r.fail(err)
			return
		}
		r.results <- renewResult{renewal: q, ttl: resp.TTL}
		if idle {
			r.fail(nil)
			return
		}
	}
}

// fail ends the stream: each renewal it still carries gets err (nil only
// when none is left: a retired stream closing).
func (r *renewStream) fail(err error) {
	r.mu.Lock()
	if r.done {
		r.mu.Unlock()
		return
	}
	r.done = true
	left := r.pending
	r.pending = nil
	r.mu.Unlock()
	r.cancel()
	if err == nil {
		err = errRenewStreamEnded
	}
	for _, q := range left {
		r.results <- renewResult{renewal: q, err: err}
	}
}
