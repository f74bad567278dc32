package rendezvous

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/straggler"
)

// TestScaleSpeedExchange measures the straggler measurement's etcd cost
// (docs/stragglers.md, docs/benchmarks.md "Stragglers"): FTL_SCALE_NODES
// (4000) simulated nodes of 8 ranks, on one embedded etcd member, run 3
// intervals of what each launcher does: put its sample, then group rank
// 0 reads them all, judges and puts the published result, and every
// other node reads it. It logs requests, bytes and time per interval, and
// per minute at the default 10 s interval. Opt-in (FTL_SCALE_BENCH=1).
func TestScaleSpeedExchange(t *testing.T) {
	scaleBenchOnly(t)
	n := envInts(t, "FTL_SCALE_NODES", "4000")[0]
	eps := embeddedCluster(t, 1)
	j := newSimJob(t, eps, simConfig{nodes: n, spares: 0, clients: 8, leaseTTL: 30 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	j.start(ctx)
	judge := straggler.NewJudge(straggler.Options{Threshold: 0.2, Window: 30 * time.Second})
	each := func(f func(i int, nd *simNode) error) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		errs := make(chan error, n)
		for i, nd := range j.nodes {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := f(i, nd); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	for iv := range 3 {
		now := t0.Add(time.Duration(iv) * 10 * time.Second)
		snap0, cpu0 := j.load.snap(), cpuTime(0)
		start := time.Now()
		each(func(i int, nd *simNode) error {
			s := straggler.NodeSample{Node: fmt.Sprintf("sim-%05d/1", i), Host: "sim", At: now.UnixMilli(), WindowS: 10}
			for lr := range 8 {
				b := 0.5
				if i == 17 {
					b = 1.0 // one slow node
				}
				s.Ranks = append(s.Ranks, straggler.RankBusy{Rank: 8*i + lr, LocalRank: lr, Busy: b})
			}
			b, _ := json.Marshal(s)
			return nd.e.PublishSpeed(ctx, 0, b)
		})
		published := time.Since(start)
		jt := time.Now()
		all, err := j.nodes[0].e.Speeds(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		var samples []straggler.NodeSample
		for _, raw := range all {
			var s straggler.NodeSample
			if json.Unmarshal(raw, &s) == nil {
				samples = append(samples, s)
			}
		}
		res := judge.Judge(now, samples)
		rb, _ := json.Marshal(res.Published())
		if err := j.nodes[0].e.PublishSpeedResult(ctx, 0, rb); err != nil {
			t.Fatal(err)
		}
		judged := time.Since(jt)
		rt := time.Now()
		each(func(i int, nd *simNode) error {
			if i == 0 {
				return nil
			}
			_, err := nd.e.SpeedResult(ctx, 0)
			return err
		})
		read := time.Since(rt)
		st := j.load.snap().since(snap0)
		reqs, sent, recv := st.totals()
		t.Logf("interval %d, %d nodes: put %v, judge (read %d samples, judge, put %d bytes) %v, %d nodes read the result %v; %d requests, %s out, %s in, CPU %v;%s",
			iv, n, published.Round(time.Millisecond), len(samples), len(rb), judged.Round(time.Millisecond), n-1, read.Round(time.Millisecond),
			reqs, kib(sent), kib(recv), (cpuTime(0) - cpu0).Round(time.Millisecond), st)
		if len(samples) != n {
			t.Fatalf("read %d samples, want %d", len(samples), n)
		}
		if iv == 2 && len(res.Published().Nodes) != 1 {
			t.Errorf("published nodes %+v, want the one slow node", res.Published().Nodes)
		}
	}
	j.closeAll()
}
