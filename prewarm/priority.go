package prewarm

import (
	"errors"
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
)

// A standby imports at the lowest CPU priority (nice 19) so that it never
// takes the CPU from the ranks that train, start or restart beside it: a
// torch import is a CPU-second or more, and a node (or a container with a
// CPU limit) without a spare core otherwise shares it between the ranks'
// own imports and their standbys'. The rank a standby becomes must run at
// the priority a cold rank has, so the launcher raises every thread of
// the standby back to its own nice value before the handover. Raising a
// nice value needs CAP_SYS_NICE or a large enough RLIMIT_NICE; a launcher
// that cannot (a container's default capabilities have no CAP_SYS_NICE)
// leaves its standbys at its own priority, as before (docs/prewarm.md,
// "Standby priority").
const standbyNice = 19

// priority is what the Starter does with its standbys' nice values.
type priority struct {
	base int    // the launcher's nice value: what cold ranks inherit
	low  bool   // standbys import at standbyNice and are raised to base
	why  string // when !low: why not
}

// probePriority reads the launcher's nice value and checks, on a thread of
// its own, that a lowered nice value can be raised back to it: the exact
// permission the handover needs (the kernel's can_nice).
func probePriority() priority {
	base, err := niceOf(os.Getpid()) // the main thread's: a rank is never forked from a lowered thread
	if err != nil {
		return priority{why: err.Error()}
	}
	if base >= standbyNice {
		return priority{base: base, why: fmt.Sprintf("the launcher already runs at nice %d", base)}
	}
	res := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, lowered if raising it failed, ends
		// with this goroutine instead of running other goroutines.
		runtime.LockOSThread()
		tid := unix.Gettid()
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, base+1); err != nil {
			res <- fmt.Errorf("lower a thread: %w", err)
			return
		}
		if err := unix.Setpriority(unix.PRIO_PROCESS, tid, base); err != nil {
			res <- fmt.Errorf("raise a lowered thread back to nice %d: %w (needs CAP_SYS_NICE or RLIMIT_NICE >= %d)", base, err, 20-base)
			return
		}
		res <- nil
	}()
	if err := <-res; err != nil {
		return priority{base: base, why: err.Error()}
	}
	return priority{base: base, low: true}
}

// niceOf is the nice value of thread (or process main thread) tid.
func niceOf(tid int) (int, error) {
	// The raw syscall returns 20 - nice, so that no value is negative.
	p, err := unix.Getpriority(unix.PRIO_PROCESS, tid)
	if err != nil {
		return 0, fmt.Errorf("getpriority(%d): %w", tid, err)
	}
	return 20 - p, nil
}

// setNiceAll sets the nice value of every thread of process pid. Threads
// started while it runs inherit the value of the thread that started them,
// which may not have been set yet, so it goes over the list again until a
// pass finds no thread it had not set (at most a few passes).
func setNiceAll(pid, nice int) error {
	done := map[int]bool{}
	for pass := 0; pass < 8; pass++ {
		tids, err := procfs.Threads(pid)
		if err != nil {
			return err
		}
		fresh := false
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			fresh = true
			if err := unix.Setpriority(unix.PRIO_PROCESS, tid, nice); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("setpriority(thread %d of %d, nice %d): %w", tid, pid, nice, err)
			}
			done[tid] = true
		}
		if !fresh {
			return nil
		}
	}
	return fmt.Errorf("process %d kept starting threads while its nice value was set", pid)
}
