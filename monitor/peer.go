package monitor

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// peerCred returns the credentials of the process that connected c.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("raw conn: %w", err)
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return cred, nil
}

// procStat returns the state, parent pid and process group of pid from
// /proc/<pid>/stat.
func procStat(pid int) (state byte, ppid, pgrp int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, 0, err
	}
	// The command name may contain spaces and parentheses; fields resume
	// after the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 3 {
		return 0, 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgrp, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil || len(f[0]) != 1 {
		return 0, 0, 0, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return f[0][0], ppid, pgrp, nil
}

// inRankTree reports whether peer is the rank, a descendant of it, or a
// member of its process group.
func inRankTree(peer, rank int) bool {
	if rank <= 0 || peer <= 0 {
		return false
	}
	if peer == rank {
		return true
	}
	_, _, rankPgrp, rerr := procStat(rank)
	p := peer
	for depth := 0; depth < 256 && p > 1; depth++ {
		_, ppid, pgrp, err := procStat(p)
		if err != nil {
			return false
		}
		// A shared process group counts only when it is not the launcher's
		// own group (a rank that is no group leader would otherwise admit
		// every process of the launcher's group).
		if p == peer && pgrp != unix.Getpgrp() && (pgrp == rank || (rerr == nil && pgrp == rankPgrp && rankPgrp > 1)) {
			return true
		}
		if ppid == rank {
			return true
		}
		p = ppid
	}
	return false
}

// groupAlive reports whether any non-zombie process is in process group pgid.
func groupAlive(pgid int) bool {
	if err := unix.Kill(-pgid, 0); err != nil {
		return false
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, _, pgrp, err := procStat(pid)
		if err == nil && pgrp == pgid && st != 'Z' && st != 'X' {
			return true
		}
	}
	return false
}
