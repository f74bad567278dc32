package policy

import "time"

// RestartBudget bounds the restarts of something that keeps failing: the
// job (Decide: --max-restarts, --restart-window, --restart-delay), the
// hosted etcd member, the fence watchdog, a parked spare's standbys, a
// filler workload. It is the one budget of the project, after Nomad's
// restart tracker (attempts within an interval, a delay) with the etcd
// member keeper's backoff:
//
//   - at most Limit restarts, within the sliding Window when one is set
//     (0: in the whole life of what is supervised);
//   - each restart waits Delay, and a restart that follows others in a
//     row waits Backoff more, doubling up to MaxBackoff;
//   - a run that lasted Stable ends the row (the backoff starts over);
//     with Stable 0 every restart continues the row.
//
// The type is pure and clock-free: callers pass the time, so a test needs
// no sleep and the job's budget can be evaluated from the restart times
// etcd holds (Used). RestartTracker keeps the state for a supervisor that
// holds it in memory.
type RestartBudget struct {
	Limit      int
	Window     time.Duration
	Delay      time.Duration
	Backoff    time.Duration
	MaxBackoff time.Duration
	Stable     time.Duration
}

// Used is how many restarts count against Limit at now: the attempts
// (times of earlier restarts) within Window, or total when there is no
// Window.
func (b RestartBudget) Used(attempts []time.Time, total int, now time.Time) int {
	if b.Window <= 0 {
		return total
	}
	n := 0
	for _, a := range attempts {
		if now.Sub(a) < b.Window {
			n++
		}
	}
	return n
}

// Allows reports whether a restart is allowed with used restarts counted.
func (b RestartBudget) Allows(used int) bool { return used < b.Limit }

// Wait is how long the restart that follows streak restarts in a row
// waits: Delay, plus Backoff doubling from the second in a row, at most
// MaxBackoff (when set).
func (b RestartBudget) Wait(streak int) time.Duration {
	wait := b.Delay
	if streak > 0 && b.Backoff > 0 {
		back := b.Backoff << min(streak-1, 30)
		if back <= 0 || (b.MaxBackoff > 0 && back > b.MaxBackoff) {
			back = b.MaxBackoff
		}
		wait += back
	}
	return wait
}

// Recent keeps the restart times that can still count at now (within
// Window), at most Limit of them, the newest: what a store of the job's
// restarts needs to keep.
func (b RestartBudget) Recent(attempts []time.Time, now time.Time) []time.Time {
	var keep []time.Time
	for _, a := range attempts {
		if b.Window <= 0 || now.Sub(a) < b.Window {
			keep = append(keep, a)
		}
	}
	if n := max(b.Limit, 1); len(keep) > n {
		keep = keep[len(keep)-n:]
	}
	return keep
}

// RestartTracker is a RestartBudget's state for one supervised thing
// whose restarts are counted in memory (a child process of the launcher).
// The zero value of the budget allows no restart.
type RestartTracker struct {
	Budget   RestartBudget
	attempts []time.Time // restarts within the window (all, with none), oldest first
	total    int         // restarts granted in all
	streak   int         // restarts in a row since the last Stable run
}

// Next is asked when the supervised thing died (or a restart failed) at
// now, having run since up (zero: it never ran). It returns how long to
// wait before the next restart, or ok=false when the budget is spent. A
// granted restart counts at the time it will happen (now + wait).
func (t *RestartTracker) Next(now, up time.Time) (wait time.Duration, ok bool) {
	b := t.Budget
	if b.Stable > 0 && !up.IsZero() && now.Sub(up) >= b.Stable {
		t.streak = 0
	}
	if b.Window > 0 {
		t.attempts = b.Recent(t.attempts, now)
	}
	if !b.Allows(b.Used(t.attempts, t.total, now)) {
		return 0, false
	}
	wait = b.Wait(t.streak)
	t.streak++
	t.total++
	if b.Window > 0 {
		t.attempts = append(t.attempts, now.Add(wait))
	}
	return wait, true
}

// Restarts is the number of restarts granted so far.
func (t *RestartTracker) Restarts() int { return t.total }
