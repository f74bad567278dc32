package state

import (
	"github.com/ftlauncher/ft-launcher/eventlog"

	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// threadPrio is a thread's nice value (/proc/self/task/TID/stat, field 19)
// and I/O priority (ioprio_get).
type threadPrio struct {
	Nice, IOPrio int
}

func readThreadPrio(tid int) (threadPrio, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/self/task/%d/stat", tid))
	if err != nil {
		return threadPrio{}, err
	}
	// Fields after the command's closing parenthesis start at field 3.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 17 {
		return threadPrio{}, fmt.Errorf("thread %d stat: %q", tid, b)
	}
	nice, err := strconv.Atoi(f[19-3])
	if err != nil {
		return threadPrio{}, fmt.Errorf("thread %d nice: %w", tid, err)
	}
	io, _, e := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(tid), 0)
	if e != 0 {
		return threadPrio{}, fmt.Errorf("ioprio_get(thread %d): %w", tid, e)
	}
	return threadPrio{Nice: nice, IOPrio: int(io)}, nil
}

// writeRecord is one write-out as the store's onWrite hook saw it, with
// the priorities of the thread that did it, read on that thread.
type writeRecord struct {
	reason eventlog.PersistReason
	tid    int
	prio   threadPrio
	err    error
}

type writeLog struct {
	mu  sync.Mutex
	got []writeRecord
}

func (w *writeLog) hook(reason eventlog.PersistReason, tid int) {
	p, err := readThreadPrio(tid)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.got = append(w.got, writeRecord{reason: reason, tid: tid, prio: p, err: err})
}

func (w *writeLog) all() []writeRecord {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]writeRecord(nil), w.got...)
}

// TestWriterPriorities: periodic write-outs run on one thread lowered to
// nice 19 and best-effort I/O level 7; urgent ones (Kick, Close) run at
// the process's own priority on another thread; the lowered thread ends
// with the store instead of going back to the runtime's pool.
func TestWriterPriorities(t *testing.T) {
	var ev events
	var wl writeLog
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := Open(Options{NLocal: 1, Dir: dir, ShmRoot: t.TempDir(), Every: Every{Saves: 3}, Poll: 10 * time.Millisecond,
		Emit: ev.record, onWrite: wl.hook})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close(context.Background())
		}
	})
	normal, err := readThreadPrio(os.Getpid()) // the main thread: never lowered (lowWriter.run)
	if err != nil {
		t.Fatal(err)
	}
	seg := s.SegmentPath(0)
	saveSeg(t, seg, 1, 64<<10)
	waitFor(t, "the first save to be seen", func() bool { return ev.count(EventSave) == 1 })
	s.Kick("rank failed") // one save, 3 are due: only the kick writes it
	waitFor(t, "the urgent write-out", func() bool { m, err := ReadManifest(dir, 5); return err == nil && m.Step == 1 })
	for step := int64(2); step <= 4; step++ {
		saveSeg(t, seg, step, 64<<10)
	}
	waitFor(t, "the periodic write-out", func() bool { m, err := ReadManifest(dir, 5); return err == nil && m.Step == 4 })
	saveSeg(t, seg, 5, 64<<10)
	closed = true
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, d := loadWritten(t, dir); d.Step != 5 {
		t.Fatalf("after Close the written step is %d, want 5", d.Step)
	}

	got := wl.all()
	var reasons []string
	for _, r := range got {
		reasons = append(reasons, string(r.reason))
	}
	if strings.Join(reasons, ",") != "rank failed,periodic,end" {
		t.Fatalf("write-outs %q, want rank failed, periodic, end", reasons)
	}
	low := threadPrio{Nice: lowNice, IOPrio: ioprio(ioprioClassBE, lowIOLevel)}
	for _, r := range got {
		if r.err != nil {
			t.Fatalf("%s write-out: reading its thread's priority: %v", r.reason, r.err)
		}
		want := normal
		if r.reason == "periodic" {
			want = low
		}
		if r.prio != want {
			t.Errorf("%s write-out on thread %d ran at nice %d, I/O priority %#x; want nice %d, %#x",
				r.reason, r.tid, r.prio.Nice, r.prio.IOPrio, want.Nice, want.IOPrio)
		}
		if r.reason != "periodic" && r.tid == got[1].tid {
			t.Errorf("the %s write-out ran on the lowered thread %d", r.reason, r.tid)
		}
	}
	if got[1].tid == os.Getpid() {
		t.Fatal("the main thread was lowered")
	}
	// The lowered thread ended with its goroutine (never unlocked).
	lowTask := fmt.Sprintf("/proc/self/task/%d", got[1].tid)
	waitFor(t, "the lowered thread to end", func() bool {
		_, err := os.Stat(lowTask)
		return errors.Is(err, os.ErrNotExist)
	})
}

// TestKickAbandonsPeriodicWrite: an urgent write-out asked for while a
// periodic one runs does not wait for it: the periodic one is abandoned
// (no temporary file, no failure recorded) and the urgent one writes the
// save.
func TestKickAbandonsPeriodicWrite(t *testing.T) {
	var ev events
	var wl writeLog
	started, kicked := make(chan struct{}), make(chan struct{})
	var once sync.Once
	hook := func(reason eventlog.PersistReason, tid int) {
		wl.hook(reason, tid)
		if reason == "periodic" {
			once.Do(func() {
				close(started)
				<-kicked // the write starts after the Kick
			})
		}
	}
	dir := filepath.Join(t.TempDir(), "ckpt")
	s, err := Open(Options{NLocal: 1, Dir: dir, ShmRoot: t.TempDir(), Every: Every{Saves: 1}, Poll: 10 * time.Millisecond,
		Emit: ev.record, onWrite: hook})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(context.Background())
	saveSeg(t, s.SegmentPath(0), 1, 1<<20)
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("no periodic write-out started")
	}
	s.Kick("rank failed")
	close(kicked)
	waitFor(t, "the urgent write-out", func() bool { m, err := ReadManifest(dir, 5); return err == nil && m.Step == 1 })
	if _, d := loadWritten(t, dir); d.Step != 1 {
		t.Fatalf("written step %d", d.Step)
	}
	if tmp := tempFiles(t, dir); len(tmp) != 0 {
		t.Fatalf("temporary files left: %v", tmp)
	}
	if n := ev.count(EventPersistFailed); n != 0 {
		t.Fatalf("%d write-out failures recorded for an abandoned periodic write-out", n)
	}
	ev.mu.Lock()
	var reasons []any
	for _, f := range ev.got {
		if f["event"] == EventPersisted {
			reasons = append(reasons, f["reason"])
		}
	}
	ev.mu.Unlock()
	if len(reasons) != 1 || reasons[0] != "rank failed" {
		t.Fatalf("write-outs recorded with reasons %v, want the urgent one only", reasons)
	}
	if got := wl.all(); len(got) < 2 || got[0].reason != "periodic" || got[1].reason != "rank failed" {
		t.Fatalf("write-outs started: %+v, want the periodic one then the urgent one", got)
	}
}
