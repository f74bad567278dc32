package state

import (
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkPersistCPU asks whether the writer would spend less CPU per
// write-out if it wrote the payload out of a read-only mapping of the slot
// (one copy, by write(2)) instead of pread into a 1 MiB buffer and write
// out of it (two copies; what CopyNewest and so Persist do). Both write a
// 256 MiB save from /dev/shm into a temporary file of the state directory
// ($FT_BENCH_STATE_DIR, else a temporary directory), compute its CRC, and
// fsync it, as Persist's data file; reported: the thread's CPU time (user
// + system, the fsync's writeback included, the kernel flusher's not) per
// write-out. It did not help (docs/benchmarks.md, "Issue 30: the writer at
// low priority"), so the mapping stays out of Persist.
//
//	FT_BENCH_STATE_DIR=/var/tmp go test -run '^$' -bench PersistCPU -benchtime 7x -count 3 ./state/
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
		copy func(w io.Writer) error
	}{
		{"pread", func(w io.Writer) error { _, _, err := CopyNewest(f, w, func() error { return nil }); return err }},
		{"mapped", func(w io.Writer) error { return copyMapped(f, w) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(256 << 20)
			runtime.LockOSThread() // each write-out's thread CPU time is its own
			defer runtime.UnlockOSThread()
			var cpu time.Duration
			for i := 0; i < b.N; i++ {
				c0 := threadCPU(b)
				tmp, err := os.CreateTemp(dir, tmpPrefix+"*.tmp")
				if err != nil {
					b.Fatal(err)
				}
				if _, err := tmp.Seek(FileHeaderSize, io.SeekStart); err != nil {
					b.Fatal(err)
				}
				if err := c.copy(tmp); err != nil {
					b.Fatal(err)
				}
				if err := tmp.Sync(); err != nil {
					b.Fatal(err)
				}
				cpu += threadCPU(b) - c0
				_ = tmp.Close()
				_ = os.Remove(tmp.Name())
			}
			b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/op")
		})
	}
}

// copyMapped writes the newest save's payload to w out of a read-only
// mapping of the slot (filled at once, MAP_POPULATE), 1 MiB a write, with
// its CRC (the benchmark's alternative to CopyNewest; no retry when a
// saver overwrites the slot: nothing saves during the benchmark).
func copyMapped(f *os.File, w io.Writer) error {
	d, err := Newest(f)
	if err != nil {
		return err
	}
	page := uint64(os.Getpagesize())
	start := d.Offset / page * page
	m, err := unix.Mmap(int(f.Fd()), int64(start), int(d.Offset-start+d.Length), unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("map slot: %w", err)
	}
	defer unix.Munmap(m)
	p := m[d.Offset-start:]
	h := crc32.NewIEEE()
	for off := 0; off < len(p); off += copyBuf {
		c := p[off:min(off+copyBuf, len(p))]
		_, _ = h.Write(c)
		if _, err := w.Write(c); err != nil {
			return err
		}
	}
	if d.HasCRC() && h.Sum32() != d.PayloadCRC {
		return fmt.Errorf("payload CRC %08x, descriptor says %08x", h.Sum32(), d.PayloadCRC)
	}
	return nil
}

func threadCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
