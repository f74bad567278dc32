package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// rejoinGate holds a restart round open for the previous round's active
// nodes, so that a node slow to stop its ranks is not demoted to standby
// (and ranks do not shift). A previous active is waited for while its
// membership key of the previous round exists (its lease is alive) and no
// node has declared it dead by gossip; the gate opens anyway RejoinWait
// after the round opened.
type rejoinGate struct {
	log     *slog.Logger
	cancel  context.CancelFunc
	done    chan struct{} // closed when the watcher goroutine returns
	changed chan struct{} // signalled by the watcher; runCloser then calls refresh
	expired chan struct{} // closed when RejoinWait has passed
	timer   *time.Timer

	mu      sync.Mutex
	waiting map[string]bool // previous actives still alive
	pending map[string]bool // events seen by the watcher, applied on refresh
	over    bool
}

// newRejoinGate reads round r-1's ranks, its live memberships and the
// gossip death records at one revision, then watches the latter two.
func (e *Etcd) newRejoinGate(ctx context.Context, r int) (*rejoinGate, error) {
	waiting, rev, err := e.previousActivesAlive(ctx, r)
	if err != nil {
		return nil, err
	}
	g := &rejoinGate{log: e.log, changed: make(chan struct{}, 1), expired: make(chan struct{}), done: make(chan struct{}),
		waiting: waiting, pending: map[string]bool{}}
	wctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	g.timer = time.AfterFunc(e.o.RejoinWait, func() {
		close(g.expired)
		g.signal()
	})
	lost := e.cli.Watch(wctx, e.k.nodes(r-1), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(rev+1))
	deaths := e.cli.Watch(wctx, e.k.deads(), clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(rev+1))
	go g.watch(lost, e.k.nodes(r-1), deaths, e.k.deads())
	if len(g.waiting) > 0 {
		e.log.Info("restart round waits for the previous active nodes", "round", r, "waiting", len(g.waiting), "bound", e.o.RejoinWait)
	}
	return g, nil
}

// previousActivesAlive returns round r-1's active nodes whose membership
// key still exists and that gossip has not declared dead, with the
// revision of that read.
func (e *Etcd) previousActivesAlive(ctx context.Context, r int) (map[string]bool, int64, error) {
	resp, err := e.cli.Txn(ctx).Then(
		clientv3.OpGet(e.k.ranks(r-1), clientv3.WithPrefix()),
		clientv3.OpGet(e.k.nodes(r-1), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(e.k.deads(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return nil, 0, fmt.Errorf("read round %d membership: %w", r-1, err)
	}
	prevActive := map[string]bool{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		var ri rankInfo
		if json.Unmarshal(kv.Value, &ri) == nil && !ri.Standby {
			prevActive[strings.TrimPrefix(string(kv.Key), e.k.ranks(r-1))] = true
		}
	}
	dead := map[string]bool{}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		dead[strings.TrimPrefix(string(kv.Key), e.k.deads())] = true
	}
	waiting := map[string]bool{}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		id := strings.TrimPrefix(string(kv.Key), e.k.nodes(r-1))
		if prevActive[id] && !dead[id] {
			waiting[id] = true
		}
	}
	return waiting, resp.Header.Revision, nil
}

// watch collects lost memberships and death records until both watches end.
func (g *rejoinGate) watch(lost clientv3.WatchChan, lostPrefix string, deaths clientv3.WatchChan, deadPrefix string) {
	defer close(g.done)
	for lost != nil || deaths != nil {
		var wr clientv3.WatchResponse
		var ok bool
		var prefix string
		select {
		case wr, ok = <-lost:
			if !ok {
				lost = nil
				continue
			}
			prefix = lostPrefix
		case wr, ok = <-deaths:
			if !ok {
				deaths = nil
				continue
			}
			prefix = deadPrefix
		}
		g.mu.Lock()
		for _, ev := range wr.Events {
			g.pending[strings.TrimPrefix(string(ev.Kv.Key), prefix)] = true
		}
		g.mu.Unlock()
		g.signal()
	}
}

func (g *rejoinGate) signal() {
	select {
	case g.changed <- struct{}{}:
	default:
	}
}

// refresh applies what the watcher saw: those nodes are gone or dead.
func (g *rejoinGate) refresh() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for id := range g.pending {
		if g.waiting[id] {
			g.log.Info("not waiting for a previous active node: lost", "lost", id)
			delete(g.waiting, id)
		}
	}
	clear(g.pending)
}

// open reports whether every live previous active is present (or the
// bound passed).
func (g *rejoinGate) open(present map[string]bool) bool {
	select {
	case <-g.expired:
		g.mu.Lock()
		defer g.mu.Unlock()
		if !g.over {
			g.over = true
			for id := range g.waiting {
				if !present[id] {
					g.log.Warn("rejoin wait over; closing the round without a previous active node", "node", id)
				}
			}
		}
		return true
	default:
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for id := range g.waiting {
		if !present[id] {
			return false
		}
	}
	return true
}

func (g *rejoinGate) stop() {
	g.timer.Stop()
	g.cancel()
	<-g.done
}
