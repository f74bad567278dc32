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

	"github.com/ftlauncher/ft-launcher/verdict"
)

// watchCtl follows <run>/ctl/ (round, end record, close record) and turns
// changes into Ended events. clientv3 resumes the watch after reconnects,
// so an etcd outage alone never ends a round.
func (e *Etcd) watchCtl(rev int64) {
	defer e.wg.Done()
	for e.ctx.Err() == nil {
		wch := e.cli.Watch(clientv3.WithRequireLeader(e.ctx), e.k.ctl(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
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
		if e.ctx.Err() != nil {
			return
		}
		// The stream broke (no leader, compaction): re-read, then re-watch.
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
		if r, err := e.loadCtl(e.ctx); err == nil {
			rev = r
		}
	}
}

// probe checks etcd reachability; past EtcdLossBound it closes the job
// locally with code 1 so the agent stops instead of running blind.
func (e *Etcd) probe() {
	defer e.wg.Done()
	t := time.NewTicker(e.o.ProbeInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(e.ctx, max(e.o.ProbeInterval, time.Second))
		_, err := e.cli.Get(ctx, e.k.round())
		cancel()
		e.mu.Lock()
		if err == nil {
			if !e.lastProbe.IsZero() && time.Since(e.lastProbe) > 2*e.o.ProbeInterval+time.Second {
				e.log.Info("etcd reachable again", "down_for", time.Since(e.lastProbe).Round(time.Millisecond))
			}
			e.lastProbe = time.Now()
			e.mu.Unlock()
			continue
		}
		down := time.Since(e.lastProbe)
		if e.ctx.Err() == nil && e.closed == nil && down > e.o.EtcdLossBound {
			e.closed = &closeInfo{Kind: verdict.RendezvousLost, Code: 1, Node: e.o.NodeID, Reason: fmt.Sprintf(
				"etcd at %s unreachable for more than %v (etcd loss bound)", e.endpoints(), e.o.EtcdLossBound)}
			e.log.Error("closing: etcd lost", "reason", e.closed.Reason)
			e.closeLocally(e.closed.Reason)
			e.broadcastLocked()
		} else if e.ctx.Err() == nil {
			e.log.Warn("etcd unreachable", "for", down.Round(time.Millisecond), "bound", e.o.EtcdLossBound, "err", err)
		}
		e.mu.Unlock()
	}
}

// keepAlive keeps the owned lease alive; if etcd reports it gone (we were
// away longer than its TTL) a new one is granted for later rounds.
func (e *Etcd) keepAlive() {
	defer e.wg.Done()
	for e.ctx.Err() == nil {
		lease := e.currentLease()
		ch, err := e.cli.KeepAlive(e.ctx, lease)
		if err == nil {
			for range ch {
			}
		}
		if e.ctx.Err() != nil {
			return
		}
		select {
		case <-e.ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		ctx, cancel := context.WithTimeout(e.ctx, 2*time.Second)
		ttl, err := e.cli.TimeToLive(ctx, lease)
		cancel()
		if err == nil && ttl.TTL <= 0 {
			if err := e.renewLease(e.ctx, lease); err != nil {
				e.log.Warn("re-grant lease", "err", err)
			}
		}
	}
}

// claimCloser tries to become the node that closes round r. The closer key
// is under our lease, so a dead closer is replaced by the next claimant.
func (e *Etcd) claimCloser(ctx context.Context, r int) (bool, error) {
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.closer(r)), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.closer(r), e.o.NodeID, clientv3.WithLease(e.currentLease()))).Commit()
	if err != nil {
		return false, fmt.Errorf("claim closer of round %d: %w", r, err)
	}
	return resp.Succeeded, nil
}

// runCloser counts round r's members (watch, no polling) and writes the
// assignment once the round may close: >= MIN present, round r open, the
// rejoin gate open (see rejoinGate), and either MAX present or LastCall
// elapsed since MIN was reached.
func (e *Etcd) runCloser(ctx context.Context, r int) {
	get, err := e.cli.Get(ctx, e.k.nodes(r), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		e.log.Debug("closer: list members", "round", r, "err", err)
		return
	}
	present := map[string]bool{}
	for _, kv := range get.Kvs {
		present[strings.TrimPrefix(string(kv.Key), e.k.nodes(r))] = true
	}
	wch := e.cli.Watch(ctx, e.k.nodes(r), clientv3.WithPrefix(), clientv3.WithRev(get.Header.Revision+1))
	var lastCall <-chan time.Time
	var lastCallTimer *time.Timer
	var gate *rejoinGate
	defer func() {
		if lastCallTimer != nil {
			lastCallTimer.Stop()
		}
		if gate != nil {
			gate.stop()
		}
	}()
	lastCallDone := false
	for {
		e.mu.Lock()
		ch, cur, closed := e.changed, e.ctlRound, e.closed
		e.mu.Unlock()
		if closed != nil || cur > r {
			return
		}
		if cur == r && r > 0 && gate == nil {
			// The previous round's actives are known once round r is open.
			g, err := e.newRejoinGate(ctx, r)
			if err != nil {
				e.log.Warn("closer: rejoin gate", "round", r, "err", err)
				if ctx.Err() != nil {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-time.After(200 * time.Millisecond):
				}
				continue
			}
			gate = g
		}
		n := len(present)
		if cur == r && n >= e.o.MinNodes {
			gateOpen := gate == nil || gate.open(present)
			if gateOpen && (n >= e.o.MaxNodes || lastCallDone || e.o.MaxNodes == e.o.MinNodes) {
				if err := e.writeAssignment(ctx, r); err != nil {
					e.log.Warn("closer: write assignment", "round", r, "err", err)
					if ctx.Err() != nil {
						return
					}
					lastCallDone = true
					select {
					case <-ctx.Done():
						return
					case <-time.After(200 * time.Millisecond):
					}
					continue
				}
				return
			}
			if lastCallTimer == nil && e.o.MaxNodes > e.o.MinNodes {
				lastCallTimer = time.NewTimer(e.o.LastCall)
				lastCall = lastCallTimer.C
			}
		}
		var gateCh <-chan struct{}
		if gate != nil {
			gateCh = gate.changed
		}
		select {
		case <-ctx.Done():
			return
		case <-ch:
		case <-lastCall:
			lastCallDone = true
		case <-gateCh:
			gate.refresh()
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				return
			}
			for _, ev := range wr.Events {
				id := strings.TrimPrefix(string(ev.Kv.Key), e.k.nodes(r))
				if ev.Type == clientv3.EventTypeDelete {
					delete(present, id)
				} else {
					present[id] = true
				}
			}
		}
	}
}

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
	resp, err := e.cli.Txn(ctx).Then(
		clientv3.OpGet(e.k.ranks(r-1), clientv3.WithPrefix()),
		clientv3.OpGet(e.k.nodes(r-1), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(e.k.deads(), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
	if err != nil {
		return nil, fmt.Errorf("read round %d membership: %w", r-1, err)
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
	g := &rejoinGate{log: e.log, changed: make(chan struct{}, 1), expired: make(chan struct{}), done: make(chan struct{}),
		waiting: map[string]bool{}, pending: map[string]bool{}}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		id := strings.TrimPrefix(string(kv.Key), e.k.nodes(r-1))
		if prevActive[id] && !dead[id] {
			g.waiting[id] = true
		}
	}
	wctx, cancel := context.WithCancel(ctx)
	g.cancel = cancel
	g.timer = time.AfterFunc(e.o.RejoinWait, func() {
		close(g.expired)
		g.signal()
	})
	rev := resp.Header.Revision + 1
	lost := e.cli.Watch(wctx, e.k.nodes(r-1), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(rev))
	deaths := e.cli.Watch(wctx, e.k.deads(), clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(rev))
	go func() {
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
				prefix = e.k.nodes(r - 1)
			case wr, ok = <-deaths:
				if !ok {
					deaths = nil
					continue
				}
				prefix = e.k.deads()
			}
			g.mu.Lock()
			for _, ev := range wr.Events {
				g.pending[strings.TrimPrefix(string(ev.Kv.Key), prefix)] = true
			}
			g.mu.Unlock()
			g.signal()
		}
	}()
	if len(g.waiting) > 0 {
		e.log.Info("restart round waits for the previous active nodes", "round", r, "waiting", len(g.waiting), "bound", e.o.RejoinWait)
	}
	return g, nil
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

// writeAssignment orders the members, writes each rank key (batches within
// etcd's default 128 ops per txn) and then the summary, which is what the
// waiting nodes watch. Every txn is fenced on the round and on our closer key.
func (e *Etcd) writeAssignment(ctx context.Context, r int) error {
	get, err := e.cli.Get(ctx, e.k.nodes(r), clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("list members: %w", err)
	}
	ms := make([]memberInfo, 0, len(get.Kvs))
	for _, kv := range get.Kvs {
		var m memberInfo
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			e.log.Warn("skip unreadable member", "key", string(kv.Key), "err", err)
			continue
		}
		ms = append(ms, m)
	}
	prev := map[string]int{}
	pinned := map[string]int{}
	if r > 0 {
		pg, err := e.cli.Get(ctx, e.k.ranks(r-1), clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("read previous ranks: %w", err)
		}
		for _, kv := range pg.Kvs {
			var ri rankInfo
			if json.Unmarshal(kv.Value, &ri) == nil {
				id := strings.TrimPrefix(string(kv.Key), e.k.ranks(r-1))
				prev[id] = ri.Order
				if !ri.Standby {
					pinned[id] = ri.GroupRank
				}
			}
		}
	}
	orderMembers(ms, prev)
	ranks, sum, err := assign(ms, e.o.MinNodes, pinned)
	if err != nil {
		return err
	}
	sum.Round, sum.MembersRev = r, get.Header.Revision
	fence := []clientv3.Cmp{
		clientv3.Compare(clientv3.Value(e.k.round()), "=", fmt.Sprint(r)),
		clientv3.Compare(clientv3.Value(e.k.closer(r)), "=", e.o.NodeID),
		clientv3.Compare(clientv3.CreateRevision(e.k.assignment(r)), "=", 0),
		e.genCmp(),
	}
	const batch = 120
	ops := make([]clientv3.Op, 0, batch)
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		resp, err := e.cli.Txn(ctx).If(fence...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("write ranks: %w", err)
		}
		if !resp.Succeeded {
			return fmt.Errorf("round %d moved on or closer changed", r)
		}
		ops = ops[:0]
		return nil
	}
	for _, m := range ms {
		b, _ := json.Marshal(ranks[m.NodeID])
		ops = append(ops, clientv3.OpPut(e.k.rank(r, m.NodeID), string(b)))
		if len(ops) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	sb, _ := json.Marshal(sum)
	ops = append(ops, clientv3.OpPut(e.k.assignment(r), string(sb)))
	if err := flush(); err != nil {
		return err
	}
	e.log.Info("closed rendezvous round", "round", r, "active", sum.GroupWorldSize, "standby", sum.Standbys,
		"world_size", sum.WorldSize, "master", sum.MasterNode)
	return nil
}

// watchLoss is the lease-expiry backstop for node loss in active round r:
// group rank 0 watches every member key for deletion, the others watch
// group rank 0's. Puts are filtered out server-side, so this costs O(1)
// events per node. It stops when the round ends.
func (e *Etcd) watchLoss(ctx context.Context, r int, sum roundSummary) {
	defer e.wg.Done()
	var wch clientv3.WatchChan
	if sum.MasterNode == e.o.NodeID {
		wch = e.cli.Watch(ctx, e.k.nodes(r), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(sum.MembersRev+1))
	} else {
		wch = e.cli.Watch(ctx, e.k.member(r, sum.MasterNode), clientv3.WithFilterPut(), clientv3.WithRev(sum.MembersRev+1))
	}
	for wr := range wch {
		if wr.Err() != nil {
			return
		}
		for _, ev := range wr.Events {
			if ev.Type != clientv3.EventTypeDelete {
				continue
			}
			id := strings.TrimPrefix(string(ev.Kv.Key), e.k.nodes(r))
			go e.nodeLost(r, id, "lease expired")
		}
	}
}

// nodeLost ends round r because node id is gone, if id was active in r and
// had not finished. Several survivors may race; the txn decides.
func (e *Etcd) nodeLost(r int, id, how string) {
	if id == e.o.NodeID {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	e.mu.Lock()
	skip := e.closed != nil || e.ctlRound != r
	e.mu.Unlock()
	if skip {
		return
	}
	rk, err := e.cli.Get(ctx, e.k.rank(r, id))
	if err != nil || len(rk.Kvs) == 0 {
		return
	}
	var ri rankInfo
	if json.Unmarshal(rk.Kvs[0].Value, &ri) != nil || ri.Standby {
		return
	}
	conds := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(e.k.done(r, id)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(e.k.assignment(r)), ">", 0),
	}
	d, err := e.endRound(ctx, r, fmt.Sprintf("node %s lost (%s)", id, how), conds)
	if err != nil {
		e.log.Warn("report node loss", "lost", id, "err", err)
		return
	}
	e.o.Metrics.NodeFailed()
	e.log.Warn("node lost", "lost", id, "how", how, "round", r, "restart", d.Restart, "reason", d.Reason)
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
	ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
	defer cancel()
	if _, err := e.cli.Txn(ctx).If(e.genCmp(), clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0)).
		Then(clientv3.OpPut(e.k.alive(e.o.NodeID), "", clientv3.WithLease(e.currentLease()))).Commit(); err != nil {
		e.log.Debug("re-register alive key", "err", err)
	}
}
