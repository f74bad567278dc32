package monitor

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

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
