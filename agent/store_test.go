package agent

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// envMap turns a spawn environment into a map (the last value wins).
func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// TestWorkerEnvAgentStore: with the agent store the ranks are told to use
// it (TORCHELASTIC_USE_AGENT_STORE=True) at the round's master address;
// without it rank 0 hosts the store there, as before. A value inherited
// from the launcher's environment never wins over the launcher's choice.
func TestWorkerEnvAgentStore(t *testing.T) {
	asg := rendezvous.Assignment{RunID: "job", Round: 3, GroupRank: 1, GroupWorldSize: 2, RankBase: 2, WorldSize: 4,
		MasterAddr: "127.0.0.2", MasterPort: 41234}
	base := []string{"TORCHELASTIC_USE_AGENT_STORE=Inherited", "MASTER_PORT=1", "PATH=/bin"}
	for _, tc := range []struct {
		on   bool
		want string
	}{{true, "True"}, {false, "False"}} {
		cfg := &configs.Config{NProcPerNode: 2, Role: "default", AgentStore: tc.on}
		env := envMap(WorkerEnv(base, cfg, asg, 1, "/tmp/err.json", nil))
		if got := env["TORCHELASTIC_USE_AGENT_STORE"]; got != tc.want {
			t.Errorf("agent store %v: TORCHELASTIC_USE_AGENT_STORE=%q, want %q", tc.on, got, tc.want)
		}
		if env["MASTER_ADDR"] != "127.0.0.2" || env["MASTER_PORT"] != "41234" || env["TORCHELASTIC_RESTART_COUNT"] != "3" || env["RANK"] != "3" {
			t.Errorf("agent store %v: MASTER_ADDR=%s MASTER_PORT=%s TORCHELASTIC_RESTART_COUNT=%s RANK=%s",
				tc.on, env["MASTER_ADDR"], env["MASTER_PORT"], env["TORCHELASTIC_RESTART_COUNT"], env["RANK"])
		}
		if env["PATH"] != "/bin" {
			t.Errorf("agent store %v: PATH not kept", tc.on)
		}
	}
}

// fakeStore records the rounds the agent hands the agent store, and
// whether any rank had started by then.
type fakeStore struct {
	mu     sync.Mutex
	ranks  *fakeRanks
	err    error
	rounds []rendezvous.Assignment
	before []int // groups already started at each call
}

func (s *fakeStore) Round(asg rendezvous.Assignment) error {
	s.ranks.mu.Lock()
	n := len(s.ranks.groups)
	s.ranks.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rounds = append(s.rounds, asg)
	s.before = append(s.before, n)
	return s.err
}

// TestAgentStoreRounds: the agent hands every round to the agent store
// before that round's ranks start (active and standby rounds alike); a
// store that cannot serve fails the start and closes the job, with no
// rank started.
func TestAgentStoreRounds(t *testing.T) {
	t.Run("each round before its ranks", func(t *testing.T) {
		h := newHarness(t)
		st := &fakeStore{ranks: h.ranks}
		h.agentStore = st
		h.rdzv.next = append(h.rdzv.next, standbyIn(0), active(1, 0), active(2, 1))
		out := h.start()
		g := h.ranks.wait(t)
		g.exit(0, 1, 0) // round 1 fails: restart into round 2
		g = h.ranks.wait(t)
		g.exit(0, 0, 0)
		g.exit(1, 0, 0)
		want(t, h.outcome(out), verdict.Succeeded, 0)
		st.mu.Lock()
		defer st.mu.Unlock()
		var rounds []int
		for _, a := range st.rounds {
			rounds = append(rounds, a.Round)
		}
		if !slices.Equal(rounds, []int{0, 1, 2}) || !st.rounds[0].Standby || !slices.Equal(st.before, []int{0, 0, 1}) {
			t.Fatalf("store saw rounds %v (standby first: %v) with %v groups started before", rounds, st.rounds[0].Standby, st.before)
		}
	})
	t.Run("a store that cannot serve closes the job", func(t *testing.T) {
		h := newHarness(t)
		h.agentStore = &fakeStore{ranks: h.ranks, err: errors.New("listen tcp 127.0.0.1:29500: address already in use")}
		h.rdzv.next = append(h.rdzv.next, active(0, 0))
		o := h.outcome(h.start())
		want(t, o, verdict.FatalError, 1)
		if !strings.Contains(o.Reason, "serve the agent store at 127.0.0.1:29500") || !strings.Contains(o.Reason, "address already in use") {
			t.Errorf("reason %q does not say the store could not be served", o.Reason)
		}
		h.ranks.mu.Lock()
		defer h.ranks.mu.Unlock()
		if len(h.ranks.groups) != 0 {
			t.Errorf("%d rank groups started without a store", len(h.ranks.groups))
		}
		h.rdzv.mu.Lock()
		defer h.rdzv.mu.Unlock()
		if len(h.rdzv.shutdowns) != 1 {
			t.Errorf("job not closed: shutdowns %v", h.rdzv.shutdowns)
		}
	})
}

type fakeSockets struct{}

func (fakeSockets) RankSocket(lr int) string { return "/run/rank" + strconv.Itoa(lr) + ".sock" }
func (fakeSockets) LauncherSocket() string   { return "/run/launcher.sock" }

// TestWorkerEnvMonitorProtocol: with a rank monitor, a rank is told its
// socket and the protocol the monitor speaks (ftl1), so that a native
// client can tell ft-launcher's monitor from nvrx's, which takes the same
// socket variable, over any inherited value; without a monitor the launcher
// sets neither.
func TestWorkerEnvMonitorProtocol(t *testing.T) {
	asg := rendezvous.Assignment{RunID: "job", WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1}
	cfg := &configs.Config{NProcPerNode: 2, Role: "default"}
	base := []string{"FT_RANK_MONITOR_PROTOCOL=inherited"}
	for _, tc := range []struct {
		name         string
		mon          Sockets
		socket, prot string
	}{
		{"monitor", fakeSockets{}, "/run/rank1.sock", "ftl1"},
		{"no monitor", nil, "", "inherited"},
	} {
		env := envMap(WorkerEnv(base, cfg, asg, 1, "/tmp/err.json", tc.mon))
		if env["FT_RANK_MONITOR_IPC_SOCKET"] != tc.socket || env["FT_RANK_MONITOR_PROTOCOL"] != tc.prot {
			t.Errorf("%s: FT_RANK_MONITOR_IPC_SOCKET=%q FT_RANK_MONITOR_PROTOCOL=%q, want %q %q", tc.name,
				env["FT_RANK_MONITOR_IPC_SOCKET"], env["FT_RANK_MONITOR_PROTOCOL"], tc.socket, tc.prot)
		}
	}
}
