package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// The agent store (--agent-store, default on): the launcher of group rank 0
// serves the ranks' TCPStore; real torch 1.13 ranks (gloo DDP) use it.

// storeRecord is the part of the weights summary that says which store
// the ranks were told to use.
type storeRecord struct {
	AgentStore *string `json:"agent_store"`
}

func readStoreRecord(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var r storeRecord
	if err := json.Unmarshal(b, &r); err != nil || r.AgentStore == nil {
		t.Fatalf("weights summary %s has no agent_store (%v)", b, err)
	}
	return *r.AgentStore
}

// servedByRound maps each round to the address its agent_store_served
// event names, and to the keys of the round before that it dropped.
func servedByRound(t *testing.T, j *job) (addr map[int]string, dropped map[int]float64) {
	t.Helper()
	addr, dropped = map[int]string{}, map[int]float64{}
	for _, e := range j.eventsOfQuiet("agent_store_served") {
		r := int(e["round"].(float64))
		addr[r], _ = e["addr"].(string)
		dropped[r], _ = e["keys_dropped"].(float64)
	}
	return addr, dropped
}

// mastersByRound maps each round this node ran to the MASTER_ADDR:PORT
// its ranks got (cycle_started).
func mastersByRound(j *job) map[int]string {
	out := map[int]string{}
	for _, e := range j.eventsOfQuiet("cycle_started") {
		out[int(e["round"].(float64))] = fmt.Sprintf("%v:%v", e["master_addr"], e["master_port"])
	}
	return out
}

// TestAgentStoreTorchDDPCrashResumes: one node, rank 0 crashes at step 25
// (with the rank-0 store that takes the store down with it; here the
// launcher's store lives on). The restarted ranks, cold or handed to
// prewarmed standbys, connect to the same launcher's store, emptied for
// the new attempt, resume from the step-20 checkpoint and end with the
// weights of the uninterrupted run. With --agent-store off (the rank-0
// store, as before) the job trains to the same weights and the launcher
// serves no store.
func TestAgentStoreTorchDDPCrashResumes(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	ref := referenceWeights(t)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"cold", []string{"--agent-store", "on"}},
		// The crash waits for the standbys (runGatedOnStandbys).
		{"prewarm", []string{"--agent-store", "on", "--prewarm", torchModules}},
		{"off", []string{"--agent-store", "off"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := newJob(t)
			out := filepath.Join(j.dir, "w.json")
			args := append([]string{"--standalone", "--nproc-per-node", nranks, "--max-restarts", "2"}, tc.flags...)
			args = append(args, trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out,
				"--crash-at-step", "25", "--crash-rank", "0")
			env := []string{"PYTHON_EXEC=" + debianPython}
			var code int
			if tc.name == "prewarm" {
				code = j.runGatedOnStandbys(env, args...)
			} else {
				code = j.run(torchTimeout, env, args...)
			}
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, j.stderr.String())
			}
			w := readWeights(t, out)
			if w.SHA256 != ref.SHA256 || w.ResumedFromStep != 20 {
				// Resumed from 0 with the right weights means round 0 failed
				// before its first checkpoint, for a reason other than the
				// injected crash (which only round 0 injects): seen twice in
				// the --prewarm pass, not understood. Say what ended it.
				t.Fatalf("weights %s resumed from step %d; want the uninterrupted run's %s, resumed from 20\nrestart events: %v\nrank exits: %v\n%s",
					w.SHA256, w.ResumedFromStep, ref.SHA256, j.eventsOfQuiet("restart"), j.eventsOfQuiet("rank_exited"), j.stderr.String())
			}
			if rs := j.eventsOf("restart"); len(rs) != 1 {
				t.Errorf("%d restart events, want 1: %v\n%s", len(rs), rs, j.stderr.String())
			}
			switch tc.name {
			case "off":
				checkNoAgentStore(t, j, out)
			case "prewarm":
				requireWarmRestart(t, j)
				checkAgentStoreRun(t, j, out)
			default:
				checkAgentStoreRun(t, j, out)
			}
		})
	}
}

// checkAgentStoreRun checks a one-node run that restarted once with the
// agent store: both rounds' ranks used the store the launcher served at
// the address they were given.
func checkAgentStoreRun(t *testing.T, j *job, out string) {
	t.Helper()
	if got := readStoreRecord(t, out); got != "True" {
		t.Errorf("ranks ran with TORCHELASTIC_USE_AGENT_STORE=%q, want True", got)
	}
	served, dropped := servedByRound(t, j)
	masters := mastersByRound(j)
	if len(masters) != 2 {
		t.Fatalf("cycles %v, want rounds 0 and 1", masters)
	}
	for r, m := range masters {
		if served[r] != m {
			t.Errorf("round %d: ranks were given %s, the store served %q", r, m, served[r])
		}
	}
	// The round-0 ranks' keys (init_process_group's barrier, gloo's
	// addresses) were in the launcher's store and are gone in round 1.
	if dropped[1] <= 0 {
		t.Errorf("round 1 dropped %v keys of round 0: the ranks did not use the agent store", dropped[1])
	}
	if n := len(j.eventsOf("agent_store_closed")); n != 1 {
		t.Errorf("%d agent_store_closed events, want 1 (at exit)", n)
	}
}

// checkNoAgentStore checks a run with --agent-store off: rank 0's store,
// none served by the launcher.
func checkNoAgentStore(t *testing.T, j *job, out string) {
	t.Helper()
	if got := readStoreRecord(t, out); got != "False" {
		t.Errorf("ranks ran with TORCHELASTIC_USE_AGENT_STORE=%q, want False", got)
	}
	if n := len(j.eventsOf("agent_store_served")) + len(j.eventsOf("agent_store_closed")); n != 0 {
		t.Errorf("%d agent store events with --agent-store off", n)
	}
}

// uninterrupted trains once per world size without faults on one node;
// the result is shared by the tests that compare against it.
var uninterrupted struct {
	mu sync.Mutex
	w  map[string]weights
}

func uninterruptedWeights(t *testing.T, nproc string) weights {
	t.Helper()
	uninterrupted.mu.Lock()
	defer uninterrupted.mu.Unlock()
	if w, ok := uninterrupted.w[nproc]; ok {
		return w
	}
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	if code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", nproc,
		trainScript(t), "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out); code != 0 {
		t.Fatalf("uninterrupted %s-rank run exited %d\n%s", nproc, code, j.stderr.String())
	}
	w := readWeights(t, out)
	if uninterrupted.w == nil {
		uninterrupted.w = map[string]weights{}
	}
	uninterrupted.w[nproc] = w
	return w
}

// TestAgentStoreMovesAfterNodeLoss: three launchers (--nnodes 2:3, two
// ranks each) on Debian's etcd; the launcher of group rank 0, which serves
// the store, is SIGKILLed mid-run. The next round's group rank 0 is
// another node, which serves the store there before any rank starts;
// training resumes from the last checkpoint with the same world size and
// ends with the weights of an uninterrupted 4-rank run.
func TestAgentStoreMovesAfterNodeLoss(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := uninterruptedWeights(t, "4")
	client := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	peer := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	startEtcd(t, t.TempDir(), client, peer) // outlives any launcher: the victim may be any node
	c := newCluster(t, client)
	ckpt := filepath.Join(c.dir, "ckpt")
	out := filepath.Join(c.dir, "w.json")
	for i := 0; i < 3; i++ {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "3",
			"--rdzv-backend", "etcd", "--agent-store", "on",
			trainScript(t), "--ckpt-dir", ckpt, "--out", out, "--step-sleep", "0.1")
	}
	waitFile(t, filepath.Join(ckpt, "ckpt_00000020.pt"), torchTimeout)
	victim := -1
	for i, n := range c.nodes {
		if served, _ := servedByRound(t, n); served[0] != "" {
			victim = i
		}
	}
	if victim < 0 {
		t.Fatalf("no node served the round-0 store\n%s", c.stderrs())
	}
	if err := c.nodes[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		if code := n.wait(torchTimeout); i != victim && code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	got := readWeights(t, out)
	if got.WorldSize != 4 || got.ResumedFromStep < 20 || got.SHA256 != want.SHA256 {
		t.Fatalf("final run: world size %d, resumed from step %d, weights %s; want 4, >= 20 and the uninterrupted run's %s",
			got.WorldSize, got.ResumedFromStep, got.SHA256, want.SHA256)
	}
	if s := readStoreRecord(t, out); s != "True" {
		t.Errorf("ranks ran with TORCHELASTIC_USE_AGENT_STORE=%q, want True", s)
	}
	// The last round's store: served by exactly one surviving node, at the
	// address every node's ranks were given.
	last := -1
	for i, n := range c.nodes {
		if i == victim {
			continue
		}
		for r := range mastersByRound(n) {
			last = max(last, r)
		}
	}
	if last < 1 {
		t.Fatalf("no round after the node loss\n%s", c.stderrs())
	}
	server := -1
	for i, n := range c.nodes {
		if i == victim {
			continue
		}
		served, _ := servedByRound(t, n)
		if served[last] == "" {
			continue
		}
		if server >= 0 {
			t.Fatalf("round %d served by nodes %d and %d", last, server, i)
		}
		server = i
		for k, m := range c.nodes {
			if k == victim {
				continue
			}
			if got := mastersByRound(m)[last]; got != served[last] {
				t.Errorf("round %d: node %d's ranks were given %s, node %d served %s", last, k, got, i, served[last])
			}
		}
	}
	if server < 0 {
		t.Fatalf("no surviving node served round %d's store\n%s", last, c.stderrs())
	}
}
