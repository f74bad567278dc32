// Package ftclient is the Go rank-side client of ft-launcher's rank monitor.
// It speaks the native FTL1 protocol (docs/protocol.md): a heartbeat is one
// byte written to a Unix socket with no reply, so it can be called from a
// training loop every step. When the monitor grants a shared-memory region at
// the handshake, a heartbeat is two stores into it and no syscall at all, and
// a section event is an entry in a ring in the same region (five stores).
//
// When FT_RANK_MONITOR_IPC_SOCKET is not set (the program was not started by
// ft-launcher), Connect returns a client whose methods do nothing, after one
// warning.
package ftclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/ftshm"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"
)

// Environment variables read by Connect.
const (
	EnvSocket = "FT_RANK_MONITOR_IPC_SOCKET"
	EnvRank   = "RANK"
	EnvLocal  = "LOCAL_RANK"
)

// ErrClosed is returned after Close.
var ErrClosed = errors.New("ftclient: client closed")

// Config is what the monitor told the client at connect time.
type Config = ftwire.ServerConfig

// Client talks to one rank monitor. Its methods are safe for concurrent use.
type Client struct {
	mu     sync.Mutex
	fd     int // -1 for a no-op client or after Close
	noop   bool
	cfg    Config
	ids    map[string]uint64
	buf    []byte
	hb     [1]byte
	closed bool
	// Shared-memory heartbeats (nil shm: socket heartbeats). The time
	// stored is CLOCK_MONOTONIC, computed as cmBase + time.Since(t0)
	// without a syscall (Go's monotonic clock is CLOCK_MONOTONIC).
	shm    *ftshm.Region
	count  uint64
	t0     time.Time
	cmBase int64
	// Section-event ring in shm (docs/protocol.md): when ring is set,
	// every section event goes through it, never the socket, so the two
	// paths cannot reorder events. head caches the monitor's counter.
	ring       bool
	tail, head uint64
}

// Options for ConnectPath.
type Options struct {
	GlobalRank     int    // -1 if unknown
	LocalRank      int    // -1 if unknown
	Iteration      *int64 // current training iteration, if known
	NumWarmupIters *int64 // overrides the configured number of warmup iterations
	Logger         *slog.Logger
	// SocketHeartbeats disables shared-memory heartbeats: every heartbeat
	// is then a write(2) on the socket, as with protocol clients that
	// predate them.
	SocketHeartbeats bool
	// SocketSections sends section events over the socket (one write(2)
	// each) instead of the shared-memory ring, as clients that predate the
	// ring do.
	SocketSections bool
}

// Connect connects to the monitor named by FT_RANK_MONITOR_IPC_SOCKET, with
// the global and local rank from RANK and LOCAL_RANK. Without the variable it
// returns a no-op client and logs one warning. A monitor that another
// launcher started (checkProtocol) is refused before connecting.
func Connect(ctx context.Context) (*Client, error) {
	path := os.Getenv(EnvSocket)
	if path == "" {
		slog.Warn("ftclient: " + EnvSocket + " is not set; fault-tolerance calls are no-ops")
		return &Client{fd: -1, noop: true}, nil
	}
	if err := checkProtocol(); err != nil {
		return nil, err
	}
	return ConnectPath(ctx, path, Options{GlobalRank: envInt(EnvRank), LocalRank: envInt(EnvLocal)})
}

// checkProtocol refuses a rank monitor that does not speak FTL1. ft-launcher
// sets FT_RANK_MONITOR_PROTOCOL; without it (launchers before it existed) a
// rank it started still has FT_LAUNCHER_RESTARTS_USED. A rank with
// TORCHELASTIC_RUN_ID and neither was started by another launcher, such as
// nvidia-resiliency-ext's ft_launcher, whose monitor reads pickle frames and
// would leave the handshake unanswered until its timeout.
func checkProtocol() error {
	proto, set := os.LookupEnv(ftwire.ProtocolEnv)
	if set && proto != ftwire.Protocol {
		return fmt.Errorf("ftclient: %s=%q: the rank monitor speaks another protocol than this client's %q",
			ftwire.ProtocolEnv, proto, ftwire.Protocol)
	}
	_, elastic := os.LookupEnv("TORCHELASTIC_RUN_ID")
	_, ours := os.LookupEnv("FT_LAUNCHER_RESTARTS_USED")
	if !set && elastic && !ours {
		return fmt.Errorf("ftclient: %s is set by a launcher other than ft-launcher (no %s): "+
			"nvidia-resiliency-ext's ft_launcher speaks pickle frames; start the job with ft-launcher", EnvSocket, ftwire.ProtocolEnv)
	}
	return nil
}

func envInt(k string) int {
	v, err := strconv.Atoi(os.Getenv(k))
	if err != nil {
		return -1
	}
	return v
}

// ConnectPath connects to the monitor socket at path and performs the
// handshake; ctx bounds the handshake.
func ConnectPath(ctx context.Context, path string, o Options) (*Client, error) {
	fd, err := dial(ctx, path)
	if err != nil {
		return nil, err
	}
	c := &Client{fd: fd, ids: map[string]uint64{}, hb: [1]byte{ftwire.MsgHeartbeat}}
	if err := c.handshake(o); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return c, nil
}

// dial connects a blocking Unix socket to path, with send and receive
// timeouts set from ctx's deadline (30 s without one): a raw fd rather than
// a net.Conn keeps heartbeats off the netpoller.
func dial(ctx context.Context, path string) (int, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("ftclient: socket: %w", err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	tv := unix.NsecToTimeval(max(time.Until(deadline), time.Millisecond).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("ftclient: connect %s: %w", path, err)
	}
	return fd, nil
}

func (c *Client) handshake(o Options) error {
	host, _ := os.Hostname()
	h, err := json.Marshal(ftwire.Hello{GlobalRank: o.GlobalRank, LocalRank: o.LocalRank, PID: os.Getpid(),
		Host: host, Iteration: o.Iteration, NumWarmupIters: o.NumWarmupIters, Client: "ftclient-go/1",
		Shm: !o.SocketHeartbeats, ShmSections: !o.SocketHeartbeats && !o.SocketSections})
	if err != nil {
		return fmt.Errorf("ftclient: encode hello: %w", err)
	}
	if err := c.write(ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgHello, h)); err != nil {
		return fmt.Errorf("ftclient: send hello: %w", err)
	}
	r := &fdReader{fd: c.fd}
	// The magic is read with recvmsg: a shared-memory region's fd rides on
	// the reply's first byte and a plain read(2) would drop it.
	shmFD, err := c.readMagicFD()
	if err != nil {
		return fmt.Errorf("ftclient: handshake (refused by the monitor?): %w", err)
	}
	if shmFD >= 0 {
		defer unix.Close(shmFD) // the mapping outlives it
	}
	var t [1]byte
	if _, err := r.Read(t[:]); err != nil || t[0] != ftwire.MsgConfig {
		return fmt.Errorf("ftclient: handshake: unexpected reply type %#x: %v", t[0], err)
	}
	p, err := ftwire.ReadPayload(r)
	if err != nil {
		return fmt.Errorf("ftclient: handshake: read config: %w", err)
	}
	if err := json.Unmarshal(p, &c.cfg); err != nil {
		return fmt.Errorf("ftclient: decode config: %w", err)
	}
	if c.cfg.Shm && shmFD >= 0 {
		if err := c.mapShm(shmFD); err != nil {
			// Socket heartbeats are always accepted too.
			slog.Debug("ftclient: no shared-memory heartbeats; using the socket", "err", err)
		}
	}
	// Back to fully blocking sends: a heartbeat must not fail because the
	// monitor was briefly slow to read.
	var zero unix.Timeval
	_ = unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &zero)
	return nil
}

// readMagicFD reads the server's magic with recvmsg and returns the fd
// attached to it, or -1.
func (c *Client) readMagicFD() (int, error) {
	var b [len(ftwire.Magic)]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	fd := -1
	got := 0
	for got < len(b) {
		n, oobn, _, _, err := unix.Recvmsg(c.fd, b[got:], oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return -1, fmt.Errorf("read magic: %w", err)
		}
		if oobn > 0 {
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err == nil {
				for _, m := range msgs {
					fds, err := unix.ParseUnixRights(&m)
					if err != nil {
						continue
					}
					for _, f := range fds {
						if fd < 0 {
							fd = f
						} else {
							unix.Close(f)
						}
					}
				}
			}
		}
		if n == 0 {
			if fd >= 0 {
				unix.Close(fd)
			}
			return -1, errors.New("connection closed by the monitor")
		}
		got += n
	}
	if err := ftwire.ReadMagic(bytesReader(b[:])); err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, err
	}
	return fd, nil
}

type bytesReader []byte

func (b bytesReader) Read(p []byte) (int, error) { return copy(p, b), nil }

// mapShm maps the shared-memory heartbeat region and calibrates the clock.
func (c *Client) mapShm(fd int) error {
	size := ftshm.Size
	if c.cfg.ShmSections {
		size = ftshm.RegionSize
	}
	shm, err := ftshm.Map(fd, size)
	if err != nil {
		return err
	}
	// time.Now first, CLOCK_MONOTONIC second: cmBase is then at least the
	// true clock at t0, so stored times err late (never an early hang).
	t0 := time.Now()
	cm, err := ftshm.Monotonic()
	if err != nil {
		_ = shm.Close()
		return err
	}
	c.shm, c.t0, c.cmBase = shm, t0, cm
	c.ring = c.cfg.ShmSections
	return nil
}

// SharedMemory reports whether heartbeats go through shared memory.
func (c *Client) SharedMemory() bool { return c.shm != nil }

// SectionRing reports whether section events go through shared memory.
func (c *Client) SectionRing() bool { return c.ring }

// fdReader reads from a blocking fd without buffering (handshake and
// acknowledgement only), so nothing after a frame is consumed.
type fdReader struct{ fd int }

func (r *fdReader) Read(p []byte) (int, error) {
	for {
		n, err := unix.Read(r.fd, p)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, errors.New("connection closed by the monitor")
		}
		return n, nil
	}
}

func (r *fdReader) ReadByte() (byte, error) {
	var b [1]byte
	if _, err := r.Read(b[:]); err != nil {
		return 0, err
	}
	return b[0], nil
}

// write sends b completely. Caller holds mu (or owns c exclusively).
func (c *Client) write(b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(c.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func (c *Client) send(b []byte) error {
	if c.noop {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if err := c.write(b); err != nil {
		return fmt.Errorf("ftclient: send: %w", err)
	}
	return nil
}

// Config returns the settings the monitor sent at connect time (zero for a
// no-op client).
func (c *Client) Config() Config { return c.cfg }

// Enabled reports whether the client is connected to a monitor.
func (c *Client) Enabled() bool { return !c.noop }

// Close ends the session. The monitor treats it as a disconnect, never as a
// failure.
func (c *Client) Close() error {
	if c.noop {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.shm != nil {
		_ = c.shm.Close()
		c.shm = nil
		c.ring = false
	}
	if err := unix.Close(c.fd); err != nil {
		return fmt.Errorf("ftclient: close: %w", err)
	}
	return nil
}
