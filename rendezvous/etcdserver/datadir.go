package etcdserver

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A temporary data dir is <tmp>/ft-launcher-etcd-XXXX/ (tmp: $TMPDIR, else
// /tmp; under Slurm the job's TMPDIR when the cluster sets one), holding
// the etcd data in data/ and owner.lock: the owner's pid, flock'ed for the
// owner's whole life. Close removes the dir; a server killed outright
// (SIGKILL of a Slurm step) cannot, so every start removes the dirs whose
// lock it can take: the kernel drops a lock when its holder dies, so a
// live owner's dir is never touched. A dir is prepared under a hidden name
// and renamed once locked, so no sweeper sees it unlocked.
const (
	dirPrefix     = "ft-launcher-etcd-"
	stagingPrefix = ".ft-launcher-etcd-new-"
	lockName      = "owner.lock"
	// stagingStale: a staging dir this old was left by a start that died
	// between creating and renaming it (microseconds in practice).
	stagingStale = 10 * time.Minute
)

// dataDir is a temporary data dir owned (locked) by this process.
type dataDir struct {
	path string   // the owned dir
	lock *os.File // owner.lock, flock'ed until remove
}

// data is the etcd data directory inside the owned dir.
func (d *dataDir) data() string { return filepath.Join(d.path, "data") }

// newDataDir creates and locks a data dir under parent.
func newDataDir(parent string) (*dataDir, error) {
	stage, err := os.MkdirTemp(parent, stagingPrefix)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd data dir: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(stage, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err == nil {
		err = syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			_, err = lock.WriteString(strconv.Itoa(os.Getpid()) + "\n")
		}
	}
	final := filepath.Join(parent, dirPrefix+strings.TrimPrefix(filepath.Base(stage), stagingPrefix))
	if err == nil {
		err = os.Rename(stage, final)
	}
	if err != nil {
		if lock != nil {
			lock.Close()
		}
		os.RemoveAll(stage)
		return nil, fmt.Errorf("embedded etcd data dir %s: %w", final, err)
	}
	return &dataDir{path: final, lock: lock}, nil
}

// adoptDataDir takes over dir, an owned dir whose owner died (this
// member's previous server, SIGKILLed or crashed), to restart the member on
// its data: it takes the owner lock, which fails while the owner lives, and
// requires etcd data in it (data/member). A dir that is gone, locked or
// holds no data is an error: the caller then replaces the member (a new
// member on a fresh dir).
func adoptDataDir(dir string) (*dataDir, error) {
	if !strings.HasPrefix(filepath.Base(dir), dirPrefix) {
		return nil, fmt.Errorf("adopt embedded etcd dir %s: not an %s* dir", dir, dirPrefix)
	}
	lock, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt embedded etcd dir: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		return nil, fmt.Errorf("adopt embedded etcd dir %s: its owner still holds %s: %w", dir, lockName, err)
	}
	d := &dataDir{path: dir, lock: lock}
	// A sweeper may have removed the dir between our open and our lock.
	if st, err := os.Stat(filepath.Join(d.data(), "member")); err != nil || !st.IsDir() {
		d.remove()
		return nil, fmt.Errorf("adopt embedded etcd dir %s: no etcd data in it (removed by a sweep, or never written)", dir)
	}
	if err := lock.Truncate(0); err == nil {
		_, _ = lock.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return d, nil
}

// remove deletes the dir, then releases the lock.
func (d *dataDir) remove() error {
	err := os.RemoveAll(d.path)
	d.lock.Close()
	if err != nil {
		return fmt.Errorf("remove embedded etcd dir: %w", err)
	}
	return nil
}

// sweepStale removes the data dirs under parent whose owner is dead, and
// staging dirs left long ago; it returns what it removed. Dirs it cannot
// open (another user's) and dirs without an owner lock (made by an older
// launcher, owner unknown) are left alone.
func sweepStale(parent string, log *slog.Logger) []string {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	var removed []string
	for _, ent := range ents {
		p := filepath.Join(parent, ent.Name())
		if !ent.IsDir() {
			continue
		}
		var stale bool
		switch {
		case strings.HasPrefix(ent.Name(), dirPrefix):
			stale = ownerDead(p)
		case strings.HasPrefix(ent.Name(), stagingPrefix):
			info, err := ent.Info()
			stale = err == nil && time.Since(info.ModTime()) > stagingStale
		}
		if !stale {
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			log.Warn("could not remove a stale embedded etcd data dir", "dir", p, "err", err)
			continue
		}
		log.Info("removed the data dir of an embedded etcd whose launcher died", "dir", p)
		removed = append(removed, p)
	}
	return removed
}

// ownerDead reports whether dir's owner lock can be taken, i.e. its owner
// is gone. The lock is dropped again at once: the caller removes the dir,
// and an owner never comes back to a dir once it let go of its lock.
func ownerDead(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR, 0)
	if err != nil {
		return false // no lock file (an older launcher's dir) or not ours
	}
	defer f.Close()
	// EWOULDBLOCK: a live owner holds it.
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}
