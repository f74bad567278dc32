package spawn

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Cgroup roots tried by Contain, in order: a cgroup v2 hierarchy (pure, or
// the "unified" one of a hybrid setup) ends a cgroup with one write to
// cgroup.kill; the v1 freezer stops it so its processes can be SIGKILLed
// without any of them forking meanwhile.
func containRoots() []string {
	return []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/freezer"}
}

// guardianScript runs in a /bin/sh outside the launcher's cgroup, in its own
// session. It blocks on its stdin, the read end of a pipe only the launcher
// holds the write end of; when the launcher is gone (any exit, SIGKILL
// included) it kills every process left in the cgroup and removes it.
const guardianScript = `trap '' HUP INT TERM QUIT PIPE
cg="$1"
while read -r _; do :; done
i=0
while [ $i -lt 50 ]; do
	i=$((i+1))
	if [ -e "$cg/cgroup.kill" ]; then
		echo 1 > "$cg/cgroup.kill" 2>/dev/null
	else
		echo FROZEN > "$cg/freezer.state" 2>/dev/null
		j=0
		while [ $j -lt 20 ] && ! grep -q FROZEN "$cg/freezer.state" 2>/dev/null; do j=$((j+1)); sleep 0.05; done
		for p in $(cat "$cg/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
		echo THAWED > "$cg/freezer.state" 2>/dev/null
	fi
	rmdir "$cg" 2>/dev/null && exit 0
	[ -d "$cg" ] || exit 0
	sleep 0.1
done
exit 1
`

// Containment is the cgroup the launcher moved itself into, watched by a
// guardian process that kills whatever is left in it once the launcher is
// gone. Every process the launcher starts afterwards (ranks, their
// descendants, even setsid'd and double-forked ones) inherits the cgroup.
type Containment struct {
	Dir      string // the cgroup directory
	Guardian int    // pid of the guardian
}

// Contain creates a cgroup for this launcher (ftl-<pid> under the first
// writable root of containRoots), starts its guardian and moves the calling
// process into it. It first removes empty cgroups of dead launchers. It
// fails, changing nothing, where no cgroup is writable (docs/architecture.md
// says what remains possible then).
func Contain(log *slog.Logger) (*Containment, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var errs []error
	for _, root := range containRoots() {
		c, err := containUnder(root)
		if err == nil {
			log.Debug("spawn: ranks contained in a cgroup", "cgroup", c.Dir, "guardian_pid", c.Guardian)
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("spawn: no writable cgroup: %w", errors.Join(errs...))
}

func containUnder(root string) (*Containment, error) {
	v2 := fileExists(filepath.Join(root, "cgroup.controllers"))
	freezer := !v2 && filepath.Base(root) == "freezer" && fileExists(filepath.Join(root, "tasks"))
	if !v2 && !freezer {
		return nil, fmt.Errorf("%s: not a cgroup v2 or freezer hierarchy", root)
	}
	removeStaleCgroups(root)
	dir := filepath.Join(root, "ftl-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%s: %w", root, err)
	}
	if v2 && !fileExists(filepath.Join(dir, "cgroup.kill")) {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("%s: no cgroup.kill (kernel older than 5.14)", root)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		_ = os.Remove(dir)
		return nil, fmt.Errorf("guardian pipe: %w", err)
	}
	// The write end stays open (a raw fd: no finalizer can close it) until
	// this process is gone; CLOEXEC keeps it out of every child.
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		_ = os.Remove(dir)
		return nil, fmt.Errorf("guardian: %w", err)
	}
	defer devnull.Close()
	pid, err := syscall.ForkExec("/bin/sh", []string{"ftl-guardian", "-c", guardianScript, "ftl-guardian", dir}, &syscall.ProcAttr{
		Dir: "/", Env: []string{"PATH=/usr/bin:/bin"},
		Files: []uintptr{uintptr(p[0]), devnull.Fd(), devnull.Fd()},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	unix.Close(p[0])
	if err != nil {
		unix.Close(p[1])
		_ = os.Remove(dir)
		return nil, fmt.Errorf("start guardian: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
		unix.Close(p[1]) // the guardian removes the (empty) cgroup and exits
		return nil, fmt.Errorf("join %s: %w", dir, err)
	}
	return &Containment{Dir: dir, Guardian: pid}, nil
}

// removeStaleCgroups removes ftl-<pid> cgroups of launchers that are gone
// and whose guardian could not clean up. rmdir fails on a cgroup that still
// has processes, so a live one is never touched.
func removeStaleCgroups(root string) {
	ents, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, ok := ownerPID(e.Name(), "ftl-")
		if !ok || !e.IsDir() || pidAlive(pid) {
			continue
		}
		_ = os.Remove(filepath.Join(root, e.Name()))
	}
}

// ownerPID parses <prefix><pid>[-...] names.
func ownerPID(name, prefix string) (int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return 0, false
	}
	if i := strings.IndexByte(rest, '-'); i >= 0 {
		rest = rest[:i]
	}
	pid, err := strconv.Atoi(rest)
	return pid, err == nil && pid > 0
}

// pidAlive: kill(pid, 0) finds the process (EPERM: it exists, another user's).
func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
