package monitor

import (
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// The launcher's default clocks (docs/timeouts.md, "With no timeout
// configured"): what a rank that heartbeats is held to when the
// configuration names no rank timeout at all, so that a hang in the first
// run of a job is caught without a flag. The values and their reasons are
// in configs (DefaultStartupTimeout, DefaultLearnedFloor,
// DefaultLearnIntervals), which --print-config shows.

// DefaultClocks parametrise the default clocks; zero fields take
// configs' Default* constants. Tests shorten them; the launcher uses the constants.
type DefaultClocks struct {
	Startup        time.Duration
	LearnedFloor   time.Duration
	LearnIntervals int64
	// JudgedFloor replaces LearnedFloor when expiries are judged from the
	// stacks (Options.Stacks; judge.go).
	JudgedFloor time.Duration
}

func (d DefaultClocks) withConstants() DefaultClocks {
	if d.Startup <= 0 {
		d.Startup = configs.DefaultStartupTimeout
	}
	if d.LearnedFloor <= 0 {
		d.LearnedFloor = configs.DefaultLearnedFloor
	}
	if d.LearnIntervals <= 0 {
		d.LearnIntervals = configs.DefaultLearnIntervals
	}
	if d.JudgedFloor <= 0 {
		d.JudgedFloor = configs.DefaultJudgedFloor
	}
	return d
}

// initialTimeoutLocked is the start-up clock in force: the configured (or
// computed, or client-sent) one, else the default when the default clocks
// are on. def reports the default.
func (r *rankMon) initialTimeoutLocked() (to time.Duration, def bool) {
	if r.to.InitialHeartbeat > 0 || !r.defaults.Load() {
		return r.to.InitialHeartbeat, false
	}
	return r.cfg.defaults.Startup, true
}

// heartbeatTimeoutLocked is the heartbeat clock in force. With the default
// clocks and no heartbeat timeout set, it is learned from the rank's own
// heartbeats of this cycle: the start-up timeout until LearnIntervals
// intervals were seen, and while a section other than "step" is open (a
// phase announced, such as a checkpoint save); then safety_factor × the
// longest interval, at least LearnedFloor.
func (r *rankMon) heartbeatTimeoutLocked() (to time.Duration, def bool) {
	if r.to.Heartbeat > 0 || !r.defaults.Load() {
		return r.to.Heartbeat, false
	}
	d := &r.cfg.defaults
	if r.nIv.Load() < d.LearnIntervals || r.namedPhaseOpenLocked() {
		return d.Startup, true
	}
	if r.cfg.judged {
		// Every expiry is judged before a kill (judge.go): the clock
		// follows the steady steps (the third longest of the latest 256
		// intervals), not the first ones (compilation, warm-up) nor a
		// rare save, with a short floor.
		return max(scaled(time.Duration(r.steadyIv.Load()), r.cfg.safety), d.JudgedFloor), true
	}
	return max(scaled(time.Duration(r.maxIv.Load()), r.cfg.safety), d.LearnedFloor), true
}

// namedPhaseOpenLocked: a section other than "step" is open.
func (r *rankMon) namedPhaseOpenLocked() bool {
	for name := range r.open {
		if name != "step" {
			return true
		}
	}
	return false
}

// learnedNow is called by the heartbeat hot path when the cycle's interval
// count went from before to after: when it crossed LearnIntervals, the
// default heartbeat clock shrinks from the start-up timeout to the learned
// one, an earlier deadline than the armed one, so the timer is re-armed
// (once a cycle; every other heartbeat only pushes deadlines later).
func (r *rankMon) learnedNow(before, after int64) {
	if !r.defaults.Load() {
		return
	}
	l := r.cfg.defaults.LearnIntervals
	if before >= l || after < l {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rearmLocked(r.host.mono())
}

// When a default clock expires, the rank is hung only if its processes
// were idle over the next activityWindow: less than activityCPU of CPU time
// and activityIO bytes read or written. A rank saving a checkpoint, running
// an evaluation or compiling, unannounced, is busy; a rank deadlocked,
// blocked on a peer in a gloo collective, waiting on a pipe or stopped is
// not. Configured, computed and client-sent timeouts are never checked so:
// they mean what they say.
const (
	activityWindow = 2 * time.Second
	activityCPU    = activityWindow / 10 // 10% of a core
	activityIO     = 1 << 20
)

// activityProbe is the baseline of one expiry's activity check.
type activityProbe struct {
	deadline int64 // the expiry checked; 0 none
	at       int64 // when the baseline was taken
	base     procfs.Activity
}

// busyLocked checks expired default clock e against the rank's activity.
// It returns true when the timer was re-armed instead (the check is under
// way, or the rank was busy: then the clock is pushed a full timeout
// later), false when the rank is to be declared hung.
func (r *rankMon) busyLocked(now int64, e expiry) bool {
	if r.pid <= 0 {
		return false
	}
	if r.probe.deadline != e.deadline {
		a, ok := procfs.GroupActivity(r.pid)
		if !ok {
			return false
		}
		r.probe = activityProbe{deadline: e.deadline, at: now, base: a}
		r.armAtLocked(now + int64(activityWindow))
		return true
	}
	if end := r.probe.at + int64(activityWindow); now < end {
		r.armAtLocked(end)
		return true
	}
	base := r.probe.base
	r.probe = activityProbe{}
	a, ok := procfs.GroupActivity(r.pid)
	if !ok {
		return false
	}
	cpu, io := a.CPU-base.CPU, a.IOBytes-base.IOBytes
	if cpu < activityCPU && io < activityIO {
		return false
	}
	r.deferTo = now + int64(e.timeout)
	r.cfg.log.Info("rank silent past the default clock but busy: not hung", "local_rank", r.local, "rank", r.globalRank,
		"cycle", r.cycle, "kind", e.kind, "timeout", e.timeout, "silent", time.Duration(now-e.start).Round(time.Millisecond),
		"cpu", cpu, "io_bytes", io, "window", activityWindow, "next_check", e.timeout)
	r.armAtLocked(r.deferTo)
	return true
}
