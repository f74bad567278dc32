package monitor

import (
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestPeerCheckExpected: a rank starter announces a rank's pid (Expect)
// before the rank runs and registers it (BeginCycle, ReplaceRank) only
// later, after waiting for other ranks. A connection from the announced
// process is held until it is registered, longer than an unknown peer, and
// admitted only then; everything else the peer check refused it still
// refuses.
func TestPeerCheckExpected(t *testing.T) {
	testenv.SkipShort(t, "runs real rank-client processes against real deadlines")
	const (
		peerHold     = 500 * time.Millisecond
		expectedHold = 4 * time.Second
		late         = 2 * time.Second // registration after the connection: past peerHold, within expectedHold
	)
	tests := []struct {
		name string
		// expect and register act on the rank's pid and another process's
		// (other); register runs late after the rank connected.
		expect   func(m *Manager, rank, other int)
		register func(m *Manager, rank, other int)
		admitted bool
		refusal  string // in the log when refused
	}{
		{
			name:     "announced, then registered by BeginCycle: admitted",
			expect:   func(m *Manager, rank, _ int) { m.Expect(0, rank) },
			register: func(m *Manager, rank, _ int) { m.BeginCycle(1, map[int]int{0: rank}) },
			admitted: true,
		},
		{
			name:   "announced, then registered by ReplaceRank: admitted",
			expect: func(m *Manager, rank, other int) { m.BeginCycle(1, map[int]int{0: other}); m.Expect(0, rank) },
			register: func(m *Manager, rank, _ int) {
				m.ReplaceRank(0, rank)
			},
			admitted: true,
		},
		{
			name:     "not announced, registered late: refused",
			expect:   func(*Manager, int, int) {},
			register: func(m *Manager, rank, _ int) { m.BeginCycle(1, map[int]int{0: rank}) },
			refusal:  "refusing peer that is not the rank or its descendant",
		},
		{
			name:     "another process announced: refused",
			expect:   func(m *Manager, _, other int) { m.Expect(0, other) },
			register: func(m *Manager, rank, _ int) { m.BeginCycle(1, map[int]int{0: rank}) },
			refusal:  "refusing peer that is not the rank or its descendant",
		},
		{
			name:     "announced, but another process registered: refused",
			expect:   func(m *Manager, rank, _ int) { m.Expect(0, rank) },
			register: func(m *Manager, _, other int) { m.BeginCycle(1, map[int]int{0: other}) },
			refusal:  "refusing peer that is not the rank or its descendant",
		},
		{
			name:     "announced, an earlier announcement replaced: refused",
			expect:   func(m *Manager, rank, other int) { m.Expect(0, rank); m.Expect(0, other) },
			register: func(m *Manager, rank, _ int) { m.BeginCycle(1, map[int]int{0: rank}) },
			refusal:  "refusing peer that is not the rank or its descendant",
		},
		{
			name:     "announced, never registered: refused after the longer hold",
			expect:   func(m *Manager, rank, _ int) { m.Expect(0, rank) },
			register: nil,
			refusal:  "announced as the rank's process, but not registered in time",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, logs := managerWithLog(t, 1, nil)
			m.mu.Lock()
			m.peerHold, m.expectedHold = peerHold, expectedHold
			m.mu.Unlock()
			other := exec.Command("sleep", "60")
			other.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			if err := other.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = other.Process.Kill(); _ = other.Wait() })
			// The previous cycle's rank: the process the monitor holds until
			// the registration (as after a restart).
			m.BeginCycle(0, map[int]int{0: other.Process.Pid})
			m.EndCycle()

			p := startRank(t, m, "mark started;connect;hb;mark connected;sleep 60s")
			rank := p.cmd.Process.Pid
			tc.expect(m, rank, other.Process.Pid)
			p.waitLine(t, "started", 20*time.Second)
			// The connection reaches the peer check: it is waiting there.
			eventually(t, 10*time.Second, "the connection in the peer check", func() bool { return len(m.pending) == 1 })
			start := time.Now()
			time.Sleep(late)
			if tc.register != nil {
				tc.register(m, rank, other.Process.Pid)
			}
			if tc.admitted {
				p.waitLine(t, "connected", 20*time.Second)
				eventually(t, 10*time.Second, "heartbeat from the rank", func() bool {
					s := m.RankStatus(0)
					return s.Connected && s.Heartbeats == 1 && s.PID == rank
				})
				if n := logs.Count("refusing"); n != 0 {
					t.Errorf("%d refusals logged for an admitted rank", n)
				}
				return
			}
			st := p.exited(t, 20*time.Second)
			if st.ExitCode() != 3 {
				t.Fatalf("rank exit %v, want 3 (its connection refused)", st)
			}
			if n := logs.Count(tc.refusal); n != 1 {
				t.Errorf("%d log lines with %q, want 1", n, tc.refusal)
			}
			if tc.register == nil {
				if took := time.Since(start); took < expectedHold-late-100*time.Millisecond {
					t.Errorf("refused %s after the registration was due: the announced rank was held less than %s", took, expectedHold)
				}
			}
			if s := m.RankStatus(0); s.Connected {
				t.Errorf("the monitor holds a connection after the refusal: %+v", s)
			}
		})
	}
}
