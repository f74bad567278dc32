package state

import (
	"errors"
	"fmt"
	"log/slog"
	"runtime"

	"golang.org/x/sys/unix"
)

// The periodic write-outs run on one OS thread of their own whose CPU and
// I/O priorities are lowered, so that on a node without an idle core the
// training loop keeps the CPU and the disk (docs/state.md, "Priority of
// the write-outs"). Only that thread is lowered: Linux keeps a nice value
// and an I/O priority per thread, and setpriority(PRIO_PROCESS, tid) and
// ioprio_set(IOPRIO_WHO_PROCESS, tid) with a thread id name that thread
// alone. The urgent write-outs (a rank failed, a signal, the end) run on
// the launcher's other threads, at the launcher's own priority: a thread
// once lowered cannot be raised back without CAP_SYS_NICE (nice) and so
// is never reused for them.
const (
	// lowNice is the writer thread's nice value (the lowest priority of
	// SCHED_OTHER). Not SCHED_IDLE: an idle-class thread gets no CPU at
	// all while the loop keeps every core busy, so a periodic write-out
	// could wait for the job's end; at nice 19 it gets about 1.5% of a
	// core against one busy nice-0 thread and still finishes.
	lowNice = 19

	// ioprio_set(2) (include/uapi/linux/ioprio.h): the value is the class
	// shifted left by 13 ORed with the level; who = IOPRIO_WHO_PROCESS
	// with a thread id names that thread.
	ioprioClassShift = 13
	ioprioClassBE    = 2 // best effort: levels 0 (highest) to 7 (lowest)
	ioprioWhoProcess = 1
	// lowIOLevel: the lowest best-effort level. Not the idle class, for the
	// reason of lowNice: an idle-class fsync can wait as long as the
	// loop's own I/O keeps the disk busy.
	lowIOLevel = 7
)

// ioprio is ioprio_set's value for class and level.
func ioprio(class, level int) int { return class<<ioprioClassShift | level }

// lowerThread lowers the calling thread's CPU and I/O priorities; the
// caller has locked it (runtime.LockOSThread). It returns the thread id
// and what could not be lowered (the write-outs go on either way).
func lowerThread() (int, error) {
	tid := unix.Gettid()
	var errs []error
	if err := unix.Setpriority(unix.PRIO_PROCESS, tid, lowNice); err != nil {
		errs = append(errs, fmt.Errorf("setpriority(thread %d, nice %d): %w", tid, lowNice, err))
	}
	if _, _, e := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, uintptr(tid), uintptr(ioprio(ioprioClassBE, lowIOLevel))); e != 0 {
		errs = append(errs, fmt.Errorf("ioprio_set(thread %d, best-effort level %d): %w", tid, lowIOLevel, e))
	}
	return tid, errors.Join(errs...)
}

// lowWriter runs functions one at a time on its lowered thread.
type lowWriter struct {
	jobs chan func()
	done chan struct{}
}

// startLowWriter starts the lowered thread. A failure to lower it is
// logged once; the write-outs then run at the launcher's priority.
func startLowWriter(log *slog.Logger) *lowWriter {
	w := &lowWriter{jobs: make(chan func()), done: make(chan struct{})}
	go w.run(log, nil)
	return w
}

// run locks its goroutine to a thread other than the main one, lowers it
// and runs the jobs; it closes moved once it holds such a thread.
func (w *lowWriter) run(log *slog.Logger, moved chan<- struct{}) {
	// Never unlocked: when this goroutine returns the runtime ends the
	// thread instead of handing it, lowered, to other goroutines. (Threads
	// the runtime starts while this one is locked are cloned from its
	// template thread, not from this one, so they do not inherit the
	// lowered priorities.)
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The main thread: ps and top show the process by it (the whole
		// launcher would read nice 19), and a locked goroutine that ends
		// on it parks it for good instead of ending it. Another goroutine
		// takes over; while this one holds the main thread, that one runs
		// on another.
		next := make(chan struct{})
		go w.run(log, next)
		<-next
		runtime.UnlockOSThread()
		if moved != nil {
			close(moved)
		}
		return
	}
	if moved != nil {
		close(moved)
	}
	defer close(w.done)
	if tid, err := lowerThread(); err != nil {
		log.Warn("state: the background writer's thread could not be lowered; periodic write-outs run at the launcher's priority",
			"tid", tid, "err", err)
	}
	for f := range w.jobs {
		f()
	}
}

// do runs f on the lowered thread and waits for it.
func (w *lowWriter) do(f func()) {
	ran := make(chan struct{})
	w.jobs <- func() { defer close(ran); f() }
	<-ran
}

// stop ends the thread (after the job running, if any) and waits.
func (w *lowWriter) stop() {
	close(w.jobs)
	<-w.done
}
