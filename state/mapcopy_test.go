package state

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPersistCPU: the writer's CPU per write-out when it writes the
// payload out of a read-only mapping of the slot (one copy, by write(2);
// what Persist does with a segment file) and when it reads it with pread
// into a 1 MiB buffer and writes that out (two copies; CopyNewest, what
// Persist does with any other io.ReaderAt). Each is a whole Persist of a
// 256 MiB save from /dev/shm into the state directory
// ($FT_BENCH_STATE_DIR, else a temporary directory): data file, CRC,
// fsync, manifest; reported: the thread's CPU time (user + system, the
// fsyncs' writeback included, the kernel flusher's not) per
// write-out (docs/benchmarks-history.md, "The writer at low priority").
//
//	FT_BENCH_STATE_DIR=/var/tmp go test -run '^$' -bench PersistCPU -benchtime 7x -count 3 ./state/
//
// truncatingWriter truncates the segment at its first write: the rest of
// the slot's mapping then faults.
type truncatingWriter struct {
	seg  *os.File
	done bool
}

func (w *truncatingWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.done = true
		if err := w.seg.Truncate(HeaderSize); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// TestMappedCopySegmentShrunk: a segment truncated under the writer's
// mapping (no saver does it; a foreign process could) fails the write-out
// with an error instead of killing the launcher with SIGBUS.
func TestMappedCopySegmentShrunk(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank-0")
	saveSeg(t, path, 1, 4*copyBuf)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &truncatingWriter{seg: f}
	_, _, err = copyNewestMapped(f, w, func() error { return nil })
	if !w.done {
		t.Fatal("nothing was written: the segment was not truncated mid-copy")
	}
	if err == nil || !strings.Contains(err.Error(), "shrank") {
		t.Fatalf("copy from a segment truncated under it: err %v, want the fault as an error", err)
	}
}

func BenchmarkPersistCPU(b *testing.B) {
	seg := filepath.Join(b.TempDir(), "rank-0")
	if shm, err := os.MkdirTemp("/dev/shm", "ftstate-bench-"); err == nil {
		b.Cleanup(func() { _ = os.RemoveAll(shm) })
		seg = filepath.Join(shm, "rank-0")
	}
	if _, err := (&Saver{Path: seg, Rank: 5}).Save(1, pattern(1, 256<<20)); err != nil {
		b.Fatal(err)
	}
	f, err := os.Open(seg)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	dir := os.Getenv("FT_BENCH_STATE_DIR")
	if dir == "" {
		dir = b.TempDir()
	} else if dir, err = os.MkdirTemp(dir, "ftstate-bench-"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	for _, c := range []struct {
		name string
		seg  io.ReaderAt
	}{{"pread", noFile{f}}, {"mapped", f}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(256 << 20)
			runtime.LockOSThread() // each write-out's thread CPU time is its own
			defer runtime.UnlockOSThread()
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				c0 := threadCPU(b)
				if _, ok, err := PersistContext(context.Background(), c.seg, dir, 0); err != nil || !ok {
					b.Fatal(ok, err)
				}
				cpu += threadCPU(b) - c0
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// noFile hides the segment's *os.File from PersistContext: the pread copy.
type noFile struct{ io.ReaderAt }

func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
