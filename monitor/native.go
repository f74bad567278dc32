package monitor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/ftshm"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// deadlineConn arms a read deadline only while a message is half read, so an
// idle rank costs nothing but a half-sent message cannot pin the goroutine.
type deadlineConn struct {
	net.Conn
	mid bool // a message has started
	set bool // a deadline is armed
}

func (d *deadlineConn) Read(p []byte) (int, error) {
	switch {
	case d.mid:
		_ = d.Conn.SetReadDeadline(time.Now().Add(frameTimeout))
		d.set = true
	case d.set:
		_ = d.Conn.SetReadDeadline(time.Time{})
		d.set = false
	}
	return d.Conn.Read(p)
}

func newReader(d *deadlineConn) *bufio.Reader { return bufio.NewReaderSize(d, 4096) }

// writeWithFD writes b with fd attached (SCM_RIGHTS) to its first byte.
func writeWithFD(c *net.UnixConn, b []byte, fd int) error {
	_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
	defer c.SetWriteDeadline(time.Time{})
	n, _, err := c.WriteMsgUnix(b, unix.UnixRights(fd), nil)
	if err != nil {
		return err
	}
	if n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

func writeAll(c net.Conn, b []byte) error {
	_ = c.SetWriteDeadline(time.Now().Add(writeTimeout))
	_, err := c.Write(b)
	_ = c.SetWriteDeadline(time.Time{})
	return err
}

// serverConfig renders what a native client gets in reply to Hello.
func (m *Manager) serverConfig(r *rankMon) ftwire.ServerConfig {
	r.mu.Lock()
	to, cycle := r.to.Clone(), r.cycle
	r.mu.Unlock()
	ft := &m.opts.FT
	sc := ftwire.ServerConfig{
		Protocol: ftwire.Version, Cycle: cycle,
		InitialRankHeartbeatTimeout: secsOf(to.InitialHeartbeat),
		RankHeartbeatTimeout:        secsOf(to.Heartbeat),
		RankOutOfSectionTimeout:     secsOf(to.OutOfSection),
		RankSectionTimeouts:         map[string]*float64{},
		SafetyFactor:                ft.SafetyFactor, WorkloadCheckInterval: ft.WorkloadCheckInterval,
		NumWarmupIterations: ft.NumWarmupIterations, InstallExceptionHook: ft.InstallExceptionHook,
		RankTerminationSignal: int(ft.RankTerminationSignal), SkipSectionResponse: true,
	}
	for s, d := range to.Sections {
		sc.RankSectionTimeouts[s] = secsOf(d)
	}
	return sc
}

// serveNative runs an FTL1 session (docs/protocol.md).
func (m *Manager) serveNative(r *rankMon, gen uint64, uc *net.UnixConn, dc *deadlineConn, br *bufio.Reader) error {
	dc.mid = true
	if err := ftwire.ReadMagic(br); err != nil {
		return err
	}
	t, err := br.ReadByte()
	if err != nil {
		return fmt.Errorf("read hello: %w", err)
	}
	if t != ftwire.MsgHello {
		return fmt.Errorf("first message is type %#x, want hello", t)
	}
	p, err := ftwire.ReadPayload(br)
	if err != nil {
		return err
	}
	var h ftwire.Hello
	if err := json.Unmarshal(p, &h); err != nil {
		return fmt.Errorf("decode hello: %w", err)
	}
	dc.mid = false
	if !r.init(gen, initInfo{globalRank: h.GlobalRank, pid: h.PID, iteration: h.Iteration, numWarmupIters: h.NumWarmupIters, inprocess: h.InProcess}) {
		return nil // replaced meanwhile
	}
	sc := m.serverConfig(r)
	shmFD, shm := -1, (*ftshm.Region)(nil)
	if h.Shm && m.shmOK {
		var err error
		if shmFD, shm, err = ftshm.Create(); err != nil {
			// Socket heartbeats still work: the client falls back.
			r.logger().Debug("rank monitor: no shared-memory heartbeats; using the socket", "err", err)
		}
		sc.Shm = shm != nil
		sc.ShmSections = sc.Shm && h.ShmSections
	}
	cfg, err := json.Marshal(sc)
	if err != nil {
		if shm != nil {
			_ = unix.Close(shmFD)
			_ = shm.Close()
		}
		return fmt.Errorf("encode config: %w", err)
	}
	reply := ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgConfig, cfg)
	if shm != nil {
		err = writeWithFD(uc, reply, shmFD)
		_ = unix.Close(shmFD) // the client holds its own copy; the mapping stays
		if err != nil {
			_ = shm.Close()
			return fmt.Errorf("write config: %w", err)
		}
	} else if err := writeAll(dc.Conn, reply); err != nil {
		return fmt.Errorf("write config: %w", err)
	}
	// FTL1 sends no reply after Config: from here on the socket is read in
	// batches (lazy.go). The deadline armed while Hello was read is cleared
	// so it cannot fire on the raw reads.
	_ = dc.Conn.SetReadDeadline(time.Time{})
	buffered, _ := br.Peek(br.Buffered())
	return m.serveLazy(r, gen, uc, bytes.Clone(buffered), shm, sc.ShmSections)
}

// applyClientTimeouts validates client-sent timeouts, honours them at once
// for the sending rank and records them for the next cycles. A refused
// update changes nothing; it is counted and logged once per rank.
func (m *Manager) applyClientTimeouts(r *rankMon, gen uint64, u *ftwire.TimeoutsUpdate) {
	cu, err := validateUpdate(u, m.configured.Sections)
	if err != nil {
		m.refuse(r, "timeouts", err)
		return
	}
	if len(cu.fields) == 0 {
		return
	}
	if !r.setTimeouts(gen, cu.applyTo) {
		return
	}
	m.clientTimeouts(r.local, cu)
}
