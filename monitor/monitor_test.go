package monitor

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestSocketsAndPermissions(t *testing.T) {
	m := newManager(t, 2, nil, "")
	dir := filepath.Dir(m.RankSocket(0))
	st, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o700 {
		t.Errorf("socket dir mode %v, want 0700", st.Mode().Perm())
	}
	for _, p := range []string{m.RankSocket(0), m.RankSocket(1), m.LauncherSocket()} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want socket 0600", p, st.Mode())
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("socket dir still exists after Close: %v", err)
	}
}

// TestSocketBase: the private socket dir goes under $TMPDIR unless a
// socket path there could pass the kernel's 107 bytes, then under /tmp.
func TestSocketBase(t *testing.T) {
	long := "/" + strings.Repeat("d", 70)
	tests := []struct {
		tmp    string
		nLocal int
		want   string
	}{
		{"/tmp", 8, "/tmp"},
		{"/var/tmp/slurm-123", 1024, "/var/tmp/slurm-123"},
		{long, 1, "/tmp"},
		{long[:50], 8, long[:50]},
	}
	for _, tt := range tests {
		if got := socketBase(tt.tmp, tt.nLocal); got != tt.want {
			t.Errorf("socketBase(%q, %d) = %q, want %q", tt.tmp, tt.nLocal, got, tt.want)
		}
	}
}

// TestLongTMPDIR: a $TMPDIR too long for a socket path (a scheduler's per-job
// one) does not stop the monitors: their sockets go under /tmp, and the dir
// goes when the manager closes.
func TestLongTMPDIR(t *testing.T) {
	long := filepath.Join(t.TempDir(), strings.Repeat("d", 100))
	if err := os.Mkdir(long, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", long)
	m := newManager(t, 2, nil, "")
	dir := filepath.Dir(m.RankSocket(1))
	if filepath.Dir(dir) != "/tmp" {
		t.Errorf("socket dir %s, want one under /tmp", dir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	m.BeginCycle(0, map[int]int{1: os.Getpid()})
	c, err := ftclient.ConnectPath(ctx, m.RankSocket(1), ftclient.Options{})
	if err != nil {
		t.Fatalf("connect to %s: %v", m.RankSocket(1), err)
	}
	c.Close()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("socket dir still exists after Close: %v", err)
	}
}

func TestPeerCheck(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	m := newManager(t, 1, nil, "")
	sleep := exec.Command("sleep", "60")
	sleep.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	m.BeginCycle(0, map[int]int{0: sleep.Process.Pid})

	// The test process is the sleep's parent, not in its tree: refused.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if c, err := ftclient.ConnectPath(ctx, m.RankSocket(0), ftclient.Options{}); err == nil {
		c.Close()
		t.Fatal("connection from a process outside the rank's tree was accepted")
	}

	// A rank started through sh: the registered pid is sh, the client is its
	// child (a descendant in the same process group): accepted.
	m.EndCycle()
	p := startProc(t, m, []string{"FTL_HELPER=connect;hb;mark connected;sleep 60s"}, "/bin/sh", "-c", `"$0" -test.run='^$'; exit $?`, os.Args[0])
	m.BeginCycle(1, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "connected", 20*time.Second)
	eventually(t, 10*time.Second, "heartbeat from the rank", func() bool {
		s := m.RankStatus(0)
		return s.Connected && s.Heartbeats == 1
	})
}

func TestHangKinds(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	tests := []struct {
		name    string
		ft      func(*configs.FaultTolerance)
		script  string
		kind    HangKind
		section string
		timeout time.Duration
		check   func(t *testing.T, m *Manager)
	}{
		{
			name:   "no first heartbeat",
			ft:     func(ft *configs.FaultTolerance) { ft.InitialRankHeartbeatTimeout = fptr(0.5) },
			script: "connect;sleep 60s",
			kind:   KindInitialHeartbeat, timeout: 500 * time.Millisecond,
		},
		{
			name: "heartbeats stop",
			ft: func(ft *configs.FaultTolerance) {
				ft.InitialRankHeartbeatTimeout = fptr(10)
				ft.RankHeartbeatTimeout = fptr(0.5)
			},
			script: "connect;hbn 5 50ms;sleep 60s",
			kind:   KindHeartbeat, timeout: 500 * time.Millisecond,
		},
		{
			// The short section was opened first and the long one last: nvrx
			// only looks at the last one iterated and would miss it.
			name: "earliest of two open sections",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"short": fptr(0.5), "long": fptr(30)}
			},
			script: "connect;open short;open long;sleep 60s",
			kind:   KindSection, section: "short", timeout: 500 * time.Millisecond,
		},
		{
			name: "out of section too long",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(30)}
				ft.RankOutOfSectionTimeout = fptr(0.5)
			},
			script: "connect;open step;close step;sleep 60s",
			kind:   KindOutOfSection, timeout: 500 * time.Millisecond,
		},
		{
			// step gets the warmup timeout for the first 2 iterations: the
			// 1 s first step survives, the third step (iteration 2) hangs.
			name: "warmup rule",
			ft: func(ft *configs.FaultTolerance) {
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(0.4), "warmup": fptr(5)}
				ft.NumWarmupIterations = 2
			},
			script: "connect;open step 0;sleep 1s;close step;open step 1;close step;open step 2;sleep 60s",
			kind:   KindSection, section: "step", timeout: 400 * time.Millisecond,
			check: func(t *testing.T, m *Manager) {
				if n := m.RankStatus(0).SectionCloses["step"]; n != 2 {
					t.Errorf("hang after %d closed steps, want 2 (warmup steps must not fire)", n)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newManager(t, 1, tc.ft, "")
			p := startRank(t, m, tc.script)
			m.BeginCycle(3, map[int]int{0: p.cmd.Process.Pid})
			h := waitHang(t, m, 30*time.Second)
			if tc.check != nil {
				tc.check(t, m)
			}
			if h.Kind != tc.kind || h.Section != tc.section || h.Timeout != tc.timeout {
				t.Errorf("hang %s/%q timeout %v, want %s/%q %v", h.Kind, h.Section, h.Timeout, tc.kind, tc.section, tc.timeout)
			}
			if h.Cycle != 3 || h.LocalRank != 0 || h.GlobalRank != 7 || h.Signal != syscall.SIGKILL || h.Escalated {
				t.Errorf("unexpected hang fields: %+v", h)
			}
			if h.Elapsed < h.Timeout {
				t.Errorf("elapsed %v shorter than timeout %v", h.Elapsed, h.Timeout)
			}
			lat := h.SignalledAt.Sub(h.ExpiredAt)
			t.Logf("%s: expiry→signal latency %v", tc.name, lat)
			if lat < 0 || lat > time.Second {
				t.Errorf("expiry→signal latency %v, want within 1s", lat)
			}
			if st := p.exited(t, 10*time.Second); signalOf(st) != syscall.SIGKILL {
				t.Errorf("rank ended with %v, want SIGKILL", st)
			}
			noHang(t, m, 300*time.Millisecond) // once per rank per cycle
			if f, ok := m.FiredHang(3, 0); !ok || f.Kind != h.Kind || f.Section != h.Section {
				t.Errorf("FiredHang(3, 0) = %+v, %v; want the %s hang", f, ok, h.Kind)
			}
			if _, ok := m.FiredHang(4, 0); ok {
				t.Errorf("FiredHang reports a hang for a cycle that never ran")
			}
		})
	}
}

func TestTerminationSignal(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	tests := []struct {
		name      string
		script    string
		escalated bool
		want      syscall.Signal
	}{
		{"rank obeys SIGTERM", "connect;sleep 60s", false, syscall.SIGTERM},
		{"rank ignores SIGTERM", "ignoreterm;connect;sleep 60s", true, syscall.SIGKILL},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newManager(t, 1, func(ft *configs.FaultTolerance) {
				ft.InitialRankHeartbeatTimeout = fptr(0.3)
				ft.RankTerminationSignal = syscall.SIGTERM
				ft.TerminationGrace = 0.7
			}, "")
			p := startRank(t, m, tc.script)
			m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
			h := waitHang(t, m, 30*time.Second)
			if h.Signal != syscall.SIGTERM || h.Escalated != tc.escalated {
				t.Errorf("hang signal %v escalated %v, want SIGTERM escalated %v", h.Signal, h.Escalated, tc.escalated)
			}
			if st := p.exited(t, 10*time.Second); signalOf(st) != tc.want {
				t.Errorf("rank ended with %v, want %v", st, tc.want)
			}
		})
	}
}

func TestDisconnectDoesNotKill(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	m := newManager(t, 1, func(ft *configs.FaultTolerance) {
		ft.InitialRankHeartbeatTimeout = fptr(0.3)
		ft.RankHeartbeatTimeout = fptr(0.3)
		ft.RankSectionTimeouts = map[string]*float64{"x": fptr(0.3)}
	}, "")
	p := startRank(t, m, "connect;hb;open x;disconnect;sleep 1500ms;mark alive;exit 0")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "alive", 30*time.Second)
	if st := p.exited(t, 10*time.Second); !st.Success() {
		t.Errorf("rank ended with %v, want exit 0", st)
	}
	noHang(t, m, 100*time.Millisecond)
	if s := m.RankStatus(0); s.Connected || len(s.OpenSections) != 0 {
		t.Errorf("status after disconnect: %+v", s)
	}
}

func TestStaleConnectionReplaced(t *testing.T) {
	t.Parallel()
	m := newManager(t, 1, nil, "")
	// The test process plays the rank here.
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Socket section events: a write to the closed connection fails, which
	// is how the test sees the close.
	c1, err := ftclient.ConnectPath(ctx, m.RankSocket(0), ftclient.Options{GlobalRank: 1, SocketSections: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := c1.StartSection("a"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "section a open", func() bool { return len(m.RankStatus(0).OpenSections) == 1 })
	start := time.Now()
	c2, err := ftclient.ConnectPath(ctx, m.RankSocket(0), ftclient.Options{GlobalRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	// The old connection is closed by the monitor at once: socket writes
	// fail (a shared-memory heartbeat writes nothing that could fail).
	eventually(t, 2*time.Second, "old connection closed", func() bool { return c1.EndAllSections() != nil })
	t.Logf("stale connection closed %v after the new one connected", time.Since(start))
	for i := 0; i < 3; i++ {
		if err := c2.SendHeartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "heartbeats on the new connection", func() bool {
		s := m.RankStatus(0)
		return s.Connected && s.Heartbeats >= 3 && len(s.OpenSections) == 0
	})
}

func TestNativeWorkloadRequest(t *testing.T) {
	t.Parallel()
	m := newManager(t, 1, nil, "")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := ftclient.RequestWorkloadAction(ctx, m.LauncherSocket(), 5, "ExcludeThisNode", "bad gpu"); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-m.Requests():
		if r != (WorkloadRequest{GlobalRank: 5, Action: "ExcludeThisNode", Description: "bad gpu"}) {
			t.Errorf("request %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no request")
	}
	if err := ftclient.RequestWorkloadAction(ctx, m.LauncherSocket(), 5, "Reboot", ""); err == nil {
		t.Error("invalid action accepted")
	}
}

func readState(t *testing.T, path string) stateFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var sf stateFile
	if err := json.Unmarshal(b, &sf); err != nil {
		t.Fatalf("state file %s: %v\n%s", path, err, b)
	}
	return sf
}

func TestComputedTimeouts(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	t.Parallel()
	state := filepath.Join(t.TempDir(), "ft_state.json")
	calc := func(ft *configs.FaultTolerance) {
		ft.CalculateTimeouts = true
		ft.SafetyFactor = 5
		ft.RankHeartbeatTimeout = fptr(60)         // configured, replaced by the computed value
		ft.InitialRankHeartbeatTimeout = fptr(120) // likewise (a disabled one stays disabled)
	}
	m := newManager(t, 1, calc, state)
	p := startRank(t, m, "connect;hbn 40 50ms;exit 0")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	if st := p.exited(t, 60*time.Second); !st.Success() {
		t.Fatalf("rank ended with %v", st)
	}
	m.EndCycleWith(true) // the rank ran to completion
	sf := readState(t, state)
	hb := sf.CurrentTimeouts.Heartbeat
	obs := sf.FTLauncher.Observed
	if hb == nil || hb.Subsequent == nil || hb.Initial == nil || !hb.WereCalculated {
		t.Fatalf("no calculated heartbeat timeouts persisted: %+v", sf.CurrentTimeouts)
	}
	t.Logf("observed max interval %.3fs over %d intervals → heartbeat timeout %.3fs", obs.HeartbeatIntervalMax, obs.HeartbeatIntervals, *hb.Subsequent)
	// A real launcher stall (a loaded machine) excludes the intervals it
	// covers; only then may fewer be counted.
	m.stalls.mu.Lock()
	stalled := len(m.stalls.windows) > 0
	m.stalls.mu.Unlock()
	if obs.HeartbeatIntervals != 39 && !(stalled && obs.HeartbeatIntervals > 0 && obs.HeartbeatIntervals < 39) {
		t.Errorf("observed %d intervals, want 39 (launcher stalled: %v)", obs.HeartbeatIntervals, stalled)
	}
	if obs.HeartbeatIntervalMax < 0.05 || *hb.Subsequent < 0.25 || *hb.Subsequent > 5 {
		t.Errorf("implausible heartbeat timeout %.3f (max interval %.3f)", *hb.Subsequent, obs.HeartbeatIntervalMax)
	}
	if d := *hb.Subsequent - 5*obs.HeartbeatIntervalMax; d > 1e-6 || d < -1e-6 {
		t.Errorf("timeout %.6f != 5 × max interval %.6f", *hb.Subsequent, obs.HeartbeatIntervalMax)
	}
	want := m.Timeouts()
	if !want.HeartbeatCalculated || want.Heartbeat != durOf(hb.Subsequent) {
		t.Errorf("manager timeouts %v do not match the file", want)
	}

	// A second manager loads the file and applies it from its first cycle.
	m2 := newManager(t, 1, calc, state)
	got := m2.Timeouts()
	if got.Heartbeat != want.Heartbeat || got.InitialHeartbeat != want.InitialHeartbeat || !got.HeartbeatCalculated {
		t.Fatalf("loaded timeouts %v, want %v", got, want)
	}
	m2.BeginCycle(0, map[int]int{0: os.Getpid()})
	if rt := m2.RankStatus(0).Timeouts; rt.Heartbeat != want.Heartbeat {
		t.Errorf("rank timeouts %v after BeginCycle, want heartbeat %v", rt, want.Heartbeat)
	}
	// Too few observations: the computed values stay as they are.
	m2.EndCycle()
	if again := readState(t, state); *again.CurrentTimeouts.Heartbeat.Subsequent != *hb.Subsequent {
		t.Errorf("untrusted cycle changed the timeout to %v", *again.CurrentTimeouts.Heartbeat.Subsequent)
	}
}

func TestBlendAndTrust(t *testing.T) {
	cur := Timeouts{Heartbeat: 10 * time.Second, InitialHeartbeat: 20 * time.Second}.Clone()
	cur.Sections["step"] = 0
	obs := &observations{InitialDelay: time.Second, HeartbeatMax: time.Second, Heartbeats: 10,
		SectionMax:    map[string]time.Duration{"step": 2 * time.Second, "other": time.Second},
		SectionCloses: map[string]int{"step": 3, "other": 5}, OutOfSectionMax: time.Second, OutOfSections: 2}
	// No checkpoint in the cycle: heartbeat intervals are not trusted, while
	// section durations are.
	noCkpt, _ := compute(cur, obs, 5, 0, map[string]bool{}, false)
	if noCkpt.Heartbeat != cur.Heartbeat || noCkpt.HeartbeatCalculated || noCkpt.Sections["step"] != 10*time.Second {
		t.Errorf("cycle without a checkpoint: %v", noCkpt)
	}
	obs.CheckpointSeen = true
	// With the judged default clock the heartbeat timeouts are left to it.
	if judged, _ := compute(cur, obs, 5, 0, map[string]bool{}, true); judged.Heartbeat != cur.Heartbeat ||
		judged.InitialHeartbeat != cur.InitialHeartbeat || judged.HeartbeatCalculated || judged.Sections["step"] != 10*time.Second {
		t.Errorf("judged default clock: %v", judged)
	}
	next, _ := compute(cur, obs, 5, 0, map[string]bool{}, false)
	// Configured values are replaced, not blended.
	if next.Heartbeat != 5*time.Second || next.InitialHeartbeat != 5*time.Second || !next.HeartbeatCalculated {
		t.Errorf("first computation: %v", next)
	}
	if next.Sections["step"] != 10*time.Second || !next.CalculatedSections["step"] {
		t.Errorf("step: %v", next)
	}
	if _, ok := next.Sections["other"]; ok {
		t.Errorf("unconfigured section got a timeout: %v", next)
	}
	if next.OutOfSection != 0 {
		t.Errorf("out-of-section computed from too few stretches: %v", next)
	}
	// Computed values are blended 0.5/0.5.
	obs.HeartbeatMax = 3 * time.Second
	next2, _ := compute(next, obs, 5, 0, map[string]bool{}, false)
	if next2.Heartbeat != 10*time.Second {
		t.Errorf("blend: heartbeat %v, want 10s", next2.Heartbeat)
	}
	// Too few heartbeats: untouched; client-set fields: untouched.
	obs.Heartbeats = 9
	next3, _ := compute(next2, obs, 5, 0, map[string]bool{"section:step": true}, false)
	if next3.Heartbeat != next2.Heartbeat || next3.Sections["step"] != next2.Sections["step"] {
		t.Errorf("untrusted or client-set values changed: %v", next3)
	}
}

func TestCorruptStateFileIgnored(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "ft_state.json")
	garbage := []byte("{not json")
	if err := os.WriteFile(state, garbage, 0o644); err != nil {
		t.Fatal(err)
	}
	m := newManager(t, 1, func(ft *configs.FaultTolerance) { ft.RankHeartbeatTimeout = fptr(42) }, state)
	if got := m.Timeouts(); got.Heartbeat != 42*time.Second || got.HeartbeatCalculated {
		t.Errorf("timeouts %v, want the configured 42s", got)
	}
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	m.EndCycle() // nothing computed: the file is left alone
	if b, _ := os.ReadFile(state); string(b) != string(garbage) {
		t.Errorf("state file rewritten without computed values: %q", b)
	}
}

func TestClientSetTimeouts(t *testing.T) {
	t.Parallel()
	state := filepath.Join(t.TempDir(), "ft_state.json")
	m := newManager(t, 1, func(ft *configs.FaultTolerance) {
		ft.RankSectionTimeouts = map[string]*float64{"step": fptr(60)}
	}, state)
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := ftclient.ConnectPath(ctx, m.RankSocket(0), ftclient.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetSectionTimeouts(map[string]time.Duration{"step": 90 * time.Second}, 120*time.Second, true); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "client timeouts applied", func() bool {
		return m.RankStatus(0).Timeouts.Sections["step"] == 90*time.Second
	})
	m.EndCycle()
	sf := readState(t, state)
	if s := sf.CurrentTimeouts.Section; s == nil || *s.Section["step"] != 90 || *s.OutOfSection != 120 {
		t.Errorf("persisted sections %+v", sf.CurrentTimeouts.Section)
	}
}

func TestComputedTimeoutFloor(t *testing.T) {
	cur := Timeouts{}.Clone()
	obs := &observations{InitialDelay: 10 * time.Millisecond, HeartbeatMax: 20 * time.Millisecond,
		Heartbeats: 50, CheckpointSeen: true, SectionMax: map[string]time.Duration{}, SectionCloses: map[string]int{}}
	next, _ := compute(cur, obs, 5, DefaultMinComputedTimeout, map[string]bool{}, false)
	if next.Heartbeat != DefaultMinComputedTimeout {
		t.Fatalf("computed heartbeat %v, want the %v floor", next.Heartbeat, DefaultMinComputedTimeout)
	}
	// A disabled initial-heartbeat timeout stays disabled: the first
	// heartbeat of a later cycle may come after a long checkpoint load.
	if next.InitialHeartbeat != 0 {
		t.Fatalf("computation enabled the initial-heartbeat timeout: %v", next.InitialHeartbeat)
	}
	cur.InitialHeartbeat = time.Hour
	next, _ = compute(cur, obs, 5, DefaultMinComputedTimeout, map[string]bool{}, false)
	if next.InitialHeartbeat != DefaultMinComputedTimeout {
		t.Fatalf("configured initial timeout not refined: %v", next.InitialHeartbeat)
	}
}
