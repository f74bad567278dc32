package ranklogs

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// runRanks starts one real sh process per rank with the attempt's files and
// waits for all of them. Streams the attempt leaves inherited (nil) are sent
// to per-rank capture files instead of the test's own stdout, and returned.
func runRanks(t *testing.T, a *Attempt, ranks []RankInfo, script string) (inherited map[string]string) {
	t.Helper()
	r, err := spawn.NewReaper(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	capDir := t.TempDir()
	var specs []spawn.Spec
	inherited = map[string]string{}
	var capFiles []*os.File
	for _, rk := range ranks {
		out, errf := a.Files(rk.LocalRank)
		for _, s := range []struct {
			f    **os.File
			name string
		}{{&out, "out"}, {&errf, "err"}} {
			if *s.f == nil {
				f, err := os.Create(filepath.Join(capDir, fmt.Sprintf("%s%d", s.name, rk.LocalRank)))
				if err != nil {
					t.Fatal(err)
				}
				capFiles = append(capFiles, f)
				*s.f = f
			}
		}
		specs = append(specs, spawn.Spec{
			LocalRank: rk.LocalRank,
			Argv:      []string{"sh", "-c", script},
			Env:       append(os.Environ(), "LOCAL_RANK="+strconv.Itoa(rk.LocalRank)),
			Stdout:    out,
			Stderr:    errf,
		})
	}
	g, err := r.StartGroup(specs)
	if err != nil {
		t.Fatal(err)
	}
	a.CloseParentEnds()
	timeout := time.After(30 * time.Second)
	for range specs {
		select {
		case <-g.Exits():
		case <-timeout:
			g.Stop(syscall.SIGKILL, 0)
			t.Fatal("ranks did not exit")
		}
	}
	g.Stop(syscall.SIGKILL, 0)
	for _, f := range capFiles {
		f.Close()
		b, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		inherited[filepath.Base(f.Name())] = string(b)
	}
	return inherited
}

func sortedLines(s string) []string {
	lines := strings.SplitAfter(s, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	slices.Sort(lines)
	return lines
}

func readOr(path, absent string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return absent
	}
	return string(b)
}

func TestRedirectTeeFilterMatrix(t *testing.T) {
	const absent = "<absent>"
	ranks := []RankInfo{{0, 4}, {1, 5}}
	tests := []struct {
		name      string
		redirects configs.StdSpec
		tee       configs.StdSpec
		filter    []int
		devNull   bool
		// per rank: stdout.log, stderr.log content (absent = no file)
		files map[int][2]string
		// sorted console lines
		console, consoleErr []string
		// captured inherited streams, keyed "out0", "err1", ...
		inherited map[string]string
	}{
		{
			name:      "none inherits",
			files:     map[int][2]string{0: {absent, absent}, 1: {absent, absent}},
			inherited: map[string]string{"out0": "out 0\n", "err0": "err 0\n", "out1": "out 1\n", "err1": "err 1\n"},
		},
		{
			name:      "redirect all",
			redirects: configs.StdSpec{All: configs.StdBoth},
			files:     map[int][2]string{0: {"out 0\n", "err 0\n"}, 1: {"out 1\n", "err 1\n"}},
			inherited: map[string]string{},
		},
		{
			name:       "tee all",
			tee:        configs.StdSpec{All: configs.StdBoth},
			files:      map[int][2]string{0: {"out 0\n", "err 0\n"}, 1: {"out 1\n", "err 1\n"}},
			console:    []string{"[default0]:out 0\n", "[default1]:out 1\n"},
			consoleErr: []string{"[default0]:err 0\n", "[default1]:err 1\n"},
			inherited:  map[string]string{},
		},
		{
			name:      "tee stdout only",
			tee:       configs.StdSpec{All: configs.StdOut},
			files:     map[int][2]string{0: {"out 0\n", absent}, 1: {"out 1\n", absent}},
			console:   []string{"[default0]:out 0\n", "[default1]:out 1\n"},
			inherited: map[string]string{"err0": "err 0\n", "err1": "err 1\n"},
		},
		{
			name:       "per-rank maps",
			redirects:  configs.StdSpec{PerRank: map[int]configs.Std{0: configs.StdOut}},
			tee:        configs.StdSpec{PerRank: map[int]configs.Std{1: configs.StdErr}},
			files:      map[int][2]string{0: {"out 0\n", absent}, 1: {absent, "err 1\n"}},
			consoleErr: []string{"[default1]:err 1\n"},
			inherited:  map[string]string{"err0": "err 0\n", "out1": "out 1\n"},
		},
		{
			name:       "tee all filtered to rank 1",
			tee:        configs.StdSpec{All: configs.StdBoth},
			filter:     []int{1},
			files:      map[int][2]string{0: {"out 0\n", "err 0\n"}, 1: {"out 1\n", "err 1\n"}},
			console:    []string{"[default1]:out 1\n"},
			consoleErr: []string{"[default1]:err 1\n"},
			inherited:  map[string]string{},
		},
		{
			name:      "none filtered to rank 0",
			filter:    []int{0},
			files:     map[int][2]string{0: {absent, absent}, 1: {absent, absent}},
			inherited: map[string]string{"out0": "out 0\n", "err0": "err 0\n"},
		},
		{
			name:       "files off, tee goes to console only",
			tee:        configs.StdSpec{All: configs.StdBoth},
			devNull:    true,
			console:    []string{"[default0]:out 0\n", "[default1]:out 1\n"},
			consoleErr: []string{"[default0]:err 0\n", "[default1]:err 1\n"},
			inherited:  map[string]string{},
		},
		{
			name:      "files off, redirect discards",
			redirects: configs.StdSpec{All: configs.StdBoth},
			devNull:   true,
			inherited: map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var console, consoleErr bytes.Buffer
			logDir := t.TempDir()
			if tc.devNull {
				logDir = os.DevNull
			}
			l, err := New(Options{LogDir: logDir, RunID: "job", Redirects: tc.redirects, Tee: tc.tee,
				LocalRanksFilter: tc.filter, Console: &console, ConsoleErr: &consoleErr})
			if err != nil {
				t.Fatal(err)
			}
			a, err := l.Attempt(0, ranks)
			if err != nil {
				t.Fatal(err)
			}
			inherited := runRanks(t, a, ranks, `echo "out $LOCAL_RANK"; echo "err $LOCAL_RANK" >&2`)
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if !equalMaps(inherited, tc.inherited) {
				t.Errorf("inherited streams %q, want %q", inherited, tc.inherited)
			}
			if got := sortedLines(console.String()); !slices.Equal(got, tc.console) && len(got)+len(tc.console) > 0 {
				t.Errorf("console %q, want %q", got, tc.console)
			}
			if got := sortedLines(consoleErr.String()); !slices.Equal(got, tc.consoleErr) && len(got)+len(tc.consoleErr) > 0 {
				t.Errorf("console stderr %q, want %q", got, tc.consoleErr)
			}
			if tc.devNull {
				if l.Dir() != "" || a.Dir() != "" || a.ErrorFile(0) != "" {
					t.Errorf("files off but dirs %q %q error file %q", l.Dir(), a.Dir(), a.ErrorFile(0))
				}
				return
			}
			if !strings.HasPrefix(filepath.Base(l.Dir()), "job_") || filepath.Dir(l.Dir()) != logDir {
				t.Errorf("run dir %q", l.Dir())
			}
			for lr, want := range tc.files {
				rdir := filepath.Join(l.Dir(), "attempt_0", strconv.Itoa(lr))
				if got := readOr(filepath.Join(rdir, "stdout.log"), absent); got != want[0] {
					t.Errorf("rank %d stdout.log %q, want %q", lr, got, want[0])
				}
				if got := readOr(filepath.Join(rdir, "stderr.log"), absent); got != want[1] {
					t.Errorf("rank %d stderr.log %q, want %q", lr, got, want[1])
				}
				if got, want := a.ErrorFile(lr), filepath.Join(rdir, "error.json"); got != want {
					t.Errorf("ErrorFile %q, want %q", got, want)
				}
			}
		})
	}
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestPrefixTemplate(t *testing.T) {
	var console bytes.Buffer
	l, err := New(Options{LogDir: t.TempDir(), RunID: "r", Role: "trainer", Tee: configs.StdSpec{All: configs.StdOut},
		PrefixTemplate: "${role_name}/g${rank}/l$local_rank $$ $nope ${nope}| ", Console: &console})
	if err != nil {
		t.Fatal(err)
	}
	ranks := []RankInfo{{LocalRank: 1, GlobalRank: 9}}
	a, err := l.Attempt(3, ranks)
	if err != nil {
		t.Fatal(err)
	}
	runRanks(t, a, ranks, `echo hello`)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if want := "trainer/g9/l1 $ $nope ${nope}| hello\n"; console.String() != want {
		t.Errorf("console %q, want %q", console.String(), want)
	}
}

func TestExpandTemplate(t *testing.T) {
	vars := map[string]string{"a": "1", "ab": "2", "rank": "7"}
	tests := []struct{ in, want string }{
		{"", ""},
		{"${a}${ab}", "12"},
		{"$ab-$a", "2-1"},
		{"$abc", "$abc"},
		{"$$a", "$a"},
		{"${", "${"},
		{"${}", "${}"},
		{"$", "$"},
		{"x$1", "x$1"},
		{"[$rank]:", "[7]:"},
	}
	for _, tc := range tests {
		if got := expandTemplate(tc.in, vars); got != tc.want {
			t.Errorf("expandTemplate(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestTeeWholeLinesNoLostTail floods the console from several ranks at once
// and checks every line arrives whole, under its own rank's prefix, and that
// a last line without newline written just before a SIGKILL is kept.
func TestTeeWholeLinesNoLostTail(t *testing.T) {
	var console bytes.Buffer
	l, err := New(Options{LogDir: t.TempDir(), RunID: "r", Tee: configs.StdSpec{All: configs.StdOut}, Console: &console})
	if err != nil {
		t.Fatal(err)
	}
	ranks := []RankInfo{{0, 0}, {1, 1}, {2, 2}, {3, 3}}
	a, err := l.Attempt(0, ranks)
	if err != nil {
		t.Fatal(err)
	}
	const n = 2000
	pad := strings.Repeat("x", 150)
	runRanks(t, a, ranks, `i=0; while [ $i -lt `+strconv.Itoa(n)+` ]; do echo "r$LOCAL_RANK-$i-`+pad+`"; i=$((i+1)); done; printf "last words $LOCAL_RANK"; kill -9 $$`)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	counts := map[int]int{}
	for _, line := range strings.Split(strings.TrimSuffix(console.String(), "\n"), "\n") {
		var lr, i int
		if _, err := fmt.Sscanf(line, "[default%d]:", &lr); err != nil {
			t.Fatalf("line without prefix: %q", line)
		}
		body := strings.TrimPrefix(line, fmt.Sprintf("[default%d]:", lr))
		if body == fmt.Sprintf("last words %d", lr) {
			counts[lr+100]++
			continue
		}
		if _, err := fmt.Sscanf(body, "r%d-%d-", new(int), &i); err != nil || body != fmt.Sprintf("r%d-%d-%s", lr, i, pad) {
			t.Fatalf("mangled line %q", line)
		}
		counts[lr]++
	}
	for lr := 0; lr < 4; lr++ {
		if counts[lr] != n || counts[lr+100] != 1 {
			t.Errorf("rank %d: %d lines and %d tails, want %d and 1", lr, counts[lr], counts[lr+100], n)
		}
		if b := readOr(filepath.Join(a.Dir(), strconv.Itoa(lr), "stdout.log"), ""); !strings.HasSuffix(b, "last words "+strconv.Itoa(lr)) {
			t.Errorf("rank %d stdout.log lacks the tail", lr)
		}
	}
}

func TestAttemptDirsNotWiped(t *testing.T) {
	l, err := New(Options{LogDir: t.TempDir(), RunID: "r", Redirects: configs.StdSpec{All: configs.StdBoth}})
	if err != nil {
		t.Fatal(err)
	}
	ranks := []RankInfo{{0, 0}}
	var dirs []string
	for _, n := range []int{0, 0, 1, 0} {
		a, err := l.Attempt(n, ranks)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(a.ErrorFile(0), []byte(a.Dir()), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, filepath.Base(a.Dir()))
	}
	if want := []string{"attempt_0", "attempt_0.1", "attempt_1", "attempt_0.2"}; !slices.Equal(dirs, want) {
		t.Errorf("attempt dirs %v, want %v", dirs, want)
	}
	for _, d := range dirs {
		full := filepath.Join(l.Dir(), d)
		if got := readOr(filepath.Join(full, "0", "error.json"), ""); got != full {
			t.Errorf("%s: marker %q was wiped", d, got)
		}
	}
}

func TestDefaultLogDir(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	l, err := New(Options{RunID: "myrun"})
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Dir(l.Dir())
	if filepath.Dir(parent) != tmp || !strings.HasPrefix(filepath.Base(parent), "torchelastic_") || !strings.HasPrefix(filepath.Base(l.Dir()), "myrun_") {
		t.Errorf("run dir %q", l.Dir())
	}
	a, err := l.Attempt(0, []RankInfo{{0, 0}})
	if err != nil {
		t.Fatal(err)
	}
	if out, errf := a.Files(0); out != nil || errf != nil {
		t.Errorf("no redirect: want inherited streams")
	}
	if a.ErrorFile(0) == "" {
		t.Error("error file is set even without --log-dir")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestRunIDWithSlashStaysOneDirectory(t *testing.T) {
	root := t.TempDir()
	l, err := New(Options{LogDir: root, RunID: "team/exp-3", Role: "default", Console: io.Discard, ConsoleErr: io.Discard})
	if err != nil {
		t.Fatalf("New with a run id containing '/': %v", err)
	}
	if filepath.Dir(l.Dir()) != root || !strings.HasPrefix(filepath.Base(l.Dir()), "team_exp-3_") {
		t.Fatalf("log dir %s, want %s/team_exp-3_<rand>", l.Dir(), root)
	}
}

// TestWaitStderr: a failed rank's stderr goes to its log through the
// launcher's pipe; WaitStderr returns once the copier has everything (the
// write end closed, as when the rank and its children exited), and gives
// up after its bound while a process still holds the pipe.
func TestWaitStderr(t *testing.T) {
	l, err := New(Options{LogDir: t.TempDir(), RunID: "r", Redirects: configs.StdSpec{All: configs.StdBoth}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := l.Attempt(0, []RankInfo{{LocalRank: 0, GlobalRank: 0}, {LocalRank: 1, GlobalRank: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	_, w0 := a.Files(0)
	_, w1 := a.Files(1)
	// The rank's copies of the write ends stand in for the processes.
	r0, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(w0.Fd())), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	r1, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(w1.Fd())), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()
	a.CloseParentEnds()
	dump := strings.Repeat("  File \"train.py\", line 4 in load\n", 2000) // a long dump, many pipe buffers
	go func() {
		_, _ = r0.WriteString(dump)
		r0.Close() // the rank died
	}()
	if !a.WaitStderr(0, 30*time.Second) {
		t.Fatal("rank 0's stderr not copied after its write end closed")
	}
	_, path := a.LogPaths(0)
	if b, err := os.ReadFile(path); err != nil || string(b) != dump {
		t.Fatalf("log has %d bytes of %d (%v)", len(b), len(dump), err)
	}
	start := time.Now()
	if a.WaitStderr(1, 200*time.Millisecond) {
		t.Fatal("rank 1's stderr reported copied while its write end is open")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("waited %v, bound 200 ms", took)
	}
}
