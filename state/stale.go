package state

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// Segments' directories and their owners. A store holds an exclusive
// flock(2) on its directory's lock file for its whole life. The kernel
// drops the lock when the last descriptor of it closes, which a SIGKILL
// does too, so a later launcher that can take the lock knows the owner is
// gone; a reused pid, or a launcher in another PID namespace sharing
// /dev/shm, cannot fool it (the lock is on the file, not on a pid). The
// descriptor is close-on-exec, so no rank or child holds it.
const (
	// ShmDirPrefix starts every segments' directory's name under ShmRoot:
	// ft-launcher-state-<pid>-<random>.
	ShmDirPrefix = "ft-launcher-state-"
	// OwnerLockName is the lock file in a segments' directory.
	OwnerLockName = ".owner.lock"
	// stagePrefix names a directory being set up: it gets its lock file
	// and lock before it is renamed to its ShmDirPrefix name, so that no
	// sweep ever sees a directory of a live store without its lock held.
	stagePrefix = "." + ShmDirPrefix
	// staleStageAge: a staging directory this old is a launcher's that
	// died in the microseconds between its mkdir and its rename (a younger
	// one may be in the middle of its set-up).
	staleStageAge = time.Minute
)

// createShmDir creates this store's segments' directory under root, with
// its owner lock held; the lock file stays open (and locked) until the
// returned file is closed.
func createShmDir(root string) (dir string, lock *os.File, err error) {
	pid := strconv.Itoa(os.Getpid())
	stage, err := os.MkdirTemp(root, stagePrefix+pid+"-")
	if err != nil {
		return "", nil, fmt.Errorf("create the segments' directory in %s: %w", root, err)
	}
	fail := func(err error) (string, *os.File, error) {
		if lock != nil {
			_ = lock.Close()
		}
		_ = os.RemoveAll(stage)
		return "", nil, err
	}
	lock, err = os.OpenFile(filepath.Join(stage, OwnerLockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fail(fmt.Errorf("create the segments' owner lock: %w", err))
	}
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return fail(fmt.Errorf("lock the segments' directory %s: %w", stage, err))
	}
	dir = filepath.Join(root, ShmDirPrefix+strings.TrimPrefix(filepath.Base(stage), stagePrefix))
	if err := unix.Renameat2(unix.AT_FDCWD, stage, unix.AT_FDCWD, dir, unix.RENAME_NOREPLACE); err != nil {
		return fail(fmt.Errorf("rename the segments' directory %s to %s: %w", stage, dir, err))
	}
	return dir, lock, nil
}

// RemoveStale removes, under root, the segments' directories whose owner
// is gone (see createShmDir): a launcher killed with SIGKILL cannot remove
// its own. A directory whose lock is held (a live launcher, in any PID
// namespace), that has no lock file (a launcher from before the lock, or
// not a launcher's), or that this user cannot open is left as it is. Each
// removal is an event (state_stale_removed) and a log line. It returns
// the directories removed.
func RemoveStale(root string, emit func(eventlog.Record), log *slog.Logger) []string {
	ents, err := os.ReadDir(root)
	if err != nil {
		log.Debug("state: cannot list for stale segments", "root", root, "err", err)
		return nil
	}
	var removed []string
	for _, e := range ents {
		name := e.Name()
		stage := strings.HasPrefix(name, stagePrefix)
		if !e.IsDir() || (!stage && !strings.HasPrefix(name, ShmDirPrefix)) {
			continue
		}
		dir := filepath.Join(root, name)
		if stage {
			info, err := e.Info()
			if err != nil || time.Since(info.ModTime()) < staleStageAge {
				continue
			}
		}
		ok, err := removeIfOrphaned(dir, stage)
		if err != nil {
			log.Warn("state: stale segments' directory not removed", "dir", dir, "err", err)
			continue
		}
		if ok.removed {
			removed = append(removed, dir)
			emit(eventlog.StateStaleRemovedEvent{Dir: dir, PID: pidOf(name), Bytes: ok.bytes, Files: ok.files})
			log.Info("state: removed the segments' directory of a launcher that is gone", "dir", dir,
				"pid", pidOf(name), "bytes", ok.bytes, "files", ok.files)
		}
	}
	return removed
}

type orphanRemoval struct {
	removed bool
	bytes   int64
	files   int
}

// removeIfOrphaned removes dir when its owner lock can be taken, holding
// the lock meanwhile so that two launchers starting together do not both
// sweep it. A staging directory without a lock file is an orphan too
// (its owner died before creating it; RemoveStale checked its age).
func removeIfOrphaned(dir string, stage bool) (orphanRemoval, error) {
	lock, err := os.OpenFile(filepath.Join(dir, OwnerLockName), os.O_RDWR, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist) && stage:
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, fs.ErrPermission):
		return orphanRemoval{}, nil // not ours to judge
	case err != nil:
		return orphanRemoval{}, fmt.Errorf("open its owner lock: %w", err)
	default:
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			if errors.Is(err, unix.EWOULDBLOCK) {
				return orphanRemoval{}, nil // its launcher is alive
			}
			return orphanRemoval{}, fmt.Errorf("lock it: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(int(lock.Fd()), &st); err == nil && st.Nlink == 0 {
			return orphanRemoval{}, nil // another launcher's sweep removed it meanwhile
		}
	}
	var r orphanRemoval
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == OwnerLockName {
			return nil
		}
		r.files++
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				r.bytes += st.Blocks * 512 // what it held (segments are sparse until written)
			} else {
				r.bytes += info.Size()
			}
		}
		return nil
	})
	if err := os.RemoveAll(dir); err != nil {
		return orphanRemoval{}, fmt.Errorf("remove it: %w", err)
	}
	r.removed = true
	return r, nil
}

// pidOf is the launcher pid in a segments' directory's name, 0 if none.
func pidOf(name string) int {
	name = strings.TrimPrefix(strings.TrimPrefix(name, "."), ShmDirPrefix)
	p, _, _ := strings.Cut(name, "-")
	n, _ := strconv.Atoi(p)
	return n
}
