package integration

import (
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/ledger"
)

// In-process restarts (--restart-mode in-process, docs/inprocess.md) with
// real torch 1.13 gloo DDP ranks: examples/ddp_train_inprocess.py uses
// ft_launcher_client.inprocess; its final weights must be bit-identical to
// an uninterrupted examples/ddp_train.py run (same model, batches and
// checkpoint schedule).

func inprocessScript(t *testing.T) string {
	p, err := filepath.Abs("../examples/ddp_train_inprocess.py")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// cyclePIDs returns the pids of each cycle_started event, by round.
func cyclePIDs(t *testing.T, j *job) map[int][]int {
	t.Helper()
	out := map[int][]int{}
	for _, e := range j.eventsOf("cycle_started") {
		var pids []int
		b, _ := json.Marshal(e["pids"])
		if err := json.Unmarshal(b, &pids); err != nil {
			t.Fatal(err)
		}
		out[int(e["round"].(float64))] = pids
	}
	return out
}

// trainLine is the line examples/ddp_train_inprocess.py logs each time its
// training function starts: $RANK and the round from the environment,
// then the process's pid and its process group rank and size.
var trainLine = regexp.MustCompile(`\[ddp_train rank=(\d+) cycle=(\d+)\] train: pid=(\d+) rank=(\d+) world=(\d+)`)

// trainRanks reads the ranks' train lines from the launchers' stderr:
// round -> pid -> global rank. $RANK must equal the process group rank.
func trainRanks(t *testing.T, stderrs ...string) map[int]map[int]int {
	t.Helper()
	out := map[int]map[int]int{}
	for _, s := range stderrs {
		for _, m := range trainLine.FindAllStringSubmatch(s, -1) {
			env, _ := strconv.Atoi(m[1])
			round, _ := strconv.Atoi(m[2])
			pid, _ := strconv.Atoi(m[3])
			rank, _ := strconv.Atoi(m[4])
			if env != rank {
				t.Errorf("round %d pid %d: RANK=%d but the process group says rank %d", round, pid, env, rank)
			}
			if out[round] == nil {
				out[round] = map[int]int{}
			}
			if r, dup := out[round][pid]; dup {
				t.Errorf("round %d: pid %d started training twice (ranks %d, %d)", round, pid, r, rank)
			}
			out[round][pid] = rank
		}
	}
	return out
}

// checkRanksKept: in rounds 0 and 1 every global rank of world ran once;
// each process of both rounds kept its rank, and the crashed rank's number
// went to a new process (ranks keep their numbers unless a node is
// swapped). It returns round -> rank -> pid.
func checkRanksKept(t *testing.T, world, crashed int, stderrs ...string) map[int]map[int]int {
	t.Helper()
	byPid := trainRanks(t, stderrs...)
	byRank := map[int]map[int]int{}
	for _, round := range []int{0, 1} {
		byRank[round] = map[int]int{}
		for pid, r := range byPid[round] {
			byRank[round][r] = pid
		}
		if len(byPid[round]) != world || len(byRank[round]) != world {
			t.Fatalf("round %d: processes -> ranks %v, want ranks 0..%d once each", round, byPid[round], world-1)
		}
	}
	for pid, r1 := range byPid[1] {
		if r0, ok := byPid[0][pid]; ok && r0 != r1 {
			t.Errorf("process %d was rank %d in round 0 and rank %d in round 1", pid, r0, r1)
		}
	}
	for r := range world {
		same := byRank[0][r] == byRank[1][r]
		if same == (r == crashed) {
			t.Errorf("rank %d: pid %d in round 0, %d in round 1; only rank %d should be a new process", r, byRank[0][r], byRank[1][r], crashed)
		}
	}
	return byRank
}

func restartModes(j *job) []string {
	var modes []string
	for _, e := range j.eventsOf("restart") {
		m, _ := e["mode"].(string)
		modes = append(modes, m)
	}
	return modes
}

// runInProcess runs one single-node job under --restart-mode in-process
// (launcher args, then script and its args with --ckpt-dir and --out
// added), requires exit 0 and nothing left behind, and returns the job and
// its final weights.
func runInProcess(t *testing.T, launcher []string, script string, args ...string) (*job, weights) {
	t.Helper()
	return runInProcessWith(t, false, launcher, script, args...)
}

// runInProcessGated is runInProcess with the fault waiting for every
// local rank's standby to be ready (job.runGatedOnStandbys).
func runInProcessGated(t *testing.T, launcher []string, script string, args ...string) (*job, weights) {
	t.Helper()
	return runInProcessWith(t, true, launcher, script, args...)
}

func runInProcessWith(t *testing.T, gated bool, launcher []string, script string, args ...string) (*job, weights) {
	t.Helper()
	j := newJob(t)
	out := filepath.Join(j.dir, "w.json")
	full := append(append([]string{"--standalone", "--restart-mode", "in-process", "--verdict-file", filepath.Join(j.dir, "verdict.json")}, launcher...),
		append([]string{script, "--ckpt-dir", filepath.Join(j.dir, "ckpt"), "--out", out}, args...)...)
	env := []string{"PYTHON_EXEC=" + debianPython}
	var code int
	if gated {
		code = j.runGatedOnStandbys(env, full...)
	} else {
		code = j.run(torchTimeout, env, full...)
	}
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	if left := j.waitNoLeftovers(5 * time.Second); len(left) > 0 {
		t.Fatalf("left behind: %s", hangdump.Describe(left))
	}
	return j, readWeights(t, out)
}

// TestInProcessCrashKeepsSurvivors: one rank crashes at step 25 of 60 in 2-
// and 4-rank jobs, with the checkpoint restored from the file and from the
// in-memory copy; the survivors keep their pids, only the crashed rank
// starts again, and the weights equal the uninterrupted run's.
func TestInProcessCrashKeepsSurvivors(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	for _, tc := range []struct {
		ranks   int
		crash   int
		restore string
	}{{2, 1, "checkpoint"}, {4, 2, "checkpoint"}, {2, 0, "memory"}} {
		t.Run(fmt.Sprintf("%d ranks, rank %d crashes, restore from %s", tc.ranks, tc.crash, tc.restore), func(t *testing.T) {
			want := uninterruptedWeights(t, strconv.Itoa(tc.ranks))
			j, got := runInProcess(t, []string{"--nproc-per-node", strconv.Itoa(tc.ranks), "--max-restarts", "2"},
				inprocessScript(t), "--crash-at-step", "25", "--crash-rank", strconv.Itoa(tc.crash), "--restore", tc.restore)
			if got.SHA256 != want.SHA256 || got.ResumedFromStep != 20 {
				t.Fatalf("weights %s resumed from %d; want %s (uninterrupted) from step 20", got.SHA256, got.ResumedFromStep, want.SHA256)
			}
			if m := restartModes(j); !slices.Equal(m, []string{"in-process"}) {
				t.Fatalf("restart modes %v, want one in-process restart", m)
			}
			pids := cyclePIDs(t, j)
			for lr := 0; lr < tc.ranks; lr++ {
				same := pids[0][lr] == pids[1][lr]
				if same == (lr == tc.crash) {
					t.Fatalf("round 0 pids %v, round 1 pids %v: only local rank %d should have a new process", pids[0], pids[1], tc.crash)
				}
			}
			// The survivors keep their global ranks, the replacement takes
			// the crashed one's; the processes are the launcher's.
			ranks := checkRanksKept(t, tc.ranks, tc.crash, j.stderr.String())
			for round, byRank := range ranks {
				for r, pid := range byRank {
					if pids[round][r] != pid { // one node: global rank = local rank
						t.Errorf("round %d: rank %d trained in pid %d, the launcher started pid %d", round, r, pid, pids[round][r])
					}
				}
			}
			// Each rank of round 1 restored step 20 from where the restore
			// choice says: the survivors from their in-memory copy with
			// --restore memory, the replacement (no copy) from the file.
			for r := 0; r < tc.ranks; r++ {
				from := `/\S*ckpt_00000020\.pt`
				if tc.restore == "memory" && r != tc.crash {
					from = "memory"
				}
				re := regexp.MustCompile(fmt.Sprintf(`\[ddp_train rank=%d cycle=1\] restored from %s at step 20 `, r, from))
				if !re.MatchString(j.stderr.String()) {
					t.Fatalf("rank %d of round 1 did not log that it restored step 20 from %s", r, from)
				}
			}
			if n := len(j.eventsOf("inprocess_first_step")); n != tc.ranks-1 {
				t.Fatalf("%d first-step reports, want one per survivor (%d)", n, tc.ranks-1)
			}
			// The node's one Active lease counts the restart by its mode.
			v := readVerdict(t, filepath.Join(j.dir, "verdict.json"))
			if len(v.Ledger) != 1 || v.Ledger[0].Role != ledger.Active || v.Ledger[0].Reason != ledger.JobSucceeded ||
				!maps.Equal(v.Ledger[0].Restarts, map[string]int{"in-process": 1}) {
				t.Fatalf("verdict ledger %+v, want one Active lease ended JobSucceeded with restarts in-process 1", v.Ledger)
			}
		})
	}
}

// TestInProcessPrewarmReplacement: with --prewarm the crashed rank's
// replacement is taken from its standby (the crash waits for the standbys
// to be ready: --fault-gate); the survivor stays; the weights are the
// uninterrupted run's.
func TestInProcessPrewarmReplacement(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := referenceWeights(t)
	j, got := runInProcessGated(t, []string{"--nproc-per-node", "2", "--max-restarts", "2", "--prewarm", "torch,torch.distributed"},
		inprocessScript(t), "--crash-at-step", "25", "--crash-rank", "1")
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
	}
	warm := j.eventsOf("prewarm_started")
	if len(warm) != 1 || fmt.Sprint(warm[0]["local_ranks"]) != "[1]" {
		t.Fatalf("prewarm_started events %v (fallbacks %v), want local rank 1 alone from its standby", warm, j.eventsOf("prewarm_fallback"))
	}
	if m := restartModes(j); !slices.Equal(m, []string{"in-process"}) {
		t.Fatalf("restart modes %v, want one in-process restart", m)
	}
}

// TestInProcessHang: rank 1 stops heartbeating 8 steps (2.4 s) before it
// hangs; the heartbeat timeout kills it, which breaks rank 0's collective;
// rank 0 heartbeated well after rank 1's last heartbeat, so it is not the
// hung rank: it stays and rejoins; the weights equal the uninterrupted
// run's.
func TestInProcessHang(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := referenceWeights(t)
	j, got := runInProcess(t, []string{"--nproc-per-node", "2", "--max-restarts", "2",
		"--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "4"},
		inprocessScript(t), "--hang-at-step", "25", "--hang-rank", "1", "--hang-quiet-steps", "8", "--step-sleep", "0.3")
	hangs := j.eventsOf("rank_hang")
	if len(hangs) != 1 || hangs[0]["rank"] != float64(1) {
		t.Fatalf("rank_hang events %v, want one for rank 1", hangs)
	}
	if m := restartModes(j); !slices.Equal(m, []string{"in-process"}) {
		t.Fatalf("restart modes %v, want one in-process restart", m)
	}
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
	}
}

// TestInProcessHangSilencesPeers: a rank hangs as in most jobs, its
// heartbeats stopping with it; its peer, waiting for it in the step's
// collective (in backward(), the example's gradient hook), falls silent at the same
// moment, so heartbeats cannot tell which one hung. The stacks, taken
// before any kill, can: the hung rank sleeps in the script, its peer
// waits in backward(). Only the hung rank is killed and the peer stays,
// as after a crash: one in-process restart and the uninterrupted run's
// weights. With --ft-rank-stacks false nothing tells them apart: the
// launcher does not keep a silent survivor (it could be the hung rank,
// which would never rejoin): one full restart, at once, no fallback.
func TestInProcessHangSilencesPeers(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := referenceWeights(t)
	for _, tc := range []struct {
		stacks string
		mode   string
	}{{"true", "in-process"}, {"false", "full"}} {
		t.Run("stacks "+tc.stacks, func(t *testing.T) {
			j, got := runInProcess(t, []string{"--nproc-per-node", "2", "--max-restarts", "2", "--inprocess-rejoin-timeout", "20",
				"--ft-initial-rank-heartbeat-timeout", "120", "--ft-rank-heartbeat-timeout", "3", "--ft-rank-stacks", tc.stacks},
				inprocessScript(t), "--hang-at-step", "25", "--hang-rank", "1", "--hang-quiet-steps", "0", "--step-sleep", "0.3")
			hangs := j.eventsOf("rank_hang")
			if len(hangs) < 1 {
				t.Fatalf("no rank_hang event")
			}
			if m := restartModes(j); !slices.Equal(m, []string{tc.mode}) {
				t.Fatalf("restart modes %v, want one %s restart", m, tc.mode)
			}
			if fb := j.eventsOf("inprocess_fallback"); len(fb) != 0 {
				t.Fatalf("inprocess_fallback events %v, want none", fb)
			}
			if tc.stacks == "true" {
				if len(hangs) != 1 || hangs[0]["rank"] != float64(1) {
					t.Fatalf("rank_hang events %v, want one, for rank 1", hangs)
				}
				st := j.eventsOf("rank_stacks")
				// Rank 0 waits in the example's gradient hook, which
				// all-gathers (examples/ddp_train.py), inside backward().
				if len(st) != 1 || st[0]["known"] != true || fmt.Sprint(st[0]["culprits"]) != "[1]" ||
					!strings.Contains(fmt.Sprint(st[0]["text"]), "rank 0: in all_gather at ddp_train.py:") {
					t.Fatalf("rank_stacks %v, want rank 1 named and rank 0 waiting in a collective", st)
				}
			} else if st := j.eventsOf("rank_stacks"); len(st) != 0 {
				t.Fatalf("rank_stacks %v with --ft-rank-stacks false", st)
			}
			if got.SHA256 != want.SHA256 {
				t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
			}
		})
	}
}

// TestInProcessFallbacks: a crash during the in-process restart escalates
// to the full restart, and ends with the uninterrupted run's weights. (A
// survivor that ignores the notice is replaced within the round:
// TestInProcessStuckSurvivor.)
func TestInProcessFallbacks(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := referenceWeights(t)
	for _, tc := range []struct {
		name  string
		extra []string
		why   string
	}{
		{"crash during the in-process restart", []string{"--crash-again-rank", "1"}, "failure_during"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The fallback must come from the replacement's crash, which
			// happens only once its cold interpreter has imported torch
			// (many seconds on a loaded machine); survivor 0 waits for it
			// in init_process_group and cannot rejoin before. A tight
			// rejoin bound would race that start and record
			// rejoin_timeout instead; a generous one costs nothing here,
			// since failure_during ends the round at the crash.
			j, got := runInProcess(t, []string{"--nproc-per-node", "2", "--max-restarts", "3", "--inprocess-rejoin-timeout", "120"},
				inprocessScript(t), append([]string{"--crash-at-step", "25", "--crash-rank", "1"}, tc.extra...)...)
			fb := j.eventsOf("inprocess_fallback")
			if len(fb) != 1 || fb[0]["why"] != tc.why {
				t.Fatalf("inprocess_fallback events %v, want one %q", fb, tc.why)
			}
			if m := restartModes(j); !slices.Equal(m, []string{"in-process", "full"}) {
				t.Fatalf("restart modes %v, want in-process then full", m)
			}
			if got.SHA256 != want.SHA256 {
				t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
			}
		})
	}
}

// TestInProcessWithoutTheAPI: examples/ddp_train.py does not use the API;
// under --restart-mode in-process its crash is a full restart, as with
// --restart-mode full.
func TestInProcessWithoutTheAPI(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	want := referenceWeights(t)
	j, got := runInProcess(t, []string{"--nproc-per-node", "2", "--max-restarts", "2"},
		trainScript(t), "--crash-at-step", "25", "--crash-rank", "1")
	if m := restartModes(j); !slices.Equal(m, []string{"full"}) {
		t.Fatalf("restart modes %v, want one full restart", m)
	}
	if n := len(j.eventsOf("inprocess_kept")) + len(j.eventsOf("inprocess_notice")); n != 0 {
		t.Fatalf("%d in-process events for a script that did not opt in", n)
	}
	pids := cyclePIDs(t, j)
	for lr := range 2 {
		if pids[0][lr] == pids[1][lr] {
			t.Fatalf("local rank %d kept its process (%v -> %v) without the API", lr, pids[0], pids[1])
		}
	}
	if got.SHA256 != want.SHA256 {
		t.Fatalf("weights %s, want %s", got.SHA256, want.SHA256)
	}
}

// inprocessCluster is the setup of the multi-node in-process tests: a
// cluster on the embedded etcd, its checkpoint directory and weights file,
// and the weights of an uninterrupted 4-rank run to compare with.
func inprocessCluster(t *testing.T) (c *cluster, ckpt, out string, want weights) {
	t.Helper()
	requireTorch(t)
	want = uninterruptedWeights(t, "4")
	c = newCluster(t, embeddedEndpoint(t))
	return c, filepath.Join(c.dir, "ckpt"), filepath.Join(c.dir, "w.json"), want
}

// wantWorld4 requires the final weights in out to be want's, from 4 ranks.
func wantWorld4(t *testing.T, out string, want weights) {
	t.Helper()
	if got := readWeights(t, out); got.SHA256 != want.SHA256 || got.WorldSize != 4 {
		t.Fatalf("weights %s world %d, want %s world 4", got.SHA256, got.WorldSize, want.SHA256)
	}
}

// TestInProcessTwoNodes: two launchers on 127.0.0.2 and 127.0.0.3, two
// ranks each (etcd rendezvous); a rank of the second node crashes. Every
// survivor on both nodes stays; the weights equal an uninterrupted 4-rank
// run's.
func TestInProcessTwoNodes(t *testing.T) {
	skipShort(t)
	c, ckpt, out, want := inprocessCluster(t)
	for range 2 {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "2",
			"--rdzv-backend", "c10d", "--restart-mode", "in-process",
			inprocessScript(t), "--ckpt-dir", ckpt, "--out", out, "--crash-at-step", "25", "--crash-rank", "3")
	}
	for i, code := range c.waitAll(torchTimeout) {
		if code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	wantWorld4(t, out, want)
	survivors := 0
	for i, n := range c.nodes {
		if m := restartModes(n); !slices.Equal(m, []string{"in-process"}) {
			t.Fatalf("node %d restart modes %v, want one in-process restart\n%s", i, m, c.stderrs())
		}
		survivors += len(n.eventsOf("inprocess_first_step"))
	}
	if survivors != 3 {
		t.Fatalf("%d survivors took a first step after the restart, want 3", survivors)
	}
	var stderrs []string
	for _, n := range c.nodes {
		stderrs = append(stderrs, n.stderr.String())
	}
	checkRanksKept(t, 4, 3, stderrs...)
}

// TestInProcessNodeLossSwapsSpare: three launchers (--nnodes 2:3, two ranks
// each); an active node other than the etcd host is killed. The standby
// takes its place and its ranks start fresh; the other active node's ranks
// stay in their processes and rejoin; the weights equal an uninterrupted
// 4-rank run's.
func TestInProcessNodeLossSwapsSpare(t *testing.T) {
	skipShort(t)
	c, ckpt, out, want := inprocessCluster(t)
	for range 3 {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2:3", "--nproc-per-node", "2", "--max-restarts", "3",
			"--rdzv-backend", "c10d", "--restart-mode", "in-process",
			inprocessScript(t), "--ckpt-dir", ckpt, "--out", out, "--step-sleep", "0.1")
	}
	waitFile(t, filepath.Join(ckpt, "ckpt_00000020.pt"), torchTimeout)
	victim := activeVictim(t, c)
	standby := 3 - victim
	if err := c.nodes[victim].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		if code := n.wait(torchTimeout); i != victim && code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	wantWorld4(t, out, want)
	if n := len(c.nodes[0].eventsOf("inprocess_first_step")); n != 2 {
		t.Fatalf("node 0: %d survivors took a first step after the swap, want 2\n%s", n, c.stderrs())
	}
	if m := restartModes(c.nodes[0]); !slices.Equal(m, []string{"in-process"}) {
		t.Fatalf("node 0 restart modes %v, want one in-process restart", m)
	}
	if len(c.nodes[standby].eventsOf("cycle_started")) == 0 || len(c.nodes[standby].eventsOf("inprocess_notice")) != 0 {
		t.Fatalf("the standby node %d did not start fresh ranks", standby)
	}
}

// activeVictim is an active node of a three-node cluster (--nnodes 2:3)
// other than node 0, which hosts the embedded etcd: the one to kill.
func activeVictim(t *testing.T, c *cluster) int {
	t.Helper()
	for i := 1; i < 3; i++ {
		if len(c.nodes[i].eventsOf("cycle_started")) > 0 {
			return i
		}
	}
	t.Fatalf("no active node besides the etcd host\n%s", c.stderrs())
	return -1
}

// TestInProcessNodeLossWaitsForNode: two launchers (--nnodes 2:3, two ranks
// each, --max-restarts 1) and no spare; an active node other than the etcd
// host is killed, and a new node comes 6 s later. The surviving node's ranks
// are kept, but they give up waiting for their notice after 2 s
// (FT_INPROCESS_NOTICE_WAIT) and exit: when the round closes they start
// afresh, which is not a failure of the new round. The job succeeds with
// its one restart (before the fix their old exits failed the new round, a
// second restart the budget did not have), with the uninterrupted weights.
func TestInProcessNodeLossWaitsForNode(t *testing.T) {
	skipShort(t)
	c, ckpt, out, want := inprocessCluster(t)
	// The survivors wait for their notice up to 8 s, then exit: far more
	// than the node loss takes to detect (a closed stream connection, ms;
	// with 2 s a loaded CI machine once let them exit first, so nothing was
	// kept), and they are gone well before the third node comes.
	add := func() *job {
		return c.addNode([]string{"PYTHON_EXEC=" + debianPython, "FT_INPROCESS_NOTICE_WAIT=8"}, "--nnodes", "2:3",
			"--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d", "--restart-mode", "in-process",
			inprocessScript(t), "--ckpt-dir", ckpt, "--out", out, "--step-sleep", "0.1")
	}
	add()
	add()
	waitFile(t, filepath.Join(ckpt, "ckpt_00000020.pt"), torchTimeout)
	if err := c.nodes[1].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	c.nodes[1].wait(torchTimeout)
	n0 := c.nodes[0]
	// Node 0 keeps its survivors; without a node to form the next round
	// they give up waiting for their notice and exit. Only then does the
	// third node come, so that they are replaced (inprocess_replaced).
	waitFor(t, torchTimeout, func() bool {
		return len(n0.eventsOfQuiet("inprocess_kept")) > 0 || len(n0.eventsOfQuiet("restart")) > 0
	})
	if k := n0.eventsOf("inprocess_kept"); len(k) != 1 {
		t.Fatalf("node 0: inprocess_kept %v, want one; its restarts: %v", k, n0.eventsOf("restart"))
	}
	survivors := cyclePIDs(t, n0)[0]
	waitFor(t, torchTimeout, func() bool {
		return !slices.ContainsFunc(survivors, pidAlive)
	})
	add()
	for _, i := range []int{0, 2} {
		if code := c.nodes[i].wait(torchTimeout); code != 0 {
			t.Fatalf("node %d exited %d", i, code)
		}
	}
	wantWorld4(t, out, want)
	var replaced []int
	for _, e := range n0.eventsOf("inprocess_replaced") {
		replaced = append(replaced, int(e["local_rank"].(float64)))
	}
	slices.Sort(replaced)
	if !slices.Equal(replaced, []int{0, 1}) {
		t.Fatalf("node 0: inprocess_replaced for local ranks %v, want [0 1]\n%s", replaced, c.stderrs())
	}
	if f := n0.eventsOf("inprocess_fallback"); len(f) != 0 {
		t.Fatalf("node 0: fallbacks %v", f)
	}
	if r := n0.eventsOf("restart"); len(r) != 1 || r[0]["action"] != "restart_in_process" {
		t.Fatalf("node 0: restarts %v, want one, restart_in_process", r)
	}
}
