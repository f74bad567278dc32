// Package rendezvous decides, job-wide, which nodes run in which round, with
// which ranks, and when a round ends. One round is one restart cycle: its
// number is TORCHELASTIC_RESTART_COUNT on every node. The same interface is
// served by Local (one node, nothing external) and by the etcd backend.
package rendezvous

import (
	"context"
	"errors"
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Assignment is what one node gets when a round closes.
type Assignment struct {
	RunID          string
	Round          int // job-wide restart cycle number, identical on every node
	GroupRank      int // this node's rank among active nodes
	GroupWorldSize int // number of active nodes
	RankBase       int // sum of lower active nodes' local world sizes
	WorldSize      int // sum of active nodes' local world sizes
	MasterAddr     string
	MasterPort     int
	MaxRestarts    int // the job's agreed budget (the first node's --max-restarts)
	// OpenedAt is when the round was opened by the end of the previous one
	// (zero when unknown, e.g. round 0).
	OpenedAt time.Time
	// Detection is, when the previous round ended because a node was lost,
	// how long its detector took from the first evidence (the lost node's
	// connection closing, or its last gossip ack) to ending the round; zero
	// otherwise or when unknown (a lease expiry).
	Detection time.Duration
	// RestartsUsed is the number of restarts the job had spent when this
	// round opened. It differs from Round once a spare replaced a lost node
	// (a swap opens a round without spending a restart).
	RestartsUsed int
	// Standby is true when this node is parked (beyond MIN nodes). A standby
	// node runs no ranks; it calls Next again to wait for a later round.
	Standby bool
	// Standbys is the number of the round's nodes parked beyond the
	// active ones (hot spares): a node that leaves now is replaced at
	// once, without changing the world size.
	Standbys int
	// NodeAddrs are the advertised addresses (IPs or host names) of the
	// round's nodes, for the agent store's allowlist: filled for group rank
	// 0 by the etcd rendezvous; nil when unknown (a single-node backend, or
	// the read failed).
	NodeAddrs []string
	// ReplicaRing are the state replica receivers ("host:port") of the
	// next active nodes after this one in group rank order (wrapping, at
	// most 4, only nodes that run one: --state-dir): the buddies are its
	// first --state-replicas, and a restore asks them all (docs/state.md).
	// Nil for a standby, a single-node backend, or without --state-dir.
	ReplicaRing []string
	// ReplicaFrom are the node ids of the active nodes whose ReplicaRing
	// holds this node's receiver (the previous ones in group rank order,
	// at most 4): the only nodes that replicate to it or restore from it,
	// which its receiver admits, each from its own host (NodeHost). Nil
	// when this node has no receiver, for a standby, or a single-node
	// backend.
	ReplicaFrom []string
}

// NodeHost is the host part of an etcd rendezvous node id
// ("<advertised address>/<pid>"): the address its launcher, and so its
// state replica sender, runs on.
func NodeHost(id string) string { return nodeAddr(id) }

// EndKind says why a round ended.
type EndKind int

// Round end kinds.
const (
	// EndRestart: some node failed (or was lost) and a next round is open;
	// stop ranks and call Next.
	EndRestart EndKind = iota + 1
	// EndJobClosed: the job is over for every node; exit with Code.
	EndJobClosed
	// EndFenced: this node's lease could not be renewed and may expire at
	// etcd soon, after which its peers may start a round without it: kill
	// its ranks at once (no grace), then report it (Fail with
	// policy.NodeStopped) and call Next, which rejoins once etcd answers
	// (docs/rendezvous.md, "Fencing: never two rounds at once").
	EndFenced
)

// RoundEnd is delivered when the current round is over for this node.
type RoundEnd struct {
	Kind   EndKind
	Round  int    // the round that ended
	Code   int    // exit code when Kind == EndJobClosed
	Reason string // human-readable, shown in logs and the event log
	Node   string // node that caused it, when known
	// Close is the job's outcome kind when Kind == EndJobClosed.
	Close verdict.Kind
	// Cause is what ended the round, when known (node_lost for a node
	// loss, the failing node's failure kind otherwise).
	Cause policy.Failure
	// Action is the restart policy's decision that opened the next round
	// (Kind == EndRestart; empty when unknown, e.g. an older launcher's).
	Action policy.Action
	// Delay is how long the next round waits to start (Kind ==
	// EndRestart; --restart-delay of a restart that spent the budget).
	Delay time.Duration
	// LedgerBy is the node that recorded Node's loss in the job's ledger
	// in the same txn that ended the round (exactly once, and before any
	// node saw the end); empty when the end did not, and then the agent
	// records it (ledger.Book.CloseOther, fenced: one survivor wins).
	LedgerBy string
	// Ledger are the leases of Node that this node's end txn closed (only
	// on the node named by LedgerBy), for its own logs and verdict.
	Ledger []ledger.Record
}

// Decision is the answer to a local failure report.
type Decision struct {
	Restart bool // true: a next round is open, call Next
	// Action is the restart policy's decision (policy.Decide); a report
	// that lost a race carries the winner's outcome instead.
	Action policy.Action
	Close  verdict.Kind // the job's outcome kind when !Restart
	Code   int          // exit code when !Restart
	Reason string
	// RestartsUsed is the job's restart count after this decision.
	RestartsUsed int
	// Delay is how long the next round waits to start after a restart
	// that spent the budget (--restart-delay; policy.Decision.Delay).
	Delay time.Duration
	// Ended is true when this report ended the round (its txn was the one
	// that committed); false when another node's report, a loss or the
	// job's close came first and the decision is theirs.
	Ended bool
}

// ErrClosed is returned by Next once the job has been closed.
var ErrClosed = errors.New("rendezvous closed")

// ErrUnreachable: etcd did not answer within the connect timeout at start.
var ErrUnreachable = errors.New("etcd unreachable")

// Errors the agent maps to outcome kinds (wrapped with details).
var (
	// ErrRendezvousLost: the rendezvous store was unreachable past its
	// loss bound; every call returns it from then on.
	ErrRendezvousLost = errors.New("rendezvous lost")
	// ErrJoinTimeout: a round did not gather --nnodes MIN nodes in time.
	ErrJoinTimeout = errors.New("rendezvous round did not close in time")
	// ErrHealthCheck: this node's health check failed before joining; the
	// node left the job.
	ErrHealthCheck = errors.New("node health check failed")
)

// Rendezvous is the node agent's view of the job-wide round state machine.
type Rendezvous interface {
	// Next joins the next round and blocks until it closes (or ctx ends).
	Next(ctx context.Context) (Assignment, error)
	// Ended returns a channel that receives once when the given round ends
	// because of another node, node loss or job closure.
	Ended(round int) <-chan RoundEnd
	// Fail reports a local failure of kind f in round: the restart policy
	// (policy.Decide) opens the next round for every node or closes the job.
	Fail(ctx context.Context, round int, f policy.Failure, reason string) (Decision, error)
	// Succeed reports that every local rank exited 0 in round and waits
	// until the job's outcome is known; it returns the exit code for this
	// node (0 when every node succeeded).
	Succeed(ctx context.Context, round int) (int, error)
	// Shutdown closes the job for every node with kind, code and reason
	// (a rank's ShutdownWorkload request, a fatal local error).
	Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error
	// Leave withdraws this node (ExcludeThisNode, health check failure)
	// without closing the job for others.
	Leave(ctx context.Context, reason string) error
	// Depart withdraws this node because its launcher was stopped by a
	// signal (reason names it): peers end the round with cause
	// policy.NodeStopped and the reason instead of recording a node loss,
	// and a spare takes its place. This node's rendezvous is then closed.
	Depart(ctx context.Context, reason string) error
	// Close releases resources (leases, connections, embedded servers).
	Close() error
}
