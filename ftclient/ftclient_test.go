package ftclient_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/ftclient"
	"github.com/ftlauncher/ft-launcher/monitor"
)

// newMonitor starts a real Manager whose rank 0 is this test process.
func newMonitor(tb testing.TB) *monitor.Manager {
	tb.Helper()
	ft := configs.DefaultFaultTolerance()
	ft.CalculateTimeouts = false
	ft.RankSectionTimeouts = map[string]*float64{"step": nil}
	m, err := monitor.New(monitor.Options{NLocal: 1, FT: ft, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { m.Close() })
	m.BeginCycle(0, map[int]int{0: os.Getpid()})
	return m
}

func connect(tb testing.TB, m *monitor.Manager) *ftclient.Client {
	tb.Helper()
	return connectOpts(tb, m, ftclient.Options{GlobalRank: 2, LocalRank: 0})
}

func connectOpts(tb testing.TB, m *monitor.Manager, o ftclient.Options) *ftclient.Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := ftclient.ConnectPath(ctx, m.RankSocket(0), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestClientMessagesReachMonitor(t *testing.T) {
	m := newMonitor(t)
	c := connect(t, m)
	if !c.SharedMemory() {
		t.Error("the monitor did not grant shared-memory heartbeats")
	}
	if _, ok := c.Config().RankSectionTimeouts["step"]; !ok || !c.Enabled() {
		t.Fatalf("config from monitor: %+v", c.Config())
	}
	for i := 0; i < 3; i++ {
		if err := c.SendHeartbeat(); err != nil {
			t.Fatal(err)
		}
	}
	steps := []func() error{
		func() error { return c.StartSectionAt("step", 4) },
		func() error { return c.StartSection("ckpt") },
	}
	for _, f := range steps {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "two open sections", func() bool {
		s := m.RankStatus(0)
		return s.Heartbeats == 3 && len(s.OpenSections) == 2 && s.GlobalRank == 2
	})
	if err := c.EndSection("step"); err != nil {
		t.Fatal(err)
	}
	if err := c.EndAllSections(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "sections closed", func() bool {
		s := m.RankStatus(0)
		return len(s.OpenSections) == 0 && s.SectionCloses["step"] == 1 && s.SectionCloses["ckpt"] == 1
	})
	if err := c.SetHeartbeatTimeouts(30*time.Second, 10*time.Second, true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "heartbeat timeouts", func() bool {
		to := m.RankStatus(0).Timeouts
		return to.Heartbeat == 10*time.Second && to.InitialHeartbeat == 30*time.Second && to.HeartbeatCalculated
	})
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.SendHeartbeat(); err == nil {
		t.Error("heartbeat after Close succeeded")
	}
}

func TestNoopWithoutSocket(t *testing.T) {
	t.Setenv(ftclient.EnvSocket, "")
	c, err := ftclient.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c.Enabled() {
		t.Fatal("client without socket is enabled")
	}
	for _, f := range []func() error{c.SendHeartbeat, func() error { return c.StartSection("x") },
		func() error { return c.EndSection("x") }, c.EndAllSections, c.Close} {
		if err := f(); err != nil {
			t.Errorf("no-op call failed: %v", err)
		}
	}
}

func TestConnectFromEnv(t *testing.T) {
	m := newMonitor(t)
	t.Setenv(ftclient.EnvSocket, m.RankSocket(0))
	t.Setenv(ftclient.EnvRank, "9")
	c, err := ftclient.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SendHeartbeat(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "heartbeat", func() bool { s := m.RankStatus(0); return s.Heartbeats == 1 && s.GlobalRank == 9 })
}

// BenchmarkHeartbeat measures SendHeartbeat against a real Manager.
func BenchmarkHeartbeat(b *testing.B) {
	m := newMonitor(b)
	c := connect(b, m)
	if !c.SharedMemory() {
		b.Fatal("no shared-memory heartbeats")
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.SendHeartbeat(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkHeartbeatSocket measures SendHeartbeat without shared memory:
// one write(2) per heartbeat, as before shared-memory heartbeats.
func BenchmarkHeartbeatSocket(b *testing.B) {
	m := newMonitor(b)
	c := connectOpts(b, m, ftclient.Options{GlobalRank: 2, LocalRank: 0, SocketHeartbeats: true})
	if c.SharedMemory() {
		b.Fatal("socket heartbeats requested, got shared memory")
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := c.SendHeartbeat(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSection measures one StartSection+EndSection pair.
func BenchmarkSection(b *testing.B) {
	m := newMonitor(b)
	c := connect(b, m)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.StartSection("step"); err != nil {
			b.Fatal(err)
		}
		if err := c.EndSection("step"); err != nil {
			b.Fatal(err)
		}
	}
}

func benchOpenClose(b *testing.B, c *ftclient.Client) {
	b.ReportAllocs()
	for b.Loop() {
		if err := c.StartSection("step"); err != nil {
			b.Fatal(err)
		}
		if err := c.EndSection("step"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSectionOpenClose measures one open+close pair through the
// shared-memory ring, including any wait for the monitor to drain it.
func BenchmarkSectionOpenClose(b *testing.B) {
	m := newMonitor(b)
	c := connect(b, m)
	if !c.SectionRing() {
		b.Fatal("no section ring")
	}
	benchOpenClose(b, c)
}

// BenchmarkSectionOpenCloseSocket is the same pair over the socket, as
// clients that predate the ring send it.
func BenchmarkSectionOpenCloseSocket(b *testing.B) {
	m := newMonitor(b)
	c := connectOpts(b, m, ftclient.Options{GlobalRank: 2, LocalRank: 0, SocketSections: true})
	if c.SectionRing() {
		b.Fatal("socket sections requested, got the ring")
	}
	benchOpenClose(b, c)
}

// TestTimeoutsOutOfBoundsRefusedLocally: values the launcher would refuse
// are refused by the client before anything is sent.
func TestTimeoutsOutOfBoundsRefusedLocally(t *testing.T) {
	var c ftclient.Client // never connected: nothing can be sent
	tests := []struct {
		name string
		call func() error
	}{
		{"negative heartbeat", func() error { return c.SetHeartbeatTimeouts(-time.Second, time.Second, false) }},
		{"heartbeat above 7 days", func() error { return c.SetHeartbeatTimeouts(time.Second, 8*24*time.Hour, false) }},
		{"negative section", func() error {
			return c.SetSectionTimeouts(map[string]time.Duration{"step": -1}, time.Second, false)
		}},
		{"out of section above 7 days", func() error { return c.SetSectionTimeouts(nil, 8*24*time.Hour, false) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); err == nil || !strings.Contains(err.Error(), "ftclient:") {
				t.Fatalf("err = %v, want the client's refusal", err)
			}
		})
	}
}

// TestConnectRefusesForeignMonitor: a socket variable set by another
// launcher (nvrx's ft_launcher: TORCHELASTIC_RUN_ID, no
// FT_RANK_MONITOR_PROTOCOL, no FT_LAUNCHER_RESTARTS_USED), or a monitor that
// announces another protocol, is refused at once, without connecting: the
// socket here accepts and never answers, as nvrx's monitor does with a
// native handshake. A rank of ft-launcher, with the marker or (launchers
// before it) with FT_LAUNCHER_RESTARTS_USED, connects.
func TestConnectRefusesForeignMonitor(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string // "" value: unset
		refused string            // substring of the error; "" connects
	}{
		{"nvrx ft_launcher", map[string]string{"TORCHELASTIC_RUN_ID": "job", "FT_RANK_MONITOR_PROTOCOL": "", "FT_LAUNCHER_RESTARTS_USED": ""}, "nvidia-resiliency-ext"},
		{"another protocol", map[string]string{"TORCHELASTIC_RUN_ID": "job", "FT_RANK_MONITOR_PROTOCOL": "ftl2", "FT_LAUNCHER_RESTARTS_USED": "0"}, `"ftl2"`},
		{"ft-launcher", map[string]string{"TORCHELASTIC_RUN_ID": "job", "FT_RANK_MONITOR_PROTOCOL": "ftl1", "FT_LAUNCHER_RESTARTS_USED": "0"}, ""},
		{"older ft-launcher", map[string]string{"TORCHELASTIC_RUN_ID": "job", "FT_RANK_MONITOR_PROTOCOL": "", "FT_LAUNCHER_RESTARTS_USED": "0"}, ""},
		{"no launcher", map[string]string{"TORCHELASTIC_RUN_ID": "", "FT_RANK_MONITOR_PROTOCOL": "", "FT_LAUNCHER_RESTARTS_USED": ""}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
				if v == "" {
					os.Unsetenv(k)
				}
			}
			path := ""
			var accepted atomic.Int32
			if tc.refused != "" {
				path = filepath.Join(t.TempDir(), "foreign.sock")
				ln, err := net.Listen("unix", path)
				if err != nil {
					t.Fatal(err)
				}
				defer ln.Close()
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						accepted.Add(1)
						defer c.Close() // never answers
					}
				}()
			} else {
				path = newMonitor(t).RankSocket(0)
			}
			t.Setenv(ftclient.EnvSocket, path)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, err := ftclient.Connect(ctx)
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("connected to a foreign monitor")
			}
			if !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("error %q does not name %s", err, tc.refused)
			}
			if n := accepted.Load(); n != 0 {
				t.Errorf("the foreign socket saw %d connections, want none", n)
			}
		})
	}
}
