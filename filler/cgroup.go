package filler

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The filler's own cgroup (cgroup v2 only): a child of the launcher's
// containment cgroup, so a reclaim can kill the whole filler tree with one
// write to cgroup.kill, escapees included. The filler's shell is moved in
// right after it starts; a child it forked before that stays in the
// launcher's cgroup and is still killed by the process-group and orphan
// sweep. With cgroup v1 (freezer) or no writable cgroup the sweep alone
// does the work.

// cgroupFor moves pid into a new cgroup under parent and returns its
// directory, or "" when the machine does not allow it.
func cgroupFor(parent string, pid int) (string, error) {
	if parent == "" {
		return "", nil
	}
	if _, err := os.Stat(filepath.Join(parent, "cgroup.kill")); err != nil {
		return "", nil // not cgroup v2 with cgroup.kill
	}
	dir := filepath.Join(parent, "filler-"+strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("filler cgroup: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
		_ = os.Remove(dir)
		return "", fmt.Errorf("filler cgroup: move pid %d: %w", pid, err)
	}
	return dir, nil
}

// killCgroup kills every process in dir and removes it (bounded).
func killCgroup(dir string) error {
	if dir == "" {
		return nil
	}
	_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := os.Remove(dir) // fails while processes are left
		if err == nil || os.IsNotExist(err) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("filler cgroup %s not empty after cgroup.kill: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cgroupPids lists the processes in dir (for tests and logs).
func cgroupPids(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			out = append(out, p)
		}
	}
	return out
}
