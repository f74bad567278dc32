package monitor

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/metrics"
)

const (
	// pendingPeerWait is how long a connection whose peer is not (yet) a
	// known rank waits for the next BeginCycle before it is refused: a fast
	// rank may connect before the launcher has registered its pid.
	pendingPeerWait = 3 * time.Second
	// expectedPeerWait is how long a connection from a process announced
	// by Expect (a rank started, or a standby about to be handed its rank,
	// while the launcher may still wait seconds for its peers' standbys)
	// waits for the BeginCycle (or ReplaceRank) that registers it: as long
	// as ft_launcher_client's own handshake timeout.
	expectedPeerWait = 60 * time.Second
	// frameTimeout bounds the time to receive the rest of a message once its
	// first byte has arrived.
	frameTimeout = 10 * time.Second
	// writeTimeout bounds every reply.
	writeTimeout = 10 * time.Second
	chanBuffer   = 256
	maxSunPath   = 107
)

// Options configure a Manager.
type Options struct {
	NLocal    int
	FT        configs.FaultTolerance
	Dir       string // socket directory; "" creates a private temp dir (mode 0700)
	StateFile string // computed timeouts are persisted here; "" disables
	Logger    *slog.Logger
	UID       int // allowed peer uid; 0 means os.Getuid() (root's uid is 0 anyway)
	// MinComputedTimeout is the floor of every timeout the launcher computes
	// (safety_factor × a few milliseconds of observed interval is too tight to
	// survive a GC pause or a loaded node). 0 means DefaultMinComputedTimeout;
	// a negative value disables the floor (tests).
	MinComputedTimeout time.Duration
	// DrainInterval is how often native sessions are read after their
	// handshake (lazy.go). 0 derives it from the timeouts in force:
	// min(10 ms, smallest enabled timeout / 20), at least 1 ms.
	DrainInterval time.Duration
	// Metrics counts refused rank input; nil records nothing.
	Metrics *metrics.Metrics
	// Defaults parametrise the default clocks that hold a rank when the
	// configuration names no rank timeout (defaults.go); the zero value is
	// the launcher's defaults.
	Defaults DefaultClocks
	// OnEvent receives the few rank milestones worth a record (the event
	// log; docs/report.md): each rank's first heartbeat and first "step"
	// of a cycle, every closed "checkpointing" section, and a summary of
	// the steps since the last checkpoint when the cycle ends. Never
	// called for ordinary heartbeats or steps; the launcher's own stalls
	// are recorded too. The records are eventlog's RankFirstHeartbeatEvent,
	// RankFirstStepEvent, RankCheckpointEvent, RankStepsEvent and
	// LauncherStallEvent. nil records nothing.
	OnEvent func(eventlog.Record)
	// Stacks, when set, takes every local rank's stacks when a rank's
	// clock expires, before any is killed, and the rank the stacks name
	// is killed (judge.go). nil: the rank whose clock expired is killed.
	Stacks StackCollector
	// StacksBound bounds the taking of the stacks (0: stacks.DefaultBound).
	StacksBound time.Duration
}

// The kinds of the records given to Options.OnEvent.
const (
	EventFirstHeartbeat = eventlog.RankFirstHeartbeat
	EventFirstStep      = eventlog.RankFirstStep
	EventCheckpoint     = eventlog.RankCheckpoint
	EventCycleSteps     = eventlog.RankSteps
	// EventLauncherStall: the launcher itself did not run (stall.go).
	EventLauncherStall = eventlog.LauncherStall
)

// DefaultMinComputedTimeout is the default floor of computed timeouts.
const DefaultMinComputedTimeout = 5 * time.Second

// Hang is one detected hang and what was done about it.
type Hang struct {
	Cycle, LocalRank, GlobalRank int
	Kind                         HangKind
	Section                      string
	Timeout, Elapsed             time.Duration
	ExpiredAt, SignalledAt       time.Time
	Signal                       syscall.Signal
	Escalated                    bool // the termination signal was not SIGKILL and SIGKILL followed after the grace
	// LastHeartbeat is the rank's last heartbeat before it hung (zero: it
	// sent none in its session).
	LastHeartbeat time.Time
	// DefaultTimeout: the clock that expired was the launcher's default
	// (no rank timeout configured; defaults.go), not one set by the
	// configuration, a computation or the client.
	DefaultTimeout bool
	// Judgement: the stacks taken before the kill and what they said
	// (Options.Stacks); the same for every hang of the cycle. nil without.
	Judgement *Judgement
	// Judged: killed because the stacks named it the culprit, before its
	// own clock ran out.
	Judged bool
}

// WorkloadRequest is a rank's request received on the launcher socket.
type WorkloadRequest struct {
	GlobalRank  int
	Action      WorkloadAction
	Description string
}

// RankStatus is a snapshot of one rank monitor, for logs and tests.
type RankStatus struct {
	LocalRank, GlobalRank, PID int
	Connected                  bool
	Heartbeats                 int64 // this cycle
	OpenSections               []string
	OpenedAt                   map[string]time.Time // open sections → when they opened
	SectionCloses              map[string]int       // this cycle
	Timeouts                   Timeouts             // in force for this rank
}

// Manager runs one rank monitor per local rank inside the launcher process.
type Manager struct {
	opts    Options
	log     *slog.Logger
	dir     string
	ownDir  bool
	dirLock *os.File // holds ownerLockFile's flock while this manager lives
	epoch   time.Time
	ranks   []*rankMon
	rankLn  []*net.UnixListener
	ctlLn   *net.UnixListener
	hangs   chan Hang
	reqs    chan WorkloadRequest
	ipReps  chan InProcessReport
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	ownPgrp int
	// cmOffset converts a client's CLOCK_MONOTONIC time to m.mono();
	// shmOK is false when it could not be sampled (no shm heartbeats then).
	cmOffset int64
	shmOK    bool
	// peerHold and expectedHold are pendingPeerWait and expectedPeerWait
	// (tests shorten them; read under mu).
	peerHold, expectedHold time.Duration
	// stalls records the launcher's own stalls (stall.go).
	stalls *stallLog
	// defaults are the default clocks (Options.Defaults with the constants
	// filled in); defaultsOn: they hold the ranks, as no rank timeout is
	// configured and default_timeouts is on.
	defaults   DefaultClocks
	defaultsOn bool

	mu       sync.Mutex
	judged   *judgement    // the latest cycle's hang judgement (judge.go)
	exchange StackExchange // shares the judgement's evidence job-wide (judge.go); nil: none
	cycle    int
	active   bool
	pids     map[int]int
	// expected: local rank -> the pid Expect announced for the next
	// BeginCycle or ReplaceRank; a peer of it is held longer, never
	// admitted on it alone. Cleared by BeginCycle (per rank by ReplaceRank).
	expected map[int]int
	// cycleCh is closed and replaced whenever pids or expected change
	// (BeginCycle, ReplaceRank, Expect): it wakes the peer checks.
	cycleCh    chan struct{}
	eff        Timeouts // timeouts for the next/current cycle
	configured Timeouts
	clientSet  map[string]bool                  // fields a client set during this cycle
	base       Timeouts                         // m.eff at BeginCycle: what a field falls back to until every rank agrees
	sent       map[string]map[int]time.Duration // this cycle: field → local rank → value it sent
	ckptStamp  string                           // checkpoint-iteration file's state at BeginCycle
	progress   progressTotals                   // the ended cycles' progress (progress.go)
	conns      map[net.Conn]struct{}
	closed     bool

	poll *poller // batched reader of native sessions

	pending     chan struct{} // one token per connection in the peer check
	refusedOnce onceSet       // refused rank input already logged (what/local rank)
	connLog     logLimiter    // refused connections
}

// New binds every socket and loads persisted timeouts.
func New(opts Options) (*Manager, error) {
	if opts.NLocal <= 0 {
		return nil, fmt.Errorf("monitor: NLocal must be positive, got %d", opts.NLocal)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.UID == 0 {
		opts.UID = os.Getuid()
	}
	if opts.FT.RankSectionTimeouts == nil {
		opts.FT.RankSectionTimeouts = map[string]*float64{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Manager{
		opts: opts, log: opts.Logger, epoch: time.Now(),
		hangs: make(chan Hang, chanBuffer), reqs: make(chan WorkloadRequest, chanBuffer), ipReps: make(chan InProcessReport, chanBuffer),
		ctx: ctx, cancel: cancel, pids: map[int]int{}, expected: map[int]int{}, cycleCh: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, clientSet: map[string]bool{}, ownPgrp: syscall.Getpgrp(),
		sent: map[string]map[int]time.Duration{}, pending: make(chan struct{}, maxPendingPeers),
		peerHold: pendingPeerWait, expectedHold: expectedPeerWait,
	}
	m.stalls = newStallLog(stallThreshold, m.mono())
	if err := m.makeDir(); err != nil {
		cancel()
		return nil, err
	}
	if off, err := monoOffset(m.mono); err != nil {
		m.log.Debug("rank monitor: shared-memory heartbeats disabled", "err", err)
	} else {
		m.cmOffset, m.shmOK = off, true
	}
	m.configured = configuredTimeouts(&opts.FT)
	m.defaults = opts.Defaults.withConstants()
	m.defaultsOn = opts.FT.DefaultClocksApply()
	m.eff = m.configured.Clone()
	m.base = m.eff.Clone()
	m.poll = newPoller(m.drainInterval())
	if opts.StateFile != "" {
		u, err := loadState(opts.StateFile)
		switch {
		case err != nil:
			m.log.Warn("ignoring unreadable timeouts state file", "path", opts.StateFile, "err", err)
		case u != nil:
			if opts.Stacks != nil && m.defaultsOn {
				// The judged default clock learns the step clock in each
				// cycle (defaults.go); a heartbeat timeout computed by an
				// earlier launcher would replace it.
				u.Heartbeat = nil
			}
			m.eff.applyUpdate(u)
			m.log.Info("loaded persisted timeouts", "path", opts.StateFile, "timeouts", m.eff.String())
		}
	}
	cfg := rankConfig{log: m.log, record: opts.OnEvent != nil, signal: opts.FT.RankTerminationSignal, judged: opts.Stacks != nil,
		safety: opts.FT.SafetyFactor, defaults: m.defaults, stalls: m.stalls}
	for i := 0; i < opts.NLocal; i++ {
		m.ranks = append(m.ranks, newRankMon(m, cfg, i))
	}
	for i := 0; i < opts.NLocal; i++ {
		ln, err := m.listen(m.RankSocket(i))
		if err != nil {
			m.Close()
			return nil, err
		}
		m.rankLn = append(m.rankLn, ln)
	}
	ln, err := m.listen(m.LauncherSocket())
	if err != nil {
		m.Close()
		return nil, err
	}
	m.ctlLn = ln
	for i, ln := range m.rankLn {
		r := m.ranks[i]
		m.goTracked(func() { m.acceptLoop(ln, func(c *net.UnixConn) { m.serveRank(r, c) }) })
	}
	m.goTracked(func() { m.acceptLoop(m.ctlLn, m.serveControl) })
	m.goTracked(m.runPoller)
	m.goTracked(m.watchStalls)
	return m, nil
}

func (m *Manager) goTracked(f func()) {
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
}

func (m *Manager) mono() int64 { return int64(time.Since(m.epoch)) }

// wall converts a m.mono() time to wall-clock time, for records.
func (m *Manager) wall(mono int64) time.Time { return m.epoch.Add(time.Duration(mono)) }

// emit hands a record to Options.OnEvent; callers hold no lock.
func (m *Manager) emit(rec eventlog.Record) {
	if m.opts.OnEvent != nil && rec != nil {
		m.opts.OnEvent(rec)
	}
}

// RankSocket is the value for FT_RANK_MONITOR_IPC_SOCKET of localRank.
func (m *Manager) RankSocket(localRank int) string {
	return filepath.Join(m.dir, "rmon"+strconv.Itoa(localRank)+".sock")
}

// LauncherSocket is the value for FT_LAUNCHER_IPC_SOCKET.
func (m *Manager) LauncherSocket() string { return filepath.Join(m.dir, "launcher.sock") }

// Hangs delivers one Hang per rank and cycle at most.
func (m *Manager) Hangs() <-chan Hang { return m.hangs }

// Requests delivers workload-control requests from ranks.
func (m *Manager) Requests() <-chan WorkloadRequest { return m.reqs }

// Timeouts returns the timeouts the current (or next) cycle uses.
func (m *Manager) Timeouts() Timeouts {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.eff.Clone()
}

// RankStatus returns a snapshot of one rank monitor.
func (m *Manager) RankStatus(localRank int) RankStatus {
	if localRank < 0 || localRank >= len(m.ranks) {
		return RankStatus{LocalRank: localRank, GlobalRank: -1}
	}
	return m.ranks[localRank].status()
}

// BeginCycle registers this cycle's rank pids (each the leader of its process
// group), resets every rank monitor and starts evaluating timeouts.
func (m *Manager) BeginCycle(cycle int, pids map[int]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cycle, m.active = cycle, true
	m.pids = make(map[int]int, len(pids))
	for k, v := range pids {
		m.pids[k] = v
	}
	clear(m.expected) // announced for this cycle: registered now, or never started
	clear(m.clientSet)
	clear(m.sent)
	m.base = m.eff.Clone()
	m.ckptStamp = fileStamp(m.opts.FT.CheckpointIterationFile)
	m.stalls.prune(m.mono())
	for i, r := range m.ranks {
		m.foldLocked(r) // a cycle that was never ended still counts
		r.begin(cycle, m.pids[i], m.eff.Clone(), m.opts.FT.NumWarmupIterations, m.defaultsOn)
	}
	m.poll.every.Store(int64(m.drainInterval()))
	close(m.cycleCh)
	m.cycleCh = make(chan struct{})
	m.log.Debug("rank monitors: cycle begins", "cycle", cycle, "pids", pids)
}

// Expect announces that pid is about to become local rank's process: the
// next BeginCycle (or ReplaceRank) will register it. A rank starter calls
// it as soon as it knows the pid and before the rank runs its code (a
// --prewarm standby before it is handed its rank), because it may return,
// and the agent call BeginCycle, only seconds later: after waiting for the
// imports of other ranks' standbys. A connection from pid or its
// descendant that comes before the registration is then held for
// expectedPeerWait instead of pendingPeerWait, and admitted only once
// registered: the peer check itself is unchanged. A later Expect for the
// same rank replaces an earlier one (a standby whose handover failed, its
// rank started cold).
func (m *Manager) Expect(localRank, pid int) {
	if localRank < 0 || localRank >= len(m.ranks) || pid <= 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.expected[localRank] = pid
	// Wake a connection of pid that came first: it holds on now.
	close(m.cycleCh)
	m.cycleCh = make(chan struct{})
}

// EndCycle stops evaluating a cycle that did not run to completion (a rank
// failed, or the round ended), folds the observed timing into the computed
// timeouts (effective from the next BeginCycle) and persists them.
func (m *Manager) EndCycle() { m.EndCycleWith(false) }

// EndCycleWith is EndCycle; completed says every rank exited 0, so the
// whole run, checkpoints included, was observed.
func (m *Manager) EndCycleWith(completed bool) {
	// Read what the native sessions have buffered first, outside m.mu (a
	// SetTimeouts message takes it), so the observations are complete.
	for _, r := range m.ranks {
		r.drain()
	}
	var summaries []eventlog.Record
	defer func() {
		// Recorded once m.mu is released (this defer runs last).
		for _, rec := range summaries {
			m.emit(rec)
		}
	}()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.active {
		return
	}
	m.active = false
	obs := observations{SectionMax: map[string]time.Duration{}, SectionCloses: map[string]int{}}
	for _, r := range m.ranks {
		o, sum := r.endWithSummary()
		obs.merge(&o)
		if sum != nil {
			summaries = append(summaries, *sum)
		}
		m.foldLocked(r)
	}
	ckptFileChanged := fileStamp(m.opts.FT.CheckpointIterationFile) != m.ckptStamp
	if ckptFileChanged && obs.SectionCloses[checkpointSection] == 0 {
		// An nvrx job's checkpoint: the iteration file changed.
		m.progress.checkpoints++
	}
	// Heartbeat and out-of-section intervals are trusted only from a cycle
	// that contained a checkpoint, the longest gap in most trainings.
	obs.CheckpointSeen = completed || obs.SectionCloses[checkpointSection] > 0 || ckptFileChanged
	if m.opts.FT.CalculateTimeouts {
		// With the judged default clock, the step clock is learned in
		// every cycle from its own steps, and every expiry is judged: a
		// heartbeat timeout computed here (5 x the longest interval,
		// saves included) would replace it with a far longer one.
		judged := m.opts.Stacks != nil && m.defaultsOn
		next, changes := compute(m.eff, &obs, m.opts.FT.SafetyFactor, m.minComputed(), m.clientSet, judged)
		for _, c := range changes {
			if !c.OldCalculated && c.Old > 0 {
				m.log.Warn("computed timeout replaces a configured one", "timeout", c.Name,
					"configured", c.Old, "computed", c.New, "loosened", c.New > c.Old)
			} else {
				m.log.Info("computed timeout", "timeout", c.Name, "previous", c.Old, "new", c.New)
			}
		}
		m.eff = next
	}
	m.persistLocked(&obs)
}

func (m *Manager) persistLocked(obs *observations) {
	if m.opts.StateFile == "" {
		return
	}
	u := m.eff.toUpdate()
	if u.Heartbeat == nil && u.Section == nil {
		return // nothing calculated: keep whatever is on disk
	}
	if err := saveState(m.opts.StateFile, m.eff, m.cycle, obs); err != nil {
		m.log.Error("persist timeouts", "path", m.opts.StateFile, "err", err)
	}
}

// clientTimeouts records a validated update from local rank local for the
// node (docs/timeouts.md, "Timeouts sent by ranks"): each field becomes the
// tightest value the ranks sent this cycle; it may be looser than the value
// the cycle began with only once every rank of the cycle sent it. So one
// rank can tighten the node's detection but never weaken another rank's.
// The result holds for every rank from the next cycle and is persisted at
// EndCycle.
func (m *Manager) clientTimeouts(local int, cu *clientUpdate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cu.hbSet {
		m.clientSet["heartbeat"] = true
	}
	if cu.secSet {
		m.clientSet["oos"] = true
	}
	for k, d := range cu.fields {
		if name, ok := strings.CutPrefix(k, "section:"); ok {
			m.clientSet["section:"+name] = true
		}
		if m.sent[k] == nil {
			m.sent[k] = map[int]time.Duration{}
		}
		m.sent[k][local] = d
		var v time.Duration
		all := true
		for l, pid := range m.pids {
			if pid <= 0 {
				continue
			}
			if s, ok := m.sent[k][l]; ok {
				v = tighter(v, s)
			} else {
				all = false
			}
		}
		if !all || v <= 0 {
			v = tighter(v, m.base.get(k))
		}
		m.eff.set(k, v, cu.calculated(k))
	}
	m.poll.every.Store(int64(m.drainInterval()))
	m.log.Info("client set timeouts", "local_rank", local, "timeouts", m.eff.String())
}

// refuse counts refused input of kind what from rank r and logs it once per
// rank and kind, so a rank repeating it cannot flood the log.
func (m *Manager) refuse(r *rankMon, what string, err error) {
	m.opts.Metrics.RankInputRefused(what)
	if m.refusedOnce.first(what + "/" + strconv.Itoa(r.local)) {
		r.logger().Warn("rank monitor: refused input from rank (further ones are only counted)", "kind", what, "err", err)
	}
}

// Close stops everything, closes the sockets and removes the socket dir.
func (m *Manager) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.active = false
	m.cancel()
	for _, ln := range m.rankLn {
		ln.Close()
	}
	if m.ctlLn != nil {
		m.ctlLn.Close()
	}
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	for _, r := range m.ranks {
		r.end()
	}
	m.wg.Wait()
	var err error
	for i := range m.ranks {
		_ = os.Remove(m.RankSocket(i))
	}
	_ = os.Remove(m.LauncherSocket())
	if m.ownDir {
		if e := os.RemoveAll(m.dir); e != nil {
			err = fmt.Errorf("monitor: remove socket dir: %w", e)
		}
	}
	m.closeDirLock()
	return err
}

// checkpointSection is the section name nvrx integrations (Megatron, PTL)
// wrap checkpoint saves in.
const checkpointSection = "checkpointing"

// fileStamp identifies the current content of a file by size and mtime; ""
// when the file is unset or missing.
func fileStamp(path *string) string {
	if path == nil || *path == "" {
		return ""
	}
	st, err := os.Stat(*path)
	if err != nil {
		return ""
	}
	return fmt.Sprintf("%d/%d", st.Size(), st.ModTime().UnixNano())
}

// drainInterval is P for m.eff. Caller holds m.mu or is New.
func (m *Manager) drainInterval() time.Duration {
	if m.opts.DrainInterval > 0 {
		return m.opts.DrainInterval
	}
	return drainIntervalFor(&m.eff)
}

func (m *Manager) minComputed() time.Duration {
	switch {
	case m.opts.MinComputedTimeout < 0:
		return 0
	case m.opts.MinComputedTimeout == 0:
		return DefaultMinComputedTimeout
	}
	return m.opts.MinComputedTimeout
}

// FiredHang reports whether the monitor of localRank declared its rank hung
// in cycle. It is recorded before the rank is signalled, so whoever sees the
// rank die can tell a hang kill from any other death even before the Hang
// itself (sent once the signal's outcome is known) arrives on Hangs().
func (m *Manager) FiredHang(cycle, localRank int) (Hang, bool) {
	if localRank < 0 || localRank >= len(m.ranks) {
		return Hang{}, false
	}
	r := m.ranks[localRank]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hang == nil || r.hang.Cycle != cycle {
		return Hang{}, false
	}
	return *r.hang, true
}
