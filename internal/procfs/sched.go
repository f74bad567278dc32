package procfs

import (
	"bytes"
	"os"
	"strconv"
	"time"
)

// GroupDemand sums, over every thread of the live members of process
// group pgid, the time spent on a CPU and the time spent runnable but
// waiting for one (the first two fields of
// /proc/<pid>/task/<tid>/schedstat, in nanoseconds). A process that
// computes accrues one or the other whatever the load; one blocked on a
// lock, a pipe or a peer accrues neither: on an oversubscribed machine the
// CPU time alone would make a computing rank look idle. ok is false when
// the group has no member or schedstat is unavailable.
func GroupDemand(pgid int) (d time.Duration, ok bool) {
	procs, err := List()
	if err != nil {
		return 0, false
	}
	for _, p := range procs {
		if p.PGID != pgid || p.Dead() {
			continue
		}
		tids, err := Threads(p.PID)
		if err != nil {
			continue
		}
		for _, tid := range tids {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/task/" + strconv.Itoa(tid) + "/schedstat")
			if err != nil {
				continue
			}
			if run, wait, good := parseSchedstat(b); good {
				d += time.Duration(run + wait)
				ok = true
			}
		}
	}
	return d, ok
}

// parseSchedstat reads "<on cpu ns> <waiting ns> <timeslices>".
func parseSchedstat(b []byte) (run, wait uint64, ok bool) {
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, 0, false
	}
	run, err1 := strconv.ParseUint(string(f[0]), 10, 64)
	wait, err2 := strconv.ParseUint(string(f[1]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return run, wait, true
}
