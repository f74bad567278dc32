package monitor

import (
	"context"
	"errors"
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
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
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

	mu     sync.Mutex
	cycle  int
	active bool
	pids   map[int]int
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
			m.eff.applyUpdate(u)
			m.log.Info("loaded persisted timeouts", "path", opts.StateFile, "timeouts", m.eff.String())
		}
	}
	cfg := rankConfig{log: m.log, record: opts.OnEvent != nil, signal: opts.FT.RankTerminationSignal,
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

func (m *Manager) makeDir() error {
	if m.opts.Dir == "" {
		tmp := socketBase(os.TempDir(), m.opts.NLocal)
		if tmp != os.TempDir() {
			m.log.Info("the rank monitors' sockets go under /tmp: $TMPDIR is too long for a Unix socket path",
				"tmpdir", os.TempDir(), "limit_bytes", maxSunPath)
		}
		removeStaleDirs(tmp, m.log)
		d, lock, err := makeLockedDir(tmp)
		if err != nil {
			return err
		}
		m.dir, m.ownDir, m.dirLock = d, true, lock
	} else {
		if _, err := os.Stat(m.opts.Dir); errors.Is(err, os.ErrNotExist) {
			m.ownDir = true
		}
		if err := os.MkdirAll(m.opts.Dir, 0o700); err != nil {
			return fmt.Errorf("monitor: create socket dir: %w", err)
		}
		m.dir = m.opts.Dir
	}
	if err := os.Chmod(m.dir, 0o700); err != nil {
		m.closeDirLock()
		return fmt.Errorf("monitor: chmod socket dir: %w", err)
	}
	return nil
}

// socketBase is where the private socket dir goes: under tmp ($TMPDIR),
// unless the longest socket path there could pass the kernel's limit (a
// scheduler's per-job TMPDIR can be long), then under /tmp, which is
// always short enough.
func socketBase(tmp string, nLocal int) string {
	// ftl-mon-<pid>-<up to 10 random digits>/<longest socket name>
	longest := max(len("launcher.sock"), len("rmon"+strconv.Itoa(max(nLocal-1, 0))+".sock"))
	n := len(filepath.Join(tmp, socketDirPrefix)) + len(strconv.Itoa(os.Getpid())) + 1 + 10 + 1 + longest
	if n > maxSunPath {
		return "/tmp"
	}
	return tmp
}

// socketDirPrefix starts the name of private socket dirs: ftl-mon-<pid>-<rand>.
const socketDirPrefix = "ftl-mon-"

// ownerLockFile, inside a private socket dir, is flock'ed by the launcher
// that owns the dir for as long as it runs; the kernel drops the lock
// when that launcher dies, SIGKILL included.
const ownerLockFile = "owner.lock"

// makeLockedDir creates a private socket dir under tmp whose owner lock is
// already held when the dir appears under its ftl-mon- name (it is built
// under a name removeStaleDirs ignores, then renamed), so no sweeping
// launcher ever sees it unlocked.
func makeLockedDir(tmp string) (string, *os.File, error) {
	build, err := os.MkdirTemp(tmp, ".ftl-mon-new-")
	if err != nil {
		return "", nil, fmt.Errorf("monitor: create socket dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(build, ownerLockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			lock.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("monitor: lock socket dir: %w", err)
	}
	// The owner's pid in the name is informational (and what launchers
	// before the lock file went by); the random part keeps it unique.
	d := filepath.Join(tmp, socketDirPrefix+strconv.Itoa(os.Getpid())+"-"+strings.TrimPrefix(filepath.Base(build), ".ftl-mon-new-"))
	if err := os.Rename(build, d); err != nil {
		lock.Close()
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("monitor: create socket dir: %w", err)
	}
	return d, lock, nil
}

func (m *Manager) closeDirLock() {
	if m.dirLock != nil {
		m.dirLock.Close()
		m.dirLock = nil
	}
}

// removeStaleDirs removes socket dirs under tmp of launchers that are gone,
// owned by this uid: a dir whose owner lock nobody holds, or (a dir made
// before the lock file existed) whose named pid is not running. The lock,
// not the pid, decides whenever there is one: a launcher in another PID
// namespace (unshare --pid, a container sharing /tmp) has a pid this one
// cannot see, and removing its dir would cut its ranks off their monitors.
func removeStaleDirs(tmp string, log *slog.Logger) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), socketDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		// Another launcher sharing this $TMPDIR may remove the same dir
		// first: Info then fails and there is nothing left to do.
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		lock, err := os.OpenFile(filepath.Join(dir, ownerLockFile), os.O_RDWR, 0)
		switch {
		case err == nil:
			held := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			if !held {
				removeDir(dir, pid, log)
			}
			lock.Close()
		case errors.Is(err, os.ErrNotExist):
			if !pidRunning(pid) {
				removeDir(dir, pid, log)
			}
		}
	}
}

func removeDir(dir string, pid int, log *slog.Logger) {
	if err := os.RemoveAll(dir); err == nil {
		log.Debug("rank monitor: removed the socket dir of a dead launcher", "dir", filepath.Base(dir), "pid", pid)
	}
}

// pidRunning: kill(pid, 0) finds it (EPERM: it exists, another user's).
func pidRunning(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

func (m *Manager) listen(path string) (*net.UnixListener, error) {
	if len(path) > maxSunPath {
		return nil, fmt.Errorf("monitor: socket path %q longer than %d bytes", path, maxSunPath)
	}
	_ = os.Remove(path) // stale socket from an earlier run
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("monitor: listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("monitor: chmod %s: %w", path, err)
	}
	return ln, nil
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
		next, changes := compute(m.eff, &obs, m.opts.FT.SafetyFactor, m.minComputed(), m.clientSet)
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

// track registers c for Close; it returns false when the manager is closed.
func (m *Manager) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *Manager) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
}

func (m *Manager) acceptLoop(ln *net.UnixListener, serve func(*net.UnixConn)) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if m.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			m.log.Warn("monitor: accept", "err", err)
			select {
			case <-time.After(10 * time.Millisecond):
			case <-m.ctx.Done():
				return
			}
			continue
		}
		if !m.track(c) {
			c.Close()
			return
		}
		m.goTracked(func() {
			defer m.untrack(c)
			defer c.Close()
			serve(c)
		})
	}
}

// admitRank checks the peer of a rank connection and installs it. It returns
// the connection generation, or false when the peer was refused.
func (m *Manager) admitRank(r *rankMon, c *net.UnixConn) (uint64, bool) {
	refused := func(msg string, args ...any) (uint64, bool) {
		m.opts.Metrics.RankInputRefused("connection")
		m.connLog.log(m.log, "rank monitor: "+msg, append([]any{"local_rank", r.local}, args...)...)
		return 0, false
	}
	select {
	case m.pending <- struct{}{}:
		defer func() { <-m.pending }()
	default:
		return refused("refusing connection: too many waiting for the peer check", "limit", maxPendingPeers)
	}
	cred, err := peerCred(c)
	if err != nil {
		return refused("cannot read peer credentials; refusing", "err", err)
	}
	if int(cred.Uid) != m.opts.UID {
		return refused("refusing peer with another uid", "peer_pid", cred.Pid, "peer_uid", cred.Uid)
	}
	since := time.Now()
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return 0, false
		}
		pid := m.pids[r.local]
		if m.active && pid > 0 && inRankTree(int(cred.Pid), pid) {
			// Installed under m.mu so a concurrent BeginCycle cannot
			// interleave between the check and the install.
			gen := r.install(c)
			m.mu.Unlock()
			return gen, true
		}
		// Not (yet) the rank: held until the registration can come. A
		// process the rank starter announced (Expect) may wait for it
		// while the starter waits for other ranks' standbys.
		exp := m.expected[r.local]
		hold, announced := m.peerHold, false
		if exp > 0 && inRankTree(int(cred.Pid), exp) {
			hold, announced = m.expectedHold, true
		}
		ch := m.cycleCh
		m.mu.Unlock()
		left := hold - time.Since(since)
		if left > 0 {
			t := time.NewTimer(left)
			select {
			case <-ch:
				t.Stop()
				continue
			case <-t.C:
			case <-m.ctx.Done():
				t.Stop()
				return 0, false
			}
		}
		if announced {
			return refused("refusing peer: announced as the rank's process, but not registered in time",
				"peer_pid", cred.Pid, "peer_uid", cred.Uid, "rank_pid", pid, "expected_pid", exp, "waited", hold)
		}
		return refused("refusing peer that is not the rank or its descendant",
			"peer_pid", cred.Pid, "peer_uid", cred.Uid, "rank_pid", pid)
	}
}

// serveRank runs one rank connection: peer check, protocol detection, session.
func (m *Manager) serveRank(r *rankMon, c *net.UnixConn) {
	gen, ok := m.admitRank(r, c)
	if !ok {
		return
	}
	defer r.disconnect(gen)
	dc := &deadlineConn{Conn: c}
	br := newReader(dc)
	first, err := br.Peek(1)
	if err != nil {
		return
	}
	log := r.logger()
	switch first[0] {
	case ftwire.Magic[0]:
		err = m.serveNative(r, gen, c, dc, br)
	case 0x00:
		err = m.serveNvrx(r, gen, dc, br)
	default:
		err = fmt.Errorf("unknown protocol (first byte %#x)", first[0])
	}
	if err != nil && m.ctx.Err() == nil && r.gen.Load() == gen {
		log.Error("rank monitor: closing connection", "err", err)
	}
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
