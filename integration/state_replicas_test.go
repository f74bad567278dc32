package integration

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/state"
)

// shmDirsOf lists the segments' directories of the launcher with pid.
func shmDirsOf(pid int) []string {
	ds, _ := filepath.Glob("/dev/shm/" + state.ShmDirPrefix + strconv.Itoa(pid) + "-*")
	return ds
}

// TestStateStaleSegmentsRemovedByNextLauncher: a launcher killed with
// SIGKILL leaves its segments' directory in /dev/shm; the next launcher
// with --state-dir removes it at its start (its owner lock is free), with
// a state_stale_removed event, and leaves a live launcher's directory
// alone; that one is removed by its own launcher as it exits.
func TestStateStaleSegmentsRemovedByNextLauncher(t *testing.T) {
	skipShort(t)
	live, dead, next := newJob(t), newJob(t), newJob(t)
	sleeper := live.script("rank.sh", "exec sleep 600\n")
	dirOf := map[*job]string{}
	for _, j := range []*job{live, dead} {
		j.start(nil, "--standalone", "--nproc-per-node", "1", "--state-dir", filepath.Join(j.dir, "state"), "--no-python", sleeper)
		pid := j.cmd.Process.Pid
		waitFor(t, generous, func() bool { return len(shmDirsOf(pid)) == 1 })
		dirOf[j] = shmDirsOf(pid)[0]
	}
	t.Cleanup(func() { _ = os.RemoveAll(dirOf[dead]) }) // if the test fails before the sweep
	if err := dead.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	dead.wait(generous)
	if _, err := os.Stat(dirOf[dead]); err != nil {
		t.Fatalf("the SIGKILLed launcher's segments are already gone (%v): nothing to test", err)
	}

	done := next.script("rank.sh", "exit 0\n")
	if code := next.run(generous, nil, "--standalone", "--nproc-per-node", "1", "--state-dir", filepath.Join(next.dir, "state"),
		"--no-python", done); code != 0 {
		t.Fatalf("exit %d\n%s", code, next.stderr.String())
	}
	if _, err := os.Stat(dirOf[dead]); !os.IsNotExist(err) {
		t.Errorf("the dead launcher's segments %s are still there (%v)", dirOf[dead], err)
	}
	if _, err := os.Stat(dirOf[live]); err != nil {
		t.Errorf("the live launcher's segments %s were removed: %v", dirOf[live], err)
	}
	found := false
	for _, e := range next.eventsOf(state.EventStaleRemoved) {
		if e["dir"] == dirOf[dead] && e["pid"] == float64(dead.cmd.Process.Pid) {
			found = true
		}
		if e["dir"] == dirOf[live] {
			t.Errorf("a live launcher's segments recorded as removed: %v", e)
		}
	}
	if !found || !strings.Contains(next.stderr.String(), "removed the segments' directory of a launcher that is gone") {
		t.Errorf("no %s event or log line for %s: %v\n%s", state.EventStaleRemoved, dirOf[dead],
			next.eventsOf(state.EventStaleRemoved), next.stderr.String())
	}

	if err := live.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	live.wait(generous)
	if _, err := os.Stat(dirOf[live]); !os.IsNotExist(err) {
		t.Errorf("the live launcher left its segments %s as it exited (%v)", dirOf[live], err)
	}
}

// plainResult is what testdata/state_plain.py writes at its end.
type plainResult struct {
	Acc         int     `json:"acc"`
	ResumedFrom *int    `json:"resumed_from"`
	StateRank   *int    `json:"state_rank"`
	Source      *string `json:"source"`
}

// TestStateTwoReplicasSurviveBuddyLoss: five launcher "nodes" on loopback
// (--nnodes 3:5, one rank each: three active nodes and two spares), each
// with a state directory of its own, --state-replicas 2 (each node streams
// its rank's saves to both other active nodes). The ranks (Python without
// torch, a small state) save after every step and wait after step 12. Once
// every node's copy of step 12 is verified at both its buddies, a node and
// its first buddy are SIGKILLed together: with one replica the first node's
// state would be gone with its buddy; with two, the remaining node holds
// both lost ranks' copies, the two spares take the lost group ranks, their
// launchers restore both ranks from it before the ranks start, and every
// rank ends with an uninterrupted run's accumulator. The report on the
// spares' event logs reads those restores as "buddy". Every node runs with
// the same --job-secret-file, so every copy and fetch here is
// authenticated (the other replication tests run without a secret).
func TestStateTwoReplicasSurviveBuddyLoss(t *testing.T) {
	skipShort(t)
	const hold, steps, nodes = 12, 30, 5
	script, err := filepath.Abs("testdata/state_plain.py")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	out := filepath.Join(c.dir, "out")
	mkdir(t, out)
	secret := filepath.Join(c.dir, "job-secret")
	if err := os.WriteFile(secret, []byte("a job secret of more than 16 bytes\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < nodes; i++ {
		c.addNodeV([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "3:5", "--nproc-per-node", "1", "--max-restarts", "1",
			"--job-secret-file", secret,
			"--state-dir", filepath.Join(c.dir, "state"+strconv.Itoa(i)), "--state-persist-every", "0", "--state-replicas", "2",
			script, "--out", out, "--steps", strconv.Itoa(steps), "--hold-at-step", strconv.Itoa(hold))
	}
	nodeOf, pidOf := readHeld(t, out, 3, generous)
	// The ring follows the group ranks (= the global ranks here): rank r's
	// buddies hold r+1 and r+2. Node 0 hosts the embedded etcd and must
	// live: the lost pair are the ranks after its rank, so node 0 is the
	// only holder left of both copies.
	var keep int
	for r, n := range nodeOf {
		if n == 0 {
			keep = r
		}
	}
	if nodeOf[keep] != 0 {
		t.Fatalf("no rank on node 0 (the etcd host): %v", nodeOf)
	}
	lost := []int{(keep + 1) % 3, (keep + 2) % 3}
	// Every rank's step-hold copy verified at both its buddies: the
	// replication is done before the loss.
	waitFor(t, generous, func() bool {
		got := 0
		for r := 0; r < 3; r++ {
			for d := 1; d <= 2; d++ {
				for _, e := range c.nodes[nodeOf[(r+d)%3]].eventsOfQuiet(state.EventReplicaReceived) {
					if e["rank"] == float64(r) && e["step"] == float64(hold) {
						got++
						break
					}
				}
			}
		}
		return got == 6
	})
	for _, r := range lost {
		n := c.nodes[nodeOf[r]]
		pid := n.cmd.Process.Pid
		t.Cleanup(func() { // a SIGKILLed launcher leaves its segments' directory
			for _, p := range shmDirsOf(pid) {
				_ = os.RemoveAll(p)
			}
		})
		if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = syscall.Kill(pidOf[r], syscall.SIGKILL)
	}
	for _, r := range lost {
		c.nodes[nodeOf[r]].wait(generous)
	}
	var logs []string
	for i, n := range c.nodes {
		if i == nodeOf[lost[0]] || i == nodeOf[lost[1]] {
			continue
		}
		if code := n.wait(generous); code != 0 {
			t.Fatalf("node %d exited %d", i, code)
		}
		logs = append(logs, "--event-log", n.events)
	}
	for r := 0; r < 3; r++ {
		b, err := os.ReadFile(filepath.Join(out, "rank-"+strconv.Itoa(r)+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var got plainResult
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := steps*1000*r + steps*(steps-1)/2 // sum of r*1000+s over the steps
		if got.Acc != want || got.ResumedFrom == nil || *got.ResumedFrom != hold || got.StateRank == nil || *got.StateRank != r {
			t.Errorf("rank %d: acc %d resumed from %v with rank %v's state; want acc %d, resumed from %d with its own",
				r, got.Acc, got.ResumedFrom, got.StateRank, want, hold)
		}
	}
	// Both lost ranks restored by the spares, each from its lost node's
	// copy (node 0 was the only holder left).
	restored := map[float64]bool{}
	for i, n := range c.nodes {
		if i == 0 || i == nodeOf[lost[0]] || i == nodeOf[lost[1]] {
			continue
		}
		for _, e := range n.eventsOf(state.EventRestoredFromBuddy) {
			restored[e["rank"].(float64)] = e["step"] == float64(hold) &&
				strings.HasPrefix(fmt.Sprint(e["sender"]), "127.0.0."+strconv.Itoa(2+nodeOf[int(e["rank"].(float64))])+"/")
		}
	}
	if len(restored) != 2 || !restored[float64(lost[0])] || !restored[float64(lost[1])] {
		t.Errorf("the spares restored %v, want ranks %v at step %d, each from its lost node's copy", restored, lost, hold)
	}
	authed := 0
	for _, l := range strings.Split(c.stderrs(), "\n") {
		if strings.Contains(l, "receiving buddy copies") && (strings.Contains(l, "authenticated=true") || strings.Contains(l, `"authenticated":true`)) {
			authed++
		}
	}
	if authed != nodes {
		t.Errorf("%d nodes' receivers said they authenticate with the job secret, want %d", authed, nodes)
	}
	rep, _ := runReport(t, c.dir, logs...)
	if rep.State == nil || rep.State.Restores["buddy"] != 2 || rep.State.Restores["memory"] != 1 {
		t.Errorf("report's restores %+v, want buddy 2 (the spares), memory 1 (node 0)", rep.State)
	}
	for i := range c.nodes {
		if i != nodeOf[lost[0]] && i != nodeOf[lost[1]] && i != 0 {
			if v := readVerdict(t, c.verdictPath(i)); len(v.StateRestoredFromBuddy) != 1 || v.StateRestoredFromBuddy[0].Step != hold {
				t.Errorf("spare node %d's verdict lists %+v restored from buddies, want its rank at step %d", i, v.StateRestoredFromBuddy, hold)
			}
		}
	}
}
