package prewarm

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// python is Debian's interpreter (the one the integration tests use).
const python = "/usr/bin/python3"

const testTimeout = 60 * time.Second

func newReaper(t *testing.T) *spawn.Reaper {
	t.Helper()
	r, err := spawn.NewReaper(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// events collects a Starter's event-log records.
type events struct {
	mu  sync.Mutex
	got []eventlog.Record
}

func (e *events) add(r eventlog.Record) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, r)
}

func (e *events) of(kind string) []eventlog.Record {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []eventlog.Record
	for _, r := range e.got {
		if r.Kind() == kind {
			out = append(out, r)
		}
	}
	return out
}

// recsOf is e's records of type T, in order.
func recsOf[T eventlog.Record](e *events) []T {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []T
	for _, r := range e.got {
		if x, ok := r.(T); ok {
			out = append(out, x)
		}
	}
	return out
}

func newStarter(t *testing.T, r *spawn.Reaper, modules ...string) (*Starter, *events) {
	t.Helper()
	ev := &events{}
	st, err := NewStarter(Options{Reaper: r, Modules: modules, OnEvent: ev.add, RefillDelay: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st, ev
}

// waitReady waits until local rank lr has a ready standby.
func waitReady(t *testing.T, st *Starter, lr int) *standby {
	t.Helper()
	deadline := time.Now().Add(testTimeout)
	for time.Now().Before(deadline) {
		st.mu.Lock()
		s := st.standby[lr]
		st.mu.Unlock()
		if s != nil {
			select {
			case <-s.ready:
				return s
			case <-s.done:
				t.Fatalf("standby of local rank %d ended: %s\n%s", lr, s.exit, s.diag.String())
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no ready standby for local rank %d within %s", lr, testTimeout)
	return nil
}

// rankGroup is what the tests use of a cycle's ranks: a *Group or a
// *spawn.Group (the cold baseline).
type rankGroup interface {
	Exits() <-chan spawn.Exit
	Stop(sig syscall.Signal, grace time.Duration) spawn.StopResult
}

// starter starts one cycle: a *Starter, or plain spawn for the baseline.
type starter func(specs []spawn.Spec) (rankGroup, error)

// warm starts through st.
func warm(st *Starter) starter {
	return func(specs []spawn.Spec) (rankGroup, error) {
		g, err := st.StartGroup(specs)
		if err != nil {
			return nil, err
		}
		return g, nil
	}
}

// cold starts with plain spawn, as the launcher does without --prewarm.
func cold(r *spawn.Reaper) starter {
	return func(specs []spawn.Spec) (rankGroup, error) {
		g, err := r.StartGroup(specs)
		if err != nil {
			return nil, err
		}
		return g, nil
	}
}

// waitAll waits for every rank of g to exit and stops what is left.
func waitAll(t *testing.T, g rankGroup, n int) []spawn.Exit {
	t.Helper()
	var out []spawn.Exit
	timeout := time.After(testTimeout)
	for len(out) < n {
		select {
		case e := <-g.Exits():
			out = append(out, e)
		case <-timeout:
			g.Stop(syscall.SIGKILL, 0)
			t.Fatalf("%d of %d ranks exited within %s", len(out), n, testTimeout)
		}
	}
	return out
}

type recordCase struct {
	name   string
	module bool
	relDir bool // run from testdata with a relative script path
}

// spec is the rank command of c as agent.WorkerArgv builds it.
func (c recordCase) spec(t *testing.T, dir, out string, stdout, stderr *os.File, extra ...string) spawn.Spec {
	td, err := filepath.Abs("testdata")
	if err != nil {
		t.Fatal(err)
	}
	argv := []string{python, "-u", filepath.Join(td, "record.py"), "a b", "--flag"}
	wd := ""
	if c.module {
		argv = []string{python, "-u", "-m", "recmod", "x", "--y=1"}
		wd = td
	}
	if c.relDir {
		argv = []string{python, "-u", "testdata/../testdata/record.py", "rel"}
		wd = filepath.Dir(td)
	}
	env := append(os.Environ(), "RECORD_OUT="+out, "RANK=0", "LOCAL_RANK=0", "TORCHELASTIC_RESTART_COUNT="+filepath.Base(dir))
	return spawn.Spec{LocalRank: 0, Argv: argv, Env: append(env, extra...), Dir: wd, Stdout: stdout, Stderr: stderr}
}

func logFiles(t *testing.T, dir string) (*os.File, *os.File) {
	t.Helper()
	o, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close(); e.Close() })
	return o, e
}

func readRecord(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("record: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// run starts spec with starter, waits for its exit and returns its record.
func run(t *testing.T, start starter, dir string, c recordCase, extra ...string) (map[string]any, spawn.Exit, rankGroup) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	o, e := logFiles(t, dir)
	out := filepath.Join(dir, "record.json")
	g, err := start([]spawn.Spec{c.spec(t, dir, out, o, e, extra...)})
	if err != nil {
		t.Fatal(err)
	}
	ex := waitAll(t, g, 1)[0]
	g.Stop(syscall.SIGKILL, 0)
	return readRecord(t, out), ex, g
}

var hexAddr = regexp.MustCompile(`0x[0-9a-f]+`)

// normalise removes what differs between any two runs (and documented
// differences of a warm rank).
func normalise(rec map[string]any, dir string) map[string]any {
	env := rec["env"].(map[string]any)
	delete(env, "RECORD_OUT")
	delete(env, "TORCHELASTIC_RESTART_COUNT")
	rec["spec"] = hexAddr.ReplaceAllString(rec["spec"].(string), "0x")
	rec["stdout"] = strings.TrimPrefix(rec["stdout"].(string), dir)
	rec["stderr"] = strings.TrimPrefix(rec["stderr"].(string), dir)
	return rec
}

// TestWarmRankObservesWhatAColdRankDoes runs the recorder cold (plain
// spawn) and warm (on a standby) and compares every record.
func TestWarmRankObservesWhatAColdRankDoes(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	for _, c := range []recordCase{
		{name: "script"},
		{name: "module", module: true},
		{name: "relative script and directory", relDir: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newReaper(t)
			base := t.TempDir()
			coldRec, coldExit, _ := run(t, cold(r), filepath.Join(base, "0"), c)

			st, ev := newStarter(t, r, "json", "email.mime.text")
			first, _, _ := run(t, warm(st), filepath.Join(base, "1"), c) // cold: no standby yet
			waitReady(t, st, 0)
			warmRec, warmExit, _ := run(t, warm(st), filepath.Join(base, "2"), c)
			if n := len(ev.of(EventWarm)); n != 1 {
				t.Fatalf("%d warm starts, want 1: %v", n, ev.got)
			}
			if coldExit.Code != 0 || warmExit.Code != 0 {
				t.Fatalf("exits: cold %v, warm %v", coldExit, warmExit)
			}
			cold := normalise(coldRec, filepath.Join(base, "0"))
			warm := normalise(warmRec, filepath.Join(base, "2"))
			normalise(first, filepath.Join(base, "1"))
			if !reflect.DeepEqual(cold, first) {
				t.Errorf("the Starter's cold start differs from spawn:\n%s", diff(cold, first))
			}
			if !reflect.DeepEqual(cold, warm) {
				t.Errorf("warm rank differs from a cold one:\n%s", diff(cold, warm))
			}
			for _, name := range []string{"stdout.log", "stderr.log"} {
				want, _ := os.ReadFile(filepath.Join(base, "0", name))
				got, _ := os.ReadFile(filepath.Join(base, "2", name))
				if string(got) != string(want) || len(want) == 0 {
					t.Errorf("%s: warm %q, cold %q", name, got, want)
				}
			}
		})
	}
}

func diff(a, b map[string]any) string {
	var out strings.Builder
	for k, v := range a {
		if !reflect.DeepEqual(v, b[k]) {
			fmt.Fprintf(&out, "  %s: cold %v\n  %s: warm %v\n", k, v, k, b[k])
		}
	}
	return out.String()
}

// TestWarmExitsAsCold compares exit codes, tracebacks and signals.
func TestWarmExitsAsCold(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	for _, tc := range []struct {
		name string
		env  []string
	}{
		{"exit code", []string{"RECORD_EXIT=7"}},
		{"exception", []string{"RECORD_RAISE=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReaper(t)
			base := t.TempDir()
			_, coldExit, _ := run(t, cold(r), filepath.Join(base, "0"), recordCase{}, tc.env...)
			st, _ := newStarter(t, r, "json")
			run(t, warm(st), filepath.Join(base, "1"), recordCase{}, tc.env...)
			waitReady(t, st, 0)
			_, warmExit, _ := run(t, warm(st), filepath.Join(base, "2"), recordCase{}, tc.env...)
			if coldExit.Code != warmExit.Code || coldExit.Signal != warmExit.Signal {
				t.Fatalf("exit: cold %v, warm %v", coldExit, warmExit)
			}
			want, _ := os.ReadFile(filepath.Join(base, "0", "stderr.log"))
			got, _ := os.ReadFile(filepath.Join(base, "2", "stderr.log"))
			if string(got) != string(want) {
				t.Fatalf("stderr: warm\n%s\ncold\n%s", got, want)
			}
		})
	}
}

// TestBrokenStandbyFallsBackCold: a standby killed, stopped (it never
// answers the handover) or whose import fails leaves its rank to a cold
// start, and the reason is recorded.
func TestBrokenStandbyFallsBackCold(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	for _, tc := range []struct {
		name    string
		modules []string
		breakIt func(t *testing.T, s *standby)
		reason  string
	}{
		{"killed", []string{"json"}, func(t *testing.T, s *standby) {
			s.g.SignalAll(syscall.SIGKILL)
			<-s.done
		}, "killed by signal 9"},
		{"stopped", []string{"json"}, func(t *testing.T, s *standby) {
			s.g.SignalAll(syscall.SIGSTOP)
		}, "did not take the rank within"},
		{"import fails", []string{"json", "no_such_module_ftl"}, nil, "No module named 'no_such_module_ftl'"},
		// A fake for a GPU: ftl_fakecuda stands for an import that created
		// a CUDA context (no GPU here).
		{"CUDA context at import (fake)", []string{"json", "ftl_fakecuda"}, nil, "created a CUDA context; a standby must not hold one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReaper(t)
			base := t.TempDir()
			st, ev := newStarter(t, r, tc.modules...)
			st.o.HandoverTimeout = 2 * time.Second
			run(t, warm(st), filepath.Join(base, "1"), recordCase{})
			if tc.breakIt != nil {
				tc.breakIt(t, waitReady(t, st, 0))
			} else {
				deadline := time.Now().Add(testTimeout)
				for len(ev.of(EventDisabled)) == 0 && time.Now().Before(deadline) {
					time.Sleep(20 * time.Millisecond)
				}
				dis := recsOf[eventlog.PrewarmDisabledEvent](ev)
				if len(dis) != 1 || !strings.Contains(dis[0].Reason, tc.reason) {
					t.Fatalf("disabled events %v, want one naming %q", dis, tc.reason)
				}
			}
			runCycle(t, st, filepath.Join(base, "2"))
			if n := len(ev.of(EventWarm)); n != 0 {
				t.Fatalf("%d warm starts, want none", n)
			}
			fb := recsOf[eventlog.PrewarmFallbackEvent](ev)
			if len(fb) != 2 || !strings.Contains(fb[1].Reason, tc.reason) {
				t.Fatalf("fallback events %v, want the second to name %q", fb, tc.reason)
			}
		})
	}
}

// runCycle runs the recorder once more with st and checks that it ran to
// its end, within half the test timeout.
func runCycle(t *testing.T, st *Starter, dir string) {
	t.Helper()
	begin := time.Now()
	rec, ex, _ := run(t, warm(st), dir, recordCase{})
	if ex.Code != 0 || rec["name"] != "__main__" {
		t.Fatalf("%s: exit %v, record %v", dir, ex, rec["name"])
	}
	if took := time.Since(begin); took > testTimeout/2 {
		t.Errorf("%s took %s", dir, took)
	}
}

// TestCloseKillsStandbys: nothing of a Starter outlives Close.
func TestCloseKillsStandbys(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	st, _ := newStarter(t, r, "json")
	run(t, warm(st), filepath.Join(t.TempDir(), "1"), recordCase{})
	s := waitReady(t, st, 0)
	st.Close()
	select {
	case <-s.done:
	default:
		t.Fatal("standby not reaped after Close")
	}
	if _, err := st.StartGroup(nil); err == nil {
		t.Fatal("StartGroup after Close succeeded")
	}
}

func TestParseArgv(t *testing.T) {
	for _, tc := range []struct {
		argv []string
		want pyCommand
		ok   bool
	}{
		{[]string{"py", "-u", "t.py", "a"}, pyCommand{"py", "script", "t.py"}, true},
		{[]string{"py", "-u", "-m", "pkg.mod", "a"}, pyCommand{"py", "module", "pkg.mod"}, true},
		{[]string{"py", "-u", "-m"}, pyCommand{}, false},
		{[]string{"./train.sh", "a", "b"}, pyCommand{}, false},
		{[]string{"py", "-u", "-c", "x"}, pyCommand{}, false},
	} {
		got, ok := parseArgv(tc.argv)
		if ok != tc.ok || got != tc.want {
			t.Errorf("parseArgv(%q) = %v, %v; want %v, %v", tc.argv, got, ok, tc.want, tc.ok)
		}
	}
}

func TestNewStarterValidates(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	for _, tc := range []struct {
		modules []string
		ok      bool
	}{
		{[]string{"torch", "torch.distributed"}, true},
		{nil, false},
		{[]string{"torch;import os"}, false},
		{[]string{"1abc"}, false},
	} {
		st, err := NewStarter(Options{Reaper: r, Modules: tc.modules})
		if (err == nil) != tc.ok {
			t.Errorf("NewStarter(%q): err %v, want ok %v", tc.modules, err, tc.ok)
		}
		if st != nil {
			st.Close()
		}
	}
}

// TestRefillWaitsTheDelay: new standbys start only after RefillDelay, and
// Close during the delay starts none.
func TestRefillWaitsTheDelay(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	r := newReaper(t)
	for _, closeEarly := range []bool{false, true} {
		st, err := NewStarter(Options{Reaper: r, Modules: []string{"json"}, RefillDelay: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		begin := time.Now()
		run(t, warm(st), filepath.Join(t.TempDir(), "1"), recordCase{})
		st.mu.Lock()
		n := len(st.standby)
		st.mu.Unlock()
		if n != 0 && time.Since(begin) < time.Second {
			t.Fatalf("a standby started before the refill delay")
		}
		if closeEarly {
			st.Close()
			if len(st.standby) != 0 {
				t.Fatalf("standbys after Close: %v", st.standby)
			}
			continue
		}
		waitReady(t, st, 0)
		st.Close()
	}
}
