package rendezvous

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkRendezvousScale runs rendezvous rounds with 100, 1000 and 4000
// simulated nodes: lightweight agents that share a few etcd clients and
// leases against the embedded etcd, gossip disabled. Run it with
//
//	go test -run '^$' -bench RendezvousScale -benchtime 1x ./rendezvous/
//
// It reports round_s (time until every node has its assignment).
func BenchmarkRendezvousScale(b *testing.B) {
	m := startEmbedded(b)
	for _, n := range []int{100, 1000, 4000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			var total time.Duration
			for i := 0; i < b.N; i++ {
				total += scaleRound(b, m.Endpoint(), n)
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "round_s")
		})
	}
}

func scaleRound(t testing.TB, ep string, n int) time.Duration {
	const nClients = 4
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	clients := make([]*clientv3.Client, nClients)
	leases := make([]clientv3.LeaseID, nClients)
	for i := range clients {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second,
			MaxCallSendMsgSize: 16 << 20, MaxCallRecvMsgSize: 64 << 20, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
		l, err := cli.Grant(ctx, 60)
		if err != nil {
			t.Fatal(err)
		}
		clients[i], leases[i] = cli, l.ID
	}
	run := fmt.Sprintf("scale-%d-%d", n, time.Now().UnixNano())
	startNew := time.Now()
	nodes := make([]*Etcd, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			nodes[i], errs[i] = NewEtcd(ctx, EtcdOptions{Client: clients[i%nClients], Lease: leases[i%nClients],
				RunID: run, NodeID: fmt.Sprintf("sim-%05d", i), LocalAddr: "127.0.0.1", NProcPerNode: 8,
				MinNodes: n, MaxNodes: n, InfraRank: -1, DisableGossip: true, ProbeInterval: time.Hour,
				Logger: testLogger(t)})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d: %v", i, err)
		}
	}
	t.Cleanup(func() {
		for _, e := range nodes {
			e.Close()
		}
	})
	tNew := time.Since(startNew)

	start := time.Now()
	as := make([]Assignment, n)
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			as[i], errs[i] = nodes[i].Next(ctx)
		}()
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("node %d Next: %v", i, err)
		}
	}
	checkConsistent(t, as, 8, n)
	t.Logf("nodes=%d NewEtcd(all)=%v round=%v", n, tNew.Round(time.Millisecond), took.Round(time.Millisecond))
	return took
}
