package rendezvous

import (
	"context"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// stacksPoll is how often ShareStacks reads the other nodes' summaries
// while it waits for them: a hang is rare and the wait is short, so a few
// reads cost less than a watch set up for it.
const stacksPoll = 20 * time.Millisecond

// maxStacksSummary bounds one node's published summary.
const maxStacksSummary = 64 << 10

// ShareStacks publishes this node's summary of what its ranks were doing
// at a hang in round (package stacks; under the node's lease, so it goes
// with the node) and returns every active node's summary of the round,
// this one's included, as soon as all have published one that current
// accepts (not one left from an earlier judgement of the round) or wait
// has passed: each node then judges the hang from the same evidence. A
// summary is data, never executed.
//
// complete reports whether every active node's summary came in time.
func (e *Etcd) ShareStacks(ctx context.Context, round int, mine []byte, wait time.Duration, current func([]byte) bool) (all [][]byte, complete bool, err error) {
	if len(mine) > maxStacksSummary {
		return nil, false, fmt.Errorf("rendezvous: stacks summary of %d bytes, at most %d", len(mine), maxStacksSummary)
	}
	e.mu.Lock()
	nodes := e.assigned[round].GroupWorldSize
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	bctx, bcancel := e.bounded(ctx)
	defer bcancel()
	if _, err := e.cli.Put(bctx, e.k.stacks(round)+e.o.NodeID, string(mine), clientv3.WithLease(e.sess.current())); err != nil {
		return [][]byte{mine}, false, fmt.Errorf("rendezvous: publish stacks of round %d: %w", round, err)
	}
	t := time.NewTicker(stacksPoll)
	defer t.Stop()
	var got [][]byte
	for {
		resp, err := e.cli.Get(bctx, e.k.stacks(round), clientv3.WithPrefix())
		if err == nil {
			got = got[:0]
			for _, kv := range resp.Kvs {
				if current(kv.Value) {
					got = append(got, kv.Value)
				}
			}
			if len(got) >= nodes {
				return got, true, nil
			}
		}
		select {
		case <-bctx.Done():
			if len(got) == 0 {
				got = [][]byte{mine}
			}
			return got, false, nil // what came in time: the judgement says what it lacks
		case <-t.C:
		}
	}
}
