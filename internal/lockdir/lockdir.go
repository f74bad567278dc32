// Package lockdir makes private temporary directories that a launcher
// holds with an flock for as long as it runs, and removes those of
// launchers that are gone: the kernel drops the lock when its holder dies,
// SIGKILL included, so nothing a killed launcher made under $TMPDIR stays
// there past the next launcher's start.
package lockdir

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// OwnerLockFile, inside a locked dir, is flock'ed by the launcher that
// owns the dir for as long as it runs.
const OwnerLockFile = "owner.lock"

// Make creates a private dir <tmp>/<prefix><pid>-<random> whose owner lock
// is already held when the dir appears under its prefix (it is built
// under a name RemoveStale ignores, then renamed), so no sweeping launcher
// ever sees it unlocked. The lock is held until the returned file is
// closed (or the process dies).
func Make(tmp, prefix string) (string, *os.File, error) {
	build, err := os.MkdirTemp(tmp, "."+prefix+"new-")
	if err != nil {
		return "", nil, fmt.Errorf("lockdir: create %s dir: %w", prefix, err)
	}
	lock, err := os.OpenFile(filepath.Join(build, OwnerLockFile), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err != nil {
			lock.Close()
		}
	}
	if err != nil {
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("lockdir: lock %s dir: %w", prefix, err)
	}
	// The owner's pid in the name is informational (and what launchers
	// before the lock file went by); the random part keeps it unique.
	d := filepath.Join(tmp, prefix+strconv.Itoa(os.Getpid())+"-"+strings.TrimPrefix(filepath.Base(build), "."+prefix+"new-"))
	if err := os.Rename(build, d); err != nil {
		lock.Close()
		_ = os.RemoveAll(build)
		return "", nil, fmt.Errorf("lockdir: create %s dir: %w", prefix, err)
	}
	return d, lock, nil
}

// RemoveStale removes dirs <tmp>/<prefix><pid>-* of launchers that are
// gone, owned by this uid: a dir whose owner lock nobody holds, or (a dir
// made before the lock file existed) whose named pid is not running. The
// lock, not the pid, decides whenever there is one: a launcher in another
// PID namespace (unshare --pid, a container sharing /tmp) has a pid this
// one cannot see, and removing its dir would cut its ranks off.
func RemoveStale(tmp, prefix string, log *slog.Logger) {
	ents, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
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
		lock, err := os.OpenFile(filepath.Join(dir, OwnerLockFile), os.O_RDWR, 0)
		switch {
		case err == nil:
			held := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
			if !held {
				remove(dir, pid, log)
			}
			lock.Close()
		case errors.Is(err, os.ErrNotExist):
			if !pidRunning(pid) {
				remove(dir, pid, log)
			}
		}
	}
}

func remove(dir string, pid int, log *slog.Logger) {
	if err := os.RemoveAll(dir); err == nil && log != nil {
		log.Debug("removed the private dir of a dead launcher", "dir", filepath.Base(dir), "pid", pid)
	}
}

// pidRunning: kill(pid, 0) finds it (EPERM: it exists, another user's).
func pidRunning(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
