package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// genCmp fences a write on this node's generation still being current
// (once joined: gen is fixed from then on).
func (e *Etcd) genCmp() clientv3.Cmp { return genFence(e.rk, e.gen) }

// genFence fences a write on generation gen of the run still being current.
func genFence(rk runKeys, gen int) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(rk.generation()), "=", strconv.Itoa(gen))
}

// joinGeneration picks the generation of the run this node belongs to and
// registers the node as alive in it. A closed generation with no live node
// left is over: the first node to notice starts the next one (one txn, one
// winner) and deletes the old generation's keys except its close record,
// which nodes of the old generation that are still running keep seeing;
// their writes are fenced on their (now stale) generation. While nodes of
// a closed generation are still alive (exiting, or crashed with a lease not
// yet expired) it waits for them, at most LeaseTTL plus a margin; after
// that it joins the closed generation and Next reports the job closed.
func (e *Etcd) joinGeneration(ctx context.Context) error {
	deadline := time.Now().Add(e.o.LeaseTTL + 2*time.Second)
	for {
		g, err := e.readGeneration(ctx)
		if err != nil {
			return err
		}
		k := e.rk.gen(g)
		reg, err := e.registerAlive(ctx, g)
		if err != nil {
			return err
		}
		if reg.Succeeded {
			e.mu.Lock() // the keep-alive loop's reputAlive reads them
			e.gen, e.k = g, k
			e.mu.Unlock()
			e.configFromRegistration(reg)
			if g > 0 {
				e.log.Info("rendezvous: joined job generation", "generation", g)
			}
			return nil
		}
		if kvs := reg.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || string(kvs[0].Value) != strconv.Itoa(g) {
			continue // a new generation started meanwhile
		}
		started, rev, err := e.startNextGeneration(ctx, g, reg)
		if err != nil {
			return err
		}
		if started {
			continue
		}
		if time.Now().After(deadline) {
			e.log.Warn("rendezvous: the job is closed and some of its nodes are still alive; not starting a new generation",
				"generation", g)
			e.mu.Lock() // the keep-alive loop's reputAlive reads them
			e.gen, e.k = g, k
			e.mu.Unlock()
			return nil
		}
		if err := e.waitAlivesGone(ctx, k, rev, deadline); err != nil {
			return err
		}
	}
}

// readGeneration returns the run's current generation, creating it (0) for
// the run's first job.
func (e *Etcd) readGeneration(ctx context.Context) (int, error) {
	gk := e.rk.generation()
	// A plain read first: it needs no raft round trip, unlike a txn
	// with a write branch (this runs once per node at start).
	get, err := e.cli.Get(ctx, gk)
	if err != nil {
		return 0, fmt.Errorf("rendezvous: read job generation from etcd at %s: %w", e.endpoints(), err)
	}
	kvs := get.Kvs
	if len(kvs) == 0 {
		resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gk), "=", 0)).
			Then(clientv3.OpPut(gk, "0")).Else(clientv3.OpGet(gk)).Commit()
		if err != nil {
			return 0, fmt.Errorf("rendezvous: create job generation in etcd at %s: %w", e.endpoints(), err)
		}
		if resp.Succeeded {
			return 0, nil
		}
		kvs = resp.Responses[0].GetResponseRange().Kvs
	}
	if len(kvs) == 0 {
		return 0, nil
	}
	g, err := strconv.Atoi(string(kvs[0].Value))
	if err != nil {
		return 0, fmt.Errorf("rendezvous: bad job generation %q at %s: %w", kvs[0].Value, gk, err)
	}
	return g, nil
}

// registerAlive puts g<g>/alive/<id> if g is current and open, and in the
// same txn creates the job config (and round 0) unless it exists, else
// reads it: nodes that start together no longer each write the config in
// their first Next (a raft round each, 4,000 at 4,000 nodes). Otherwise
// the response holds the generation pointer and g's close record.
func (e *Etcd) registerAlive(ctx context.Context, g int) (*clientv3.TxnResponse, error) {
	gk, k := e.rk.generation(), e.rk.gen(g)
	_, cfg := e.wantConfig()
	reg, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(gk), "=", strconv.Itoa(g)), clientv3.Compare(clientv3.CreateRevision(k.closed()), "=", 0)).
		Then(clientv3.OpPut(k.alive(e.o.NodeID), "", clientv3.WithLease(e.sess.current())),
			clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(k.config()), "=", 0)},
				[]clientv3.Op{clientv3.OpPut(k.config(), cfg), clientv3.OpPut(k.round(), "0")},
				[]clientv3.Op{clientv3.OpGet(k.config())})).
		Else(clientv3.OpGet(gk), clientv3.OpGet(k.closed())).Commit()
	if err != nil {
		return nil, fmt.Errorf("rendezvous: register in job generation %d: %w", g, err)
	}
	return reg, nil
}

// configFromRegistration takes the job config that registerAlive created
// or read. A node it does not fit is left to Next's checkConfig, which
// refuses it there, as before.
func (e *Etcd) configFromRegistration(reg *clientv3.TxnResponse) {
	if len(reg.Responses) < 2 || reg.Responses[1].GetResponseTxn() == nil {
		return
	}
	tr := reg.Responses[1].GetResponseTxn()
	var kvs []*mvccpb.KeyValue
	if !tr.Succeeded && len(tr.Responses) > 0 {
		kvs = tr.Responses[0].GetResponseRange().Kvs
	}
	want, _ := e.wantConfig()
	if err := e.adoptConfig(want, tr.Succeeded, kvs); err != nil {
		e.log.Debug("job config not settled at registration", "err", err)
	}
}

// startNextGeneration starts g+1 when closed generation g has no live node
// left. It returns the revision of its attempt when it did not.
func (e *Etcd) startNextGeneration(ctx context.Context, g int, reg *clientv3.TxnResponse) (bool, int64, error) {
	gk, k := e.rk.generation(), e.rk.gen(g)
	ops := []clientv3.Op{clientv3.OpPut(gk, strconv.Itoa(g+1)),
		clientv3.OpDelete(k.base, clientv3.WithRange(k.closed())),
		clientv3.OpDelete(k.closed()+"\x00", clientv3.WithRange(clientv3.GetPrefixRangeEnd(k.base)))}
	if g > 0 {
		ops = append(ops, clientv3.OpDelete(e.rk.gen(g-1).base, clientv3.WithPrefix()))
	}
	bump, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(gk), "=", strconv.Itoa(g)),
			clientv3.Compare(clientv3.CreateRevision(k.alives()), "=", 0).WithPrefix()).
		Then(ops...).Commit()
	if err != nil {
		return false, 0, fmt.Errorf("rendezvous: start job generation %d: %w", g+1, err)
	}
	if !bump.Succeeded {
		return false, bump.Header.Revision, nil
	}
	var ci closeInfo
	if kvs := reg.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &ci)
	}
	e.log.Info("rendezvous: run id reused after its job closed; started a new job generation",
		"generation", g+1, "previous_code", ci.Code, "previous_reason", ci.Reason)
	return true, bump.Header.Revision, nil
}

// waitAlivesGone waits until a node of generation k drops its alive key
// (or the deadline passes).
func (e *Etcd) waitAlivesGone(ctx context.Context, k keys, rev int64, deadline time.Time) error {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	wch := e.cli.Watch(wctx, k.alives(), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(rev+1))
	select {
	case <-wch:
	case <-wctx.Done():
	}
	if ctx.Err() != nil {
		return fmt.Errorf("rendezvous: waiting for the closed job's nodes to exit: %w", ctx.Err())
	}
	return nil
}

// dropAliveLocked removes this node's alive key once the job is closed, so
// a new job with the same run id can start a new generation while this
// process is still exiting (mu held by the caller; the delete runs in
// background).
func (e *Etcd) dropAliveLocked() {
	if e.k.base == "" {
		return
	}
	key := e.k.alive(e.o.NodeID)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := e.lostTimeout(5 * time.Second)
		defer cancel()
		if _, err := e.cli.Delete(ctx, key); err != nil {
			e.log.Debug("drop alive key", "err", err)
		}
	}()
}

// supersededErr is what a node of a stale generation gets: the close record
// of its own generation (kept for this), else a generic close.
func (e *Etcd) supersededErr(ctx context.Context) error {
	closed := e.view.closedInfo()
	if closed == nil {
		if resp, err := e.cli.Get(ctx, e.k.closed()); err == nil && len(resp.Kvs) > 0 {
			ci := decodeClose(resp.Kvs[0].Value)
			closed = &ci
		}
	}
	if closed == nil {
		closed = &closeInfo{Kind: verdict.FatalError, Code: 1, Reason: fmt.Sprintf("job generation %d of run %s was superseded by a newer one", e.gen, e.o.RunID)}
	}
	return &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
}
