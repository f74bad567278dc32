package ranklogs

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/metrics"
)

// TestKeepAttempts: only the newest KeepAttempts attempt dirs survive; 0
// keeps every one.
func TestKeepAttempts(t *testing.T) {
	tests := []struct {
		name   string
		keep   int
		cycles int
		want   []string
	}{
		{"keep all", 0, 4, []string{"attempt_0", "attempt_1", "attempt_2", "attempt_3"}},
		{"keep 1", 1, 4, []string{"attempt_3"}},
		{"keep 2", 2, 5, []string{"attempt_3", "attempt_4"}},
		{"keep more than made", 10, 3, []string{"attempt_0", "attempt_1", "attempt_2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New(Options{LogDir: t.TempDir(), RunID: "r", KeepAttempts: tc.keep,
				Redirects: configs.StdSpec{All: configs.StdOut | configs.StdErr}})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < tc.cycles; i++ {
				a, err := l.Attempt(i, []RankInfo{{LocalRank: 0, GlobalRank: 0}})
				if err != nil {
					t.Fatal(err)
				}
				a.CloseParentEnds()
				if err := a.Close(); err != nil {
					t.Fatal(err)
				}
			}
			ents, err := os.ReadDir(l.Dir())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range ents {
				got = append(got, e.Name())
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("attempt dirs %v, want %v", got, tc.want)
			}
		})
	}
}

// TestLogWriteErrorReportedOnceAndCounted: a rank log that cannot be
// written (here /dev/full: ENOSPC, as a full disk) is logged once and every
// failed write counted.
func TestLogWriteErrorReportedOnceAndCounted(t *testing.T) {
	full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
	if err != nil {
		testenv.Missing(t, testenv.DevFull, err.Error())
	}
	defer full.Close()
	logs := &lockedbuf.Buffer{}
	met := metrics.New()
	lost := &outputLoss{}
	a := &Attempt{ranks: map[int]*rankFiles{}, log: slog.New(slog.NewTextHandler(logs, nil)), met: met, lost: lost}
	w, err := a.startTee(full, nil, "", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := w.Write([]byte("line\n")); err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			// Wait until the reader consumed it, so each write is one failure.
			deadline := time.Now().Add(30 * time.Second)
			for n := failures(t, met); n < float64(i+1); n = failures(t, met) {
				if time.Now().After(deadline) {
					t.Fatalf("write %d not counted", i)
				}
				time.Sleep(time.Millisecond)
			}
		}
	}
	a.CloseParentEnds()
	a.tees.Wait()
	for _, r := range a.readers {
		r.Close()
	}
	if n := strings.Count(logs.String(), "rank output lost"); n != 1 {
		t.Errorf("write error logged %d times, want once:\n%s", n, logs.String())
	}
	if n := failures(t, met); n != 3 {
		t.Errorf("counted %v failed writes, want 3", n)
	}
	if n := lost.bytes.Load(); n != 3*int64(len("line\n")) {
		t.Errorf("counted %d bytes lost, want %d", n, 3*len("line\n"))
	}
}

func failures(t *testing.T, m *metrics.Metrics) float64 {
	t.Helper()
	mfs, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "ftlauncher_rank_log_write_errors_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// TestFullFileSystemReportedOncePerLauncher: with the log dir on a full
// file system, the output of every rank and stream of every attempt is
// counted in LostBytes, and the launcher logs the loss once, naming the
// file and the bytes lost so far.
func TestFullFileSystemReportedOncePerLauncher(t *testing.T) {
	dir := testenv.Tmpfs(t, "64k")
	logs := &lockedbuf.Buffer{}
	l, err := New(Options{LogDir: dir, RunID: "r", Log: slog.New(slog.NewTextHandler(logs, nil)),
		Redirects: configs.StdSpec{All: configs.StdOut | configs.StdErr}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.FillUp(t, dir) // the directories exist; no data fits any more
	chunk := []byte(strings.Repeat("y", 999) + "\n")
	var want int64
	for attempt := 0; attempt < 2; attempt++ {
		a, err := l.Attempt(attempt, []RankInfo{{LocalRank: 0, GlobalRank: 0}, {LocalRank: 1, GlobalRank: 1}})
		if err != nil {
			t.Fatal(err)
		}
		for r := 0; r < 2; r++ {
			out, errw := a.Files(r)
			for _, w := range []*os.File{out, errw} {
				for i := 0; i < 3; i++ {
					if _, err := w.Write(chunk); err != nil {
						t.Fatal(err)
					}
					want += int64(len(chunk))
				}
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := l.LostBytes(); got != want {
		t.Errorf("LostBytes() = %d, want %d", got, want)
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d error lines, want 1:\n%s", n, logs.String())
	}
	for _, w := range []string{"rank output lost", "file=" + dir, "no space left on device", "bytes_lost="} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("the error line lacks %q:\n%s", w, logs.String())
		}
	}
}

// TestLongestRunIDFits: the longest run id configs accepts still makes a
// run log directory (<run_id>_<random>, one path element under NAME_MAX).
func TestLongestRunIDFits(t *testing.T) {
	l, err := New(Options{LogDir: t.TempDir(), RunID: strings.Repeat("r", configs.MaxRunIDLen)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(l.Dir()); err != nil {
		t.Fatal(err)
	}
}
