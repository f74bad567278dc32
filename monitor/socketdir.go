package monitor

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
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
// that owns the dir for as long as it runs; the kernel drops the lock
// when that launcher dies, SIGKILL included.
const ownerLockFile = "owner.lock"

// makeLockedDir creates a private socket dir under tmp whose owner lock is
// already held when the dir appears under its ftl-mon- name (it is built
// under a name removeStaleDirs ignores, then renamed), so no sweeping
// launcher ever sees it unlocked.
func makeLockedDir(tmp string) (string, *os.File, error) {
	build, err := os.MkdirTemp(tmp, ".ftl-mon-new-")
	if err != nil {
		return "", nil, fmt.Errorf("monitor: create socket dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(build, ownerLockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			lock.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("monitor: lock socket dir: %w", err)
	}
	// The owner's pid in the name is informational (and what launchers
	// before the lock file went by); the random part keeps it unique.
	d := filepath.Join(tmp, socketDirPrefix+strconv.Itoa(os.Getpid())+"-"+strings.TrimPrefix(filepath.Base(build), ".ftl-mon-new-"))
	if err := os.Rename(build, d); err != nil {
		lock.Close()
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("monitor: create socket dir: %w", err)
	}
	return d, lock, nil
}

func (m *Manager) closeDirLock() {
	if m.dirLock != nil {
		m.dirLock.Close()
		m.dirLock = nil
	}
}

// removeStaleDirs removes socket dirs under tmp of launchers that are gone,
// owned by this uid: a dir whose owner lock nobody holds, or (a dir made
// before the lock file existed) whose named pid is not running. The lock,
// not the pid, decides whenever there is one: a launcher in another PID
// namespace (unshare --pid, a container sharing /tmp) has a pid this one
// cannot see, and removing its dir would cut its ranks off their monitors.
func removeStaleDirs(tmp string, log *slog.Logger) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), socketDirPrefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 {
			continue
		}
		// Another launcher sharing this $TMPDIR may remove the same dir
		// first: Info then fails and there is nothing left to do.
		info, err := e.Info()
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
			continue
		}
		dir := filepath.Join(tmp, e.Name())
		lock, err := os.OpenFile(filepath.Join(dir, ownerLockFile), os.O_RDWR, 0)
		switch {
		case err == nil:
			held := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			if !held {
				removeDir(dir, pid, log)
			}
			lock.Close()
		case errors.Is(err, os.ErrNotExist):
			if !pidRunning(pid) {
				removeDir(dir, pid, log)
			}
		}
	}
}

func removeDir(dir string, pid int, log *slog.Logger) {
	if err := os.RemoveAll(dir); err == nil {
		log.Debug("rank monitor: removed the socket dir of a dead launcher", "dir", filepath.Base(dir), "pid", pid)
	}
}

// pidRunning: kill(pid, 0) finds it (EPERM: it exists, another user's).
func pidRunning(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

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
