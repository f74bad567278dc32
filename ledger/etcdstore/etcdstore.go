// Package etcdstore keeps a job's ledger in etcd, under the job
// generation's prefix of the rendezvous (<prefix><run_id>/g<N>/ledger/), so
// every node and any tool can read it while the job runs: one key per lease,
// <node>#<seq>, holding the JSON record.
package etcdstore

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/ledger"
)

// Store is the ledger of one job generation in etcd.
type Store struct {
	cli  *clientv3.Client
	base string // <prefix><run_id>/g<N>/ledger/
	// bound wraps every call's context (the rendezvous's etcd-loss bound);
	// nil leaves it as it is.
	bound func(context.Context) (context.Context, context.CancelFunc)
}

var _ ledger.Store = (*Store)(nil)

// New returns the store under genBase (<prefix><run_id>/g<N>/).
func New(cli *clientv3.Client, genBase string, bound func(context.Context) (context.Context, context.CancelFunc)) *Store {
	return &Store{cli: cli, base: LedgerBase(genBase), bound: bound}
}

// Discover finds the current generation of run under prefix (the layout
// of docs/rendezvous.md: <prefix><run_id>/generation holds N) and returns
// its store.
func Discover(ctx context.Context, cli *clientv3.Client, prefix, runID string) (*Store, int, error) {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	run := prefix + runID + "/"
	resp, err := cli.Get(ctx, run+"generation")
	if err != nil {
		return nil, 0, fmt.Errorf("read the job generation of run %q: %w", runID, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, fmt.Errorf("no job with run id %q under %s", runID, prefix)
	}
	g, err := strconv.Atoi(string(resp.Kvs[0].Value))
	if err != nil {
		return nil, 0, fmt.Errorf("bad job generation %q of run %q", resp.Kvs[0].Value, runID)
	}
	return New(cli, run+"g"+strconv.Itoa(g)+"/", nil), g, nil
}

func (s *Store) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.bound == nil {
		return context.WithCancel(ctx)
	}
	return s.bound(ctx)
}

func (s *Store) key(r ledger.Record) string { return s.base + r.ID() }

// Put writes a record (new or changed).
func (s *Store) Put(ctx context.Context, r ledger.Record) error {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if _, err := s.cli.Put(ctx, s.key(r), string(b)); err != nil {
		return fmt.Errorf("put %s: %w", r.ID(), err)
	}
	return nil
}

// CloseOpen ends every open lease of node; the record returned is the one
// this call closed (the Active one when there were several). closed is
// false when another writer closed them first.
func (s *Store) CloseOpen(ctx context.Context, node string, reason ledger.Reason, detail, by string, at time.Time) (ledger.Record, bool, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, NodePrefix(s.base, node), clientv3.WithPrefix())
	if err != nil {
		return ledger.Record{}, false, fmt.Errorf("read %s's leases: %w", node, err)
	}
	var out ledger.Record
	closed := false
	for _, c := range CloseOps(resp.Kvs, reason, detail, by, at) {
		tr, err := s.cli.Txn(ctx).If(c.Cmp).Then(c.Put).Commit()
		if err != nil {
			return ledger.Record{}, false, fmt.Errorf("close %s: %w", c.Record.ID(), err)
		}
		if tr.Succeeded && (!closed || c.Record.Role == ledger.Active) {
			out, closed = c.Record, true
		}
	}
	return out, closed, nil
}

// NodePrefix is the key prefix of node's leases in the ledger under base
// (a store's base, <prefix><run_id>/g<N>/ledger/).
func NodePrefix(base, node string) string { return base + node + "#" }

// LedgerBase is the ledger's base under a job generation's prefix
// (<prefix><run_id>/g<N>/).
func LedgerBase(genBase string) string { return genBase + "ledger/" }

// Closing is the write that ends one open lease, fenced on the lease not
// having changed since it was read (so that of several writers exactly
// one ends it), and the record it writes.
type Closing struct {
	Cmp    clientv3.Cmp
	Put    clientv3.Op
	Record ledger.Record
}

// CloseOps returns the writes that end the open leases among kvs (a read
// of NodePrefix) with reason, detail and by. A caller may run each in its
// own txn, or nest them in a larger txn (the rendezvous ends a lost node's
// leases in the txn that ends its round).
func CloseOps(kvs []*mvccpb.KeyValue, reason ledger.Reason, detail, by string, at time.Time) []Closing {
	var out []Closing
	for _, kv := range kvs {
		var r ledger.Record
		if json.Unmarshal(kv.Value, &r) != nil || !r.Open() {
			continue
		}
		r.End, r.Reason, r.Detail, r.ClosedBy = &at, reason, detail, by
		b, _ := json.Marshal(r)
		out = append(out, Closing{Cmp: clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision),
			Put: clientv3.OpPut(string(kv.Key), string(b)), Record: r})
	}
	return out
}

// List returns every record of the job, ordered by start.
func (s *Store) List(ctx context.Context) ([]ledger.Record, int64, error) {
	ctx, cancel := s.ctx(ctx)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.base, clientv3.WithPrefix())
	if err != nil {
		return nil, 0, fmt.Errorf("read the ledger: %w", err)
	}
	out := make([]ledger.Record, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var r ledger.Record
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, 0, fmt.Errorf("ledger record %s: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	ledger.SortByStart(out)
	return out, resp.Header.Revision, nil
}

// Watch calls f with every record written after revision rev until ctx
// ends or the watch fails.
func (s *Store) Watch(ctx context.Context, rev int64, f func(ledger.Record)) error {
	wch := s.cli.Watch(ctx, s.base, clientv3.WithPrefix(), clientv3.WithRev(rev+1), clientv3.WithFilterDelete())
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch the ledger: %w", err)
		}
		for _, ev := range wr.Events {
			var r ledger.Record
			if json.Unmarshal(ev.Kv.Value, &r) == nil {
				f(r)
			}
		}
	}
	return ctx.Err()
}
