package rendezvous

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// rpcLoad counts what the simulated nodes ask of etcd, on the client side
// (a gRPC interceptor on their shared clients): unary requests and stream
// messages per method, and the bytes of every message both ways (protobuf
// size, without gRPC and HTTP/2 framing). The counts do not depend on the
// machine's load, unlike the timings.
type rpcLoad struct {
	mu sync.Mutex
	m  map[string]*methodLoad
}

type methodLoad struct {
	calls, sent, recv atomic.Int64 // calls: unary requests, or stream messages sent
	sentB, recvB      atomic.Int64
}

// loadSnap is a copy of the counters at one instant.
type loadSnap map[string]methodCount

type methodCount struct{ Calls, Recv, SentB, RecvB int64 }

func newRPCLoad() *rpcLoad { return &rpcLoad{m: map[string]*methodLoad{}} }

func (l *rpcLoad) method(full string) *methodLoad {
	name := full[strings.LastIndexByte(full, '/')+1:]
	l.mu.Lock()
	defer l.mu.Unlock()
	ml, ok := l.m[name]
	if !ok {
		ml = &methodLoad{}
		l.m[name] = ml
	}
	return ml
}

func msgSize(m any) int64 {
	if pm, ok := m.(proto.Message); ok {
		return int64(proto.Size(pm))
	}
	return 0
}

func (l *rpcLoad) dialOptions() []grpc.DialOption {
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, inv grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		ml := l.method(method)
		ml.calls.Add(1)
		ml.sentB.Add(msgSize(req))
		err := inv(ctx, method, req, reply, cc, opts...)
		if err == nil {
			ml.recv.Add(1)
			ml.recvB.Add(msgSize(reply))
		}
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, st grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		cs, err := st(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, err
		}
		return &countedStream{ClientStream: cs, ml: l.method(method)}, nil
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

type countedStream struct {
	grpc.ClientStream
	ml *methodLoad
}

func (s *countedStream) SendMsg(m any) error {
	s.ml.calls.Add(1)
	s.ml.sentB.Add(msgSize(m))
	return s.ClientStream.SendMsg(m)
}

func (s *countedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil {
		s.ml.recv.Add(1)
		s.ml.recvB.Add(msgSize(m))
	}
	return err
}

func (l *rpcLoad) snap() loadSnap {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := loadSnap{}
	for k, ml := range l.m {
		s[k] = methodCount{Calls: ml.calls.Load(), Recv: ml.recv.Load(), SentB: ml.sentB.Load(), RecvB: ml.recvB.Load()}
	}
	return s
}

// since is the load between an earlier snapshot and this one.
func (s loadSnap) since(old loadSnap) loadSnap {
	d := loadSnap{}
	for k, c := range s {
		o := old[k]
		if dc := (methodCount{c.Calls - o.Calls, c.Recv - o.Recv, c.SentB - o.SentB, c.RecvB - o.RecvB}); dc != (methodCount{}) {
			d[k] = dc
		}
	}
	return d
}

// keepAlive is the name of the lease keep-alive stream, whose traffic
// depends on time (one message per lease every TTL/3), not on rounds.
const keepAliveMethod = "LeaseKeepAlive"

// totals sums requests (unary calls and stream messages sent) and bytes,
// keep-alives excluded.
func (s loadSnap) totals() (reqs, sentB, recvB int64) {
	for k, c := range s {
		if k == keepAliveMethod {
			continue
		}
		reqs += c.Calls
		sentB += c.SentB
		recvB += c.RecvB
	}
	return reqs, sentB, recvB
}

func (s loadSnap) String() string {
	names := make([]string, 0, len(s))
	for k := range s {
		names = append(names, k)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, k := range names {
		c := s[k]
		fmt.Fprintf(&b, " %s=%d(%s out, %d msgs/%s in)", k, c.Calls, kib(c.SentB), c.Recv, kib(c.RecvB))
	}
	return b.String()
}

func kib(b int64) string { return fmt.Sprintf("%.1fKiB", float64(b)/1024) }
