package monitor

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// python is Debian's interpreter (the one on PATH may differ); the clients
// under test use the standard library only.
const python = "/usr/bin/python3"

func pyEnv(t *testing.T) []string {
	t.Helper()
	dir, err := filepath.Abs("../client/python")
	if err != nil {
		t.Fatal(err)
	}
	return []string{"PYTHONPATH=" + dir, "PYTHONDONTWRITEBYTECODE=1"}
}

// runPy starts a python script as rank 0 of m, registers it with a new
// cycle and returns its first stdout line.
func runPy(t *testing.T, m *Manager, env []string, args ...string) (*rankProc, string) {
	t.Helper()
	p := startProc(t, m, append(pyEnv(t), env...), append([]string{python}, args...)...)
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	select {
	case l, ok := <-p.lines:
		if !ok {
			t.Fatalf("%v printed nothing (exit %v)", args, p.exited(t, 10*time.Second))
		}
		return p, l
	case <-time.After(30 * time.Second):
		t.Fatalf("%v printed nothing within 30s", args)
	}
	return nil, ""
}

func TestNvrxProtocolSessions(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	okReplies := []any{"OkMsg", "OkMsg", "ErrorMsg:Section 'step' is already open", "OkMsg",
		"ErrorMsg:Section 'step' is not open", "OkMsg"}
	tests := []struct {
		name       string
		configSkip bool
		client     string
		wantSkip   bool
		replies    []any
	}{
		{"v0.6 client, skip configured", true, "0.6", true, []any{"OkMsg"}},
		{"v0.5 client, skip configured", true, "0.5", false, okReplies},
		{"v0.6 client, skip disabled", false, "0.6", false, okReplies},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := newManager(t, 1, func(ft *configs.FaultTolerance) {
				ft.SkipSectionResponse = tc.configSkip
				ft.RankSectionTimeouts = map[string]*float64{"step": fptr(120)}
			}, "")
			_, line := runPy(t, m, nil, "testdata/nvrx_standin.py", tc.client, "30")
			var got map[string]any
			if err := json.Unmarshal([]byte(line), &got); err != nil {
				t.Fatalf("stand-in output %q: %v", line, err)
			}
			if got["authkey_reply"] != "OkMsg" || got["init_reply"] != "OkMsg" || got["skip_section_response"] != tc.wantSkip {
				t.Errorf("handshake: %v", got)
			}
			if got["cfg_step_timeout"] != 120.0 || got["cfg_signal"] != 9.0 {
				t.Errorf("advertised config: %v", got)
			}
			if !reflect.DeepEqual(got["replies"], tc.replies) || got["nothing_pending"] != true {
				t.Errorf("replies %v (nothing pending %v), want %v", got["replies"], got["nothing_pending"], tc.replies)
			}
			s := m.RankStatus(0)
			if s.GlobalRank != 3 || s.Heartbeats != 1 || s.SectionCloses["step"] != 1 {
				t.Errorf("monitor state %+v", s)
			}
			if s.Timeouts.Heartbeat != 20*time.Second || s.Timeouts.InitialHeartbeat != 30*time.Second {
				t.Errorf("UpdateConfigMsg not applied: %v", s.Timeouts)
			}
		})
	}
}

func TestNvrxMalformedAndWorkload(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := newManager(t, 1, nil, "")
	_, line := runPy(t, m, nil, "testdata/nvrx_standin.py", "garbage")
	if line != `{"closed": true}` {
		t.Errorf("malformed frame: %s", line)
	}
	_, line = runPy(t, m, nil, "testdata/nvrx_standin.py", "workload")
	if line != `{"reply": "ok"}` {
		t.Errorf("workload reply: %s", line)
	}
	select {
	case r := <-m.Requests():
		if r != (WorkloadRequest{GlobalRank: 4, Action: "ShutdownWorkload", Description: "stop please"}) {
			t.Errorf("request %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no workload request")
	}
}

func TestPythonClient(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := newManager(t, 1, func(ft *configs.FaultTolerance) {
		ft.RankSectionTimeouts = map[string]*float64{"step": fptr(60)}
	}, "")
	flag := filepath.Join(t.TempDir(), "_finished_flag")
	p := startProc(t, m, append(pyEnv(t), "FAULT_TOL_FINISHED_FLAG_FILE="+flag), python, "testdata/py_client.py")
	m.BeginCycle(0, map[int]int{0: p.cmd.Process.Pid})
	p.waitLine(t, "done", 30*time.Second)
	s := m.RankStatus(0)
	if !s.Connected || s.GlobalRank != 7 || s.Heartbeats != 5 || s.SectionCloses["step"] != 2502 ||
		s.SectionCloses["a"] != 1 || len(s.OpenSections) != 0 || r0Iter(m) != 2500 {
		t.Errorf("monitor state %+v", s)
	}
	if !s.Timeouts.HeartbeatCalculated || s.Timeouts.Heartbeat < 5*time.Second {
		t.Errorf("client-calculated timeouts not applied: %v", s.Timeouts)
	}
	select {
	case r := <-m.Requests():
		if r.Action != "ShutdownWorkload" || r.GlobalRank != 7 {
			t.Errorf("request %+v", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no workload request")
	}
	if _, err := os.Stat(flag); err != nil {
		t.Errorf("finished flag: %v", err)
	}
}

func TestPythonClientNoop(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := newManager(t, 1, nil, "")
	p, line := runPy(t, m, []string{"FT_RANK_MONITOR_IPC_SOCKET="}, "testdata/py_noop.py")
	if line != "noop-ok" {
		t.Errorf("no-op client printed %q", line)
	}
	if st := p.exited(t, 10*time.Second); !st.Success() {
		t.Errorf("no-op client exit %v", st)
	}
}

// TestPythonClientBench runs client/python/bench_client.py against a live
// monitor and reports its per-call cost (target p50 < 10 µs). It asserts the
// benchmark ran and its messages arrived, not its speed.
func TestPythonClientBench(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes")
	t.Parallel()
	m := newManager(t, 1, nil, "")
	const n = 5000
	_, line := runPy(t, m, nil, "../client/python/bench_client.py", "5000")
	if !strings.Contains(line, "heartbeat_p50_us") {
		t.Fatalf("bench output %q", line)
	}
	t.Logf("python client: %s", line)
	eventually(t, 10*time.Second, "benchmark messages counted", func() bool {
		s := m.RankStatus(0)
		return s.Heartbeats == n && s.SectionCloses["step"] == n
	})
}
