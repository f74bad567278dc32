package prewarm

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Importing says what a restart does with a standby that is still
// importing its modules (--prewarm-importing).
type Importing string

const (
	// ImportingAuto waits for the standby when its import should end
	// sooner than a cold start would finish, and stops it otherwise
	// (decideImporting).
	ImportingAuto Importing = "auto"
	// ImportingWait always waits for the standby (bounded).
	ImportingWait Importing = "wait"
	// ImportingStop always stops the standby and starts the rank cold.
	ImportingStop Importing = "stop"
)

// ParseImporting parses a --prewarm-importing value.
func ParseImporting(s string) (Importing, error) {
	switch v := Importing(strings.ToLower(strings.TrimSpace(s))); v {
	case ImportingAuto, ImportingWait, ImportingStop:
		return v, nil
	}
	return "", fmt.Errorf("%q: want auto, wait or stop", s)
}

// The rule's constants (docs/prewarm.md, "A restart while a standby is
// still importing").
const (
	// minShare: with a measurement, a standby that has done less than
	// this share of the last import's CPU time is stopped: waiting would
	// save less than a tenth of a cold start.
	minShare = 0.10
	// firstMinCPU: without a measurement, a standby that has used less
	// CPU than this is stopped (it has barely started, or it is blocked,
	// not importing). 100 ms is about a tenth of Debian's torch import.
	firstMinCPU = 100 * time.Millisecond
	// firstWait bounds a wait without a measurement: a cold import of
	// torch with 4 ranks on 2 cores takes about 6 s here.
	firstWait = 10 * time.Second
	// waitSlack is added to a measured import's wall time to bound a
	// wait with a measurement.
	waitSlack = time.Second
)

// importStats is one completed standby import: start -> ready. It is also
// the launcher's measure of a cold start to ready: a cold rank runs the
// same interpreter start and the same imports.
type importStats struct {
	Wall time.Duration // wall time
	CPU  time.Duration // CPU time of the standby process (user + system)
	// Unended is, while no import has been measured, how long a wait for
	// a standby's import lasted that ran out (a module that blocks at
	// import?); zero otherwise.
	Unended time.Duration
}

// importing is how far a standby is at a restart.
type importing struct {
	Elapsed time.Duration // wall time since it started
	CPU     time.Duration // CPU time it used so far; < 0: unknown
}

// choice is what decideImporting chose for one rank.
type choice struct {
	Wait     bool          // wait for the standby; else stop it and start cold
	MaxWait  time.Duration // how long to wait at most (Wait only)
	Estimate time.Duration // expected wait, when known (Wait only)
	Reason   string
}

// decideImporting chooses, for a rank whose standby is still importing at
// a restart, between waiting for the standby and stopping it so that the
// cold start does not compete with it for CPU. last is the last completed
// import (zero: none yet).
//
// The comparison is in CPU time: at the restart the standby's remaining
// import and a cold start would run under the same load, and a cold start
// needs about one whole import (last.CPU), the standby only what it has
// not done yet. The standby's wall time of last time is not comparable
// (refills import while the ranks train), but bounds the wait.
func decideImporting(policy Importing, now importing, last importStats) choice {
	maxWait := firstWait
	if last.CPU > 0 {
		maxWait = max(last.Wall, last.CPU) + waitSlack
	}
	cpu := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
	switch policy {
	case ImportingStop:
		return choice{Reason: "--prewarm-importing stop"}
	case ImportingWait:
		c := choice{Wait: true, MaxWait: maxWait, Reason: "--prewarm-importing wait"}
		if last.CPU > 0 && now.CPU >= 0 {
			c.Estimate = max(last.CPU-now.CPU, 0)
		}
		return c
	}
	if now.CPU < 0 {
		return choice{Reason: "the standby's CPU time is unknown"}
	}
	if last.CPU <= 0 {
		if last.Unended > 0 {
			// Waiting again would likely cost the same bound again, at
			// every restart: a cold start is what a wait ended in.
			return choice{Reason: fmt.Sprintf("no import measured yet, and a wait of %s for an earlier standby's import ran out",
				last.Unended.Round(time.Millisecond))}
		}
		if now.CPU < firstMinCPU {
			return choice{Reason: fmt.Sprintf("no import measured yet and the standby used only %s CPU (under %s)",
				cpu(now.CPU), cpu(firstMinCPU))}
		}
		return choice{Wait: true, MaxWait: maxWait, Reason: fmt.Sprintf(
			"no import measured yet; the standby used %s CPU, a cold start starts from nothing", cpu(now.CPU))}
	}
	remaining := max(last.CPU-now.CPU, 0)
	if float64(now.CPU) < minShare*float64(last.CPU) {
		return choice{Reason: fmt.Sprintf("the standby did %s of a %s CPU import (under %.0f%%): a wait would save little",
			cpu(now.CPU), cpu(last.CPU), minShare*100)}
	}
	return choice{Wait: true, MaxWait: maxWait, Estimate: remaining, Reason: fmt.Sprintf(
		"about %s CPU of import left against %s for a cold start", cpu(remaining), cpu(last.CPU))}
}

// clockTick is the unit of the CPU times in /proc/PID/stat (USER_HZ,
// 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// processCPU is the CPU time (user + system, all threads) process pid has
// used, from /proc/PID/stat.
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var sum time.Duration
	for _, s := range f[11:13] { // utime, stime: fields 14 and 15
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		sum += time.Duration(n) * clockTick
	}
	return sum, nil
}
