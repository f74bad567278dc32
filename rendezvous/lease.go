package rendezvous

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func (e *Etcd) grantLease(ctx context.Context) error {
	ttl := int64((e.o.LeaseTTL + time.Second - 1) / time.Second)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := e.cli.Grant(actx, ttl)
	if err != nil {
		return fmt.Errorf("etcd lease at %s: %w", e.endpoints(), err)
	}
	e.mu.Lock()
	e.lease = resp.ID
	e.mu.Unlock()
	return nil
}

// renewLease replaces an expired lease old with a new one, unless another
// goroutine already did (then it is a no-op), and re-registers what hangs on
// the lease. Both the keep-alive loop and a join that finds its lease gone
// call it, so exactly one new lease is granted.
func (e *Etcd) renewLease(ctx context.Context, old clientv3.LeaseID) error {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if e.currentLease() != old {
		return nil
	}
	e.log.Warn("membership lease expired; taking a new one", "lease", fmt.Sprintf("%x", old))
	if err := e.grantLease(ctx); err != nil {
		return err
	}
	e.reputAlive()
	return nil
}

func (e *Etcd) currentLease() clientv3.LeaseID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// keepAlive keeps the owned lease alive; if etcd reports it gone (we were
// away longer than its TTL) a new one is granted for later rounds. It stops
// once etcd is lost.
func (e *Etcd) keepAlive() {
	defer e.wg.Done()
	for e.lost.Err() == nil {
		lease := e.currentLease()
		ch, err := e.cli.KeepAlive(e.lost, lease)
		if err == nil {
			for range ch {
			}
		}
		if e.lost.Err() != nil || !sleepCtx(e.lost, 500*time.Millisecond) {
			return
		}
		ctx, cancel := e.lostTimeout(2 * time.Second)
		ttl, err := e.cli.TimeToLive(ctx, lease)
		cancel()
		if err == nil && ttl.TTL <= 0 {
			if err := e.renewLease(e.lost, lease); err != nil {
				e.log.Warn("re-grant lease", "err", err)
			}
		}
	}
}

// reputAlive registers this node as alive again under a re-granted lease,
// unless its job is closed (or its generation superseded).
func (e *Etcd) reputAlive() {
	e.mu.Lock()
	closed := e.closed != nil
	e.mu.Unlock()
	if closed {
		return
	}
	ctx, cancel := e.lostTimeout(5 * time.Second)
	defer cancel()
	if _, err := e.cli.Txn(ctx).If(e.genCmp(), clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0)).
		Then(clientv3.OpPut(e.k.alive(e.o.NodeID), "", clientv3.WithLease(e.currentLease()))).Commit(); err != nil {
		e.log.Debug("re-register alive key", "err", err)
	}
}
