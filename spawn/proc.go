package spawn

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procStat is the part of /proc/<pid>/stat that the sweep needs.
type procStat struct {
	pid, ppid, pgid int
	state           byte
	comm            string
}

// listProcs reads /proc/*/stat. Processes that vanish while being read are
// skipped.
func listProcs() ([]procStat, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("read /proc: %w", err)
	}
	var out []procStat
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		ps, err := readProcStat(pid)
		if err != nil {
			continue
		}
		out = append(out, ps)
	}
	return out, nil
}

// readProcStat parses /proc/<pid>/stat. The command name is in parentheses
// and may itself contain spaces and parentheses, so fields are counted from
// the last ')'.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	return parseProcStat(b)
}

func parseProcStat(b []byte) (procStat, error) {
	open := bytes.IndexByte(b, '(')
	closeIdx := bytes.LastIndexByte(b, ')')
	if open < 0 || closeIdx < open {
		return procStat{}, fmt.Errorf("malformed stat %q", b)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b[:open])))
	if err != nil {
		return procStat{}, fmt.Errorf("malformed stat pid: %w", err)
	}
	// After ")": state ppid pgrp ...
	f := bytes.Fields(b[closeIdx+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed stat %q", b)
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	if err1 != nil || err2 != nil {
		return procStat{}, fmt.Errorf("malformed stat %q", b)
	}
	return procStat{pid: pid, ppid: ppid, pgid: pgid, state: f[0][0], comm: string(b[open+1 : closeIdx])}, nil
}
