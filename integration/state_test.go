package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/state"
)

type stateResult struct {
	SHA256      string  `json:"sha256"`
	ResumedFrom *int    `json:"resumed_from"`
	Source      *string `json:"source"`
}

func readStateResult(t *testing.T, dir string, rank int) stateResult {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "rank-"+strconv.Itoa(rank)+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r stateResult
	if err := json.Unmarshal(b, &r); err != nil || r.SHA256 == "" {
		t.Fatalf("rank %d result %s: %v", rank, b, err)
	}
	return r
}

// stateReference runs each rank of the script alone, without a launcher
// (its saves go to files), and returns the directory of its results.
// stateScript is testdata/state_train.py's path and the output of its
// reference run (stateReference), for the tests that need torch.
func stateScript(t *testing.T) (script, refOut string) {
	t.Helper()
	skipShort(t)
	requireTorch(t)
	script, err := filepath.Abs("testdata/state_train.py")
	if err != nil {
		t.Fatal(err)
	}
	return script, stateReference(t, script)
}

// readHeld waits for the held-<RANK> files of ranks 0..n-1 that
// state_train.py's --hold-at-step writes (its $NODE and pid) and returns
// which node and pid hold each rank.
func readHeld(t *testing.T, out string, n int, timeout time.Duration) (nodeOf, pidOf map[int]int) {
	t.Helper()
	nodeOf, pidOf = map[int]int{}, map[int]int{}
	for r := 0; r < n; r++ {
		p := filepath.Join(out, "held-"+strconv.Itoa(r))
		waitFile(t, p, timeout)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			t.Fatalf("%s: %q", p, b)
		}
		nodeOf[r], _ = strconv.Atoi(f[0])
		pidOf[r], _ = strconv.Atoi(f[1])
	}
	return nodeOf, pidOf
}

// mkdir makes the directory dir or fails the test.
func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func stateReference(t *testing.T, script string) string {
	t.Helper()
	refOut := t.TempDir()
	for r := 0; r < 2; r++ {
		cmd := exec.Command(debianPython, script, "--out", refOut)
		cmd.Env = append(os.Environ(), "RANK="+strconv.Itoa(r), "LOCAL_RANK="+strconv.Itoa(r),
			state.EnvDir+"="+filepath.Join(refOut, "files"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("reference rank %d: %v\n%s", r, err, out)
		}
	}
	return refOut
}

// TestTorchStateRestoredFromLauncherMemory trains two real torch ranks that
// save their whole state after every step with ft_launcher_client.state.
// Rank 1 crashes right after its save of step 25; the launcher restarts
// both ranks, each loads its newest save from the launcher's memory, and
// the final weights equal those of the same script run without any
// launcher (its saves then go to files). The launcher writes the saves out
// when the ranks stop and at the end, counts them as checkpoints, and
// removes its segments when it exits.
func TestTorchStateRestoredFromLauncherMemory(t *testing.T) {
	script, refOut := stateScript(t)

	j := newJob(t)
	out, dir := filepath.Join(j.dir, "out"), filepath.Join(j.dir, "state")
	mkdir(t, out)
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		"--state-dir", dir, "--state-persist-every", "0",
		script, "--out", out, "--crash-at-step", "25", "--crash-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	for r := 0; r < 2; r++ {
		ref, got := readStateResult(t, refOut, r), readStateResult(t, out, r)
		if got.SHA256 != ref.SHA256 {
			t.Errorf("rank %d: final weights %s differ from the uninterrupted run's %s", r, got.SHA256, ref.SHA256)
		}
		if got.Source == nil || *got.Source != "memory" {
			t.Errorf("rank %d restored from %v, want the launcher's memory", r, got.Source)
		}
		if got.ResumedFrom == nil {
			t.Errorf("rank %d did not resume from a save", r)
		}
		// The write-out at the end holds the last step.
		m, err := state.ReadManifest(dir, int32(r))
		if err != nil {
			t.Fatal(err)
		}
		if m.Step != 39 {
			t.Errorf("rank %d: written step %d, want 39", r, m.Step)
		}
		if _, _, err := state.ReadFile(filepath.Join(dir, m.File)); err != nil {
			t.Error(err)
		}
	}
	if t.Failed() {
		evs, _ := os.ReadFile(j.events)
		t.Logf("events:\n%s\nstderr:\n%s", evs, j.stderr.String())
	}
	for r, want := range []int{30, 25} { // where rank 0 waited; rank 1's save right before its crash
		if got := readStateResult(t, out, r); got.ResumedFrom == nil || *got.ResumedFrom != want {
			t.Errorf("rank %d resumed from %v, want %d", r, got.ResumedFrom, want)
		}
	}
	reasons := map[any]int{}
	for _, e := range j.eventsOf(state.EventPersisted) {
		reasons[e["reason"]]++
	}
	if reasons["ranks stopped"] == 0 || reasons["end"] == 0 {
		t.Errorf("write-outs by reason %v, want some when the ranks stopped and at the end", reasons)
	}
	if n := len(j.eventsOf(state.EventSave)); n == 0 {
		t.Error("no state_save events")
	}
	if n := len(j.eventsOf("rank_checkpoint")); n < 40 {
		t.Errorf("%d rank_checkpoint events, want at least 40 (every save is a checkpoint)", n)
	}
	// Each load() is recorded with its source (state_restore), and the
	// report shows where round 1's ranks restored from.
	rep, _ := runReport(t, j.dir, "--event-log", j.events)
	if rep.State == nil || rep.State.Restores["memory"] != 2 || rep.State.EmptyLoads != 2 || rep.State.Saves != 80 {
		t.Errorf("report's state account %+v, want 2 restores from memory, 2 empty loads (round 0), 80 saves (40 steps, 2 ranks)", rep.State)
	}
	if len(rep.Rounds) != 2 || rep.Rounds[1].RestoreSources() != "memory ×2" {
		t.Errorf("rounds %+v, want round 1 restored from memory ×2", rep.Rounds)
	} else {
		for _, x := range rep.Rounds[1].Restores {
			if got := readStateResult(t, out, x.Rank); got.ResumedFrom == nil || int64(*got.ResumedFrom) != x.Step {
				t.Errorf("rank %d: the report says it restored step %d, the rank says %v", x.Rank, x.Step, got.ResumedFrom)
			}
		}
	}
	left, _ := filepath.Glob("/dev/shm/ft-launcher-state-" + strconv.Itoa(j.cmd.Process.Pid) + "-*")
	if len(left) != 0 {
		t.Errorf("segments left after the launcher exited: %v", left)
	}
}

// TestTorchStateWrittenOnSignalContinuesInNewJob stops a job with SIGTERM
// (a walltime) while its ranks save after every step and nothing is
// written periodically (--state-persist-every 0): the launcher writes the
// newest saves out as it stops, and a new job (a new launcher, fresh
// memory) resumes from them and ends with the weights of an uninterrupted
// run.
func TestTorchStateWrittenOnSignalContinuesInNewJob(t *testing.T) {
	script, refOut := stateScript(t)
	j := newJob(t)
	out, dir := filepath.Join(j.dir, "out"), filepath.Join(j.dir, "state")
	mkdir(t, out)
	j.start([]string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--state-dir", dir, "--state-persist-every", "0", script, "--out", out, "--step-sleep", "0.2")
	seen := map[any]float64{} // local rank -> newest step the launcher saw saved
	deadline := time.Now().Add(torchTimeout)
	for len(seen) < 2 || seen[float64(0)] < 5 || seen[float64(1)] < 5 {
		if time.Now().After(deadline) {
			t.Fatalf("the ranks did not save 5 steps in %s: %v", torchTimeout, seen)
		}
		time.Sleep(50 * time.Millisecond)
		if _, err := os.Stat(j.events); err != nil {
			continue // the launcher has not opened its event log yet
		}
		for _, e := range j.eventsOf(state.EventSave) {
			seen[e["local_rank"]] = max(seen[e["local_rank"]], e["step"].(float64))
		}
	}
	if err := j.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(time.Minute); code == 0 {
		t.Fatalf("a job stopped by SIGTERM exited 0\n%s", j.stderr.String())
	}
	written := map[int32]int64{}
	for r := int32(0); r < 2; r++ {
		m, err := state.ReadManifest(dir, r)
		if err != nil {
			t.Fatalf("nothing written on SIGTERM: %v\n%s", err, j.stderr.String())
		}
		if float64(m.Step) < seen[float64(r)] || m.Step >= 39 {
			t.Fatalf("rank %d: written step %d, want the newest save (at least %v, the job was stopped before the end)", r, m.Step, seen[float64(r)])
		}
		written[r] = m.Step
	}
	for _, e := range j.eventsOf(state.EventPersisted) {
		if e["reason"] != "ranks stopped" && e["reason"] != "end" {
			t.Errorf("write-out %v: want only at the stop (--state-persist-every 0)", e)
		}
	}

	// The continuation job: a new launcher, nothing in memory.
	j2 := newJob(t)
	code := j2.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--state-dir", dir, script, "--out", out)
	if code != 0 {
		t.Fatalf("continuation job: exit %d\n%s", code, j2.stderr.String())
	}
	for r := 0; r < 2; r++ {
		ref, got := readStateResult(t, refOut, r), readStateResult(t, out, r)
		if got.SHA256 != ref.SHA256 {
			t.Errorf("rank %d: final weights %s differ from the uninterrupted run's %s", r, got.SHA256, ref.SHA256)
		}
		if got.Source == nil || *got.Source != "file" || got.ResumedFrom == nil || int64(*got.ResumedFrom) != written[int32(r)] {
			t.Errorf("rank %d resumed from step %v of %v, want step %d from the file", r, got.ResumedFrom, got.Source, written[int32(r)])
		}
	}
}

// TestTorchStateFullDiskWarnsAndTrainingGoesOn gives the launcher a state
// directory on a 16 KiB tmpfs, too small for any write-out: every
// write-out fails, which is a state_persist_failed event and a verdict
// warning, while the ranks train to the end, restoring from memory after a
// crash as usual.
func TestTorchStateFullDiskWarnsAndTrainingGoesOn(t *testing.T) {
	script, refOut := stateScript(t)
	dir := testenv.Tmpfs(t, "16k")
	j := newJob(t)
	out, vpath := filepath.Join(j.dir, "out"), filepath.Join(j.dir, "verdict.json")
	mkdir(t, out)
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--verdict-file", vpath,
		"--state-dir", dir, "--state-persist-every", "1",
		script, "--out", out, "--crash-at-step", "25", "--crash-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d: a full state directory must not stop training\n%s", code, j.stderr.String())
	}
	for r := 0; r < 2; r++ {
		ref, got := readStateResult(t, refOut, r), readStateResult(t, out, r)
		if got.SHA256 != ref.SHA256 || got.Source == nil || *got.Source != "memory" {
			t.Errorf("rank %d: weights %s (from %v), want %s restored from memory", r, got.SHA256, got.Source, ref.SHA256)
		}
	}
	if n := len(j.eventsOf(state.EventPersistFailed)); n == 0 {
		t.Error("no state_persist_failed event")
	}
	v := readVerdict(t, vpath)
	if len(v.StateWarnings) == 0 || !strings.Contains(strings.Join(v.StateWarnings, "\n"), "no space left") {
		t.Errorf("verdict state_warnings %q, want the failed write-outs", v.StateWarnings)
	}
}

// TestTorchStateMemoryTooSmallSavesToFiles gives the launcher's segments a
// 1 MiB tmpfs (--state-shm-dir), too small for the two 1 MiB slots of a
// segment: every save says so on the rank's stderr (the sizes and where it
// goes instead) and is written to the state directory's files, and the
// crashed rank's next process resumes from the file, with the weights of
// an uninterrupted run.
func TestTorchStateMemoryTooSmallSavesToFiles(t *testing.T) {
	script, refOut := stateScript(t)
	shm := testenv.Tmpfs(t, "1m")
	j := newJob(t)
	out, dir := filepath.Join(j.dir, "out"), filepath.Join(j.dir, "state")
	mkdir(t, out)
	code := j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
		"--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		"--state-dir", dir, "--state-shm-dir", shm,
		script, "--out", out, "--crash-at-step", "25", "--crash-rank", "1")
	if code != 0 {
		t.Fatalf("exit %d: a segment that does not fit must not stop training\n%s", code, j.stderr.String())
	}
	stderr := j.stderr.String()
	if !strings.Contains(stderr, "the state segment needs") || !strings.Contains(stderr, "saving to files in "+dir) {
		t.Errorf("no warning naming the segment's size and the files it saves to instead in the output:\n%s", stderr)
	}
	for r := 0; r < 2; r++ {
		ref, got := readStateResult(t, refOut, r), readStateResult(t, out, r)
		if got.SHA256 != ref.SHA256 {
			t.Errorf("rank %d: weights %s, want %s (an uninterrupted run's)", r, got.SHA256, ref.SHA256)
		}
		if got.ResumedFrom == nil || got.Source == nil || *got.Source != "file" {
			t.Errorf("rank %d: resumed from step %v (source %v), want a step restored from the file", r, got.ResumedFrom, got.Source)
		}
		if _, err := os.Stat(filepath.Join(dir, "rank-"+strconv.Itoa(r)+".json")); err != nil {
			t.Errorf("rank %d: no manifest in the state directory: %v", r, err)
		}
	}
}

// TestTorchStateNodeLossRestoredFromBuddy: three launcher "nodes" on
// loopback (--nnodes 2:3, one rank each, so one is a spare), each with a
// state directory of its own (no shared storage) and --state-replicas 1
// (each node streams its rank's saves to the next active node). Both ranks
// save after every step and wait after step 20; once the lost node's save
// of step 20 reached its buddy, that node's launcher and rank are
// SIGKILLed. The spare takes its group rank and global rank, its launcher
// restores that rank's state from the buddy (state_restored_from_buddy,
// naming the lost node) before the rank starts, and the rank loads it from
// memory: both ranks end with the weights of an uninterrupted run,
// bit-identical.
func TestTorchStateNodeLossRestoredFromBuddy(t *testing.T) {
	script, refOut := stateScript(t)

	const hold = 20
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	out := filepath.Join(c.dir, "out")
	mkdir(t, out)
	for i := 0; i < 3; i++ {
		c.addNodeV([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2:3", "--nproc-per-node", "1", "--max-restarts", "1",
			"--state-dir", filepath.Join(c.dir, "state"+strconv.Itoa(i)), "--state-persist-every", "0", "--state-replicas", "1",
			script, "--out", out, "--hold-at-step", strconv.Itoa(hold))
	}
	// Which node holds which rank (node 0 hosts the embedded etcd: never
	// the victim).
	nodeOf, pidOf := readHeld(t, out, 2, torchTimeout)
	if _, err := os.Stat(filepath.Join(out, "held-2")); err == nil {
		t.Fatal("a third rank ran in round 0: no node was a spare")
	}
	victimRank := 1
	if nodeOf[1] == 0 {
		victimRank = 0
	}
	victim, survivor := nodeOf[victimRank], nodeOf[1-victimRank]
	spare := 3 - victim - survivor
	if victim == survivor || victim == 0 {
		t.Fatalf("ranks on nodes %v", nodeOf)
	}
	// Wait until the buddy (the survivor: the next node of a 2-node ring)
	// verified the victim's copy of step hold.
	waitFor(t, generous, func() bool {
		for _, e := range c.nodes[survivor].eventsOfQuiet(state.EventReplicaReceived) {
			if e["rank"] == float64(victimRank) && e["step"] == float64(hold) {
				return true
			}
		}
		return false
	})
	victimPid := c.nodes[victim].cmd.Process.Pid
	t.Cleanup(func() { // a SIGKILLed launcher leaves its segments' directory
		left, _ := filepath.Glob("/dev/shm/ft-launcher-state-" + strconv.Itoa(victimPid) + "-*")
		for _, p := range left {
			if err := os.RemoveAll(p); err != nil {
				t.Errorf("remove the lost launcher's segments: %v", err)
			}
		}
	})
	if err := c.nodes[victim].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = syscall.Kill(pidOf[victimRank], syscall.SIGKILL)
	c.nodes[victim].wait(generous)

	for _, i := range []int{survivor, spare, 0} {
		if i == victim {
			continue
		}
		if code := c.nodes[i].wait(torchTimeout); code != 0 {
			t.Fatalf("node %d exited %d", i, code)
		}
	}
	for r := 0; r < 2; r++ {
		ref, got := readStateResult(t, refOut, r), readStateResult(t, out, r)
		if got.SHA256 != ref.SHA256 {
			t.Errorf("rank %d: final weights %s differ from the uninterrupted run's %s", r, got.SHA256, ref.SHA256)
		}
		if got.Source == nil || *got.Source != "memory" {
			t.Errorf("rank %d restored from %v, want the launcher's memory", r, got.Source)
		}
		if got.ResumedFrom == nil || *got.ResumedFrom != hold {
			t.Errorf("rank %d resumed from %v, want %d", r, got.ResumedFrom, hold)
		}
	}
	restored := c.nodes[spare].eventsOf(state.EventRestoredFromBuddy)
	victimAddr := "127.0.0." + strconv.Itoa(2+victim) + "/"
	if len(restored) != 1 || restored[0]["rank"] != float64(victimRank) || restored[0]["step"] != float64(hold) ||
		!strings.HasPrefix(fmt.Sprint(restored[0]["sender"]), victimAddr) {
		t.Errorf("the spare's restores %v, want one of rank %d, step %d, from node %s*", restored, victimRank, hold, victimAddr)
	}
	if n := len(c.nodes[survivor].eventsOf(state.EventRestoredFromBuddy)); n != 0 {
		t.Errorf("the survivor restored %d ranks from buddies; its own memory holds its rank", n)
	}
}
