package pytrace

import (
	"os"
	"testing"
)

func addSeeds(f *testing.F) {
	for _, name := range testdataFiles(f) {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		"",
		"\n\n\n",
		"Thread 0x1 (most recent call first):\n  File \"x\", line 1 in f\nThread 0x1 (most recent call first):\n",
		"Fatal Python error: x\n\nStack (most recent call first):\n  ...\n",
		"[r]:Traceback (most recent call last):\n[r]:  File \"x\", line 1, in f\n[r]:E: m\n[r]:m2\n",
		"  + Exception Group Traceback (most recent call last):\n  |   File \"x\", line 1, in f\n  | EG: m\n  +-+---\n    | x\n",
		"\r\x1b[31mTraceback (most recent call last):\r\n  File \"x\", line 9, in f\nE\n",
	} {
		f.Add([]byte(s))
	}
}

func checkThread(t *testing.T, th Thread) {
	if len(th.Frames) > maxFrames {
		t.Fatalf("%d frames", len(th.Frames))
	}
	_ = Classify(th)
	_ = Collective(th)
	_, _ = UserFrame(th.Frames)
	_ = th.String()
	for _, f := range th.Frames {
		_ = f.String()
		_ = IsLibrary(f.File)
		if f.Line < 0 {
			t.Fatalf("negative line %d", f.Line)
		}
	}
}

func FuzzParseDumps(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		ds := ParseDumps(b)
		if len(ds) > maxDumps {
			t.Fatalf("%d dumps", len(ds))
		}
		for _, d := range ds {
			if len(d.Threads) > maxThreads {
				t.Fatalf("%d threads", len(d.Threads))
			}
			if len(d.Threads) == 0 && d.Fatal == "" {
				t.Fatalf("empty dump %+v", d)
			}
			for _, th := range d.Threads {
				checkThread(t, th)
			}
			if m, ok := d.MainThread(); ok {
				checkThread(t, m)
			} else if len(d.Threads) > 0 {
				t.Fatal("MainThread false with threads")
			}
		}
	})
}

func FuzzLastTraceback(f *testing.F) {
	addSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		tb, ok := LastTraceback(b)
		all := Tracebacks(b)
		if ok != (len(all) > 0) {
			t.Fatalf("LastTraceback %v but %d tracebacks", ok, len(all))
		}
		if len(all) > maxTracebacks {
			t.Fatalf("%d tracebacks", len(all))
		}
		if ok {
			last := all[len(all)-1]
			if last.Type != tb.Type || last.Message != tb.Message || len(last.Frames) != len(tb.Frames) {
				t.Fatalf("LastTraceback %+v != last of Tracebacks %+v", tb, last)
			}
		}
		for _, tb := range all {
			if tb.Type == "" {
				t.Fatal("empty type")
			}
			if len(tb.Message) > maxMessageBytes {
				t.Fatalf("message of %d bytes", len(tb.Message))
			}
			if len(tb.Frames) > maxFrames || tb.Chained < 0 {
				t.Fatalf("%d frames, chained %d", len(tb.Frames), tb.Chained)
			}
			checkThread(t, Thread{Frames: tb.Frames})
		}
	})
}
