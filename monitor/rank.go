package monitor

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// initInfo is what a client tells the monitor when its session starts
// (native Hello or nvrx InitMsg).
type initInfo struct {
	globalRank     int
	pid            int
	iteration      *int64
	numWarmupIters *int64
	inprocess      bool // registered for in-process restarts (native Hello)
}

// rankHost is what a rank monitor needs of the Manager that runs it: the
// monitor's clock, and where its records, refused input and hangs go. A
// rankMon holds this and its rankConfig, never the Manager itself, so what
// a rank can reach of the manager is written down here.
type rankHost interface {
	// mono is the monitor's monotonic clock: ns since its epoch.
	mono() int64
	// wall converts a mono() time to wall-clock time, for records.
	wall(mono int64) time.Time
	// emit writes a record (Options.OnEvent); callers hold no lock.
	emit(eventlog.Record)
	// refuse counts input the rank sent beyond the limits, logging it once.
	refuse(r *rankMon, what string, err error)
	// hung terminates the hung rank pid in the background and reports h.
	hung(h Hang, pid int)
	// judging reports whether an expired clock is judged from the
	// stacks (judge.go) rather than handed to hung at once.
	judging() bool
	// expired judges r's expired clock h in the background, then kills
	// the rank it names (judge.go).
	expired(r *rankMon, h Hang, pid int)
}

// rankConfig is what a rank monitor reads of the manager's settings, all
// fixed when the manager is made.
type rankConfig struct {
	log      *slog.Logger
	record   bool           // Options.OnEvent is set: records are worth building
	signal   syscall.Signal // FT.RankTerminationSignal: what a hung rank is sent first
	safety   float64        // FT.SafetyFactor, for the default clocks' learned timeout
	defaults DefaultClocks  // with their constants filled in (defaults.go)
	stalls   *stallLog      // the launcher's own stalls (stall.go), shared by every rank
	judged   bool           // expiries are judged from the stacks (Options.Stacks; judge.go)
}

// rankMon is the monitor of one local rank. The heartbeat hot path touches
// only atomics; everything else is under mu. One timer per rank is armed at
// the earliest deadline and re-armed lazily: heartbeats only push deadlines
// later, so a timer that fires early just re-evaluates and re-arms.
type rankMon struct {
	host  rankHost
	cfg   rankConfig
	local int

	gen    atomic.Uint64 // generation of the current connection; stale connections are ignored
	phase  atomic.Uint32 // a rankPhase; written under mu, read lock-free by the heartbeat hot path
	lastHB atomic.Int64  // monotonic ns since m.epoch
	maxIv  atomic.Int64  // longest heartbeat interval this cycle
	// steadyIv is what the judged default clock learns from (defaults.go):
	// the third longest of the last len(steady) intervals of this cycle
	// after the first LearnIntervals/2 (compilation, warm-up), so that a
	// rare save or evaluation, which the judgement spares, does not
	// lengthen the clock that catches hangs. Written by the hot path.
	steadyIv   atomic.Int64
	steadyN    atomic.Int64
	steady     [steadyWindow]atomic.Int64
	nIv        atomic.Int64 // heartbeat intervals this cycle
	heartbeats atomic.Int64 // heartbeats received this cycle (status only)

	mu          sync.Mutex
	conn        io.Closer // net.Conn, or *lazyConn after a native handshake
	cycle       int
	pid         int
	globalRank  int
	hang        *Hang // what fired this cycle, recorded before the rank is signalled; kept after the cycle ends
	to          Timeouts
	initAt      int64
	open        map[string]int64 // open sections → opened at
	oosStart    int64
	stepSeen    bool
	stepOpens   int64
	iterKnown   bool
	initialIter int64
	currentIter int64
	warmupIters int64
	timer       *time.Timer
	armed       int64 // deadline the timer is set for; 0 = not armed
	obs         observations
	inprocess   bool // the current connection registered for in-process restarts
	// defaults: the launcher's default clocks apply this cycle (defaults.go);
	// atomic because the heartbeat hot path reads it.
	defaults atomic.Bool
	probe    activityProbe // a default clock's expiry being checked against the rank's activity
	deferTo  int64         // a default clock does not expire before this (the rank was busy); 0 none
	// judgingExpiry: an expired clock of this cycle is being judged
	// (judge.go); the timer does not hand it over again.
	judgingExpiry bool
	// spareTo: no clock expires before this; the rank waits in a
	// collective for a culprit found on this node (judge.go). 0 none.
	spareTo int64
	rec     cycleRecord
	pending []eventlog.Record // recorded under mu, emitted by unlockAndRecord
}

// recordLocked queues a record of the rank for Options.OnEvent.
func (r *rankMon) recordLocked(rec eventlog.Record) {
	if r.cfg.record {
		r.pending = append(r.pending, rec)
	}
}

// unlockAndRecord releases mu, then emits the queued records (writing the
// event log is I/O, not done under the rank's lock).
func (r *rankMon) unlockAndRecord() {
	p := r.pending
	r.pending = nil
	r.mu.Unlock()
	for _, rec := range p {
		r.host.emit(rec)
	}
}

// cycleRecord is what a rank did this cycle that is worth a record
// (Options.OnEvent), across its sessions.
type cycleRecord struct {
	firstHB, firstStep bool  // already recorded
	steps              int64 // "step" sections opened
	stepsAtCkpt        int64 // steps when the last checkpoint closed
	checkpoints        int64
	lastStepAt         int64 // mono time of the last step opened; 0 none

	// For the verdict's progress and rank failures (progress.go).
	connected        bool  // a session began this cycle
	iterSteps        int64 // new iterations carried by sections other than "step"
	iterSeen         bool
	iterMin, iterMax int64
	lastIter         int64
	folded           bool // added to the manager's totals

	// computeNS is the time the rank spent in closed "compute" sections
	// this cycle (ComputeSection; the straggler measurement's own-work
	// time where the client reports it).
	computeNS   int64
	computeSeen bool
}

func newRankMon(host rankHost, cfg rankConfig, local int) *rankMon {
	r := &rankMon{host: host, cfg: cfg, local: local, globalRank: -1, open: map[string]int64{}}
	r.timer = time.AfterFunc(time.Hour, r.onTimer)
	r.timer.Stop()
	return r
}

// begin resets the rank for a new cycle. Caller holds m.mu.
func (r *rankMon) begin(cycle, pid int, to Timeouts, warmup int, defaults bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		r.conn.Close()
		r.conn = nil
	}
	r.gen.Add(1)
	r.resetSessionLocked()
	r.cycle, r.pid, r.to, r.warmupIters = cycle, pid, to, int64(warmup)
	r.defaults.Store(defaults)
	r.hang = nil
	if p := r.loadPhase(); p != phaseIdle && p != phaseEnded {
		r.setPhaseLocked(phaseEnded) // the previous cycle was never ended
	}
	if pid > 0 {
		r.setPhaseLocked(phaseWaiting)
	} else {
		r.setPhaseLocked(phaseIdle)
	}
	r.globalRank = -1
	r.rec = cycleRecord{}
	r.inprocess = false
	r.obs = observations{SectionMax: map[string]time.Duration{}, SectionCloses: map[string]int{}}
	r.maxIv.Store(0)
	r.steadyIv.Store(0)
	r.steadyN.Store(0)
	for i := range r.steady {
		r.steady[i].Store(0)
	}
	r.nIv.Store(0)
	r.heartbeats.Store(0)
}

// end stops evaluation and returns this cycle's observations.
func (r *rankMon) end() observations {
	o, _ := r.endWithSummary()
	return o
}

// endWithSummary is end, with the record of the cycle's steps (nil when
// the rank never opened a "step" section this cycle).
func (r *rankMon) endWithSummary() (observations, *eventlog.RankStepsEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum *eventlog.RankStepsEvent
	if r.rec.steps > 0 && r.loadPhase() != phaseIdle && r.loadPhase() != phaseEnded {
		sum = &eventlog.RankStepsEvent{Round: r.cycle, LocalRank: r.local, Rank: r.globalRank,
			Steps: r.rec.steps, StepsSinceCheckpoint: r.rec.steps - r.rec.stepsAtCkpt,
			Checkpoints: r.rec.checkpoints, LastStepAt: r.host.wall(r.rec.lastStepAt)}
	}
	if r.loadPhase() != phaseIdle {
		r.setPhaseLocked(phaseEnded)
	}
	r.timer.Stop()
	r.armed = 0
	o := r.obs
	o.HeartbeatMax = time.Duration(r.maxIv.Load())
	o.Heartbeats = r.nIv.Load()
	return o, sum
}

// loadPhase returns the current phase.
func (r *rankMon) loadPhase() rankPhase { return rankPhase(r.phase.Load()) }

// setPhaseLocked moves the rank to phase to, logging an illegal transition
// (a bug) but making it anyway so the monitor follows what happened.
func (r *rankMon) setPhaseLocked(to rankPhase) {
	from := r.loadPhase()
	if !phaseTransitionOK(from, to) {
		r.cfg.log.Error("rank monitor: illegal phase transition", "local_rank", r.local, "cycle", r.cycle, "from", from, "to", to)
	}
	r.phase.Store(uint32(to))
}

// endSessionLocked returns a rank whose session ended to waiting for the
// next one. A hung rank stays hung: nothing more is evaluated this cycle.
func (r *rankMon) endSessionLocked() {
	if r.loadPhase().inSession() {
		r.setPhaseLocked(phaseWaiting)
	}
	r.resetSessionLocked()
}

// resetSessionLocked clears every clock of the session.
func (r *rankMon) resetSessionLocked() {
	r.lastHB.Store(0)
	r.probe, r.deferTo = activityProbe{}, 0
	r.judgingExpiry, r.spareTo = false, 0
	clear(r.open)
	r.stepSeen, r.stepOpens, r.iterKnown = false, 0, false
	r.initialIter, r.currentIter = 0, 0
}

// handover replaces connection gen's net.Conn by its batched reader.
func (r *rankMon) handover(gen uint64, lc *lazyConn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen.Load() != gen {
		return false
	}
	r.conn = lc
	return true
}

// drain processes whatever the rank's native session has buffered.
func (r *rankMon) drain() {
	r.mu.Lock()
	lc, _ := r.conn.(*lazyConn)
	r.mu.Unlock()
	if lc != nil {
		lc.drain()
	}
}

// install makes c the rank's connection, closing the previous one at once.
// It returns the new connection's generation.
func (r *rankMon) install(c net.Conn) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn != nil {
		r.cfg.log.Warn("rank monitor: new connection replaces the previous one", "local_rank", r.local, "cycle", r.cycle)
		r.conn.Close()
		r.warnOpenLocked("replaced")
		r.endSessionLocked()
	}
	r.conn = c
	return r.gen.Add(1)
}

// disconnect handles the end of connection gen. It never kills the rank.
func (r *rankMon) disconnect(gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen.Load() != gen {
		return
	}
	r.conn = nil
	r.inprocess = false
	r.gen.Add(1)
	r.warnOpenLocked("disconnected")
	r.endSessionLocked()
}

func (r *rankMon) warnOpenLocked(why string) {
	if len(r.open) > 0 {
		names := make([]string, 0, len(r.open))
		for s := range r.open {
			names = append(names, s)
		}
		slices.Sort(names)
		r.cfg.log.Warn("rank monitor: client "+why+" with sections open", "local_rank", r.local, "cycle", r.cycle, "sections", names)
	}
}

// init starts a session: all clocks start now.
func (r *rankMon) init(gen uint64, info initInfo) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen.Load() != gen {
		return false
	}
	r.globalRank = info.globalRank
	r.inprocess = info.inprocess
	if p := r.loadPhase(); p != phaseWaiting && !p.inSession() {
		// Hung, or no cycle running: keep the connection, evaluate nothing.
		return true
	}
	now := r.host.mono()
	r.resetSessionLocked()
	r.setPhaseLocked(phaseInitial)
	r.initAt, r.oosStart = now, now
	if info.numWarmupIters != nil && *info.numWarmupIters >= 0 {
		r.warmupIters = *info.numWarmupIters
	}
	if info.iteration != nil {
		r.iterKnown, r.initialIter, r.currentIter = true, *info.iteration, *info.iteration
	}
	r.rec.connected = true
	r.noteIterLocked("", info.iteration)
	r.rearmLocked(now)
	return true
}

// heartbeat records a heartbeat arriving now.
func (r *rankMon) heartbeat(gen uint64) { r.heartbeatAt(gen, r.host.mono()) }

// heartbeatAt is the hot path; now is when it was read.
func (r *rankMon) heartbeatAt(gen uint64, now int64) { r.heartbeatsAt(gen, now, 1) }

// heartbeatsAt records k heartbeats, the last one at now. Shared-memory
// heartbeats arrive this way: k > 1 when several were stored between two
// reads, and then the k intervals are merged into one whose length (an
// upper bound of their maximum) feeds the interval statistics.
func (r *rankMon) heartbeatsAt(gen uint64, now, k int64) {
	if r.gen.Load() != gen {
		return
	}
	if r.loadPhase() != phaseHeartbeating && !r.firstHeartbeat(gen, now, k) {
		return
	}
	r.heartbeats.Add(k)
	// Clocks only move forward: a heartbeat stamped earlier than the last
	// one (socket and shared-memory stamps mixed) still counts.
	var prev int64
	for {
		prev = r.lastHB.Load()
		if now <= prev {
			n := r.nIv.Add(k)
			r.learnedNow(n-k, n)
			return
		}
		if r.lastHB.CompareAndSwap(prev, now) {
			break
		}
	}
	// An interval across a launcher stall is the launcher's gap, not the
	// rank's: it is neither counted nor measured (stall.go).
	if r.cfg.stalls.overlaps(prev, now, r.host.mono()) {
		return
	}
	iv := now - prev
	storeMax(&r.maxIv, iv)
	if r.nIv.Load() >= r.cfg.defaults.LearnIntervals/2 {
		r.steadyInterval(iv)
	}
	// Counted after the maximum is stored, so that the learned timeout
	// armed when the count reaches its threshold includes this interval.
	n := r.nIv.Add(k)
	r.learnedNow(n-k, n)
}

// steadyWindow is how many of the latest steady intervals the judged
// default clock learns from.
const steadyWindow = 256

// steadyInterval records interval iv for steadyIv: the third longest of
// the window, recomputed at every interval while the window fills its
// first 32 and every 32nd after (a scan of 256 values).
func (r *rankMon) steadyInterval(iv int64) {
	n := r.steadyN.Add(1)
	r.steady[(n-1)%steadyWindow].Store(iv)
	if n > 32 && n%32 != 0 {
		return
	}
	var top [3]int64
	for i := range min(n, steadyWindow) {
		v := r.steady[i].Load()
		switch {
		case v > top[0]:
			top = [3]int64{v, top[0], top[1]}
		case v > top[1]:
			top[1], top[2] = v, top[1]
		case v > top[2]:
			top[2] = v
		}
	}
	third := top[2]
	if n < 3 {
		third = top[n-1] // fewer than three: the shortest seen
	}
	r.steadyIv.Store(third)
}

// storeMax raises v to x when x is larger.
func storeMax(v *atomic.Int64, x int64) {
	for {
		cur := v.Load()
		if x <= cur || v.CompareAndSwap(cur, x) {
			return
		}
	}
}

// firstHeartbeat handles a heartbeat that found the rank not heartbeating.
// It reports whether the caller should count it as an ordinary heartbeat:
// another one got the lock first, or the rank hung after heartbeating.
func (r *rankMon) firstHeartbeat(gen uint64, now, k int64) bool {
	r.mu.Lock()
	defer r.unlockAndRecord()
	if r.gen.Load() != gen {
		return false
	}
	switch r.loadPhase() {
	case phaseHeartbeating:
		return true
	case phaseHung:
		return r.lastHB.Load() != 0
	case phaseInitial:
	default:
		return false
	}
	r.heartbeats.Add(k)
	now = max(now, r.initAt) // a client time cannot precede the session
	if !r.rec.firstHB {
		r.rec.firstHB = true
		r.recordLocked(eventlog.RankFirstHeartbeatEvent{Round: r.cycle, LocalRank: r.local, Rank: r.globalRank,
			At: r.host.wall(now), SinceInitMS: float64(time.Duration(now-r.initAt).Microseconds()) / 1000})
	}
	if !r.cfg.stalls.overlaps(r.initAt, now, r.host.mono()) {
		r.nIv.Add(k - 1)
		r.obs.InitialDelay = max(r.obs.InitialDelay, time.Duration(now-r.initAt))
	}
	r.lastHB.Store(now)
	r.setPhaseLocked(phaseHeartbeating)
	r.rearmLocked(r.host.mono())
	return false
}

// setTimeouts applies timeouts sent by the client, at once. It reports
// false when connection gen was replaced meanwhile.
func (r *rankMon) setTimeouts(gen uint64, apply func(*Timeouts)) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen.Load() != gen {
		return false
	}
	apply(&r.to)
	r.rearmLocked(r.host.mono())
	return true
}

// status returns the rank's current state.
func (r *rankMon) status() RankStatus {
	r.drain()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := RankStatus{
		LocalRank: r.local, GlobalRank: r.globalRank, PID: r.pid, Connected: r.loadPhase().inSession(),
		Heartbeats: r.heartbeats.Load(), Timeouts: r.to.Clone(),
	}
	s.OpenedAt = make(map[string]time.Time, len(r.open))
	for name, at := range r.open {
		s.OpenSections = append(s.OpenSections, name)
		s.OpenedAt[name] = r.host.wall(at)
	}
	slices.Sort(s.OpenSections)
	s.SectionCloses = map[string]int{}
	for k, v := range r.obs.SectionCloses {
		s.SectionCloses[k] = v
	}
	return s
}

// logger for a connection.
func (r *rankMon) logger() *slog.Logger {
	return r.cfg.log.With("local_rank", r.local)
}
