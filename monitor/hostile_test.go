package monitor

import (
	"bufio"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/lockedbuf"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func managerWithLog(t *testing.T, nlocal int, mut func(*configs.FaultTolerance)) (*Manager, *lockedbuf.Buffer) {
	t.Helper()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	if mut != nil {
		mut(&ft)
	}
	buf := &lockedbuf.Buffer{}
	m, err := New(Options{NLocal: nlocal, FT: ft, MinComputedTimeout: -1,
		Logger: slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return m, buf
}

// rawSession is a native session driven byte by byte, as a hostile rank would.
func rawSession(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	hello, _ := json.Marshal(ftwire.Hello{GlobalRank: 1, LocalRank: 1, PID: os.Getpid()})
	if _, err := c.Write(ftwire.AppendFrame([]byte(ftwire.Magic), ftwire.MsgHello, hello)); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	br := bufio.NewReader(c)
	if err := ftwire.ReadMagic(br); err != nil {
		t.Fatalf("no config reply: %v", err)
	}
	if typ, err := br.ReadByte(); err != nil || typ != ftwire.MsgConfig {
		t.Fatalf("config reply type %#x, %v", typ, err)
	}
	if _, err := ftwire.ReadPayload(br); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Time{})
	return c
}

func TestValidateUpdate(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	configured := map[string]time.Duration{"step": time.Minute}
	hb := func(init, sub *float64) *ftwire.TimeoutsUpdate {
		return &ftwire.TimeoutsUpdate{Heartbeat: &ftwire.HeartbeatTimeouts{Initial: init, Subsequent: sub}}
	}
	sec := func(name string, v *float64) *ftwire.TimeoutsUpdate {
		return &ftwire.TimeoutsUpdate{Section: &ftwire.SectionTimeouts{Section: map[string]*float64{name: v}}}
	}
	tests := []struct {
		name   string
		u      *ftwire.TimeoutsUpdate
		ok     bool
		fields map[string]time.Duration
	}{
		{"valid", hb(f(30), f(10)), true, map[string]time.Duration{"initial": 30 * time.Second, "heartbeat": 10 * time.Second}},
		{"null keeps", hb(nil, f(10)), true, map[string]time.Duration{"heartbeat": 10 * time.Second}},
		{"zero", hb(f(30), f(0)), false, nil},
		{"negative", hb(f(-1), f(10)), false, nil},
		{"nan", hb(f(math.NaN()), f(10)), false, nil},
		{"inf", hb(f(30), f(math.Inf(1))), false, nil},
		{"1e300", hb(f(1e300), f(10)), false, nil},
		{"above max", hb(f(30), f(MaxClientTimeout.Seconds()+1)), false, nil},
		{"below min raised", hb(f(30), f(1e-9)), true, map[string]time.Duration{"initial": 30 * time.Second, "heartbeat": MinClientTimeout}},
		{"section", sec("step", f(90)), true, map[string]time.Duration{"section:step": 90 * time.Second}},
		{"section zero", sec("step", f(0)), false, nil},
		{"unconfigured section", sec("other", f(90)), false, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cu, err := validateUpdate(tc.u, configured)
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
			if tc.ok && len(cu.fields) != len(tc.fields) {
				t.Fatalf("fields %v, want %v", cu.fields, tc.fields)
			}
			for k, v := range tc.fields {
				if cu.fields[k] != v {
					t.Errorf("%s = %v, want %v", k, cu.fields[k], v)
				}
			}
		})
	}
}

// TestHostileTimeoutsCannotDisableDetection: one rank sending 0, negative,
// null, 1e300 or malformed timeouts changes nothing, is logged once, and the
// hang of another rank is still caught; a valid looser value applies to the
// sender only until every rank agrees, a tighter one applies to the node.
func TestHostileTimeoutsCannotDisableDetection(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	m, logs := managerWithLog(t, 2, func(ft *configs.FaultTolerance) {
		ft.InitialRankHeartbeatTimeout = nil
		ft.RankHeartbeatTimeout = fptr(2)
	})
	victim := startRank(t, m, "connect;hbn 3 20ms;mark hung;sleep 60s")
	m.BeginCycle(0, map[int]int{0: victim.cmd.Process.Pid, 1: os.Getpid()})
	hostile := rawSession(t, m.RankSocket(1))
	for _, p := range []string{
		`{"heartbeat":{"initial":0,"subsequent":0}}`,
		`{"heartbeat":{"initial":-5,"subsequent":-5}}`,
		`{"heartbeat":{"initial":1e300,"subsequent":1e300}}`,
		`{"section":{"section":{"x":0},"out_of_section":null}}`,
	} {
		for i := 0; i < 50; i++ {
			if _, err := hostile.Write(ftwire.AppendFrame(nil, ftwire.MsgSetTimeouts, []byte(p))); err != nil {
				t.Fatal(err)
			}
		}
	}
	// null everywhere is valid and changes nothing.
	if _, err := hostile.Write(ftwire.AppendFrame(nil, ftwire.MsgSetTimeouts,
		[]byte(`{"heartbeat":{"initial":null,"subsequent":null}}`))); err != nil {
		t.Fatal(err)
	}
	victim.waitLine(t, "hung", 20*time.Second)
	h := waitHang(t, m, 30*time.Second)
	if h.LocalRank != 0 || h.Kind != KindHeartbeat || h.Timeout != 2*time.Second {
		t.Fatalf("hang %+v, want rank 0's 2s heartbeat timeout", h)
	}
	eventually(t, 10*time.Second, "refusals logged", func() bool { return logs.Count("refused input from rank") >= 1 })
	if n := logs.Count("refused input from rank"); n != 1 {
		t.Errorf("refused updates logged %d times, want once per rank", n)
	}
	if got := m.RankStatus(1).Timeouts.Heartbeat; got != 2*time.Second {
		t.Errorf("hostile rank's own heartbeat timeout %v, want 2s", got)
	}
	m.EndCycle()
	if got := m.Timeouts().Heartbeat; got != 2*time.Second {
		t.Errorf("next cycle's heartbeat timeout %v, want 2s", got)
	}
}

// TestClientTimeoutsScope: a looser value from one rank applies to it alone
// until every rank sent one (then the tightest wins); a tighter one
// applies to the node from the next cycle.
func TestClientTimeoutsScope(t *testing.T) {
	t.Parallel()
	m, _ := managerWithLog(t, 2, func(ft *configs.FaultTolerance) {
		ft.InitialRankHeartbeatTimeout = nil
		ft.RankHeartbeatTimeout = fptr(20)
	})
	m.BeginCycle(0, map[int]int{0: os.Getpid(), 1: os.Getpid()})
	send := func(c net.Conn, p string) {
		t.Helper()
		if _, err := c.Write(ftwire.AppendFrame(nil, ftwire.MsgSetTimeouts, []byte(p))); err != nil {
			t.Fatal(err)
		}
	}
	c1 := rawSession(t, m.RankSocket(1))
	send(c1, `{"heartbeat":{"initial":null,"subsequent":100}}`)
	eventually(t, 10*time.Second, "rank 1's own timeout", func() bool { return m.RankStatus(1).Timeouts.Heartbeat == 100*time.Second })
	if got := m.Timeouts().Heartbeat; got != 20*time.Second {
		t.Errorf("one rank loosened the node's timeout to %v", got)
	}
	if got := m.RankStatus(0).Timeouts.Heartbeat; got != 20*time.Second {
		t.Errorf("one rank loosened rank 0's timeout to %v", got)
	}
	c0 := rawSession(t, m.RankSocket(0))
	send(c0, `{"heartbeat":{"initial":null,"subsequent":50}}`)
	eventually(t, 10*time.Second, "agreed timeout", func() bool { return m.Timeouts().Heartbeat == 50*time.Second })
	send(c1, `{"heartbeat":{"initial":null,"subsequent":5}}`)
	eventually(t, 10*time.Second, "tightened timeout", func() bool { return m.Timeouts().Heartbeat == 5*time.Second })
	m.EndCycle()
}

// TestManySectionNamesBounded: 100,000 distinct section names from one rank
// keep the monitor's tables at MaxSectionNames and the log at one line.
func TestManySectionNamesBounded(t *testing.T) {
	t.Parallel()
	m, logs := managerWithLog(t, 1, nil)
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	r := m.ranks[0]
	c := rawSession(t, m.RankSocket(0))
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// Through the socket: ids beyond the limit close the session.
	var b []byte
	for i := 0; i < MaxSectionNames+10; i++ {
		b = ftwire.AppendDefineSection(b, uint64(i), "s"+strings.Repeat("x", 10)+string(rune('a'+i%26))+itoa(i))
	}
	_, _ = c.Write(b)
	eventually(t, 10*time.Second, "session closed", func() bool { return !m.RankStatus(0).Connected })
	// Directly through the monitor, as the nvrx path and the ring reach it.
	gen := r.gen.Load()
	r.mu.Lock()
	r.setPhaseLocked(phaseInitial)
	r.mu.Unlock()
	refused := 0
	for i := 0; i < 100_000; i++ {
		name := "section-" + itoa(i)
		if r.openSection(gen, name, nil, m.mono()) == sectionLimitCause {
			refused++
			continue
		}
		r.closeSection(gen, name, m.mono())
	}
	r.mu.Lock()
	n := len(r.obs.SectionMax) + len(r.obs.SectionCloses) + len(r.open)
	r.mu.Unlock()
	if n > 2*MaxSectionNames {
		t.Errorf("monitor holds %d section entries, want at most %d", n, 2*MaxSectionNames)
	}
	if refused != 100_000-MaxSectionNames {
		t.Errorf("refused %d names, want %d", refused, 100_000-MaxSectionNames)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 16<<20 {
		t.Errorf("heap grew by %d bytes for 100,000 section names", grow)
	}
	if n := logs.Count("refused input from rank"); n != 1 {
		t.Errorf("refused sections logged %d times, want 1", n)
	}
}

// TestConnectionFloodLogBounded: 500 refused connections (the peer is not
// the rank) produce a bounded number of log lines.
func TestConnectionFloodLogBounded(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	m, logs := managerWithLog(t, 1, nil)
	other := startProc(t, m, nil, "sleep", "60") // the test process is not in its tree
	m.BeginCycle(0, map[int]int{0: other.cmd.Process.Pid})
	var wg sync.WaitGroup
	for i := 0; i < 500; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", m.RankSocket(0))
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = c.Read(make([]byte, 1)) // until refused (closed)
		}()
	}
	wg.Wait()
	if n := logs.Count("refusing"); n < 1 || n > refusedLogBurst+2 {
		t.Errorf("500 refused connections logged %d lines, want 1..%d", n, refusedLogBurst+2)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestStaleSocketDirsRemoved: socket dirs of dead launchers are removed at
// the next start; those of live ones (and foreign names) are kept.
func TestStaleSocketDirsRemoved(t *testing.T) {
	testenv.SkipShort(t, "runs Python rank clients")
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		keep bool
	}{
		{socketDirPrefix + strconv.Itoa(dead.Process.Pid) + "-abc", false},
		{socketDirPrefix + strconv.Itoa(os.Getpid()) + "-abc", true},
		{socketDirPrefix + "xyz", true},
		{"other-1-abc", true},
	}
	for _, tc := range tests {
		if err := os.MkdirAll(filepath.Join(tmp, tc.name, "sub"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	removeStaleDirs(tmp, slog.New(slog.DiscardHandler))
	for _, tc := range tests {
		_, err := os.Stat(filepath.Join(tmp, tc.name))
		if got := err == nil; got != tc.keep {
			t.Errorf("%s kept = %v, want %v", tc.name, got, tc.keep)
		}
	}
}

// TestStaleSocketDirsRemovedConcurrently: launchers sharing $TMPDIR start
// together and sweep the same dead launcher's dirs; a dir another one
// removed first is skipped (it once crashed the launcher: a nil FileInfo).
func TestStaleSocketDirsRemovedConcurrently(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 20; round++ {
		tmp := t.TempDir()
		for i := 0; i < 100; i++ {
			name := socketDirPrefix + strconv.Itoa(dead.Process.Pid) + "-" + strconv.Itoa(i)
			if err := os.MkdirAll(filepath.Join(tmp, name), 0o700); err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				removeStaleDirs(tmp, slog.New(slog.DiscardHandler))
			}()
		}
		wg.Wait()
		if left, _ := os.ReadDir(tmp); len(left) != 0 {
			t.Fatalf("round %d: %d stale dirs left", round, len(left))
		}
	}
}

// TestStaleSocketDirsOwnerLock: a live launcher's socket dir is kept even
// when the pid in its name is not running here, as it is for a launcher in
// another PID namespace sharing $TMPDIR (unshare --pid; its sweep once
// removed a running job's dir and the in-process replacement rank could not
// reach its monitor). The owner lock decides; once released, the dir goes.
func TestStaleSocketDirsOwnerLock(t *testing.T) {
	testenv.SkipShort(t, "runs Python rank clients")
	tmp := t.TempDir()
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	dir, lock, err := makeLockedDir(tmp)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if !strings.HasPrefix(filepath.Base(dir), socketDirPrefix+strconv.Itoa(os.Getpid())+"-") {
		t.Fatalf("socket dir %s, want %s<pid>-...", dir, socketDirPrefix)
	}
	// The pid another namespace would see in the name: not running here.
	foreign := filepath.Join(tmp, socketDirPrefix+strconv.Itoa(dead.Process.Pid)+"-ns")
	if err := os.Rename(dir, foreign); err != nil {
		t.Fatal(err)
	}
	removeStaleDirs(tmp, slog.New(slog.DiscardHandler))
	if _, err := os.Stat(foreign); err != nil {
		t.Fatalf("the dir of a live owner (lock held) was removed: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(tmp, ".ftl-mon-new-*")); len(left) != 0 {
		t.Errorf("build dirs left behind: %v", left)
	}
	lock.Close() // the owner dies
	removeStaleDirs(tmp, slog.New(slog.DiscardHandler))
	if _, err := os.Stat(foreign); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the dir of a dead owner (lock free) was kept: %v", err)
	}
}

// TestManagerSocketDirSurvivesSweep: a running Manager's socket dir
// survives another launcher's sweep whatever pid its name carries, and
// its rank sockets stay reachable.
func TestManagerSocketDirSurvivesSweep(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	m, err := New(Options{NLocal: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	sock := m.RankSocket(0)
	removeStaleDirs(tmp, slog.New(slog.DiscardHandler))
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("rank socket gone after a sweep: %v", err)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(sock), ownerLockFile)); err != nil {
		t.Fatalf("no owner lock in the socket dir: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("Close left %d entries in $TMPDIR", len(left))
	}
}
