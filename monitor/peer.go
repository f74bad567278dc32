package monitor

import (
	"fmt"
	"net"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
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

// inRankTree reports whether peer is the rank, a descendant of it, or a
// member of its process group.
func inRankTree(peer, rank int) bool {
	if rank <= 0 || peer <= 0 {
		return false
	}
	if peer == rank {
		return true
	}
	rst, rerr := procfs.Read(rank)
	rankPgrp := rst.PGID
	p := peer
	for depth := 0; depth < 256 && p > 1; depth++ {
		st, err := procfs.Read(p)
		if err != nil {
			return false
		}
		ppid, pgrp := st.PPID, st.PGID
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
