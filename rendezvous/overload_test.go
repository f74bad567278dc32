package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
)

// TestTransientOverload: etcd's "too many requests" is transient in each
// form a caller sees it (the server's status, clientv3's EtcdError,
// wrapped), and waited for with a jittered pause; "database space
// exceeded", under the same gRPC code, is not.
func TestTransientOverload(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		transient  bool
		overloaded bool
	}{
		{"too many requests, status", rpctypes.ErrGRPCRequestTooManyRequests, true, true},
		{"too many requests, clientv3", rpctypes.ErrTooManyRequests, true, true},
		{"too many requests, wrapped", fmt.Errorf("rendezvous: join round 0: %w", rpctypes.ErrTooManyRequests), true, true},
		{"no space, status", rpctypes.ErrGRPCNoSpace, false, false},
		{"no space, clientv3", rpctypes.ErrNoSpace, false, false},
		{"unavailable", status.Error(codes.Unavailable, "connection refused"), true, false},
		{"no leader", rpctypes.ErrNoLeader, true, false},
		{"lease not found", rpctypes.ErrLeaseNotFound, false, false},
		{"canceled", context.Canceled, false, false},
		{"deadline", context.DeadlineExceeded, false, false},
		{"a call's own bound", fmt.Errorf("etcd lease at x: %w", fmt.Errorf("%w (%w)", errEtcdSlow, context.DeadlineExceeded)), true, false},
		{"other", errors.New("boom"), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := transient(tc.err); got != tc.transient {
				t.Errorf("transient(%v) = %v, want %v", tc.err, got, tc.transient)
			}
			if got := overloaded(tc.err); got != tc.overloaded {
				t.Errorf("overloaded(%v) = %v, want %v", tc.err, got, tc.overloaded)
			}
			for range 50 {
				w := retryWait(tc.err)
				lo, hi := retryPause, retryPause
				if tc.overloaded {
					hi = 5 * retryPause
				}
				if w < lo || w > hi {
					t.Fatalf("retryWait(%v) = %v, want within [%v, %v]", tc.err, w, lo, hi)
				}
			}
		})
	}
}

// TestOverloadedEtcdIsWaitedFor: a node whose lease grant, generation
// txn, control read, round registration and closer claim are each first
// refused with "too many requests" still starts and gets its assignment.
// Before, the first refusal ended NewEtcd or Next with the error (seen at
// 16,000 simulated nodes: "join round 0: etcdserver: too many requests"),
// and a refused claim was not made again: a round whose claimants were all
// refused had no closer.
//
// The refusals are injected by a client interceptor in front of a real
// embedded etcd: etcd answers so only while its applied index lags its
// committed one by more than 5,000 entries, which takes thousands of
// nodes writing at once (the opt-in TestScaleMeasure at 16,000 nodes
// reproduces it; too slow and too uncertain for every run).
func TestOverloadedEtcdIsWaitedFor(t *testing.T) {
	c := embeddedJob(t)
	refuse := &refusals{left: map[string]int{
		"lease grant":        2,
		"generation txn":     2, // registering as alive in the job's generation
		"round registration": 2,
		"closer claim":       2, // the round's only node: nobody else would close it
		"read":               3, // the reachability read, the generation's, the control state's
	}}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.ep}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(refuse.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	o := c.opts(0, 1, 1, 1, 0)
	var logs lockedbuf.Buffer
	o.Endpoints, o.Client, o.DisableGossip = nil, cli, true
	o.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	e := c.add(o)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a, err := e.Next(ctx)
	if err != nil {
		t.Fatalf("Next with an overloaded etcd: %v", err)
	}
	if a.Round != 0 || a.GroupRank != 0 || a.WorldSize != 1 {
		t.Fatalf("assignment %+v, want round 0, group rank 0, world size 1", a)
	}
	refuse.mu.Lock()
	defer refuse.mu.Unlock()
	for m, n := range refuse.left {
		if n > 0 {
			t.Errorf("%s: %d refusals left unused: the node never met them (the test would prove nothing)", m, n)
		}
	}
	if refuse.refused != 11 {
		t.Errorf("%d calls refused, want 11", refuse.refused)
	}
	// Said once per retry loop: the start's steps and the join.
	if n := strings.Count(logs.String(), "etcd is overloaded or slow"); n < 2 {
		t.Errorf("%d warnings of an overloaded etcd, want one per step that met it; log:\n%s", n, logs.String())
	}
}

// refusals answers the first calls of each kind with etcd's "too many
// requests", as the server does (the request is not executed).
type refusals struct {
	mu      sync.Mutex
	left    map[string]int
	refused int
}

// kind names a call for refusals.
func kind(method string, req any) string {
	switch method {
	case "/etcdserverpb.Lease/LeaseGrant":
		return "lease grant"
	case "/etcdserverpb.KV/Range":
		return "read"
	case "/etcdserverpb.KV/Txn":
		for _, op := range req.(*pb.TxnRequest).GetSuccess() {
			key := string(op.GetRequestPut().GetKey())
			switch {
			case strings.Contains(key, "/alive/"):
				return "generation txn"
			case strings.Contains(key, "/nodes/"):
				return "round registration"
			case strings.HasSuffix(key, "/closer"):
				return "closer claim"
			}
		}
	}
	return ""
}

func (r *refusals) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	k := kind(method, req)
	r.mu.Lock()
	refuse := r.left[k] > 0
	if refuse {
		r.left[k]--
		r.refused++
	}
	r.mu.Unlock()
	if refuse {
		return rpctypes.ErrGRPCRequestTooManyRequests
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
