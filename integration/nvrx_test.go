package integration

import (
	"github.com/ftlauncher/ft-launcher/verdict"

	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Ranks instrumented for nvrx talk to ft-launcher's monitors in nvrx's own
// pickle protocol. nvrx cannot be installed here (no PyPI), so the worker
// uses stand-in classes with nvrx's exact module and class names; the bytes
// on the wire are the same.

func TestNvrxClientHangDetected(t *testing.T) {
	skipShort(t)
	worker, _ := filepath.Abs("testdata/nvrx_worker.py")
	j := newJob(t)
	code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--max-restarts", "1", "--ft-rank-heartbeat-timeout", "1.5", worker, "hang")
	if code != 0 {
		t.Fatalf("exit %d, want 0 after one restart\n%s", code, j.stderr.String())
	}
	hangs := j.eventsOf("rank_hang")
	if len(hangs) != 1 || hangs[0]["timeout_kind"] != "heartbeat" || hangs[0]["rank"] != float64(1) {
		t.Fatalf("rank_hang events %v, want one heartbeat timeout of rank 1", hangs)
	}
	if n := len(j.eventsOf("restart")); n != 1 {
		t.Fatalf("%d restarts, want 1", n)
	}
}

func TestNvrxShutdownWorkloadRequestHonoured(t *testing.T) {
	skipShort(t)
	worker, _ := filepath.Abs("testdata/nvrx_worker.py")
	j := newJob(t)
	vpath := filepath.Join(j.dir, "verdict.json")
	code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
		"--max-restarts", "3", "--verdict-file", vpath, worker, "shutdown")
	if code != 93 {
		t.Fatalf("exit %d, want 93 (the no-restart exit code)\n%s", code, j.stderr.String())
	}
	v := readVerdict(t, vpath)
	wantVerdict(t, v, verdict.NoRestart, 93)
	if !strings.Contains(v.Reason, "ShutdownWorkload") || v.RestartsUsed != 0 {
		t.Fatalf("verdict %+v", v)
	}
	reqs := j.eventsOf("workload_request")
	if len(reqs) != 1 || reqs[0]["action"] != "ShutdownWorkload" || reqs[0]["description"] != "loss is NaN" {
		t.Fatalf("workload_request events %v", reqs)
	}
	if n := len(j.eventsOf("cycle_started")); n != 1 {
		t.Fatalf("%d cycles started, want 1 (no restart after ShutdownWorkload)", n)
	}
	failed := j.eventsOf("job_failed")
	if len(failed) != 1 || !strings.Contains(fmt.Sprint(failed[0]["reason"]), "ShutdownWorkload") {
		t.Fatalf("job_failed %v", failed)
	}
}

// TestNvrxExcludeThisNodeLeavesJob: a rank asks for its node to be excluded;
// that node leaves (exit 1) and the job goes on with the standby in its place.
func TestNvrxExcludeThisNodeLeavesJob(t *testing.T) {
	skipShort(t)
	worker, _ := filepath.Abs("testdata/nvrx_worker.py")
	c := newCluster(t, embeddedEndpoint(t))
	for i := 0; i < 3; i++ {
		c.addNodeV([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2:3", "--nproc-per-node", "1",
			"--max-restarts", "2", worker, "exclude")
	}
	codes := c.waitAll(2 * time.Minute)
	excluded := -1
	for i, code := range codes {
		if code != 0 {
			if excluded >= 0 {
				t.Fatalf("exit codes %v, want exactly one node to fail\n%s", codes, c.stderrs())
			}
			excluded = i
		}
	}
	if excluded < 0 || codes[excluded] != 1 {
		t.Fatalf("exit codes %v, want one node excluded with 1\n%s", codes, c.stderrs())
	}
	reqs := c.nodes[excluded].eventsOf("workload_request")
	if len(reqs) != 1 || reqs[0]["action"] != "ExcludeThisNode" {
		t.Fatalf("excluded node %d workload_request events %v", excluded, reqs)
	}
	v := readVerdict(t, c.verdictPath(excluded))
	wantVerdict(t, v, verdict.NodeExcluded, 1)
	if len(v.Quarantined) != 1 || v.Quarantined[0].Evidence != verdict.EvidenceExcluded || v.Quarantined[0].Node != v.Node {
		t.Fatalf("the excluded node's verdict does not quarantine itself: %+v", v.Quarantined)
	}
	seen := false // the peer active with it in round 0 records why it left
	for i := range c.nodes {
		if i == excluded {
			continue
		}
		pv := readVerdict(t, c.verdictPath(i))
		wantVerdict(t, pv, verdict.Succeeded, 0)
		for _, q := range pv.Quarantined {
			if q.Node == v.Node && q.Evidence == verdict.EvidenceExcluded {
				seen = true
			}
		}
	}
	if !seen {
		t.Errorf("no peer recorded node %s as excluded", v.Node)
	}
	ran := 0
	for i, n := range c.nodes {
		if i == excluded {
			continue
		}
		for _, e := range n.eventsOf("cycle_started") {
			if e["round"] == float64(1) && e["world_size"] == float64(2) {
				ran++
			}
		}
	}
	if ran != 2 {
		t.Fatalf("%d of the other nodes ran round 1 with world size 2, want 2\n%s", ran, c.stderrs())
	}
}
