package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// ErrRoundRestarted is returned by Succeed when another node failed the
// round before every node was done: the job goes on in a next round, so the
// caller should call Next (Ended(round) also fires EndRestart).
var ErrRoundRestarted = errors.New("rendezvous: round restarted before every node succeeded")

// JobClosedError is returned by Next once the job is closed; it matches
// ErrClosed with errors.Is and carries the job's exit code and reason, so a
// standby node exits with the same code as the others.
type JobClosedError struct {
	Kind   verdict.Kind
	Code   int
	Reason string
	// Quarantine is set when this node was parked because it is
	// quarantined in the job (it waited for the job's end, not a round).
	Quarantine *QuarantineError
}

func (c *JobClosedError) Error() string {
	return fmt.Sprintf("%v: code %d: %s", ErrClosed, c.Code, c.Reason)
}

// Is makes errors.Is(err, ErrClosed) true, and errors.Is(err,
// ErrRendezvousLost) when the job was closed because etcd was lost.
func (c *JobClosedError) Is(target error) bool {
	return target == ErrClosed || (target == ErrRendezvousLost && c.Kind == verdict.RendezvousLost) ||
		(target == ErrQuarantined && c.Quarantine != nil)
}

// EtcdOptions configures the multi-node etcd v3 rendezvous.
type EtcdOptions struct {
	Endpoints          []string
	CACert, Cert, Key  string // TLS files ("" disables TLS unless CACert is set)
	Username, Password string
	RunID              string
	KeyPrefix          string // default "/ft-launcher/"; keys live under <prefix><run_id>/
	NodeID             string // unique per launcher, e.g. "<local_addr>/<pid>"
	LocalAddr          string // advertised address (MASTER_ADDR when group rank 0; gossip bind)
	NProcPerNode       int
	MinNodes, MaxNodes int
	MaxRestarts        int
	// RestartWindow and RestartDelay are the job's --restart-window and
	// --restart-delay (policy.Input); the first node's are the job's.
	RestartWindow, RestartDelay time.Duration
	InfraRank                   int           // -1 unknown; else SLURM_PROCID / --node-rank: decides order
	LastCall                    time.Duration // straggler wait after MIN present when MAX > MIN (default 500ms)
	// RejoinWait bounds how long a restart round waits for the previous
	// round's active nodes that are still alive (lease held, not declared
	// dead by gossip), so a node slow to stop its ranks keeps its group rank
	// instead of being replaced by a standby. Default 30s; set it above the
	// agent's workers stop timeout.
	RejoinWait time.Duration
	LeaseTTL   time.Duration // membership lease (default 6s, renewed every TTL/3): backstop for node loss
	// OnLeaseRenewed, when set, is called after every successful renewal of this node's own lease with
	// the instant until which the lease is certainly still valid at etcd: the local send time of the
	// renewal plus the TTL etcd granted. A grant of a new own lease counts as its first renewal.
	// Instants only move forward (an overtaken answer is not reported); not after Close.
	OnLeaseRenewed func(validUntil time.Time)
	// FenceMargin is how long before its lease can expire at etcd an
	// active node stops its ranks when no renewal came through (the fence:
	// docs/rendezvous.md, "Fencing: never two rounds at once"). Default
	// LeaseTTL/5 (1.2 s with the default 6 s TTL); it must be below LeaseTTL/2.
	FenceMargin time.Duration
	JoinTimeout time.Duration // an open round must close within this (default 10m)
	// FixedAllocation says no new node can join to replace a lost one (the
	// launcher sets it under Slurm when MIN == MAX): a restart round left
	// with fewer than MIN live nodes and no spare then closes the job with
	// kind verdict.NotEnoughNodes after MinNodesWait (--rdzv-conf
	// min_nodes_wait, default 1s: fixed.go), not after JoinTimeout.
	FixedAllocation bool
	MinNodesWait    time.Duration
	EtcdLossBound   time.Duration // etcd unreachable longer than this mid-run closes the job (default 60s)
	ConnectTimeout  time.Duration // etcd unreachable at start: error after this (default 20s)
	GossipPort      int           // memberlist port on LocalAddr (0 picks one)
	// GossipKey, when set (32 bytes, derived from the job secret), makes
	// gossip encrypt and authenticate every packet (memberlist's keyring,
	// AES-GCM): a host without the secret can neither read the membership
	// nor have its probes or rumours heard. nil: plain gossip.
	GossipKey []byte
	// ReplicaAddr is this node's state replica receiver ("host:port"),
	// published in its registration for its peers' Assignment.ReplicaRing;
	// "" when it runs none (docs/state.md).
	ReplicaAddr string
	// RelayListen, when set ("host:port"; port 0 picks one), makes this
	// node a relay of the two-level join (relay.go): it registers the
	// nodes that name it as their Relay in batches and reads their rank
	// entries in batches. Relay is this node's relay ("" registers
	// directly). Either needs RelayKey (at least 32 bytes, derived from
	// the job secret): the relay port answers only a peer that proves it.
	RelayListen, Relay string
	RelayKey           []byte
	// RelayListener and RelayDial replace the relay's TCP listener and a
	// member's TCP dial (the scale harness connects its 16,000 in-process
	// nodes over in-memory pipes: their TCP connections would not fit one
	// process's descriptors). nil: TCP.
	RelayListener net.Listener
	RelayDial     func(ctx context.Context, addr string) (net.Conn, error)
	DisableGossip bool          // lease expiry is then the only node-loss detector
	Gossip        GossipTimings // failure detector timings (zero fields: defaults)
	HealthCheck   func(ctx context.Context) error
	// MasterPort is the port this node advertises for round (its
	// MASTER_PORT should it be group rank 0); nil picks a free one. The
	// agent store binds its server on LocalAddr here, before the node
	// registers, so group rank 0's store listens before the round closes.
	MasterPort func(round int) (int, error)
	// ctlStream, when set, gives the ctl watch a gRPC stream of its own,
	// shared only with the nodes that set the same value: for the scale
	// harness, whose nodes share 8 connections (on a cluster each launcher
	// has its own, and its ctl watch its own stream). etcd buffers 128
	// responses per stream; thousands of nodes' watches on one stream
	// overflow it on every ctl change, and etcd then catches the overflowed
	// watchers up by reading the store ("victims"), a cost a real job does
	// not have.
	ctlStream string
	Metrics   *metrics.Metrics
	Logger    *slog.Logger

	// ProbeInterval is how often etcd reachability is checked (default 1s).
	ProbeInterval time.Duration
	// Client and Lease let many lightweight agents share one connection and
	// one lease (the scale test); Close then leaves both alone.
	Client *clientv3.Client
	Lease  clientv3.LeaseID
}

// Etcd is the etcd v3 Rendezvous. See docs/rendezvous.md for the design.
//
// It is a façade over three parts, each with its own lock (as etcd's
// concurrency.Election composes a Session): the session (session.go: the
// lease, its incarnation, the fence timer, the probe, Lost()), the control
// view (ctlview.go: the job's round, end and close records and their
// subscribers) and the loss detector (detector.go: gossip and stream
// evidence). Etcd makes rounds (round.go: one round's join, wait, close
// and end, from those parts and the round's number) and keeps this node's
// rendezvous life under mu: its state, assignment, round watchers and
// fence record. Lock order: mu, then
// the view's; the session and the detector are never called with mu held
// (but for the session's lose, which only cancels Lost()) and call back
// with none of their locks held.
type Etcd struct {
	o          EtcdOptions
	log        *slog.Logger
	rk         runKeys // <prefix><run_id>/: the generation pointer
	k          keys    // this node's generation: <prefix><run_id>/g<N>/
	gen        int
	cli        *clientv3.Client
	ownsClient bool
	// sess owns the lease, its renewals, the fence timer, the probe and
	// the loss context (session.go); it is never called with mu held.
	sess *session

	ctx    context.Context // ends on Close
	cancel context.CancelFunc
	lost   context.Context // sess.Lost(): ends on Close, or with an ErrRendezvousLost cause once etcd is lost
	wg     sync.WaitGroup

	mu        sync.Mutex
	state     nodeState
	cfg       *jobConfig // job config as stored, after the first successful check
	lastRound int        // round of the last assignment this node got; -1 none
	// rankRound is the round whose rank entry (key) this node holds in
	// rank, -1 none: a round whose summary says the entry is unchanged
	// (roundSummary.Delta) reuses it instead of reading the key.
	rankRound  int
	rank       rankInfo
	reborn     int // the lastRound after which this node took a new lease; -1 none
	assigned   map[int]roundSummary
	roundStop  context.CancelFunc // stops the watchers of the active round
	roundCtx   context.Context    // ends with the watchers of round roundCtxOf
	roundCtxOf int
	fence      fenceState // this node's fence out of a round (fence.go)
	// loss is the node-loss detector: gossip, the stream listener and
	// watches, the evidence of each loss (detector.go); its lock is a leaf.
	loss *lossDetector
	// view is the job's control state (round, end and close records) and
	// its subscribers (ctlview.go); its lock is taken after mu, never before.
	view *ctlView
	// parts are what every round of this node shares (round.go), fixed
	// once the node joined its generation.
	parts *roundParts
	// relay is this node's relay listener (RelayListen), nil when none.
	relay *relayServer
}

var _ Rendezvous = (*Etcd)(nil)

// NewEtcd connects to etcd, takes a lease and starts watching the job. When
// etcd cannot be reached within ConnectTimeout it returns an error naming
// the endpoints.
func NewEtcd(ctx context.Context, opts EtcdOptions) (*Etcd, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	e := &Etcd{o: opts, log: opts.Logger.With("node", opts.NodeID, "run_id", opts.RunID),
		rk:   runKeys{base: opts.KeyPrefix + opts.RunID + "/"},
		view: newCtlView(opts.NodeID, opts.FenceMargin), lastRound: -1, reborn: -1, rankRound: -1,
		assigned: map[int]roundSummary{}, fence: fenceState{round: -1}}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	e.loss = newLossDetector(opts.NodeID, opts.Gossip, e.log, e, &e.wg)
	// Before the session there is nothing to stop but the context and an
	// owned client.
	abort := func(err error) (*Etcd, error) {
		e.cancel()
		if e.ownsClient {
			_ = e.cli.Close()
		}
		return nil, err
	}
	if err := e.connect(ctx); err != nil {
		return abort(err)
	}
	var sess *session
	err := retryFor(ctx, e.log, opts.ConnectTimeout, func(ctx context.Context) (err error) {
		sess, err = newSession(ctx, e.ctx, e.cli, opts.Lease, sessionConfig{TTL: opts.LeaseTTL, FenceMargin: opts.FenceMargin,
			ProbeInterval: opts.ProbeInterval, LossBound: opts.EtcdLossBound, Endpoints: e.endpoints, OnRenewed: e.leaseRenewed,
			OnFenceDue: e.fenceDue, OnReplaced: e.leaseReplaced, OnLost: e.etcdLost, Metrics: opts.Metrics}, e.log)
		return err
	})
	if err != nil {
		return abort(err)
	}
	e.sess, e.lost = sess, sess.Lost()
	if err := e.start(ctx); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// start joins the job generation, makes this node's rounds' shared parts
// and starts the background watchers (the session is live already).
func (e *Etcd) start(ctx context.Context) error {
	// Each step is safe to repeat; a whole job starting at once can
	// overload etcd (too many requests) or outlast its request timeout.
	if err := retryFor(ctx, e.log, e.o.ConnectTimeout, e.joinGeneration); err != nil {
		return err
	}
	e.view.k = e.k // fixed from here on
	e.parts = &roundParts{cli: e.cli, k: e.k, gen: e.gen, genCmp: e.genCmp(), o: e.o, log: e.log,
		sess: e.sess, view: e.view, loss: e.loss, node: e}
	if e.o.Relay != "" {
		e.parts.relay = &relayClient{addr: e.o.Relay, key: e.o.RelayKey, log: e.log, dial: e.o.RelayDial}
	}
	if e.o.RelayListen != "" || e.o.RelayListener != nil {
		ln := e.o.RelayListener
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", e.o.RelayListen); err != nil {
				return fmt.Errorf("rendezvous: relay listener on %s: %w", e.o.RelayListen, err)
			}
		}
		e.relay = startRelay(ln, e.o.RelayKey, e.parts, e.gen, e.log)
	}
	var rev int64
	if err := retryFor(ctx, e.log, e.o.ConnectTimeout, func(ctx context.Context) (err error) {
		rev, err = e.loadCtl(ctx)
		return err
	}); err != nil {
		return err
	}
	e.wg.Add(1)
	go e.watchCtl(rev)
	e.sess.startProbe(e.k.round())
	if !e.o.DisableGossip {
		return e.startGossip()
	}
	return nil
}

func (o *EtcdOptions) defaults() error {
	if len(o.Endpoints) == 0 && o.Client == nil {
		return errors.New("rendezvous: no etcd endpoints")
	}
	if o.RunID == "" || o.NodeID == "" {
		return errors.New("rendezvous: RunID and NodeID are required")
	}
	if o.NProcPerNode <= 0 || o.MinNodes <= 0 || o.MaxNodes < o.MinNodes {
		return fmt.Errorf("rendezvous: bad sizes nproc=%d nnodes=%d:%d", o.NProcPerNode, o.MinNodes, o.MaxNodes)
	}
	if (o.Relay != "" || o.RelayListen != "" || o.RelayListener != nil) && len(o.RelayKey) < 32 {
		return fmt.Errorf("rendezvous: a relay (Relay %q, RelayListen %q) needs RelayKey of at least 32 bytes derived from the job secret; got %d bytes",
			o.Relay, o.RelayListen, len(o.RelayKey))
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "/ft-launcher/"
	}
	if !strings.HasSuffix(o.KeyPrefix, "/") {
		o.KeyPrefix += "/"
	}
	if o.LocalAddr == "" {
		o.LocalAddr = "127.0.0.1"
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&o.LastCall, 500*time.Millisecond)
	def(&o.RejoinWait, 30*time.Second)
	def(&o.LeaseTTL, 6*time.Second)
	def(&o.FenceMargin, o.LeaseTTL/5)
	if o.FenceMargin >= o.LeaseTTL/2 {
		return fmt.Errorf("rendezvous: fence margin %v must be below half the lease TTL %v (a node renews every TTL/%d)",
			o.FenceMargin, o.LeaseTTL, renewsPerTTL)
	}
	def(&o.JoinTimeout, 10*time.Minute)
	def(&o.MinNodesWait, time.Second)
	def(&o.EtcdLossBound, 60*time.Second)
	def(&o.ConnectTimeout, 20*time.Second)
	def(&o.ProbeInterval, time.Second)
	o.Gossip.defaults()
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

// Ended returns a channel that receives once when round ends.
func (e *Etcd) Ended(round int) <-chan RoundEnd { return e.view.subscribe(round) }

// Generation is the job generation this node belongs to: it grows by one
// each time a run id is reused after its job closed (docs/rendezvous.md).
func (e *Etcd) Generation() int { return e.gen }

// NodeID is this node's id in the job's records (<local addr>/<pid>): the
// id peers use when they record this node as lost or excluded.
func (e *Etcd) NodeID() string { return e.o.NodeID }
