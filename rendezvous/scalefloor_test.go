package rendezvous

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestScaleFloor measures the floor under a round of N nodes on this
// machine: the etcd requests a round cannot do without, issued bare (no
// rendezvous logic, no ledger, no renewals), from the same 8 shared
// connections and all at once, as the harness's nodes issue them. Each
// piece is timed alone on an idle embedded etcd: N registration txns
// (guarded, one key under the node's own lease, the round keys read),
// the same N keys written 64 per txn (each still under its own lease:
// the write of a two-level join), one assignment delivered to N ctl
// watches, and N point reads (a first round's rank keys).
// docs/benchmarks.md, "Rendezvous at scale", shows them beside the rounds.
func TestScaleFloor(t *testing.T) {
	scaleBenchOnly(t)
	reps := envInts(t, "FTL_SCALE_REPS", "3")[0]
	for _, n := range envInts(t, "FTL_SCALE_NODES", "4000,16000") {
		t.Run(fmt.Sprintf("nodes=%d", n), func(t *testing.T) {
			rows := map[string][]scaleRow{}
			var names []string
			for rep := range reps {
				for _, p := range measureFloor(t, n, rep) {
					if rep == 0 {
						names = append(names, p.name)
					}
					rows[p.name] = append(rows[p.name], scaleRow{took: p.took, cpu: p.cpu})
					t.Logf("rep %d %s: %v, CPU %v", rep, p.name, p.took.Round(time.Millisecond), p.cpu.Round(time.Millisecond))
				}
			}
			t.Logf("| nodes | floor piece | p50 s | worst s | CPU s (p50) |")
			for _, name := range names {
				var took, cpu []float64
				for _, r := range rows[name] {
					took, cpu = append(took, r.took.Seconds()), append(cpu, r.cpu.Seconds())
				}
				t.Logf("| %d | %s | %.3f | %.3f | %.2f |", n, name, median(took), slices.Max(took), median(cpu))
			}
		})
	}
}

type floorPiece struct {
	name      string
	took, cpu time.Duration
}

// measureFloor runs each piece once on a fresh embedded etcd.
func measureFloor(t *testing.T, n, rep int) []floorPiece {
	ep := startEmbedded(t).Endpoint()
	clis := scaleClients(t, []string{ep}, 8)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prefix := fmt.Sprintf("floor/%d/", rep)
	// all runs f(i) for every node at once and returns how long it took
	// and the CPU it cost (this process: server and clients).
	all := func(name string, f func(i int) error) floorPiece {
		var wg sync.WaitGroup
		var failed atomic.Int64
		c0, t0 := cpuTime(0), time.Now()
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := f(i); err != nil && failed.Add(1) == 1 {
					t.Errorf("%s, node %d: %v", name, i, err)
				}
			}()
		}
		wg.Wait()
		return floorPiece{name: name, took: time.Since(t0), cpu: cpuTime(0) - c0}
	}
	leases := make([]clientv3.LeaseID, n)
	grant := all("lease grants", func(i int) error {
		g, err := clis[i%8].Grant(ctx, 300)
		if err == nil {
			leases[i] = g.ID
		}
		return err
	})
	// One ctl watch per node, opened before the pieces, as every node
	// holds one for the job's life.
	var got atomic.Int64
	delivered := make(chan struct{})
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	for i := range n {
		wc := clis[i%8].Watch(wctx, prefix+"ctl/", clientv3.WithPrefix())
		go func() {
			for resp := range wc {
				for _, ev := range resp.Events {
					if strings.HasSuffix(string(ev.Kv.Key), "/assignment") && got.Add(1) == int64(n) {
						close(delivered)
					}
				}
			}
		}()
	}
	member := strings.Repeat("m", 200) // a registration's member record is about this size
	asgKey, closerKey := prefix+"ctl/rounds/1/assignment", prefix+"ctl/rounds/1/closer"
	reg := all("registration txns, one per node", func(i int) error {
		k := fmt.Sprintf("%srounds/1/members/n%06d", prefix, i)
		_, err := clis[i%8].Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(asgKey), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
			Then(clientv3.OpPut(k, member, clientv3.WithLease(leases[i])),
				clientv3.OpGet(asgKey, clientv3.WithRange(closerKey+"\x00"))).Commit()
		return err
	})
	const per = 64
	batched := all(fmt.Sprintf("the same, %d nodes per txn", per), func(i int) error {
		if i%per != 0 {
			return nil
		}
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for j := i; j < min(i+per, n); j++ {
			k := fmt.Sprintf("%srounds/2/members/n%06d", prefix, j)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
			ops = append(ops, clientv3.OpPut(k, member, clientv3.WithLease(leases[j])))
		}
		_, err := clis[i%8].Txn(ctx).If(cmps...).Then(append(ops, clientv3.OpGet(asgKey))...).Commit()
		return err
	})
	c0, t0 := cpuTime(0), time.Now()
	if _, err := clis[0].Txn(ctx).Then(clientv3.OpPut(closerKey, "n0"),
		clientv3.OpPut(asgKey, strings.Repeat("a", 2048))).Commit(); err != nil {
		t.Fatalf("write the assignment: %v", err)
	}
	select {
	case <-delivered:
	case <-ctx.Done():
		t.Fatalf("assignment delivered to %d of %d watches", got.Load(), n)
	}
	fanout := floorPiece{name: "assignment to every ctl watch", took: time.Since(t0), cpu: cpuTime(0) - c0}
	reads := all("point reads, one per node", func(i int) error {
		_, err := clis[i%8].Get(ctx, fmt.Sprintf("%srounds/1/members/n%06d", prefix, i))
		return err
	})
	return []floorPiece{grant, reg, batched, fanout, reads}
}
