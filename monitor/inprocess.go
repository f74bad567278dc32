package monitor

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// InProcessReport is a survivor's report during an in-process restart
// (ftwire.MsgInProcessReport), with the local rank that sent it.
type InProcessReport struct {
	LocalRank int
	ftwire.InProcessReport
}

// ErrNotRegistered: the rank's current connection did not register for
// in-process restarts (or has not finished its handshake yet), so it
// cannot be sent a notice.
var ErrNotRegistered = errors.New("rank did not register for in-process restarts")

// InProcessReports delivers survivors' rejoin and first-step reports.
func (m *Manager) InProcessReports() <-chan InProcessReport { return m.ipReps }

// InProcessCapable reports whether local rank's current connection
// registered for in-process restarts (native Hello "inprocess": true) and
// finished its handshake.
func (m *Manager) InProcessCapable(localRank int) bool {
	if localRank < 0 || localRank >= len(m.ranks) {
		return false
	}
	return m.ranks[localRank].noticeConn() != nil
}

// noticeConn is the rank's session a notice can be written on: a native
// session that registered for in-process restarts and has been handed over
// to the poller. Hello sets the registration before the Config reply is
// written and before serveLazy closes the handshake's net.Conn (keeping a
// duplicate fd), so a notice written on the net.Conn in that window could
// interleave with the Config reply or hit the closed net.Conn ("use of
// closed network connection"): until the handover the rank counts as not
// registered yet.
func (r *rankMon) noticeConn() *lazyConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	lc, _ := r.conn.(*lazyConn)
	if !r.inprocess {
		return nil
	}
	return lc
}

// Silence is a rank's last sign of progress, for telling a hung rank from
// peers blocked in its collectives (as silent as it is, but only since it
// stopped).
type Silence struct {
	Last        time.Time     // its last heartbeat (before the first: when its session began)
	Timeout     time.Duration // the timeout in force for that clock
	MaxInterval time.Duration // its longest heartbeat interval this cycle
	Hung        bool          // its own monitor found it hung (it is being terminated)
	// Waiting: the stacks taken at this cycle's hang found it waiting in
	// a collective for another rank, which they named as the one that
	// hung (judge.go): a bystander, as a crash's peers are.
	Waiting bool
}

// Silence reports local rank's silence; ok is false when it has no
// session. Timeout is 0 when heartbeat timeouts are off (its heartbeats
// are still timed).
func (m *Manager) Silence(localRank int) (s Silence, ok bool) {
	if localRank < 0 || localRank >= len(m.ranks) {
		return s, false
	}
	r := m.ranks[localRank]
	r.drain() // heartbeats in shared memory not read yet
	m.mu.Lock()
	cycle := m.cycle
	m.mu.Unlock()
	waiting := m.waiting(cycle, localRank) // before r.mu: m.mu is never taken under it
	r.mu.Lock()
	defer r.mu.Unlock()
	defer func() { s.Waiting = waiting && ok && !s.Hung }()
	switch r.loadPhase() {
	case phaseHung:
		return Silence{Hung: true}, true
	case phaseHeartbeating:
		to, _ := r.heartbeatTimeoutLocked()
		s = Silence{Last: m.wall(r.lastHB.Load()), Timeout: to}
	case phaseInitial:
		to, _ := r.initialTimeoutLocked()
		s = Silence{Last: m.wall(r.initAt), Timeout: to}
	default:
		return s, false
	}
	s.MaxInterval = time.Duration(r.maxIv.Load())
	return s, true
}

// Notify sends an in-process restart's notice to local rank over its
// rank-monitor connection. The write never blocks past writeTimeout: a
// notice is a few hundred bytes and the rank reads its socket.
func (m *Manager) Notify(localRank int, n ftwire.Rejoin) error {
	if localRank < 0 || localRank >= len(m.ranks) {
		return fmt.Errorf("notify: no local rank %d", localRank)
	}
	p, err := json.Marshal(n)
	if err != nil {
		return fmt.Errorf("encode notice: %w", err)
	}
	b := ftwire.AppendFrame(nil, ftwire.MsgRejoin, p)
	lc := m.ranks[localRank].noticeConn()
	if lc == nil {
		return ErrNotRegistered
	}
	return lc.write(b)
}

// write writes b on the session's non-blocking fd, waiting (bounded) while
// the socket buffer is full.
func (lc *lazyConn) write(b []byte) error {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	deadline := time.Now().Add(writeTimeout)
	for len(b) > 0 {
		if lc.fd < 0 || lc.closing.Load() {
			return errors.New("notify: connection closed")
		}
		n, err := unix.Write(lc.fd, b)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			if time.Now().After(deadline) {
				return fmt.Errorf("notify: socket full for %s", writeTimeout)
			}
			time.Sleep(time.Millisecond)
			continue
		case err != nil:
			return fmt.Errorf("notify: %w", err)
		}
		b = b[n:]
	}
	return nil
}

// inProcessReport forwards a survivor's report to the agent.
func (m *Manager) inProcessReport(r *rankMon, u ftwire.InProcessReport) {
	if u.Phase != "rejoined" && u.Phase != "first_step" {
		m.refuse(r, "inprocess_report", fmt.Errorf("unknown phase %q (rejoined or first_step)", u.Phase))
		return
	}
	select {
	case m.ipReps <- InProcessReport{LocalRank: r.local, InProcessReport: u}:
	default:
		r.logger().Warn("rank monitor: in-process report channel full; dropping", "phase", u.Phase)
	}
}

// ReplaceRank makes pid local rank's process in the running cycle: an
// in-process restart replaced a survivor that did not rejoin by a fresh
// rank. That rank's monitor starts over as at BeginCycle (connections from
// the old process are refused from now on); the other ranks' monitors are
// untouched.
func (m *Manager) ReplaceRank(localRank, pid int) {
	if localRank < 0 || localRank >= len(m.ranks) {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.active {
		return
	}
	m.pids[localRank] = pid
	delete(m.expected, localRank)
	m.ranks[localRank].begin(m.cycle, pid, m.eff.Clone(), m.opts.FT.NumWarmupIterations, m.defaultsOn)
	// Wake connections waiting in admitRank for this rank's pid.
	close(m.cycleCh)
	m.cycleCh = make(chan struct{})
	m.log.Debug("rank monitors: rank replaced in the cycle", "cycle", m.cycle, "local_rank", localRank, "pid", pid)
}
