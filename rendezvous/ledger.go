package rendezvous

import (
	"context"
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/ledger/etcdstore"
)

// LedgerStore is the job's ledger in this node's job generation, sharing
// the rendezvous's connection and its etcd-loss bound (every write is also
// bounded to two seconds, and skipped at once while etcd is unreachable:
// the ledger is a record, never a reason to wait).
func (e *Etcd) LedgerStore() ledger.Store {
	bound := func(ctx context.Context) (context.Context, context.CancelFunc) {
		bctx, cancel := e.bounded(ctx)
		tctx, tcancel := context.WithTimeout(bctx, 2*time.Second)
		if e.sess.unreachableNow() {
			tcancel() // fail the write now
		}
		return tctx, func() { tcancel(); cancel() }
	}
	return etcdstore.New(e.cli, e.k.base, bound)
}
