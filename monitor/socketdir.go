package monitor

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/ftlauncher/ft-launcher/internal/lockdir"
)

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
// that owns the dir for as long as it runs (package lockdir).
const ownerLockFile = lockdir.OwnerLockFile

// makeLockedDir creates a private socket dir under tmp, locked before it
// appears under its ftl-mon- name (lockdir.Make).
func makeLockedDir(tmp string) (string, *os.File, error) {
	d, lock, err := lockdir.Make(tmp, socketDirPrefix)
	if err != nil {
		return "", nil, fmt.Errorf("monitor: socket dir: %w", err)
	}
	return d, lock, nil
}

func (m *Manager) closeDirLock() {
	if m.dirLock != nil {
		m.dirLock.Close()
		m.dirLock = nil
	}
}

// removeStaleDirs removes the socket dirs under tmp of launchers that are
// gone (lockdir.RemoveStale).
func removeStaleDirs(tmp string, log *slog.Logger) { lockdir.RemoveStale(tmp, socketDirPrefix, log) }

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
