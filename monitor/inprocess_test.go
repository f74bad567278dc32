package monitor

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/monitor/ftwire"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// inprocessRank is a Python rank using the real client: it registers (or
// not) for in-process restarts, prints "ready", prints the notice it
// reads, then sends a first-step report for the notice's round.
const inprocessRank = `
import json, sys, time
from ft_launcher_client import RankMonitorClient
c = RankMonitorClient()
c.use_shared_memory = False
c.inprocess = sys.argv[1] == "yes"
c.init_workload_monitoring()
print("ready", flush=True)
s = c._sock
t = s.recv(1)
n, shift = 0, 0
while True:
    b = s.recv(1)[0]
    n |= (b & 0x7F) << shift
    shift += 7
    if not b & 0x80:
        break
p = b""
while len(p) < n:
    p += s.recv(n - len(p))
print("notice %02x %s" % (t[0], p.decode()), flush=True)
r = json.loads(p)["round"]
body = json.dumps({"round": r, "phase": "first_step", "teardown_s": 0.5, "rejoin_s": 0.25}).encode()
assert len(body) < 128
s.sendall(bytes((0x47, len(body))) + body)
c.send_heartbeat()
`

func TestInProcessNoticeAndReports(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	m := newManager(t, 1, nil, "")
	p, first := runPy(t, m, nil, "-c", inprocessRank, "yes")
	if first != "ready" {
		t.Fatalf("rank printed %q", first)
	}
	eventually(t, 10*time.Second, "registered", func() bool { return m.InProcessCapable(0) })
	want := ftwire.Rejoin{Round: 3, Rank: 5, LocalRank: 0, WorldSize: 8, MasterAddr: "127.0.0.1", MasterPort: 29500,
		StorePrefix: "/worker/attempt_3", DeadlineS: 30}
	if err := m.Notify(0, want); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-p.lines:
		if !strings.HasPrefix(l, "notice 46 {") || !strings.Contains(l, `"store_prefix":"/worker/attempt_3"`) || !strings.Contains(l, `"rank":5`) {
			t.Fatalf("rank read %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the rank did not read the notice")
	}
	select {
	case r := <-m.InProcessReports():
		if r.LocalRank != 0 || r.Round != 3 || r.Phase != "first_step" || r.TeardownS != 0.5 || r.RejoinS != 0.25 {
			t.Fatalf("report %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no report")
	}
	if st := p.exited(t, 10*time.Second); !st.Success() {
		t.Fatalf("rank exit %v", st)
	}
	eventually(t, 10*time.Second, "registration ends with the session", func() bool { return !m.InProcessCapable(0) })
}

func TestInProcessNotRegistered(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	m := newManager(t, 1, nil, "")
	_, first := runPy(t, m, nil, "-c", inprocessRank, "no")
	if first != "ready" {
		t.Fatalf("rank printed %q", first)
	}
	time.Sleep(100 * time.Millisecond)
	if m.InProcessCapable(0) {
		t.Fatal("a rank that did not register is in-process capable")
	}
	if err := m.Notify(0, ftwire.Rejoin{Round: 1}); err != ErrNotRegistered {
		t.Fatalf("notify: %v, want ErrNotRegistered", err)
	}
	if err := m.Notify(5, ftwire.Rejoin{}); err == nil {
		t.Fatal("notify of a local rank that does not exist succeeded")
	}
}

// TestSilence: Silence follows the rank's heartbeat clock: none before a
// session, the session's start before the first heartbeat, then the last
// heartbeat, and Hung once its monitor found it hung; the Hang record keeps
// the last heartbeat.
func TestSilence(t *testing.T) {
	testenv.SkipShort(t, "waits on real deadlines and socket clients for seconds")
	m := newManager(t, 2, func(ft *configs.FaultTolerance) {
		ft.InitialRankHeartbeatTimeout = fptr(30)
		ft.RankHeartbeatTimeout = fptr(1.5)
	}, "")
	p := startRank(t, m, "connect;mark connected;sleep 300ms;hb;sleep 200ms;hb;mark beat;sleep 60s")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid, 1: os.Getpid()})
	if _, ok := m.Silence(1); ok {
		t.Fatal("Silence of a rank without a session reports a clock")
	}
	p.waitLine(t, "connected", 10*time.Second)
	var initial Silence
	eventually(t, 10*time.Second, "the initial clock", func() bool {
		s, ok := m.Silence(0)
		initial = s
		return ok && s.Timeout == 30*time.Second && !s.Hung
	})
	p.waitLine(t, "beat", 10*time.Second)
	var s Silence
	eventually(t, 10*time.Second, "the heartbeat clock", func() bool {
		var ok bool
		s, ok = m.Silence(0)
		return ok && s.Timeout == 1500*time.Millisecond
	})
	if gap := s.Last.Sub(initial.Last); gap < 450*time.Millisecond || gap > 10*time.Second {
		t.Fatalf("last heartbeat %v after the session's start, want about 0.5 s", gap)
	}
	if s.MaxInterval < 150*time.Millisecond || s.MaxInterval > 10*time.Second {
		t.Fatalf("longest interval %v, want about 0.2 s", s.MaxInterval)
	}
	h := waitHang(t, m, 10*time.Second)
	if !h.LastHeartbeat.Equal(s.Last) {
		t.Fatalf("hang's last heartbeat %v, want %v", h.LastHeartbeat, s.Last)
	}
	if s, ok := m.Silence(0); !ok || !s.Hung {
		t.Fatalf("Silence %+v %v after the hang, want Hung", s, ok)
	}
}

// TestReplaceRank: an in-process restart replaces a stuck survivor within
// the cycle; the replacement's session is admitted under its new pid (the
// cycle began with the stuck process's) and registers for in-process
// restarts.
func TestReplaceRank(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	m := newManager(t, 1, nil, "")
	stuck := startProc(t, m, nil, "sleep", "60")
	m.BeginCycle(1, map[int]int{0: stuck.cmd.Process.Pid})
	p := startProc(t, m, pyEnv(t), python, "-c", inprocessRank, "yes")
	m.ReplaceRank(0, p.cmd.Process.Pid)
	select {
	case l := <-p.lines:
		if l != "ready" {
			t.Fatalf("replacement printed %q", l)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the replacement did not connect")
	}
	eventually(t, 10*time.Second, "the replacement registered", func() bool { return m.InProcessCapable(0) })
	if st := m.RankStatus(0); st.PID != p.cmd.Process.Pid {
		t.Fatalf("rank status pid %d, want the replacement's %d", st.PID, p.cmd.Process.Pid)
	}
}
