package procfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"strconv"
)

// pfExiting is PF_EXITING of the kernel's task flags (include/linux/sched.h):
// the task has entered do_exit.
const pfExiting = 0x4

// sigkillBit is SIGKILL's bit in the pending-signal masks of
// /proc/<pid>/status (bit signo-1).
const sigkillBit = 1 << (9 - 1)

// Ending reports whether pid has ended or is ending, although its parent
// may not have reaped it yet: it is gone from /proc (reaped), a zombie, in
// do_exit (PF_EXITING), or has SIGKILL pending (sent, not yet acted on).
// Between a SIGKILL and the parent's wait4 a process passes through these
// states in that order, so a process killed a moment ago is ending even
// when its SIGCHLD has not been handled. An error reading /proc other than
// "no such process" reports false: the process is taken to be alive.
func Ending(pid int) bool {
	if pid <= 0 {
		return false
	}
	base := "/proc/" + strconv.Itoa(pid)
	b, err := os.ReadFile(base + "/stat")
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	st, err := Parse(b)
	if err != nil {
		return false
	}
	if st.Dead() {
		return true
	}
	if flags, ok := statFlags(b); ok && flags&pfExiting != 0 {
		return true
	}
	status, err := os.ReadFile(base + "/status")
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	return err == nil && sigkillPending(status)
}

// statFlags returns the flags field of a /proc/<pid>/stat (the 9th, the
// 7th after the command name).
func statFlags(b []byte) (uint64, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 7 {
		return 0, false
	}
	v, err := strconv.ParseUint(string(f[6]), 10, 64)
	return v, err == nil
}

// sigkillPending reports SIGKILL in the thread's (SigPnd) or the process's
// (ShdPnd) pending signals of a /proc/<pid>/status.
func sigkillPending(status []byte) bool {
	for line := range bytes.SplitSeq(status, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || (string(k) != "SigPnd" && string(k) != "ShdPnd") {
			continue
		}
		mask, err := strconv.ParseUint(string(bytes.TrimSpace(v)), 16, 64)
		if err == nil && mask&sigkillBit != 0 {
			return true
		}
	}
	return false
}
