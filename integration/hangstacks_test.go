package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// hangCulprit is the rank that hangs in round r of a job of world ranks,
// as testdata/hang_kinds_worker.py picks it.
func hangCulprit(r, world int) int {
	per := max(world/4, 1)
	return ([]int{1, 2, 3, 0}[r%4]*per + (r/4)%per) % world
}

// hangKindWants is what the finding says of each kind's culprit.
var hangKindWants = map[string]string{
	"lock":       "hung: in hang_kinds_worker.py:",
	"fifo":       "hung: in hang_kinds_worker.py:",
	"stop":       "hung: stopped by a signal (SIGSTOP)",
	"collective": "hung: in all_reduce at hang_kinds_worker.py:",
}

// TestHangCulpritTwoNodes: two launchers, two torch ranks each; in each
// round one rank hangs in one of four ways (a deadlocked lock, a read on
// a FIFO, SIGSTOP, a collective its peer never joins), on either node,
// while the others wait for it in an all_reduce. Each time both nodes
// take their ranks' stacks before any kill, share them, name the same
// rank, and the restart reason names it and groups the others. With
// FTL_HANG_CAMPAIGN=N the kinds repeat N times (the culprit moves over
// the four ranks) and the test logs how often each kind's culprit was
// right (docs/benchmarks.md, "Which rank hung").
func TestHangCulpritTwoNodes(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	kinds := []string{"lock", "fifo", "stop", "collective"}
	reps := 1
	if n, err := strconv.Atoi(os.Getenv("FTL_HANG_CAMPAIGN")); err == nil && n > 0 {
		reps = n
	}
	var rounds []string
	for range reps {
		rounds = append(rounds, kinds...)
	}
	worker, err := filepath.Abs("testdata/hang_kinds_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	nproc := 2
	if n, err := strconv.Atoi(os.Getenv("FTL_HANG_NPROC")); err == nil && n >= 2 {
		nproc = n
	}
	c := newCluster(t, embeddedEndpoint(t))
	for range 2 {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2", "--nproc-per-node", strconv.Itoa(nproc),
			"--max-restarts", strconv.Itoa(len(rounds)), "--rdzv-backend", "c10d",
			"--ft-initial-rank-heartbeat-timeout", "300", "--ft-rank-heartbeat-timeout", "2", "--ft-calculate-timeouts", "false",
			worker, strings.Join(rounds, ","))
	}
	timeout := time.Duration(len(rounds))*40*time.Second + torchTimeout
	for i, code := range c.waitAll(timeout) {
		if code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	right := map[string]int{}
	var took []float64 // each node's first expiry to its finding, stacks and exchange
	for r, kind := range rounds {
		culprit := hangCulprit(r, 2*nproc)
		ok := true
		var texts []string
		for i, n := range c.nodes {
			var found map[string]any
			for _, e := range n.eventsOf("rank_stacks") {
				if e["round"] == float64(r) {
					found = e
				}
			}
			if found == nil {
				t.Errorf("round %d (%s, culprit %d): node %d took no stacks", r, kind, culprit, i)
				ok = false
				continue
			}
			text := fmt.Sprint(found["text"])
			texts = append(texts, text)
			if found["known"] != true || fmt.Sprint(found["culprits"]) != fmt.Sprintf("[%d]", culprit) ||
				!strings.Contains(text, fmt.Sprintf("rank %d %s", culprit, hangKindWants[kind])) {
				t.Logf("round %d (%s, culprit %d): node %d found %v", r, kind, culprit, i, found)
				ok = false
			}
			tm, _ := found["took_ms"].(float64)
			took = append(took, tm)
			// The bound is 1 s (contexts); 10 s only catches a wait
			// that is not bounded, on a machine at any load.
			if tm > 10000 {
				t.Errorf("round %d: node %d took %.0f ms for the stacks, bound 1 s", r, i, tm)
			}
		}
		if ok && len(texts) == 2 && texts[0] != texts[1] {
			t.Logf("round %d: the nodes' findings differ: %q / %q", r, texts[0], texts[1])
			ok = false
		}
		var reason string
		for _, e := range c.nodes[0].eventsOf("restart") {
			if e["after_round"] == float64(r) {
				reason = fmt.Sprint(e["reason"])
			}
		}
		if !strings.Contains(reason, fmt.Sprintf("rank %d hung", culprit)) {
			t.Logf("round %d (%s, culprit %d): restart reason %q", r, kind, culprit, reason)
			ok = false
		}
		if ok {
			right[kind]++
		}
	}
	slices.Sort(took)
	if len(took) > 0 {
		t.Logf("%d ranks on 2 nodes: stacks taken and judged job-wide in %.1f ms median, %.1f ms worst (%d judgements)",
			2*nproc, took[len(took)/2], took[len(took)-1], len(took))
	}
	for _, kind := range kinds {
		t.Logf("%s: culprit named %d of %d", kind, right[kind], reps)
		if right[kind]*10 < reps*9 {
			t.Errorf("%s: culprit named %d of %d times, want at least 9 in 10\n%s", kind, right[kind], reps, c.stderrs())
		}
	}
}

// TestHangFlightRecorder: with torch's flight recorder on
// (TORCH_NCCL_TRACE_BUFFER_SIZE), each rank's recorder is taken with its
// stacks at a hang, written beside its logs and read into the event: the
// culprit, stuck in a collective of its own, is one all_reduce behind its
// peers. This torch has no NCCL and this machine no GPU: the ranks stand
// torch's _dump_nccl_trace in by a function returning a pickle of the
// same shape (hang_kinds_worker.py); the launcher's side is real.
func TestHangFlightRecorder(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	worker, err := filepath.Abs("testdata/hang_kinds_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, embeddedEndpoint(t))
	for range 2 {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython, "TORCH_NCCL_TRACE_BUFFER_SIZE=2000", "FTL_FAKE_FLIGHT_RECORDER=1"},
			"--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "1", "--rdzv-backend", "c10d",
			"--ft-initial-rank-heartbeat-timeout", "300", "--ft-rank-heartbeat-timeout", "2", "--ft-calculate-timeouts", "false",
			worker, "collective")
	}
	for i, code := range c.waitAll(40*time.Second + torchTimeout) {
		if code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
	}
	culprit := hangCulprit(0, 4)
	ranks := 0
	for i, n := range c.nodes {
		evs := n.eventsOf("rank_stacks")
		if len(evs) == 0 {
			t.Fatalf("node %d took no stacks\n%s", i, c.stderrs())
		}
		// The finding's groups read each rank's collective too.
		if text, _ := evs[0]["text"].(string); evs[0]["known"] != true ||
			!strings.Contains(text, fmt.Sprintf("rank %d hung: ", culprit)) || !strings.Contains(text, "(nccl:all_reduce #20)") ||
			!strings.Contains(text, "(nccl:all_reduce #21)") {
			t.Errorf("node %d: finding %v %q, want rank %d hung, its collective #20 and its peers' #21", i, evs[0]["known"], text, culprit)
		}
		for _, rr := range evs[0]["ranks"].([]any) {
			r := rr.(map[string]any)
			rank := int(r["rank"].(float64))
			ranks++
			want := "in nccl:all_reduce #21 (group 0 default_pg) started"
			if rank == culprit {
				want = "in nccl:all_reduce #20 (group 0 default_pg) started"
			}
			if r["flight_recorder"] != "taken" || r["flight_recorder_text"] != want {
				t.Errorf("rank %d: flight recorder %v %q, want taken %q", rank, r["flight_recorder"], r["flight_recorder_text"], want)
				continue
			}
			file, _ := r["flight_recorder_file"].(string)
			stacksFile, _ := r["file"].(string)
			if filepath.Dir(file) != filepath.Dir(stacksFile) || filepath.Base(file) != "flight_recorder.pkl" {
				t.Errorf("rank %d: flight recorder file %q, want flight_recorder.pkl beside %q", rank, file, stacksFile)
				continue
			}
			b, err := os.ReadFile(file)
			if err != nil || len(b) == 0 {
				t.Errorf("rank %d: %s: %d bytes, %v", rank, file, len(b), err)
			}
			st, _ := os.ReadFile(stacksFile)
			if !strings.Contains(string(st), "# NCCL flight recorder (flight_recorder.pkl): "+want) {
				t.Errorf("rank %d: the stacks file does not name the flight recorder:\n%s", rank, st)
			}
		}
	}
	if ranks != 4 {
		t.Errorf("the nodes' rank_stacks listed %d ranks, want 4", ranks)
	}
}
