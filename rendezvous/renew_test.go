package rendezvous

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/ftlauncher/ft-launcher/internal/etcdtest"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// renewClient is an etcd client of endpoint that counts the LeaseKeepAlive
// streams it opens.
func renewClient(t *testing.T, endpoint string) (*clientv3.Client, *atomic.Int64) {
	t.Helper()
	var streams atomic.Int64
	count := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, st grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		if method == "/etcdserverpb.Lease/LeaseKeepAlive" {
			streams.Add(1)
		}
		return st(ctx, desc, cc, method, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainStreamInterceptor(count)}})
	if err != nil {
		t.Fatalf("etcd client: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli, &streams
}

func nextRenewal(t *testing.T, results <-chan renewResult, within time.Duration) renewResult {
	t.Helper()
	return recvWithin(t, results, within, "renewal result")
}

// TestRenewStream: renewals go as messages on one stream and are answered
// in order, each credited with its own send time; a lease etcd no longer
// knows is answered with TTL 0; a retired stream closes once answered.
func TestRenewStream(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	cli, streams := renewClient(t, m.Endpoint())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	g, err := cli.Grant(ctx, 5)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan renewResult, maxRenewals)
	r := openRenewStream(ctx, cli, results, 30*time.Second)
	var sent []time.Time
	for i := 0; i < maxRenewals; i++ {
		before := time.Now()
		if !r.send(g.ID) {
			t.Fatal("a live stream refused a renewal")
		}
		sent = append(sent, before)
	}
	for i := 0; i < maxRenewals; i++ {
		res := nextRenewal(t, results, 30*time.Second)
		if res.err != nil || res.ttl <= 0 || res.lease != g.ID {
			t.Fatalf("renewal %d: lease %x ttl %d err %v, want %x renewed", i, res.lease, res.ttl, res.err, g.ID)
		}
		if res.seq != uint64(i+1) || res.sent.Before(sent[i]) || (i+1 < len(sent) && res.sent.After(sent[i+1])) {
			t.Errorf("renewal %d: answer %d sent %v, out of order or with another's send time", i, res.seq, res.sent)
		}
	}
	for i := 0; i < 5; i++ { // more renewals, one at a time, on the same stream
		r.send(g.ID)
		if res := nextRenewal(t, results, 30*time.Second); res.err != nil || res.ttl <= 0 {
			t.Fatalf("renewal: ttl %d err %v", res.ttl, res.err)
		}
	}
	if n := streams.Load(); n != 1 {
		t.Errorf("%d LeaseKeepAlive streams opened for %d renewals, want 1", n, maxRenewals+5)
	}
	if _, err := cli.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	r.send(g.ID)
	if res := nextRenewal(t, results, 30*time.Second); res.err != nil || res.ttl != 0 {
		t.Errorf("renewal of a revoked lease: ttl %d err %v, want ttl 0 (the lease is gone)", res.ttl, res.err)
	}
	r.retire()
	if r.send(g.ID) {
		t.Error("a retired stream with nothing pending still takes renewals")
	}
}

// TestRenewStreamFrozenMember: against a member that holds the connection
// but answers nothing (Debian's etcd, SIGSTOPped), a renewal ends with
// errRenewTimeout within its bound and the stream is closed; one answered
// late, within its bound, is credited with its own send time.
func TestRenewStreamFrozenMember(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	srv := etcdtest.Start(t)
	cli, _ := renewClient(t, srv.ClientURL)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	g, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan renewResult, maxRenewals)
	defer func() { _ = srv.Signal(syscall.SIGCONT) }()

	// Late but within the bound: counted, from its own send time.
	r := openRenewStream(ctx, cli, results, 20*time.Second)
	r.send(g.ID)
	if res := nextRenewal(t, results, 30*time.Second); res.err != nil || res.ttl <= 0 {
		t.Fatalf("first renewal: ttl %d err %v", res.ttl, res.err)
	}
	srv.Freeze(t)
	before := time.Now()
	r.send(g.ID)
	time.Sleep(500 * time.Millisecond)
	if !r.stale(100 * time.Millisecond) {
		t.Error("a stream whose renewal waits past the interval is not stale: the next renewal would queue behind it")
	}
	if err := srv.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	res := nextRenewal(t, results, 30*time.Second)
	// Sent right after before (the bound is for a loaded machine), not when
	// the answer came, 0.5 s later.
	if res.err != nil || res.ttl <= 0 || res.sent.Before(before) || res.sent.After(before.Add(400*time.Millisecond)) {
		t.Errorf("late renewal: ttl %d err %v sent %v after the freeze, want it counted from its send", res.ttl, res.err, res.sent.Sub(before))
	}

	// Past the bound: errRenewTimeout, and the stream takes no more.
	const bound = 700 * time.Millisecond
	r2 := openRenewStream(ctx, cli, results, bound)
	r2.send(g.ID)
	if res := nextRenewal(t, results, 30*time.Second); res.err != nil {
		t.Fatalf("renewal before the freeze: %v", res.err)
	}
	srv.Freeze(t)
	r2.send(g.ID)
	res = nextRenewal(t, results, 30*time.Second)
	if !errors.Is(res.err, errRenewTimeout) {
		t.Errorf("renewal to a frozen member: err %v, want errRenewTimeout", res.err)
	}
	if took := time.Since(res.sent); took < bound {
		t.Errorf("timed out after %v, before its bound %v", took, bound)
	}
	if r2.send(g.ID) {
		t.Error("a timed-out stream still takes renewals")
	}
}

// TestRenewStreamEndedRefuses: a stream that ended before a renewal was
// put on it (here its context was already cancelled, as when etcd refuses
// the stream as it opens) refuses the renewal, so that the keep-alive loop
// counts it as failed at once instead of waiting for an answer that cannot
// come (a Close then hung for good).
func TestRenewStreamEndedRefuses(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	cli, _ := renewClient(t, m.Endpoint())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	results := make(chan renewResult, maxRenewals)
	r := openRenewStream(ctx, cli, results, 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for !r.stale(time.Hour) { // stale: ended
		if time.Now().After(deadline) {
			t.Fatal("a stream opened with a cancelled context did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.send(1) {
		t.Fatal("an ended stream took a renewal: nobody would answer it")
	}
	select {
	case res := <-results:
		t.Fatalf("a refused renewal was answered too: %+v", res)
	default:
	}
}
