package rendezvous

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/policy"
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
}

func (c *JobClosedError) Error() string {
	return fmt.Sprintf("%v: code %d: %s", ErrClosed, c.Code, c.Reason)
}

// Is makes errors.Is(err, ErrClosed) true.
func (c *JobClosedError) Is(target error) bool { return target == ErrClosed }

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
	InfraRank          int           // -1 unknown; else SLURM_PROCID / --node-rank: decides order
	LastCall           time.Duration // straggler wait after MIN present when MAX > MIN (default 500ms)
	// RejoinWait bounds how long a restart round waits for the previous
	// round's active nodes that are still alive (lease held, not declared
	// dead by gossip), so a node slow to stop its ranks keeps its group rank
	// instead of being replaced by a standby. Default 30s; set it above the
	// agent's workers stop timeout.
	RejoinWait     time.Duration
	LeaseTTL       time.Duration // membership lease (default 5s): backstop for node loss
	JoinTimeout    time.Duration // an open round must close within this (default 10m)
	EtcdLossBound  time.Duration // etcd unreachable longer than this mid-run closes the job (default 60s)
	ConnectTimeout time.Duration // etcd unreachable at start: error after this (default 20s)
	GossipPort     int           // memberlist port on LocalAddr (0 picks one)
	DisableGossip  bool          // lease expiry is then the only node-loss detector
	HealthCheck    func(ctx context.Context) error
	Metrics        *metrics.Metrics
	Logger         *slog.Logger

	// ProbeInterval is how often etcd reachability is checked (default 1s).
	ProbeInterval time.Duration
	// Client and Lease let many lightweight agents share one connection and
	// one lease (the scale test); Close then leaves both alone.
	Client *clientv3.Client
	Lease  clientv3.LeaseID
}

// Etcd is the etcd v3 Rendezvous. See docs/rendezvous.md for the design.
type Etcd struct {
	o          EtcdOptions
	log        *slog.Logger
	rk         runKeys // <prefix><run_id>/: the generation pointer
	k          keys    // this node's generation: <prefix><run_id>/g<N>/
	gen        int
	cli        *clientv3.Client
	ownsClient bool
	ownsLease  bool
	leaseMu    sync.Mutex // serializes lease renewals (keepAlive and joinRound)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ml     *memberlist.Memberlist

	mu         sync.Mutex
	lease      clientv3.LeaseID
	state      nodeState
	cfg        *jobConfig // job config as stored, after the first successful check
	ctlRound   int        // the job's current round, as last seen from etcd
	closed     *closeInfo // the job's close record, or a local close (etcd lost, Leave)
	ends       map[int]*endSub
	lastEnds   map[int]endInfo
	changed    chan struct{} // closed and replaced on every ctl change
	lastRound  int           // round of the last assignment this node got; -1 none
	assigned   map[int]roundSummary
	roundStop  context.CancelFunc // stops the watchers of the active round
	lastProbe  time.Time
	gossipAddr string
}

type endSub struct {
	ch    chan RoundEnd
	fired bool
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
		rk: runKeys{base: opts.KeyPrefix + opts.RunID + "/"}, ends: map[int]*endSub{},
		lastEnds: map[int]endInfo{}, changed: make(chan struct{}), lastRound: -1,
		assigned: map[int]roundSummary{}, ctlRound: -1}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	ok := false
	defer func() {
		if !ok {
			e.Close()
		}
	}()

	if opts.Client != nil {
		e.cli = opts.Client
	} else {
		cfg := clientv3.Config{Endpoints: opts.Endpoints, DialTimeout: 5 * time.Second,
			DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
			Username: opts.Username, Password: opts.Password,
			// The client logs every retry while etcd is away; our own
			// slog lines report reachability once per state change.
			Logger: zap.NewNop(),
			// Reconnect within about a second once etcd is back (gRPC's
			// default backoff grows to minutes): a member's lease must be
			// kept alive again before its TTL runs out after an etcd restart.
			DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
				MinConnectTimeout: time.Second})}}
		if opts.CACert != "" || opts.Cert != "" {
			tc, err := loadTLS(opts.CACert, opts.Cert, opts.Key)
			if err != nil {
				return nil, err
			}
			cfg.TLS = tc
		}
		cli, err := e.newClient(ctx, cfg)
		if err != nil {
			return nil, err
		}
		e.cli, e.ownsClient = cli, true
	}
	if err := e.waitReachable(ctx); err != nil {
		return nil, err
	}
	if opts.Lease != 0 {
		e.lease = opts.Lease
	} else {
		if err := e.grantLease(ctx); err != nil {
			return nil, err
		}
		e.ownsLease = true
	}
	if err := e.joinGeneration(ctx); err != nil {
		return nil, err
	}
	rev, err := e.loadCtl(ctx)
	if err != nil {
		return nil, err
	}
	e.lastProbe = time.Now()
	e.wg.Add(2)
	go e.watchCtl(rev)
	go e.probe()
	if e.ownsLease {
		e.wg.Add(1)
		go e.keepAlive()
	}
	if !opts.DisableGossip {
		if err := e.startGossip(); err != nil {
			return nil, err
		}
	}
	ok = true
	return e, nil
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
	def(&o.LeaseTTL, 5*time.Second)
	def(&o.JoinTimeout, 10*time.Minute)
	def(&o.EtcdLossBound, 60*time.Second)
	def(&o.ConnectTimeout, 20*time.Second)
	def(&o.ProbeInterval, time.Second)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return nil
}

func loadTLS(ca, cert, key string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("read etcd CA cert: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("etcd CA cert %s: no certificates", ca)
		}
		tc.RootCAs = pool
	}
	if cert != "" {
		kp, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("load etcd client cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{kp}
	}
	return tc, nil
}

// newClient creates the etcd client. With a username the client
// authenticates inside clientv3.New, which then fails when etcd is not up
// yet: retry that for ConnectTimeout, but report a refused login at once.
func (e *Etcd) newClient(ctx context.Context, cfg clientv3.Config) (*clientv3.Client, error) {
	deadline := time.Now().Add(e.o.ConnectTimeout)
	for {
		cfg.DialTimeout = min(5*time.Second, max(time.Until(deadline), 100*time.Millisecond))
		cli, err := clientv3.New(cfg)
		if err == nil {
			return cli, nil
		}
		if errors.Is(err, rpctypes.ErrAuthFailed) || errors.Is(err, rpctypes.ErrGRPCAuthFailed) {
			return nil, fmt.Errorf("etcd at %s refused the login of user %q (wrong rdzv username or password?): %w",
				e.endpoints(), cfg.Username, err)
		}
		if cfg.Username == "" || ctx.Err() != nil || time.Now().After(deadline) {
			return nil, fmt.Errorf("etcd unreachable at %s after %v: %w%s", e.endpoints(), e.o.ConnectTimeout, err, e.tlsHintCfg(ctx, cfg.TLS))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tlsHint explains a TLS failure, which the etcd client only reports as a
// timeout: it tries one handshake itself and returns "" when that works.
func (e *Etcd) tlsHint(ctx context.Context) string {
	if e.o.CACert == "" && e.o.Cert == "" {
		return ""
	}
	tc, err := loadTLS(e.o.CACert, e.o.Cert, e.o.Key)
	if err != nil {
		return ""
	}
	return e.tlsHintCfg(ctx, tc)
}

func (e *Etcd) tlsHintCfg(ctx context.Context, tc *tls.Config) string {
	if tc == nil {
		return ""
	}
	for _, ep := range e.o.Endpoints {
		host := ep
		if u, err := url.Parse(ep); err == nil && u.Host != "" {
			host = u.Host
		}
		if err := tlsProbe(ctx, host, tc); err != nil {
			return fmt.Sprintf(" (TLS with %s: %v)", host, err)
		}
	}
	return ""
}

// tlsProbe handshakes with addr and reads briefly: with TLS 1.3 a server
// that rejects our client certificate says so only after the handshake.
func tlsProbe(ctx context.Context, addr string, tc *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d := tls.Dialer{Config: tc.Clone()}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := conn.Read(make([]byte, 1)); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil // the server waits for our request: TLS is fine
		}
		return err
	}
	return nil
}

// waitReachable retries a read until etcd answers or ConnectTimeout passes.
func (e *Etcd) waitReachable(ctx context.Context) error {
	deadline := time.Now().Add(e.o.ConnectTimeout)
	var last error
	for {
		actx, cancel := context.WithTimeout(ctx, min(2*time.Second, time.Until(deadline)+10*time.Millisecond))
		_, err := e.cli.Get(actx, e.rk.generation())
		cancel()
		if err == nil {
			return nil
		}
		last = err
		if ctx.Err() != nil {
			return fmt.Errorf("connect to etcd at %s: %w", e.endpoints(), ctx.Err())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("etcd unreachable at %s after %v: %w%s", e.endpoints(), e.o.ConnectTimeout, last, e.tlsHint(ctx))
		}
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (e *Etcd) endpoints() string {
	if len(e.o.Endpoints) == 0 && e.cli != nil {
		return strings.Join(e.cli.Endpoints(), ",")
	}
	return strings.Join(e.o.Endpoints, ",")
}

func (e *Etcd) grantLease(ctx context.Context) error {
	ttl := int64((e.o.LeaseTTL + time.Second - 1) / time.Second)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := e.cli.Grant(actx, ttl)
	if err != nil {
		return fmt.Errorf("etcd lease at %s: %w", e.endpoints(), err)
	}
	e.mu.Lock()
	e.lease = resp.ID
	e.mu.Unlock()
	return nil
}

// renewLease replaces an expired lease old with a new one, unless another
// goroutine already did (then it is a no-op), and re-registers what hangs on
// the lease. Both the keep-alive loop and a join that finds its lease gone
// call it, so exactly one new lease is granted.
func (e *Etcd) renewLease(ctx context.Context, old clientv3.LeaseID) error {
	e.leaseMu.Lock()
	defer e.leaseMu.Unlock()
	if e.currentLease() != old {
		return nil
	}
	e.log.Warn("membership lease expired; taking a new one", "lease", fmt.Sprintf("%x", old))
	if err := e.grantLease(ctx); err != nil {
		return err
	}
	e.reputAlive()
	return nil
}

func (e *Etcd) currentLease() clientv3.LeaseID {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lease
}

// broadcastLocked wakes every waiter and fires due Ended channels.
func (e *Etcd) broadcastLocked() {
	close(e.changed)
	e.changed = make(chan struct{})
	for r, s := range e.ends {
		e.fireLocked(r, s)
	}
}

func (e *Etcd) fireLocked(r int, s *endSub) {
	if s.fired {
		return
	}
	var end RoundEnd
	switch {
	case e.closed != nil:
		end = RoundEnd{Kind: EndJobClosed, Round: r, Code: e.closed.Code, Reason: e.closed.Reason, Node: e.closed.Node, Close: e.closed.Kind}
	case e.ctlRound > r:
		le := e.lastEnds[r]
		reason := le.Reason
		if reason == "" {
			reason = fmt.Sprintf("round %d superseded by round %d", r, e.ctlRound)
		}
		end = RoundEnd{Kind: EndRestart, Round: r, Reason: reason, Node: le.Node}
	default:
		return
	}
	s.fired = true
	s.ch <- end
}

func (e *Etcd) setStateLocked(to nodeState, why string) {
	if e.state == to {
		return
	}
	if !transitionOK(e.state, to) {
		e.log.Error("rendezvous: unexpected state transition", "from", e.state, "to", to, "why", why)
	}
	e.log.Debug("rendezvous state", "from", e.state, "to", to, "why", why)
	e.state = to
}

// applyCtlLocked records the job's round, last end and close record.
func (e *Etcd) applyCtlLocked(key string, val []byte, deleted bool) {
	switch key {
	case e.k.round():
		if deleted {
			return
		}
		r, err := strconv.Atoi(string(val))
		if err != nil || r <= e.ctlRound {
			return
		}
		if e.ctlRound >= 0 {
			e.o.Metrics.Restarted()
		}
		e.ctlRound = r
		if e.lastRound >= 0 && e.lastRound < r && e.state == stateActive {
			e.setStateLocked(stateRoundEnded, "round "+strconv.Itoa(r)+" opened")
			if e.roundStop != nil {
				e.roundStop()
				e.roundStop = nil
			}
		}
	case e.k.lastEnd():
		var le endInfo
		if json.Unmarshal(val, &le) == nil {
			e.lastEnds[le.Round] = le
		}
	case e.k.closed():
		if deleted || e.closed != nil {
			return
		}
		var ci closeInfo
		if err := json.Unmarshal(val, &ci); err != nil {
			ci = closeInfo{Kind: verdict.FatalError, Code: 1, Reason: "unreadable close record: " + string(val)}
		}
		e.closed = &ci
		e.closeLocally("job closed: " + ci.Reason)
		e.dropAliveLocked()
	}
}

// closeLocally moves to closed and stops round watchers (mu held).
func (e *Etcd) closeLocally(why string) {
	e.setStateLocked(stateClosed, why)
	if e.roundStop != nil {
		e.roundStop()
		e.roundStop = nil
	}
}

// loadCtl reads the job's round and close record; it returns the revision
// to watch from.
func (e *Etcd) loadCtl(ctx context.Context) (int64, error) {
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := e.cli.Get(actx, e.k.ctl(), clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("read job state from etcd at %s: %w", e.endpoints(), err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	// The end record first, so a round change finds its reason.
	for _, kv := range resp.Kvs {
		if string(kv.Key) == e.k.lastEnd() {
			e.applyCtlLocked(string(kv.Key), kv.Value, false)
		}
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != e.k.lastEnd() {
			e.applyCtlLocked(string(kv.Key), kv.Value, false)
		}
	}
	e.broadcastLocked()
	return resp.Header.Revision, nil
}

// Ended returns a channel that receives once when round ends.
func (e *Etcd) Ended(round int) <-chan RoundEnd {
	e.mu.Lock()
	defer e.mu.Unlock()
	s, ok := e.ends[round]
	if !ok {
		s = &endSub{ch: make(chan RoundEnd, 1)}
		e.ends[round] = s
		e.fireLocked(round, s)
	}
	return s.ch
}

// Next joins the next round and blocks until it closes.
func (e *Etcd) Next(ctx context.Context) (Assignment, error) {
	e.mu.Lock()
	if e.closed != nil {
		e.mu.Unlock()
		return Assignment{}, &JobClosedError{Kind: e.closed.Kind, Code: e.closed.Code, Reason: e.closed.Reason}
	}
	if e.state == stateClosed {
		e.mu.Unlock()
		return Assignment{}, ErrClosed
	}
	e.setStateLocked(stateJoining, "next")
	needCfg := e.cfg == nil
	e.mu.Unlock()

	if needCfg {
		if err := e.checkConfig(ctx); err != nil {
			return Assignment{}, err
		}
	}
	if e.o.HealthCheck != nil {
		if err := e.o.HealthCheck(ctx); err != nil {
			reason := fmt.Sprintf("health check failed: %v", err)
			if lerr := e.Leave(ctx, reason); lerr != nil {
				e.log.Warn("leave after failed health check", "err", lerr)
			}
			return Assignment{}, fmt.Errorf("rendezvous: node %s kept out: %w", e.o.NodeID, err)
		}
	}
	for {
		e.mu.Lock()
		target := max(e.ctlRound, e.lastRound+1)
		e.mu.Unlock()
		a, retarget, err := e.joinRound(ctx, target)
		if err != nil {
			return Assignment{}, err
		}
		if !retarget {
			return a, nil
		}
	}
}

// checkConfig creates the job config once, or refuses a node that differs.
func (e *Etcd) checkConfig(ctx context.Context) error {
	want := jobConfig{NProcPerNode: e.o.NProcPerNode, MinNodes: e.o.MinNodes, MaxNodes: e.o.MaxNodes, MaxRestarts: e.o.MaxRestarts}
	b, _ := json.Marshal(want)
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.config()), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.config(), string(b)), clientv3.OpPut(e.k.round(), "0")).
		Else(clientv3.OpGet(e.k.config())).Commit()
	if err != nil {
		return fmt.Errorf("rendezvous: write job config: %w", err)
	}
	got := want
	if !resp.Succeeded {
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return e.supersededErr(ctx)
		}
		if err := json.Unmarshal(kvs[0].Value, &got); err != nil {
			return fmt.Errorf("rendezvous: bad job config %q: %w", kvs[0].Value, err)
		}
		if got.NProcPerNode != want.NProcPerNode {
			return fmt.Errorf("rendezvous: node %s refused: nproc_per_node=%d but the job has nproc_per_node=%d",
				e.o.NodeID, want.NProcPerNode, got.NProcPerNode)
		}
		if got.MinNodes != want.MinNodes || got.MaxNodes != want.MaxNodes {
			return fmt.Errorf("rendezvous: node %s refused: nnodes=%d:%d but the job has nnodes=%d:%d",
				e.o.NodeID, want.MinNodes, want.MaxNodes, got.MinNodes, got.MaxNodes)
		}
		if got.MaxRestarts != want.MaxRestarts {
			e.log.Warn("max_restarts differs from the job's; using the job's", "mine", want.MaxRestarts, "job", got.MaxRestarts)
		}
	}
	e.mu.Lock()
	e.cfg = &got
	if e.ctlRound < 0 {
		e.ctlRound = 0
	}
	e.mu.Unlock()
	return nil
}

// joinRound registers this node in round target and waits for its
// assignment. retarget is true when the job moved past target meanwhile.
func (e *Etcd) joinRound(ctx context.Context, target int) (Assignment, bool, error) {
	start := time.Now()
	port, err := FreePort(e.o.LocalAddr)
	if err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: %w", err)
	}
	e.mu.Lock()
	gossipAddr := e.gossipAddr
	e.mu.Unlock()
	mi := memberInfo{NodeID: e.o.NodeID, Addr: e.o.LocalAddr, InfraRank: e.o.InfraRank,
		NProc: e.o.NProcPerNode, MasterPort: port, GossipAddr: gossipAddr}
	b, _ := json.Marshal(mi)
	register := func(lease clientv3.LeaseID) (*clientv3.TxnResponse, error) {
		then := []clientv3.Op{clientv3.OpPut(e.k.member(target, e.o.NodeID), string(b), clientv3.WithLease(lease))}
		if target >= 2 {
			// Our membership two rounds back is certainly stale; drop it so
			// long jobs do not pile up keys. (One round back may still be live.)
			then = append(then, clientv3.OpDelete(e.k.member(target-2, e.o.NodeID)))
		}
		return e.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.k.assignment(target)), "=", 0),
				clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
			Then(then...).
			Commit()
	}
	lease := e.currentLease()
	resp, err := register(lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// We were cut off longer than the lease TTL (a partition that
		// healed): take a new lease and register with it.
		if rerr := e.renewLease(ctx, lease); rerr != nil {
			return Assignment{}, false, fmt.Errorf("rendezvous: join round %d: renew expired lease: %w", target, rerr)
		}
		resp, err = register(e.currentLease())
	}
	if err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: join round %d: %w", target, err)
	}
	e.mu.Lock()
	e.setStateLocked(stateWaiting, "registered in round "+strconv.Itoa(target))
	e.mu.Unlock()
	if !resp.Succeeded {
		// Closed, or the round was assigned without us: handled below.
		e.log.Debug("round already closed or job closed when joining", "round", target)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closerDone := make(chan struct{})
	closerRunning := false
	tryCloser := func() {
		if closerRunning {
			return
		}
		won, err := e.claimCloser(wctx, target)
		if err != nil {
			e.log.Debug("claim closer", "round", target, "err", err)
			return
		}
		if won {
			closerRunning = true
			go func() {
				defer close(closerDone)
				e.runCloser(wctx, target)
			}()
		}
	}
	defer func() {
		cancel()
		if closerRunning {
			<-closerDone
		}
	}()

	// One watch covers the assignment and the closer key (adjacent keys).
	get, err := e.cli.Get(wctx, e.k.assignment(target))
	if err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: read round %d: %w", target, err)
	}
	var sumRaw []byte
	if len(get.Kvs) > 0 {
		sumRaw = get.Kvs[0].Value
	}
	wch := e.cli.Watch(wctx, e.k.assignment(target), clientv3.WithRange(e.k.closer(target)+"\x00"),
		clientv3.WithRev(get.Header.Revision+1))
	if sumRaw == nil {
		tryCloser()
	}
	var joinDeadline <-chan time.Time
	for sumRaw == nil {
		e.mu.Lock()
		ch, closed, cur := e.changed, e.closed, e.ctlRound
		e.mu.Unlock()
		if closed != nil {
			return Assignment{}, false, &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
		}
		if cur > target {
			return Assignment{}, true, nil
		}
		if cur == target && joinDeadline == nil {
			t := time.NewTimer(e.o.JoinTimeout)
			defer t.Stop()
			joinDeadline = t.C
		}
		select {
		case <-ctx.Done():
			e.withdraw(target)
			return Assignment{}, false, fmt.Errorf("rendezvous: waiting for round %d: %w", target, ctx.Err())
		case <-joinDeadline:
			e.withdraw(target)
			return Assignment{}, false, fmt.Errorf("rendezvous: round %d did not close within %v (need %d nodes)", target, e.o.JoinTimeout, e.o.MinNodes)
		case <-ch:
		case wr, ok := <-wch:
			if !ok {
				if ctx.Err() != nil {
					continue
				}
				return Assignment{}, false, errors.New("rendezvous: watch closed")
			}
			if err := wr.Err(); err != nil {
				// Compacted or similar: re-read from scratch.
				return Assignment{}, true, nil
			}
			for _, ev := range wr.Events {
				switch string(ev.Kv.Key) {
				case e.k.assignment(target):
					if ev.Type == clientv3.EventTypePut {
						sumRaw = ev.Kv.Value
					}
				case e.k.closer(target):
					if ev.Type == clientv3.EventTypeDelete {
						tryCloser()
					}
				}
			}
		}
	}
	var sum roundSummary
	if err := json.Unmarshal(sumRaw, &sum); err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: bad assignment for round %d: %w", target, err)
	}
	rresp, err := e.cli.Get(ctx, e.k.rank(target, e.o.NodeID))
	if err != nil {
		return Assignment{}, false, fmt.Errorf("rendezvous: read rank for round %d: %w", target, err)
	}
	ri := rankInfo{GroupRank: -1, Standby: true} // not listed: arrived after the round closed
	if len(rresp.Kvs) > 0 {
		if err := json.Unmarshal(rresp.Kvs[0].Value, &ri); err != nil {
			return Assignment{}, false, fmt.Errorf("rendezvous: bad rank for round %d: %w", target, err)
		}
	}
	e.mu.Lock()
	maxRestarts := e.o.MaxRestarts
	if e.cfg != nil {
		maxRestarts = e.cfg.MaxRestarts
	}
	a := Assignment{RunID: e.o.RunID, Round: target, GroupRank: ri.GroupRank, GroupWorldSize: sum.GroupWorldSize,
		RankBase: ri.RankBase, WorldSize: sum.WorldSize, MasterAddr: sum.MasterAddr, MasterPort: sum.MasterPort,
		MaxRestarts: maxRestarts, Standby: ri.Standby}
	e.lastRound = target
	e.assigned[target] = sum
	for r := range e.assigned {
		if r < target-1 {
			delete(e.assigned, r)
		}
	}
	if a.Standby {
		e.setStateLocked(stateStandby, "parked in round "+strconv.Itoa(target))
	} else {
		e.setStateLocked(stateActive, "assigned in round "+strconv.Itoa(target))
	}
	if e.roundStop != nil {
		e.roundStop()
	}
	rctx, rcancel := context.WithCancel(e.ctx)
	e.roundStop = rcancel
	stale := e.ctlRound > target || e.closed != nil
	e.mu.Unlock()
	if stale {
		rcancel()
	} else if !a.Standby {
		e.wg.Add(1)
		go e.watchLoss(rctx, target, sum)
		e.gossipJoin(sum.Seeds)
	}
	e.o.Metrics.RoundCompleted(target, a.WorldSize, time.Since(start))
	e.log.Info("rendezvous round closed", "round", target, "group_rank", a.GroupRank,
		"group_world_size", a.GroupWorldSize, "world_size", a.WorldSize, "standby", a.Standby,
		"master", fmt.Sprintf("%s:%d", a.MasterAddr, a.MasterPort), "took", time.Since(start))
	return a, false, nil
}

// withdraw removes this node's registration in an unassigned round.
func (e *Etcd) withdraw(r int) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.assignment(r)), "=", 0)).
		Then(clientv3.OpDelete(e.k.member(r, e.o.NodeID))).Commit()
}

// Fail reports a local failure in round r: one txn opens round r+1 if the
// budget allows, else closes the job. A stale report is a no-op.
func (e *Etcd) Fail(ctx context.Context, round int, f policy.Failure, reason string) (Decision, error) {
	conds := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.k.member(round, e.o.NodeID)), ">", 0)}
	d, err := e.endRound(ctx, round, fmt.Sprintf("node %s failed: %s", e.o.NodeID, reason), conds)
	if err != nil {
		return Decision{}, err
	}
	return d, nil
}

// endRound is the single fenced txn that ends round r: open r+1 when the
// job-wide budget allows (restarts used == r), else close the job with 1.
func (e *Etcd) endRound(ctx context.Context, r int, reason string, extra []clientv3.Cmp) (Decision, error) {
	e.mu.Lock()
	maxRestarts := e.o.MaxRestarts
	if e.cfg != nil {
		maxRestarts = e.cfg.MaxRestarts
	}
	e.mu.Unlock()
	conds := append([]clientv3.Cmp{
		clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(r)),
		clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0),
		e.genCmp(),
	}, extra...)
	var ops []clientv3.Op
	var dec Decision
	if r < maxRestarts {
		le, _ := json.Marshal(endInfo{Round: r, Reason: reason, Node: e.o.NodeID})
		ops = []clientv3.Op{clientv3.OpPut(e.k.lastEnd(), string(le)), clientv3.OpPut(e.k.round(), strconv.Itoa(r+1))}
		dec = Decision{Restart: true, Reason: reason}
	} else {
		ci := closeInfo{Kind: verdict.RestartBudgetExhausted, Code: 1, Reason: fmt.Sprintf("restart budget exhausted (%d of %d restarts used): %s", r, maxRestarts, reason), Node: e.o.NodeID}
		cb, _ := json.Marshal(ci)
		ops = []clientv3.Op{clientv3.OpPut(e.k.closed(), string(cb))}
		dec = Decision{Restart: false, Code: 1, Reason: ci.Reason}
	}
	resp, err := e.cli.Txn(ctx).If(conds...).Then(ops...).
		Else(clientv3.OpGet(e.k.round()), clientv3.OpGet(e.k.closed())).Commit()
	if err != nil {
		return Decision{}, fmt.Errorf("rendezvous: end round %d: %w", r, err)
	}
	if resp.Succeeded {
		e.log.Info("rendezvous round ended", "round", r, "restart", dec.Restart, "reason", dec.Reason)
		return dec, nil
	}
	// Lost the race or fenced out: report what the job did instead.
	if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
		var ci closeInfo
		_ = json.Unmarshal(kvs[0].Value, &ci)
		return Decision{Restart: false, Code: ci.Code, Reason: ci.Reason}, nil
	}
	cur := -1
	if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
		cur, _ = strconv.Atoi(string(kvs[0].Value))
	}
	if cur > r {
		return Decision{Restart: true, Reason: fmt.Sprintf("round %d already superseded by round %d", r, cur)}, nil
	}
	if cur < r {
		return Decision{}, fmt.Errorf("rendezvous: round %d reported but the job is at round %d", r, cur)
	}
	return Decision{Restart: true, Reason: fmt.Sprintf("node %s no longer belongs to round %d (membership expired)", e.o.NodeID, r)}, nil
}

// Succeed marks this node done in round and waits for the job's outcome.
func (e *Etcd) Succeed(ctx context.Context, round int) (int, error) {
	resp, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(round)),
			clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.done(round, e.o.NodeID), "1")).Commit()
	if err != nil {
		return 1, fmt.Errorf("rendezvous: mark done in round %d: %w", round, err)
	}
	if resp.Succeeded {
		e.mu.Lock()
		sum, ok := e.assigned[round]
		e.mu.Unlock()
		if !ok {
			return 1, fmt.Errorf("rendezvous: Succeed for round %d, which this node was not assigned", round)
		}
		// The last node to mark done sees every marker and closes the job.
		cnt, err := e.cli.Get(ctx, e.k.dones(round), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 1, fmt.Errorf("rendezvous: count done nodes: %w", err)
		}
		if int(cnt.Count) >= sum.GroupWorldSize {
			cb, _ := json.Marshal(closeInfo{Kind: verdict.Succeeded, Code: 0, Reason: "all nodes succeeded", Node: e.o.NodeID})
			if _, err := e.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0),
					clientv3.Compare(clientv3.Value(e.k.round()), "=", strconv.Itoa(round)), e.genCmp()).
				Then(clientv3.OpPut(e.k.closed(), string(cb))).Commit(); err != nil {
				return 1, fmt.Errorf("rendezvous: close job: %w", err)
			}
		}
	}
	for {
		e.mu.Lock()
		ch, closed, cur := e.changed, e.closed, e.ctlRound
		e.mu.Unlock()
		if closed != nil {
			return closed.Code, nil
		}
		if cur > round {
			return 1, ErrRoundRestarted
		}
		select {
		case <-ctx.Done():
			return 1, fmt.Errorf("rendezvous: waiting for other nodes to finish round %d: %w", round, ctx.Err())
		case <-ch:
		}
	}
}

// Shutdown closes the job for every node; the first close record wins.
func (e *Etcd) Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error {
	cb, _ := json.Marshal(closeInfo{Kind: kind, Code: code, Reason: reason, Node: e.o.NodeID})
	if _, err := e.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.k.closed()), "=", 0), e.genCmp()).
		Then(clientv3.OpPut(e.k.closed(), string(cb))).Commit(); err != nil {
		return fmt.Errorf("rendezvous: close job: %w", err)
	}
	// Wait until the watcher has seen it so Ended fires before we return.
	for {
		e.mu.Lock()
		ch, closed := e.changed, e.closed
		e.mu.Unlock()
		if closed != nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("rendezvous: waiting for job close: %w", ctx.Err())
		case <-ch:
		}
	}
}

// Leave withdraws this node: it drops its lease (so its membership keys
// go now) and leaves gossip; the job goes on and others see a node loss.
func (e *Etcd) Leave(ctx context.Context, reason string) error {
	e.mu.Lock()
	e.closeLocally("left: " + reason)
	lease := e.lease
	e.mu.Unlock()
	e.log.Warn("leaving the job", "reason", reason)
	e.stopGossip(true)
	if lease != 0 && e.ownsLease {
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			return fmt.Errorf("rendezvous: revoke lease on leave: %w", err)
		}
		return nil
	}
	// A shared lease must survive: delete our own keys instead.
	e.mu.Lock()
	r := e.lastRound
	e.mu.Unlock()
	if _, err := e.cli.Delete(ctx, e.k.alive(e.o.NodeID)); err != nil {
		return fmt.Errorf("rendezvous: remove alive key on leave: %w", err)
	}
	for _, rr := range []int{r, r + 1} {
		if rr < 0 {
			continue
		}
		if _, err := e.cli.Delete(ctx, e.k.member(rr, e.o.NodeID)); err != nil {
			return fmt.Errorf("rendezvous: remove membership on leave: %w", err)
		}
	}
	return nil
}

// Close stops watchers and gossip, revokes an owned lease and closes an
// owned client. It does not close the job.
func (e *Etcd) Close() error {
	e.mu.Lock()
	if e.state != stateClosed {
		e.closeLocally("closed")
	}
	lease := e.lease
	e.mu.Unlock()
	e.stopGossip(true)
	e.cancel()
	e.wg.Wait()
	var errs []error
	if e.ownsLease && lease != 0 && e.cli != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if _, err := e.cli.Revoke(ctx, lease); err != nil {
			e.log.Debug("revoke lease on close", "err", err)
		}
		cancel()
	}
	if e.ownsClient && e.cli != nil {
		if err := e.cli.Close(); err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("rendezvous: close etcd client: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Generation is the job generation this node belongs to: it grows by one
// each time a run id is reused after its job closed (docs/rendezvous.md).
func (e *Etcd) Generation() int { return e.gen }

// genCmp fences a write on this node's generation still being current.
func (e *Etcd) genCmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(e.rk.generation()), "=", strconv.Itoa(e.gen))
}

// joinGeneration picks the generation of the run this node belongs to and
// registers the node as alive in it. A closed generation with no live node
// left is over: the first node to notice starts the next one (one txn, one
// winner) and deletes the old generation's keys except its close record,
// which nodes of the old generation that are still running keep seeing;
// their writes are fenced on their (now stale) generation. While nodes of
// a closed generation are still alive (exiting, or crashed with a lease not
// yet expired) it waits for them, at most LeaseTTL plus a margin; after
// that it joins the closed generation and Next reports the job closed.
func (e *Etcd) joinGeneration(ctx context.Context) error {
	deadline := time.Now().Add(e.o.LeaseTTL + 2*time.Second)
	gk := e.rk.generation()
	for {
		// A plain read first: it needs no raft round trip, unlike a txn
		// with a write branch (this runs once per node at start).
		get, err := e.cli.Get(ctx, gk)
		if err != nil {
			return fmt.Errorf("rendezvous: read job generation from etcd at %s: %w", e.endpoints(), err)
		}
		kvs := get.Kvs
		if len(kvs) == 0 {
			resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(gk), "=", 0)).
				Then(clientv3.OpPut(gk, "0")).Else(clientv3.OpGet(gk)).Commit()
			if err != nil {
				return fmt.Errorf("rendezvous: create job generation in etcd at %s: %w", e.endpoints(), err)
			}
			if !resp.Succeeded {
				kvs = resp.Responses[0].GetResponseRange().Kvs
			}
		}
		g := 0
		if len(kvs) > 0 {
			if g, err = strconv.Atoi(string(kvs[0].Value)); err != nil {
				return fmt.Errorf("rendezvous: bad job generation %q at %s: %w", kvs[0].Value, gk, err)
			}
		}
		k, gs := e.rk.gen(g), strconv.Itoa(g)
		isGen := clientv3.Compare(clientv3.Value(gk), "=", gs)
		reg, err := e.cli.Txn(ctx).
			If(isGen, clientv3.Compare(clientv3.CreateRevision(k.closed()), "=", 0)).
			Then(clientv3.OpPut(k.alive(e.o.NodeID), "", clientv3.WithLease(e.currentLease()))).
			Else(clientv3.OpGet(gk), clientv3.OpGet(k.closed())).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous: register in job generation %d: %w", g, err)
		}
		if reg.Succeeded {
			e.gen, e.k = g, k
			if g > 0 {
				e.log.Info("rendezvous: joined job generation", "generation", g)
			}
			return nil
		}
		if kvs := reg.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || string(kvs[0].Value) != gs {
			continue // a new generation started meanwhile
		}
		// Generation g is closed: start g+1 unless some of its nodes live.
		ops := []clientv3.Op{clientv3.OpPut(gk, strconv.Itoa(g+1)),
			clientv3.OpDelete(k.base, clientv3.WithRange(k.closed())),
			clientv3.OpDelete(k.closed()+"\x00", clientv3.WithRange(clientv3.GetPrefixRangeEnd(k.base)))}
		if g > 0 {
			ops = append(ops, clientv3.OpDelete(e.rk.gen(g-1).base, clientv3.WithPrefix()))
		}
		bump, err := e.cli.Txn(ctx).
			If(isGen, clientv3.Compare(clientv3.CreateRevision(k.alives()), "=", 0).WithPrefix()).
			Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("rendezvous: start job generation %d: %w", g+1, err)
		}
		if bump.Succeeded {
			var ci closeInfo
			if kvs := reg.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
				_ = json.Unmarshal(kvs[0].Value, &ci)
			}
			e.log.Info("rendezvous: run id reused after its job closed; started a new job generation",
				"generation", g+1, "previous_code", ci.Code, "previous_reason", ci.Reason)
			continue
		}
		if time.Now().After(deadline) {
			e.log.Warn("rendezvous: the job is closed and some of its nodes are still alive; not starting a new generation",
				"generation", g)
			e.gen, e.k = g, k
			return nil
		}
		// Wait until those nodes drop their alive keys (or the deadline).
		wctx, cancel := context.WithDeadline(ctx, deadline)
		wch := e.cli.Watch(wctx, k.alives(), clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithRev(bump.Header.Revision+1))
		select {
		case <-wch:
		case <-wctx.Done():
		}
		cancel()
		if ctx.Err() != nil {
			return fmt.Errorf("rendezvous: waiting for the closed job's nodes to exit: %w", ctx.Err())
		}
	}
}

// dropAlive removes this node's alive key once the job is closed, so a new
// job with the same run id can start a new generation while this process
// is still exiting (mu held by the caller; the delete runs in background).
func (e *Etcd) dropAliveLocked() {
	if e.k.base == "" {
		return
	}
	key := e.k.alive(e.o.NodeID)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(e.ctx, 5*time.Second)
		defer cancel()
		if _, err := e.cli.Delete(ctx, key); err != nil {
			e.log.Debug("drop alive key", "err", err)
		}
	}()
}

// supersededErr is what a node of a stale generation gets: the close record
// of its own generation (kept for this), else a generic close.
func (e *Etcd) supersededErr(ctx context.Context) error {
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed == nil {
		if resp, err := e.cli.Get(ctx, e.k.closed()); err == nil && len(resp.Kvs) > 0 {
			var ci closeInfo
			if json.Unmarshal(resp.Kvs[0].Value, &ci) == nil {
				closed = &ci
			}
		}
	}
	if closed == nil {
		closed = &closeInfo{Kind: verdict.FatalError, Code: 1, Reason: fmt.Sprintf("job generation %d of run %s was superseded by a newer one", e.gen, e.o.RunID)}
	}
	return &JobClosedError{Kind: closed.Kind, Code: closed.Code, Reason: closed.Reason}
}
