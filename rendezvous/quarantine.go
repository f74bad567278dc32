package rendezvous

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"
)

// A node that failed is quarantined for the rest of its job generation:
// it may not become active again, even as a new launcher on the same
// address. The record is keyed by the node's address (the part of its id
// before the pid), written in the same txn as the round end that replaced
// it. Which failures quarantine:
//   - an exclusion (ExcludeThisNode, a failed health check, repeated hang
//     verdicts on the node, a spare whose filler could not be reclaimed):
//     the node said it is bad;
//   - a loss that a spare made good (swap): the job goes on without it;
//   - not a loss without a spare: the job cannot run below MIN nodes, so a
//     node that comes back (a stall, a healed partition) may rejoin;
//   - not a node stopped by a signal: that is no evidence against it.

// ErrQuarantined is matched by the error Next returns to a quarantined node.
var ErrQuarantined = errors.New("node quarantined in this job")

// QuarantineError says why this node may not rejoin.
type QuarantineError struct {
	Addr     string
	Cause    policy.Failure // node_lost or node_excluded
	Reason   string
	Round    int
	RecordAt time.Time
}

func (q *QuarantineError) Error() string {
	return fmt.Sprintf("%v: node %s was quarantined in round %d (%s: %s); it cannot become active again in this job",
		ErrQuarantined, q.Addr, q.Round, q.Cause, q.Reason)
}

// Is makes errors.Is(err, ErrQuarantined) true.
func (q *QuarantineError) Is(target error) bool { return target == ErrQuarantined }

// quarantineInfo is the stored record.
type quarantineInfo struct {
	Node   string         `json:"node"`
	Cause  policy.Failure `json:"cause"`
	Reason string         `json:"reason"`
	Round  int            `json:"round"`
	At     time.Time      `json:"at"`
}

// nodeAddr is the address part of a node id (<addr>/<pid>).
func nodeAddr(id string) string {
	if i := strings.LastIndexByte(id, '/'); i > 0 {
		return id[:i]
	}
	return id
}

// quarantines reports whether ending round r for failure f of node lost,
// with action a, quarantines it.
func quarantines(f policy.Failure, a policy.Action, lost string) bool {
	if lost == "" {
		return false
	}
	return f == policy.NodeExcluded || (f == policy.NodeLost && a == policy.SwapSpare)
}

// quarantineOp is the write that quarantines node lost.
func (rd *round) quarantineOp(f policy.Failure, lost, reason string) clientv3.Op {
	b, _ := json.Marshal(quarantineInfo{Node: lost, Cause: f, Reason: reason, Round: rd.r, At: time.Now().UTC()})
	return clientv3.OpPut(rd.k.quarantine(nodeAddr(lost)), string(b))
}

// parkQuarantined keeps a quarantined node out of every round until the
// job closes; it returns the job's close with the quarantine attached.
func (e *Etcd) parkQuarantined(ctx context.Context, q *QuarantineError) error {
	e.log.Warn("this node is quarantined in this job: parked until the job ends", "why", q.Error())
	for {
		ch, closed, _ := e.view.snapshot()
		if closed != nil {
			return &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason, Quarantine: q}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rendezvous: parked as quarantined: %w", ctx.Err())
		case <-ch:
		}
	}
}

// quarantinedAddrs lists the quarantined addresses (for the closer, which
// leaves them out of a round even if they registered before the record).
func (rd *round) quarantinedAddrs(ctx context.Context) (map[string]bool, error) {
	resp, err := rd.cli.Get(ctx, rd.k.quarantines(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list quarantined nodes: %w", err)
	}
	out := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		out[strings.TrimPrefix(string(kv.Key), rd.k.quarantines())] = true
	}
	return out, nil
}
