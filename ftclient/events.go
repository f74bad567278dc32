package ftclient

// What a rank tells its monitor on an open session: heartbeats, section
// events (through the shared-memory ring when granted, else the socket) and
// timeout updates.

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/ftshm"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// monoNow is CLOCK_MONOTONIC in ns without a syscall.
func (c *Client) monoNow() uint64 { return uint64(c.cmBase + int64(time.Since(c.t0))) }

// push appends one event to the ring and publishes it. The event is stamped
// when the caller asked for it, before any wait for space; events are never
// dropped or reordered. Caller holds mu.
func (c *Client) push(kind, id, iter uint64) error {
	at := c.monoNow()
	if c.tail-c.head >= ftshm.RingCap {
		if err := c.waitSpace(); err != nil {
			return err
		}
	}
	c.shm.PutEvent(c.tail, ftshm.Event{Kind: kind, ID: id, Iter: iter, Time: at})
	c.tail++
	c.shm.Store(ftshm.OffTail, c.tail) // publishes the event
	return nil
}

// waitSpace waits until the monitor has consumed an event. The monitor
// drains at least every P (10 ms at most) and shortens P while a session is
// busy, so this is rare and short: a spin first, then polls of the socket,
// which also notice a monitor that went away (it never writes after
// Config, so readability means EOF or an error).
func (c *Client) waitSpace() error {
	full := func() bool {
		c.head = c.shm.Load(ftshm.OffHead)
		return c.tail-c.head >= ftshm.RingCap
	}
	spinUntil := time.Now().Add(time.Millisecond)
	for full() {
		if time.Now().Before(spinUntil) {
			runtime.Gosched()
			continue
		}
		pfd := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 1)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("ftclient: section ring full: poll: %w", err)
		}
		if n > 0 && full() {
			return errors.New("ftclient: section ring full and the monitor closed the connection")
		}
	}
	return nil
}

// SendHeartbeat tells the monitor the rank is alive: two stores into the
// shared region when there is one, else one write(2); never a reply.
func (c *Client) SendHeartbeat() error {
	if c.noop {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if c.shm != nil {
		c.count++
		c.shm.StoreHeartbeat(c.count, c.monoNow())
		return nil
	}
	for {
		_, err := unix.Write(c.fd, c.hb[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ftclient: heartbeat: %w", err)
		}
		return nil
	}
}

// sectionID returns name's id, appending its definition to c.buf the first
// time. Caller holds mu.
func (c *Client) sectionID(name string) uint64 {
	id, ok := c.ids[name]
	if !ok {
		id = uint64(len(c.ids))
		c.ids[name] = id
		c.buf = ftwire.AppendDefineSection(c.buf, id, name)
	}
	return id
}

func (c *Client) sectionOp(name string, t byte, iter *int64) error {
	if c.noop {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.buf = c.buf[:0]
	id := c.sectionID(name)
	if c.ring {
		// A new name is defined over the socket before the event using it
		// is published: the monitor reads the socket again when it meets
		// an id it does not know yet.
		if len(c.buf) > 0 {
			if err := c.write(c.buf); err != nil {
				return fmt.Errorf("ftclient: section %q: %w", name, err)
			}
		}
		kind, it := uint64(ftshm.EvOpen), uint64(0)
		switch {
		case t == ftwire.MsgSectionClose:
			kind = ftshm.EvClose
		case iter != nil && *iter >= 0:
			kind, it = ftshm.EvOpenIter, uint64(*iter)
		}
		return c.push(kind, id, it)
	}
	switch {
	case iter != nil && *iter >= 0:
		c.buf = ftwire.AppendSectionOpenIter(c.buf, id, uint64(*iter))
	default:
		c.buf = ftwire.AppendSectionOp(c.buf, t, id)
	}
	if err := c.write(c.buf); err != nil {
		return fmt.Errorf("ftclient: section %q: %w", name, err)
	}
	return nil
}

// StartSection opens the named section.
func (c *Client) StartSection(name string) error {
	return c.sectionOp(name, ftwire.MsgSectionOpen, nil)
}

// StartSectionAt opens the named section and reports the training iteration
// (used by the warmup rule for "step").
func (c *Client) StartSectionAt(name string, iteration int64) error {
	return c.sectionOp(name, ftwire.MsgSectionOpen, &iteration)
}

// EndSection closes the named section.
func (c *Client) EndSection(name string) error { return c.sectionOp(name, ftwire.MsgSectionClose, nil) }

// EndAllSections closes every open section.
func (c *Client) EndAllSections() error {
	if c.noop {
		return nil
	}
	c.mu.Lock()
	ring := c.ring && !c.closed
	if ring {
		defer c.mu.Unlock()
		return c.push(ftshm.EvCloseAll, 0, 0)
	}
	c.mu.Unlock()
	return c.send([]byte{ftwire.MsgSectionCloseAll})
}

// maxTimeout mirrors monitor.MaxClientTimeout (the client does not import
// the launcher's packages).
const maxTimeout = 7 * 24 * time.Hour

func secs(d time.Duration) *float64 {
	if d <= 0 {
		return nil
	}
	s := d.Seconds()
	return &s
}

// SetHeartbeatTimeouts sets the initial and subsequent heartbeat timeouts
// (0 leaves one unchanged: a rank cannot disable a timeout). calculated
// marks them as computed from observed timing, so the launcher may blend
// them with later observations. A timeout above monitor.MaxClientTimeout
// (7 days) is refused here; the launcher would refuse the whole update. The
// new values apply at once to this rank; to the node from the next cycle as
// docs/timeouts.md ("Timeouts sent by ranks") says.
func (c *Client) SetHeartbeatTimeouts(initial, subsequent time.Duration, calculated bool) error {
	if initial < 0 || subsequent < 0 || initial > maxTimeout || subsequent > maxTimeout {
		return fmt.Errorf("ftclient: heartbeat timeouts %v/%v outside 0 to %v", initial, subsequent, maxTimeout)
	}
	return c.setTimeouts(ftwire.TimeoutsUpdate{Heartbeat: &ftwire.HeartbeatTimeouts{
		Initial: secs(initial), Subsequent: secs(subsequent), WereCalculated: calculated}})
}

// SetSectionTimeouts sets per-section timeouts (configured sections only)
// and the out-of-section timeout (0 leaves one unchanged). calculated marks
// them as computed. Rules as for SetHeartbeatTimeouts.
func (c *Client) SetSectionTimeouts(sections map[string]time.Duration, outOfSection time.Duration, calculated bool) error {
	if outOfSection < 0 || outOfSection > maxTimeout {
		return fmt.Errorf("ftclient: invalid out-of-section timeout %v", outOfSection)
	}
	st := &ftwire.SectionTimeouts{Section: map[string]*float64{}, OutOfSection: secs(outOfSection),
		CalculatedSections: []string{}, IsOutOfSectionCalculated: calculated}
	for s, d := range sections {
		if d < 0 || d > maxTimeout || math.IsInf(d.Seconds(), 0) {
			return fmt.Errorf("ftclient: invalid timeout %v for section %q", d, s)
		}
		st.Section[s] = secs(d)
		if calculated {
			st.CalculatedSections = append(st.CalculatedSections, s)
		}
	}
	return c.setTimeouts(ftwire.TimeoutsUpdate{Section: st})
}

func (c *Client) setTimeouts(u ftwire.TimeoutsUpdate) error {
	p, err := json.Marshal(u)
	if err != nil {
		return fmt.Errorf("ftclient: encode timeouts: %w", err)
	}
	return c.send(ftwire.AppendFrame(nil, ftwire.MsgSetTimeouts, p))
}
