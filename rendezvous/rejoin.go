package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rejoinGate is a restart round closer's view of the job's population: the
// previous round's active nodes (they are waited for, so that a node slow
// to stop its ranks keeps its group rank), which nodes hold their lease
// (alive keys) and which were recorded dead (a closed connection confirmed
// by a refused dial, or gossip). decideClose turns it, with the members
// present, into "close now" or "wait until".
type rejoinGate struct {
	log     *slog.Logger
	cancel  context.CancelFunc
	done    chan struct{} // closed when the watcher goroutine returns
	changed chan struct{} // signalled by the watcher; runCloser then calls refresh
	opened  time.Time

	prevActive map[string]bool
	bad        map[string]bool // quarantined addresses: never waited for
	alive      map[string]bool // alive keys (lease held)
	dead       map[string]bool // death records

	mu      sync.Mutex
	pending []gateEvent // seen by the watcher, applied on refresh
}

type gateEvent struct {
	dead, put bool // dead: a death record (else an alive key); put: created (else deleted)
	id        string
}

// newRejoinGate reads round r-1's ranks, the alive keys, the death records
// and the quarantine at one revision, then watches the alive keys and the
// death records.
func (rd *round) newRejoinGate(ctx context.Context) (*rejoinGate, error) {
	resp, err := rd.cli.Txn(ctx).Then(
		clientv3.OpGet(rd.k.ranks(rd.r-1), clientv3.WithPrefix()),
		clientv3.OpGet(rd.k.alives(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(rd.k.deads(), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(rd.k.quarantines(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return nil, fmt.Errorf("read round %d membership: %w", rd.r-1, err)
	}
	kvs := func(i int) []*mvccpb.KeyValue { return resp.Responses[i].GetResponseRange().Kvs }
	g := &rejoinGate{log: rd.log, changed: make(chan struct{}, 1), done: make(chan struct{}), opened: time.Now(),
		prevActive: map[string]bool{}, bad: map[string]bool{}, alive: map[string]bool{}, dead: map[string]bool{}}
	for _, kv := range kvs(0) {
		var ri rankInfo
		if json.Unmarshal(kv.Value, &ri) == nil && !ri.Standby {
			g.prevActive[strings.TrimPrefix(string(kv.Key), rd.k.ranks(rd.r-1))] = true
		}
	}
	ids := func(kvs []*mvccpb.KeyValue, prefix string, into map[string]bool) {
		for _, kv := range kvs {
			into[strings.TrimPrefix(string(kv.Key), prefix)] = true
		}
	}
	ids(kvs(1), rd.k.alives(), g.alive)
	ids(kvs(2), rd.k.deads(), g.dead)
	ids(kvs(3), rd.k.quarantines(), g.bad)
	rev := resp.Header.Revision
	wctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	alives := rd.cli.Watch(wctx, rd.k.alives(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	deaths := rd.cli.Watch(wctx, rd.k.deads(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	go g.watch(alives, rd.k.alives(), deaths, rd.k.deads())
	return g, nil
}

// watch collects alive-key and death-record changes until both watches end.
func (g *rejoinGate) watch(alives clientv3.WatchChan, alivePrefix string, deaths clientv3.WatchChan, deadPrefix string) {
	defer close(g.done)
	for alives != nil || deaths != nil {
		var wr clientv3.WatchResponse
		var ok, isDead bool
		var prefix string
		select {
		case wr, ok = <-alives:
			if !ok {
				alives = nil
				continue
			}
			prefix = alivePrefix
		case wr, ok = <-deaths:
			if !ok {
				deaths = nil
				continue
			}
			prefix, isDead = deadPrefix, true
		}
		g.mu.Lock()
		for _, ev := range wr.Events {
			g.pending = append(g.pending, gateEvent{dead: isDead, put: ev.Type == clientv3.EventTypePut,
				id: strings.TrimPrefix(string(ev.Kv.Key), prefix)})
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

// refresh applies what the watcher saw (runCloser's goroutine only).
func (g *rejoinGate) refresh() {
	g.mu.Lock()
	evs := g.pending
	g.pending = nil
	g.mu.Unlock()
	for _, ev := range evs {
		set := g.alive
		if ev.dead {
			set = g.dead
		}
		if ev.put {
			set[ev.id] = true
		} else {
			delete(set, ev.id)
		}
		if ev.dead && ev.put && g.prevActive[ev.id] {
			g.log.Info("not waiting for a previous active node: recorded dead", "lost", ev.id)
		}
	}
}

// missing lists the nodes of the job not present in the round, with what
// is known of them; suspects are the nodes this node's gossip suspects now.
func (g *rejoinGate) missing(present, suspects map[string]bool) []missingPeer {
	var out []missingPeer
	add := func(id string) {
		if present[id] || g.bad[nodeAddr(id)] {
			return
		}
		st := peerAlive
		switch {
		case g.dead[id] || !g.alive[id]:
			st = peerDead // recorded dead, or its lease is gone
		case suspects[id]:
			st = peerSuspect
		}
		out = append(out, missingPeer{ID: id, State: st, PrevActive: g.prevActive[id]})
	}
	for id := range g.prevActive {
		add(id)
	}
	for id := range g.alive {
		if !g.prevActive[id] {
			add(id)
		}
	}
	return out
}

func (g *rejoinGate) stop() {
	g.cancel()
	<-g.done
}
