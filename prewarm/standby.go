package prewarm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// standby is one waiting interpreter for one local rank: starting →
// ready | failed; ready → handed over (it is the rank now) | dead.
type standby struct {
	localRank int
	g         *spawn.Group // one process, started for localRank
	pid       int
	conn      *net.UnixConn // the launcher's end of the control socket
	mode      string        // "script" or "module": what it was warmed for
	target    string
	modules   []string   // what it imports
	spec      spawn.Spec // the rank it was started for (auto: restarted from it)
	started   time.Time

	ready    chan struct{} // closed when it reported ready
	said     chan struct{} // closed when awaitReady has read the standby's first word (or EOF)
	imported importStats   // its import: start -> ready (valid once ready is closed)
	done     chan struct{} // closed when it was reaped
	exit     spawn.Exit    // valid once done is closed

	// paused: stopped (SIGSTOP) while a cycle that does not need it
	// starts its ranks (Starter.pauseIdle); pausedAt when, pausedFor the
	// time of the pauses that ended (not part of its import). Under
	// Starter.mu.
	paused    bool
	pausedAt  time.Time
	pausedFor time.Duration

	// lowered: it imports at standbyNice (priority.go); the handover
	// raises it to the launcher's nice value first.
	lowered bool
	// launched: started by Launch, at the launcher's start, for the first
	// cycle's rank (a rank waits for its import: launchedChoice); cleared
	// when the node parks as a spare. Under Starter.mu while the standby
	// is in Starter.standby.
	launched bool

	// auto (--prewarm auto): skipped are the modules it could not import
	// (valid once ready is closed); unsafe the module that created a CUDA
	// context or started a thread or process, and why (set before done).
	skipped   []string
	unsafe    string
	unsafeWhy string

	mu       sync.Mutex
	failure  string // why it cannot be used (import error, death)
	diag     tailBuffer
	diagDone chan struct{}
}

// tailBuffer keeps the last bytes written to it: the standby's own output
// (import-time warnings, a traceback), for the launcher's messages.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const diagKeep = 4096

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > diagKeep {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-diagKeep:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// startStandby starts the standby interpreter for localRank: python -u -c
// <standby.py> with the environment and directory the rank will have (the
// previous cycle's, so what the imports read matches), its own process
// group and parent-death signal like a rank, stdout the control socket and
// stderr a diagnostics pipe.
func startStandby(r *spawn.Reaper, localRank int, python string, env []string, dir, mode, target string, modules []string, auto bool) (*standby, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("prewarm: socketpair: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "prewarm-control")
	defer child.Close()
	own := os.NewFile(uintptr(fds[0]), "prewarm-control")
	fc, err := net.FileConn(own)
	own.Close()
	if err != nil {
		child.Close()
		return nil, fmt.Errorf("prewarm: control socket: %w", err)
	}
	conn := fc.(*net.UnixConn)
	pr, pw, err := os.Pipe()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("prewarm: diagnostics pipe: %w", err)
	}
	argv := []string{python, "-u", "-c", standbyProgram, mode, target, strings.Join(modules, ",")}
	if auto {
		argv = append(argv, "auto")
	}
	g, err := r.StartGroup([]spawn.Spec{{LocalRank: localRank, Argv: argv, Env: env, Dir: dir, Stdout: child, Stderr: pw}})
	pw.Close()
	if err != nil {
		conn.Close()
		pr.Close()
		return nil, fmt.Errorf("prewarm: start the standby of local rank %d: %w", localRank, err)
	}
	s := &standby{localRank: localRank, g: g, started: time.Now(), pid: g.PIDs()[localRank], conn: conn, mode: mode, target: target, modules: modules,
		ready: make(chan struct{}), said: make(chan struct{}), done: make(chan struct{}), diagDone: make(chan struct{})}
	go func() {
		defer close(s.diagDone)
		defer pr.Close()
		_, _ = io.Copy(&s.diag, pr)
	}()
	go func() {
		s.exit = <-g.Exits()
		// What the standby said before it died comes first: an import
		// error it reported must not read as a plain exit (a failed
		// import disables prewarming; an exit does not).
		<-s.said
		s.fail("the standby " + s.exit.String())
		close(s.done)
	}()
	go s.awaitReady()
	return s, nil
}

// awaitReady reads the standby's first word: ready, or why its imports
// failed. It never blocks anything else: the handover reads only after it.
func (s *standby) awaitReady() {
	defer close(s.said)
	buf := make([]byte, 4096)
	n, err := s.conn.Read(buf)
	switch {
	case err != nil:
		s.fail("the standby closed its control socket before it was ready")
	case buf[0] == 'R':
		// Read at once: from here the standby only waits (or runs the
		// rank: a handover needs this ready first).
		cpu, err := processCPU(s.pid)
		if err != nil {
			cpu = -1
		}
		s.imported = importStats{Wall: time.Since(s.started), CPU: cpu}
		if n > 1 {
			s.skipped = strings.Split(string(buf[1:n]), ",")
		}
		close(s.ready)
	case buf[0] == 'U':
		mod, why, _ := strings.Cut(string(buf[1:n]), "\t")
		s.unsafe, s.unsafeWhy = mod, why
		s.fail(fmt.Sprintf("importing %s %s: not safe in a standby", mod, why))
	case buf[0] == 'E':
		msg := string(buf[1:n])
		for n == len(buf) { // the rest of a long message
			var m int
			m, err = s.conn.Read(buf)
			if err != nil {
				break
			}
			msg += string(buf[:m])
			n = m
		}
		s.fail("import failed: " + strings.TrimSpace(msg))
	default:
		s.fail(fmt.Sprintf("the standby said %q instead of ready", buf[:n]))
	}
}

// fail records the first reason the standby cannot be used.
func (s *standby) fail(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failure == "" {
		s.failure = why
	}
}

// stillImporting is usable's answer for a standby that is importing.
const stillImporting = "the standby is still importing"

// progress is how far the standby's import is at now.
func (s *standby) progress(now time.Time) importing {
	cpu, err := processCPU(s.pid)
	if err != nil {
		cpu = -1
	}
	return importing{Elapsed: now.Sub(s.started), CPU: cpu}
}

// usable reports whether the standby can take a rank now, and why not.
func (s *standby) usable() (bool, string) {
	s.mu.Lock()
	failure := s.failure
	s.mu.Unlock()
	if failure != "" {
		return false, failure
	}
	select {
	case <-s.done:
		return false, "the standby " + s.exit.String()
	default:
	}
	select {
	case <-s.ready:
		return true, ""
	default:
		return false, stillImporting
	}
}

// importFailed reports whether the standby failed on its imports (a
// failure that a new standby would repeat).
func (s *standby) importFailed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.HasPrefix(s.failure, "import failed")
}

// handover makes the standby the rank of spec: it sends the directory,
// argv, environment and the rank's stdout and stderr (SCM_RIGHTS) and waits
// up to timeout for the standby to say it runs the user's code.
func (s *standby) handover(spec spawn.Spec, timeout time.Duration) error {
	dir := spec.Dir
	if dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return fmt.Errorf("working directory: %w", err)
		}
		dir = wd
	}
	env := spec.Env
	if env == nil {
		env = os.Environ()
	}
	var payload bytes.Buffer
	payload.WriteString(dir)
	payload.WriteByte(0)
	payload.WriteString(strconv.Itoa(len(spec.Argv)))
	for _, a := range spec.Argv {
		payload.WriteByte(0)
		payload.WriteString(a)
	}
	for _, kv := range env {
		payload.WriteByte(0)
		payload.WriteString(kv)
	}
	msg := binary.BigEndian.AppendUint32(nil, uint32(payload.Len()))
	msg = append(msg, payload.Bytes()...)
	out, errw := orDefault(spec.Stdout, os.Stdout), orDefault(spec.Stderr, os.Stderr)
	rights := unix.UnixRights(int(out.Fd()), int(errw.Fd()))
	deadline := time.Now().Add(timeout)
	if err := s.conn.SetDeadline(deadline); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	n, _, err := s.conn.WriteMsgUnix(msg, rights, nil)
	for err == nil && n < len(msg) {
		var m int
		m, err = s.conn.Write(msg[n:])
		n += m
	}
	if err != nil {
		return fmt.Errorf("send the rank to the standby: %w", err)
	}
	ack := make([]byte, 1)
	if _, err := io.ReadFull(s.conn, ack); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("the standby did not take the rank within %s", timeout)
		}
		return fmt.Errorf("the standby did not take the rank: %w", err)
	}
	if ack[0] != 'S' {
		return fmt.Errorf("the standby answered %q to the handover", ack)
	}
	s.conn.Close()
	return nil
}

// kill ends a standby that will not become a rank; it does not wait.
func (s *standby) kill() {
	s.conn.Close()
	select {
	case <-s.done:
	default:
		s.g.SignalAll(syscall.SIGKILL)
	}
}

func orDefault(f, def *os.File) *os.File {
	if f == nil {
		return def
	}
	return f
}

// pyCommand is a rank command as agent.WorkerArgv builds it for Python:
// python -u [-m] target args...
type pyCommand struct {
	python, mode, target string
}

func parseArgv(argv []string) (pyCommand, bool) {
	if len(argv) < 3 || argv[1] != "-u" {
		return pyCommand{}, false
	}
	if argv[2] == "-m" {
		if len(argv) < 4 {
			return pyCommand{}, false
		}
		return pyCommand{argv[0], "module", argv[3]}, true
	}
	if strings.HasPrefix(argv[2], "-") {
		return pyCommand{}, false
	}
	return pyCommand{argv[0], "script", argv[2]}, true
}

// warmable says why spec cannot run on a standby ("" when it can): only a
// plain script file or a module (python runs a directory or zip through
// its __main__.py, which the standby does not emulate).
func warmable(spec spawn.Spec) (pyCommand, string) {
	c, ok := parseArgv(spec.Argv)
	if !ok {
		return c, "the rank command is not python -u [-m] TARGET"
	}
	if c.mode == "script" {
		p := c.target
		if !strings.HasPrefix(p, "/") && spec.Dir != "" {
			p = spec.Dir + "/" + p
		}
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return c, "the script is not a regular file"
		}
	}
	return c, ""
}
