// Package procfs reads the few fields of Linux's /proc/<pid>/stat that the
// launcher needs (state, parent, process group) to find a rank's processes,
// and their CPU time and I/O counters to tell a busy rank from a hung one;
// and which sockets a process holds and which of them listen (sockets.go).
// It is the only place that parses /proc.
package procfs

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Stat is the part of /proc/<pid>/stat the launcher uses.
type Stat struct {
	PID, PPID, PGID int
	State           byte // R, S, D, Z, X, T, ...
	Comm            string
	// StartTime is when the process started, in clock ticks since boot:
	// with the pid it names one process, never a later one reusing the pid.
	StartTime uint64
	// CPUTicks is the CPU time the process used so far (user and system,
	// every thread), in clock ticks.
	CPUTicks uint64
	// Nice is the nice value of the process's main thread (-20 to 19).
	Nice int
}

// Dead reports a process that has exited: a zombie awaiting its reaper, or
// one being torn down.
func (s Stat) Dead() bool { return s.State == 'Z' || s.State == 'X' }

// Stopped reports a process stopped by a signal (SIGSTOP, SIGTSTP, ...):
// it runs no code until a SIGCONT. A tracer's stop ('t') is not counted:
// a debugger holds that process on purpose.
func (s Stat) Stopped() bool { return s.State == 'T' }

// Read returns the stat of pid.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, fmt.Errorf("procfs: %w", err)
	}
	return Parse(b)
}

// Parse parses the content of a /proc/<pid>/stat file. The command name is
// in parentheses and may itself contain spaces and parentheses, so fields
// are counted from the last ')'.
func Parse(b []byte) (Stat, error) {
	open := bytes.IndexByte(b, '(')
	closeIdx := bytes.LastIndexByte(b, ')')
	if open < 0 || closeIdx < open {
		return Stat{}, fmt.Errorf("procfs: malformed stat %q", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return Stat{}, fmt.Errorf("procfs: malformed stat pid: %w", err)
	}
	// After ")": state ppid pgrp ...
	f := bytes.Fields(b[closeIdx+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("procfs: malformed stat %q", b)
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return Stat{}, fmt.Errorf("procfs: malformed stat %q", b)
	}
	st := Stat{PID: pid, PPID: ppid, PGID: pgid, State: f[0][0], Comm: string(b[open+1 : closeIdx])}
	// utime and stime are fields 14 and 15 of stat, nice field 19,
	// starttime field 22: the 12th, 13th, 17th and 20th after the command
	// name.
	if len(f) >= 20 {
		ut, _ := strconv.ParseUint(string(f[11]), 10, 64)
		stt, _ := strconv.ParseUint(string(f[12]), 10, 64)
		st.CPUTicks = ut + stt
		st.Nice, _ = strconv.Atoi(string(f[16]))
		st.StartTime, _ = strconv.ParseUint(string(f[19]), 10, 64)
	}
	return st, nil
}

// List returns the stat of every process. Processes that vanish while
// being read are skipped.
func List() ([]Stat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("procfs: read /proc: %w", err)
	}
	out := make([]Stat, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := Read(pid); err == nil {
			out = append(out, st)
		}
	}
	return out, nil
}

// Threads returns the thread ids of process pid (its main thread's id is
// pid), in /proc's order.
func Threads(pid int) ([]int, error) {
	entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return nil, fmt.Errorf("procfs: threads of %d: %w", pid, err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// GroupAlive reports whether process group pgid has a member that has not
// exited (zombies do not count: they only wait for their reaper).
func GroupAlive(pgid int) bool {
	// Cheap first: signal 0 fails once the group has no member at all.
	if pgid <= 0 || unix.Kill(-pgid, 0) != nil {
		return false
	}
	procs, err := List()
	if err != nil {
		return true // members exist; their state is unknown
	}
	for _, p := range procs {
		if p.PGID == pgid && !p.Dead() {
			return true
		}
	}
	return false
}

// ClockTick is the unit of CPUTicks: USER_HZ, 100 on every Linux ABI.
const ClockTick = 10 * time.Millisecond

// Activity is what the processes of a group did so far.
type Activity struct {
	CPU time.Duration // CPU time of its live members
	// IOBytes is the bytes its live members passed to read and write
	// calls (rchar + wchar of /proc/<pid>/io: files, pipes, sockets
	// read or written with read(2) and write(2)); 0 where unreadable.
	IOBytes uint64
}

// GroupActivity sums the activity of the live members of process group
// pgid. ok is false when the group has none.
func GroupActivity(pgid int) (a Activity, ok bool) {
	procs, err := List()
	if err != nil {
		return a, false
	}
	for _, p := range procs {
		if p.PGID != pgid || p.Dead() {
			continue
		}
		ok = true
		a.CPU += time.Duration(p.CPUTicks) * ClockTick
		a.IOBytes += ioBytes(p.PID)
	}
	return a, ok
}

// ioBytes returns rchar + wchar of pid, 0 when unreadable.
func ioBytes(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0
	}
	var n uint64
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		k, v, found := bytes.Cut(line, []byte(": "))
		if found && (string(k) == "rchar" || string(k) == "wchar") {
			x, _ := strconv.ParseUint(string(bytes.TrimSpace(v)), 10, 64)
			n += x
		}
	}
	return n
}
