package rendezvous

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxSpeedRecord bounds one node's speed sample and the job-wide result.
const maxSpeedRecord = 256 << 10

// PublishSpeed puts this node's speed sample for round (package
// straggler), under the node's lease: one write per node per interval,
// overwriting its previous one. A sample is data, never executed.
func (e *Etcd) PublishSpeed(ctx context.Context, round int, sample []byte) error {
	if len(sample) > maxSpeedRecord {
		return fmt.Errorf("rendezvous: speed sample of %d bytes, at most %d", len(sample), maxSpeedRecord)
	}
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.k.speeds(round)+e.o.NodeID, string(sample), clientv3.WithLease(e.sess.current())); err != nil {
		return fmt.Errorf("rendezvous: publish speed of round %d: %w", round, err)
	}
	return nil
}

// Speeds returns every node's latest speed sample of round: one range
// read, by the node that judges them (the round's group rank 0).
func (e *Etcd) Speeds(ctx context.Context, round int) ([][]byte, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.k.speeds(round), clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("rendezvous: read speeds of round %d: %w", round, err)
	}
	out := make([][]byte, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out = append(out, kv.Value)
	}
	return out, nil
}

// PublishSpeedResult puts the job-wide judgement of round's speeds
// (under the judging node's lease: it goes with that node).
func (e *Etcd) PublishSpeedResult(ctx context.Context, round int, result []byte) error {
	if len(result) > maxSpeedRecord {
		return fmt.Errorf("rendezvous: speed result of %d bytes, at most %d", len(result), maxSpeedRecord)
	}
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.k.speedResult(round), string(result), clientv3.WithLease(e.sess.current())); err != nil {
		return fmt.Errorf("rendezvous: publish the speed result of round %d: %w", round, err)
	}
	return nil
}

// SpeedResult returns round's latest job-wide speed judgement (nil when
// none was published yet).
func (e *Etcd) SpeedResult(ctx context.Context, round int) ([]byte, error) {
	ctx, cancel := e.bounded(ctx)
	defer cancel()
	resp, err := e.cli.Get(ctx, e.k.speedResult(round))
	if err != nil {
		return nil, fmt.Errorf("rendezvous: read the speed result of round %d: %w", round, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0].Value, nil
}
