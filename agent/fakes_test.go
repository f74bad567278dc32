package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// The agent's unit tests drive the state machine through fakes of the
// rendezvous, the ranks and the monitors (the integration package runs the
// real ones). Each fake records the calls it got.

type failCall struct {
	round  int
	kind   policy.Failure
	reason string
}

type shutdownCall struct {
	kind verdict.Kind
	code int
}

// fakeRdzv is a scripted rendezvous: each method runs its hook, or a
// default that suits the happy path.
type fakeRdzv struct {
	mu       sync.Mutex
	next     []func(ctx context.Context) (rendezvous.Assignment, error) // consumed in order
	fail     func(ctx context.Context, c failCall) (rendezvous.Decision, error)
	succeed  func(ctx context.Context, round int) (int, error)
	shutdown func(ctx context.Context) error
	ends     map[int]chan rendezvous.RoundEnd

	fails     []failCall
	shutdowns []shutdownCall
	leaves    []string
	departs   []string
	nexts     int
}

func newFakeRdzv() *fakeRdzv { return &fakeRdzv{ends: map[int]chan rendezvous.RoundEnd{}} }

func active(round, restarts int) func(context.Context) (rendezvous.Assignment, error) {
	return func(context.Context) (rendezvous.Assignment, error) {
		return rendezvous.Assignment{RunID: "job", Round: round, GroupWorldSize: 1, WorldSize: 2,
			MasterAddr: "127.0.0.1", MasterPort: 29500, MaxRestarts: 3, RestartsUsed: restarts}, nil
	}
}

func standbyIn(round int) func(context.Context) (rendezvous.Assignment, error) {
	return func(context.Context) (rendezvous.Assignment, error) {
		return rendezvous.Assignment{RunID: "job", Round: round, GroupRank: -1, Standby: true, MaxRestarts: 3}, nil
	}
}

func nextErr(err error) func(context.Context) (rendezvous.Assignment, error) {
	return func(context.Context) (rendezvous.Assignment, error) { return rendezvous.Assignment{}, err }
}

// blockUntilDone blocks until ctx ends, as a call to an unreachable etcd.
func blockUntilDone(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

func (f *fakeRdzv) Next(ctx context.Context) (rendezvous.Assignment, error) {
	f.mu.Lock()
	i := f.nexts
	f.nexts++
	f.mu.Unlock()
	if i >= len(f.next) {
		return rendezvous.Assignment{}, &rendezvous.JobClosedError{Kind: verdict.FatalError, Code: 1, Reason: "fake: no more rounds scripted"}
	}
	return f.next[i](ctx)
}

func (f *fakeRdzv) Ended(round int) <-chan rendezvous.RoundEnd {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch, ok := f.ends[round]
	if !ok {
		ch = make(chan rendezvous.RoundEnd, 1)
		f.ends[round] = ch
	}
	return ch
}

func (f *fakeRdzv) endRound(round int, e rendezvous.RoundEnd) {
	f.Ended(round)
	f.mu.Lock()
	ch := f.ends[round]
	f.mu.Unlock()
	ch <- e
}

func (f *fakeRdzv) Fail(ctx context.Context, round int, k policy.Failure, reason string) (rendezvous.Decision, error) {
	c := failCall{round, k, reason}
	f.mu.Lock()
	f.fails = append(f.fails, c)
	hook := f.fail
	f.mu.Unlock()
	if hook != nil {
		return hook(ctx, c)
	}
	return rendezvous.Decision{Restart: true, Action: policy.RestartInPlace, RestartsUsed: round + 1}, nil
}

func (f *fakeRdzv) Succeed(ctx context.Context, round int) (int, error) {
	if f.succeed != nil {
		return f.succeed(ctx, round)
	}
	return 0, nil
}

func (f *fakeRdzv) Shutdown(ctx context.Context, kind verdict.Kind, code int, reason string) error {
	f.mu.Lock()
	f.shutdowns = append(f.shutdowns, shutdownCall{kind, code})
	hook := f.shutdown
	f.mu.Unlock()
	if hook != nil {
		return hook(ctx)
	}
	return nil
}

func (f *fakeRdzv) Leave(ctx context.Context, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leaves = append(f.leaves, reason)
	return nil
}

// Depart is a no-op here (added with the interface method; rendezvous tests cover it).
func (f *fakeRdzv) Depart(ctx context.Context, reason string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.departs = append(f.departs, reason)
	return nil
}

func (f *fakeRdzv) Close() error { return nil }

// fakeRanks starts fakeGroups; the test makes their ranks exit.
type fakeRanks struct {
	mu       sync.Mutex
	groups   []*fakeGroup
	started  chan *fakeGroup
	startErr error
	// stopBlocks makes Stop wait for SignalAll(SIGKILL) or the grace.
	stopBlocks bool
	// onStart runs as a group starts, before the agent sees it.
	onStart func(g *fakeGroup)
}

func newFakeRanks() *fakeRanks { return &fakeRanks{started: make(chan *fakeGroup, 16)} }

func (r *fakeRanks) StartGroup(specs []spawn.Spec) (RankGroup, error) {
	for _, s := range specs {
		// The agent hands the log ends over; close them as a process would.
		if s.Stdout != nil {
			s.Stdout.Close()
		}
		if s.Stderr != nil && s.Stderr != s.Stdout {
			s.Stderr.Close()
		}
	}
	if r.startErr != nil {
		return nil, r.startErr
	}
	g := &fakeGroup{n: len(specs), exits: make(chan spawn.Exit, len(specs)), alive: map[int]bool{},
		killed: make(chan struct{}), stopBlocks: r.stopBlocks, specs: specs}
	for _, s := range specs {
		g.alive[s.LocalRank] = true
	}
	r.mu.Lock()
	r.groups = append(r.groups, g)
	r.mu.Unlock()
	if r.onStart != nil {
		r.onStart(g)
	}
	r.started <- g
	return g, nil
}

// wait returns the next started group.
func (r *fakeRanks) wait(t *testing.T) *fakeGroup {
	t.Helper()
	select {
	case g := <-r.started:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("no ranks started")
		return nil
	}
}

type fakeGroup struct {
	mu         sync.Mutex
	n          int
	specs      []spawn.Spec
	exits      chan spawn.Exit
	alive      map[int]bool
	stopped    []syscall.Signal
	signalled  []syscall.Signal
	killed     chan struct{}
	killOnce   sync.Once
	stopBlocks bool
	ending     map[int]bool // local ranks Ending reports although they have not exited
}

func (g *fakeGroup) PIDs() map[int]int {
	m := map[int]int{}
	for i := 0; i < g.n; i++ {
		lr := i
		if i < len(g.specs) {
			lr = g.specs[i].LocalRank
		}
		m[lr] = 1000 + lr
	}
	return m
}

// Ending reports a rank that exited, or that the test marked as ending
// (killed, its exit not delivered yet).
func (g *fakeGroup) Ending(lr int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.alive[lr] || g.ending[lr]
}

func (g *fakeGroup) Exits() <-chan spawn.Exit { return g.exits }

// exit makes local rank lr exit with code (sig != 0: killed by sig).
func (g *fakeGroup) exit(lr, code int, sig syscall.Signal) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.alive[lr] {
		return
	}
	delete(g.alive, lr)
	if sig != 0 {
		code = -1
	}
	g.exits <- spawn.Exit{LocalRank: lr, PID: 1000 + lr, Code: code, Signal: sig, At: time.Now()}
}

func (g *fakeGroup) Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult {
	g.mu.Lock()
	g.stopped = append(g.stopped, sig)
	g.mu.Unlock()
	if g.stopBlocks {
		select {
		case <-g.killed:
		case <-time.After(grace):
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var res spawn.StopResult
	for lr := 0; lr < g.n; lr++ {
		if g.alive[lr] {
			delete(g.alive, lr)
			res.Exits = append(res.Exits, spawn.Exit{LocalRank: lr, PID: 1000 + lr, Code: -1, Signal: sig, At: time.Now()})
		}
	}
	return res
}

func (g *fakeGroup) SignalAll(sig syscall.Signal) {
	g.mu.Lock()
	g.signalled = append(g.signalled, sig)
	g.mu.Unlock()
	if sig == syscall.SIGKILL {
		g.killOnce.Do(func() { close(g.killed) })
	}
}

// fakeMonitors lets a test report hangs and workload requests.
type fakeMonitors struct {
	hangs chan monitor.Hang
	reqs  chan monitor.WorkloadRequest // unbuffered: a send returns once the agent has the request
	mu    sync.Mutex
	fired map[int]bool  // local rank -> the monitor killed it
	hang  *monitor.Hang // what FiredHang returns for its local rank (nil: a zero Hang)
	ended []bool
}

func newFakeMonitors() *fakeMonitors {
	return &fakeMonitors{hangs: make(chan monitor.Hang, 4), reqs: make(chan monitor.WorkloadRequest), fired: map[int]bool{}}
}

func (m *fakeMonitors) BeginCycle(int, map[int]int) {}
func (m *fakeMonitors) EndCycleWith(ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ended = append(m.ended, ok)
}
func (m *fakeMonitors) Hangs() <-chan monitor.Hang               { return m.hangs }
func (m *fakeMonitors) Requests() <-chan monitor.WorkloadRequest { return m.reqs }
func (m *fakeMonitors) RankSocket(lr int) string                 { return "/nonexistent/rank.sock" }
func (m *fakeMonitors) LauncherSocket() string                   { return "/nonexistent/launcher.sock" }
func (m *fakeMonitors) Judged(context.Context, int) (*monitor.Judgement, bool) {
	return nil, false
}

func (m *fakeMonitors) FiredHang(cycle, lr int) (monitor.Hang, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.hang != nil && m.hang.LocalRank == lr {
		return *m.hang, m.fired[lr]
	}
	return monitor.Hang{}, m.fired[lr]
}

// harness is one agent wired to fakes.
type harness struct {
	t     *testing.T
	cfg   *configs.Config
	rdzv  *fakeRdzv
	ranks *fakeRanks
	mons  *fakeMonitors
	sigs  chan os.Signal
	agent *Agent
	env   []string
	// callTimeout bounds short rendezvous calls (default 5s).
	callTimeout time.Duration
	met         *metrics.Metrics
	walltime    []os.Signal
	// walltimeSettle is Deps.WalltimeSettle.
	walltimeSettle time.Duration
	// repeatWindow is Deps.SignalRepeatWindow (0: the default).
	repeatWindow time.Duration
	spare        *fakeSpare
	store        *memStore // the job's ledger; a lost peer's lease is put here first
	agentStore   Store     // nil: --agent-store off
	monitors     Monitors  // nil: mons (inprocess_test.go passes monitors with in-process support)
	eventsPath   string    // the agent's JSON-lines event log (set by start)
	// speed, speedInterval, demand: Deps.Speed, SpeedInterval, Demand.
	speed         SpeedExchange
	speedInterval time.Duration
	demand        func(pgid int) (time.Duration, bool)

	// logHandler takes the agent's logs (nil: discarded).
	logHandler slog.Handler
	// ctx is Run's context (nil: context.Background()).
	ctx context.Context
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	cfg := &configs.Config{NNodes: configs.NNodes{Min: 1, Max: 1}, NProcPerNode: 2, MaxRestarts: 3,
		RdzvID: "job", Role: "default", NoPython: true, Script: "/bin/true",
		WorkersStopTimeout: 2 * time.Second, TermTimeout: 2 * time.Second, FT: configs.DefaultFaultTolerance()}
	cfg.FT.TerminationGrace = 0.1
	return &harness{t: t, cfg: cfg, rdzv: newFakeRdzv(), ranks: newFakeRanks(), mons: newFakeMonitors(),
		sigs: make(chan os.Signal, 4), callTimeout: 5 * time.Second, met: metrics.New()}
}

func (h *harness) start() <-chan Outcome {
	h.t.Helper()
	logs, err := ranklogs.New(ranklogs.Options{LogDir: h.t.TempDir(), RunID: "job", Console: io.Discard, ConsoleErr: io.Discard})
	if err != nil {
		h.t.Fatal(err)
	}
	var spare Spare
	if h.spare != nil {
		spare = h.spare
	}
	var book *ledger.Book
	if h.store != nil {
		book = ledger.NewBook("job", "10.0.0.1/42", "host-a", func(err error) { h.t.Error(err) }, h.store)
	}
	h.eventsPath = filepath.Join(h.t.TempDir(), "events.jsonl")
	events, err := eventlog.Open(h.eventsPath, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { events.Close() })
	logHandler := h.logHandler
	if logHandler == nil {
		logHandler = slog.DiscardHandler
	}
	h.agent = New(Deps{Spare: spare, Ledger: book, Config: h.cfg, Logger: slog.New(logHandler), Metrics: h.met, Ranks: h.ranks, Logs: logs, Events: events,
		Monitors: h.mons, Rdzv: h.rdzv, Signals: h.sigs, Hostname: "host-a", NodeID: "10.0.0.1/42",
		Environ: h.env, CallTimeout: h.callTimeout, WalltimeSignals: h.walltime, WalltimeSettle: h.walltimeSettle, Store: h.agentStore,
		SignalRepeatWindow: h.repeatWindow, Speed: h.speed, SpeedInterval: h.speedInterval, Demand: h.demand})
	if h.monitors != nil {
		h.agent.d.Monitors = h.monitors
	}
	out := make(chan Outcome, 1)
	ctx := h.ctx
	if ctx == nil {
		ctx = context.Background()
	}
	go func() { out <- h.agent.Run(ctx) }()
	return out
}

func (h *harness) outcome(out <-chan Outcome) Outcome {
	h.t.Helper()
	select {
	case o := <-out:
		return o
	case <-time.After(60 * time.Second): // generous: a loaded machine is slow, never wrong
		h.t.Fatalf("agent did not end (state %v)", h.agent.State())
		return Outcome{}
	}
}

// events reads the agent's event log: the records of kind.
func (h *harness) events(kind string) []map[string]any {
	h.t.Helper()
	all, err := eventlog.Read(h.eventsPath)
	if err != nil {
		h.t.Fatal(err)
	}
	var out []map[string]any
	for _, e := range all {
		if e["event"] == kind {
			out = append(out, e)
		}
	}
	return out
}

// metric reads one sample of the harness's metrics (labels as name{k="v"}).
func (h *harness) metric(name string) float64 {
	h.t.Helper()
	mfs, err := h.met.Registry.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			full := mf.GetName()
			for _, l := range m.GetLabel() {
				full += "{" + l.GetName() + "=\"" + l.GetValue() + "\"}"
			}
			if full == name {
				if c := m.GetCounter(); c != nil {
					return c.GetValue()
				}
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// fakeSpare records what the agent asks of a spare's filler.
type fakeSpare struct {
	mu       sync.Mutex
	calls    []string
	reclaimE error
}

func (s *fakeSpare) record(c string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}
func (s *fakeSpare) Park() { s.record("park") }
func (s *fakeSpare) Reclaim(context.Context) (time.Duration, error) {
	s.record("reclaim")
	return 3 * time.Millisecond, s.reclaimE
}
func (s *fakeSpare) Close() { s.record("close") }

// memStore is a job-wide ledger store in memory (several nodes' leases).
type memStore struct {
	mu   sync.Mutex
	recs map[string]ledger.Record
}

func newMemStore() *memStore { return &memStore{recs: map[string]ledger.Record{}} }

func (m *memStore) Put(_ context.Context, r ledger.Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[r.ID()] = r
	return nil
}

func (m *memStore) CloseOpen(_ context.Context, node string, reason ledger.Reason, detail, by string, at time.Time) (ledger.Record, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, r := range m.recs {
		if r.Node == node && r.Open() {
			r.End, r.Reason, r.Detail, r.ClosedBy = &at, reason, detail, by
			m.recs[id] = r
			return r, true, nil
		}
	}
	return ledger.Record{}, false, nil
}

func (m *memStore) all() []ledger.Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ledger.Record, 0, len(m.recs))
	for _, r := range m.recs {
		out = append(out, r)
	}
	ledger.SortByChange(out)
	return out
}

func want(t *testing.T, o Outcome, kind verdict.Kind, code int) {
	t.Helper()
	if o.Kind != kind || o.ExitCode() != code {
		t.Fatalf("outcome %s (exit %d), reason %q; want %s (exit %d)", o.Kind, o.ExitCode(), o.Reason, kind, code)
	}
	if o.Reason == "" || o.EndedAt.IsZero() || o.StartedAt.IsZero() {
		t.Errorf("outcome without reason or times: %+v", o)
	}
}

func wantQuarantine(t *testing.T, o Outcome, node string, ev verdict.Evidence) {
	t.Helper()
	for _, q := range o.Quarantined {
		if q.Node == node && q.Evidence == ev && q.Detail != "" {
			return
		}
	}
	t.Errorf("no quarantine of %s with %s in %+v", node, ev, o.Quarantined)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
