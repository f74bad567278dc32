package state

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a saver or writer that the tests kill in the
// middle of its work (TestMain dispatches on childEnv).
const childEnv = "FTSTATE_TEST_CHILD"

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(child(mode, os.Args[len(os.Args)-3:]))
	}
	os.Exit(m.Run())
}

// child runs a save or a write-out that prints "started" once it is under
// way and then goes slowly, so that the parent's SIGKILL lands mid-write.
// args: path, step, size.
func child(mode string, args []string) int {
	path := args[0]
	step, _ := strconv.ParseInt(args[1], 10, 64)
	size, _ := strconv.Atoi(args[2])
	var once sync.Once
	started := func() { once.Do(func() { fmt.Println("started") }) }
	switch mode {
	case "save":
		s := &Saver{Path: path, Rank: 3, chunk: 4096, beforeChunk: func(off int) {
			if off > 0 {
				started()
				time.Sleep(5 * time.Millisecond)
			}
		}}
		if _, err := s.Save(step, pattern(step, size)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case "persist":
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		slow := slowReader{f, started}
		if _, _, err := Persist(slow, args[1], 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	case "persist-mapped":
		// The launcher's own path (the segment as an *os.File, copied out
		// of a mapping), at full speed: the parent kills it once the
		// temporary file has data, before the fsync and rename that a
		// large payload makes slow.
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		started()
		if _, _, err := Persist(f, args[1], 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}

// slowReader reads payload bytes slowly (header reads are fast).
type slowReader struct {
	r       io.ReaderAt
	started func()
}

func (s slowReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= HeaderSize {
		s.started()
		time.Sleep(5 * time.Millisecond)
		p = p[:min(len(p), 4096)]
	}
	return s.r.ReadAt(p, off)
}

// pattern is a payload whose every byte is derived from step and position,
// so a payload mixing two saves is detected without a checksum.
func pattern(step int64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(int64(i/8)*31 + step*7)
	}
	if n >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(step))
	}
	return b
}

func checkPattern(t testing.TB, d Desc, p []byte) {
	t.Helper()
	if want := pattern(d.Step, int(d.Length)); !bytes.Equal(p, want) {
		t.Fatalf("save %d (step %d): payload of %d bytes is not the one saved", d.Seq, d.Step, len(p))
	}
}

func TestDescriptorValidity(t *testing.T) {
	good := Desc{Seq: 4, Step: 10, Offset: HeaderSize, Length: 5, Capacity: 8, Rank: 2, Flags: flagCRC, PayloadCRC: 9}
	tests := []struct {
		name   string
		mangle func([]byte)
		valid  bool
	}{
		{"intact", func([]byte) {}, true},
		{"zeroed (being written)", func(b []byte) { clear(b) }, false},
		{"torn: first half new, second old", func(b []byte) { b[40] ^= 0xff }, false},
		{"descriptor crc flipped", func(b []byte) { b[61] ^= 1 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := good.encode()
			tc.mangle(b)
			d, ok := decodeDesc(b)
			if ok != tc.valid {
				t.Fatalf("valid = %v, want %v", ok, tc.valid)
			}
			if ok && d != good {
				t.Fatalf("decoded %+v, want %+v", d, good)
			}
		})
	}
	// Sequence 0 and a length past the capacity are never a commit, even
	// with a matching CRC.
	for _, d := range []Desc{{Seq: 0, Offset: HeaderSize}, {Seq: 1, Offset: HeaderSize, Length: 9, Capacity: 8}} {
		if _, ok := decodeDesc(d.encode()); ok {
			t.Errorf("%+v decoded as committed", d)
		}
	}
}

func TestDoubleBuffering(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rank-0")
	s := &Saver{Path: path, Rank: 1}
	for step := int64(1); step <= 5; step++ {
		if _, err := s.Save(step, pattern(step, 10000)); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		ds, err := readHeader(f)
		if err != nil {
			t.Fatal(err)
		}
		// The newest save and, from the second on, the one before it.
		want := min(int(step), 2)
		if len(ds) != want || ds[0].Step != step || (want == 2 && ds[1].Step != step-1) {
			t.Fatalf("after step %d: committed %+v", step, ds)
		}
		if want == 2 && ds[0].Offset == ds[1].Offset {
			t.Fatalf("both saves in one slot at %d", ds[0].Offset)
		}
		d, p, err := ReadNewest(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		checkPattern(t, d, p)
		if d.Rank != 1 || d.Seq != uint64(step) || !d.HasCRC() {
			t.Fatalf("descriptor %+v", d)
		}
	}
	// A larger state grows the segment; the newest save is the larger one.
	if _, err := s.Save(6, pattern(6, 3<<20)); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	d, p, err := ReadNewest(f)
	if err != nil {
		t.Fatal(err)
	}
	checkPattern(t, d, p)
	if d.Seq != 6 || d.Capacity < 3<<20 {
		t.Fatalf("after growing: %+v", d)
	}
}

// TestUncommittedSlotNeverRead writes what a saver killed at each point of
// a save leaves behind, by hand, and checks the previous save is read.
func TestUncommittedSlotNeverRead(t *testing.T) {
	tests := []struct {
		name  string
		leave func(f *os.File, d Desc) // d: the interrupted save's descriptor
	}{
		{"killed after invalidating the slot", func(f *os.File, d Desc) {
			_, _ = f.WriteAt(make([]byte, DescSize), descOff[1])
		}},
		{"killed mid-payload", func(f *os.File, d Desc) {
			_, _ = f.WriteAt(make([]byte, DescSize), descOff[1])
			_, _ = f.WriteAt(pattern(d.Step, int(d.Length))[:d.Length/2], int64(d.Offset))
		}},
		{"killed mid-descriptor", func(f *os.File, d Desc) {
			_, _ = f.WriteAt(make([]byte, DescSize), descOff[1])
			_, _ = f.WriteAt(pattern(d.Step, int(d.Length)), int64(d.Offset))
			_, _ = f.WriteAt(d.encode()[:32], descOff[1])
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0")
			s := &Saver{Path: path}
			first, err := s.Save(1, pattern(1, 5000))
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			next := Desc{Seq: 2, Step: 2, Offset: HeaderSize + first.Capacity, Length: 5000, Capacity: first.Capacity}
			tc.leave(f, next)
			d, p, err := ReadNewest(f)
			if err != nil {
				t.Fatal(err)
			}
			if d.Seq != 1 {
				t.Fatalf("read save %d, want the committed save 1", d.Seq)
			}
			checkPattern(t, d, p)
			// The next save after the crash commits normally.
			if _, err := s.Save(3, pattern(3, 5000)); err != nil {
				t.Fatal(err)
			}
			if d, p, err = ReadNewest(f); err != nil || d.Step != 3 {
				t.Fatalf("after the crash, a new save: %+v %v", d, err)
			}
			checkPattern(t, d, p)
		})
	}
}

// startChild starts the test binary as a slow saver or writer and waits
// until it says it is under way.
func startChild(t *testing.T, mode string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{"-test.run=^$"}, args...)...)
	cmd.Env = append(os.Environ(), childEnv+"="+mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "started" {
		t.Fatalf("child %s: %q %v", mode, line, err)
	}
	return cmd
}

// TestSaverKilledMidSave kills a real saver process with SIGKILL in the
// middle of a save, in place and while it grows the segment.
func TestSaverKilledMidSave(t *testing.T) {
	tests := []struct {
		name string
		size int // of the killed save; the first is 64 KiB (1 MiB slots)
	}{
		{"in place", 512 << 10},
		{"growing the segment", 3 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0")
			s := &Saver{Path: path, Rank: 3}
			for step := int64(1); step <= 2; step++ {
				if _, err := s.Save(step, pattern(step, 64<<10)); err != nil {
					t.Fatal(err)
				}
			}
			cmd := startChild(t, "save", path, "9", strconv.Itoa(tc.size))
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			if err := cmd.Wait(); err == nil {
				t.Fatal("the saver finished before it was killed; the test proves nothing")
			}
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			d, p, err := ReadNewest(f)
			if err != nil {
				t.Fatal(err)
			}
			if d.Step != 2 || d.Seq != 2 {
				t.Fatalf("after the kill the newest save is %+v, want step 2", d)
			}
			checkPattern(t, d, p)
			// The rank's next process saves over the debris.
			if _, err := s.Save(10, pattern(10, tc.size)); err != nil {
				t.Fatal(err)
			}
			f2, _ := os.Open(path)
			defer f2.Close()
			if d, p, err = ReadNewest(f2); err != nil || d.Step != 10 {
				t.Fatalf("save after the kill: %+v %v", d, err)
			}
			checkPattern(t, d, p)
		})
	}
}

// TestReaderRacesSaver reads while a saver saves as fast as it can: every
// read returns one whole committed save, never a mix (with and without the
// saver's CRC: without it only the descriptor re-check guards the read),
// through pread (ReadNewest) and through a mapping (the writer's copy).
func TestReaderRacesSaver(t *testing.T) {
	readMapped := func(f *os.File) (Desc, []byte, error) {
		var buf sliceWriter
		d, _, err := copyNewestMapped(f, &buf, func() error { buf.b = buf.b[:0]; return nil })
		return d, buf.b, err
	}
	for _, c := range []struct {
		skip   bool
		reader string
		read   func(*os.File) (Desc, []byte, error)
	}{
		{false, "pread", readPread}, {true, "pread", readPread},
		{false, "mapped", readMapped}, {true, "mapped", readMapped},
	} {
		skip := c.skip
		t.Run(fmt.Sprintf("skip_crc=%v/%s", skip, c.reader), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rank-0")
			s := &Saver{Path: path, SkipCRC: skip}
			if _, err := s.Save(0, pattern(0, 256<<10)); err != nil {
				t.Fatal(err)
			}
			// At least 1.5 s, and on until both sides did enough to overlap
			// (a loaded machine may give them little CPU), at most 2 min.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			var saves, reads, retried atomic.Int64
			go func() {
				atLeast := time.After(1500 * time.Millisecond)
				tick := time.NewTicker(50 * time.Millisecond)
				defer tick.Stop()
				for enough := false; ; {
					select {
					case <-ctx.Done():
						return
					case <-atLeast:
						enough = true
					case <-tick.C:
					}
					if enough && saves.Load() >= 10 && reads.Load() >= 10 {
						cancel()
						return
					}
				}
			}()
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for step := int64(1); ctx.Err() == nil; step++ {
					if _, err := s.Save(step, pattern(step, 256<<10)); err != nil {
						t.Error(err)
						return
					}
					saves.Add(1)
				}
			}()
			for r := 0; r < 2; r++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					f, err := os.Open(path)
					if err != nil {
						t.Error(err)
						return
					}
					defer f.Close()
					last := int64(-1)
					for ctx.Err() == nil {
						d, p, err := c.read(f)
						if errors.Is(err, errChanged) {
							retried.Add(1)
							continue
						}
						if err != nil {
							t.Error(err)
							return
						}
						if !bytes.Equal(p, pattern(d.Step, int(d.Length))) {
							t.Errorf("read a mixed payload for step %d", d.Step)
							return
						}
						if d.Step < last {
							t.Errorf("read step %d after step %d", d.Step, last)
						}
						last = d.Step
						reads.Add(1)
					}
				}()
			}
			wg.Wait()
			if saves.Load() < 10 || reads.Load() < 10 {
				t.Fatalf("too little overlap to prove anything: %d saves, %d reads", saves.Load(), reads.Load())
			}
			t.Logf("%d saves, %d whole reads, %d reads given up after 8 overwrites", saves.Load(), reads.Load(), retried.Load())
		})
	}
}

func readPread(f *os.File) (Desc, []byte, error) { return ReadNewest(f) }

func TestParseEvery(t *testing.T) {
	tests := []struct {
		in   string
		want Every
		err  bool
	}{
		{"10", Every{Saves: 10}, false},
		{"0", Every{}, false},
		{"90s", Every{Interval: 90 * time.Second}, false},
		{"5m", Every{Interval: 5 * time.Minute}, false},
		{"-1", Every{}, true},
		{"0s", Every{}, true},
		{"1000h", Every{}, true},
		{"often", Every{}, true},
	}
	for _, tc := range tests {
		got, err := ParseEvery(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseEvery(%q) = %+v, %v; want %+v, error %v", tc.in, got, err, tc.want, tc.err)
		}
		if err != nil && !strings.Contains(err.Error(), "--state-persist-every") {
			t.Errorf("error %q does not name the flag", err)
		}
	}
}
