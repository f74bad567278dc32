package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/ftlauncher/ft-launcher/state"
)

// peerHealResult is what testdata/peerheal_train.py writes per rank.
type peerHealResult struct {
	SHA256      string  `json:"sha256"`
	ResumedFrom *int    `json:"resumed_from"`
	Heal        *string `json:"heal"`
	Source      *string `json:"source"`
	FromRank    *int    `json:"from_rank"`
	HealMS      float64 `json:"heal_ms"`
	Bytes       int64   `json:"bytes"`
}

// TestTorchPeerHealInProcess: two real torch ranks, data-parallel
// replicas, in-process restarts, saving into launcher memory every 10
// steps. Rank 1 is SIGKILLed in the middle of step 25 (its gradients
// computed, before their all_reduce); rank 0, blocked in that all_reduce,
// stays in its process and rejoins. In the new round both call
// ctx.state.heal: they agree through the round's store that rank 0 holds
// step 24, and the replacement receives rank 0's live state over the new
// gloo group. Step 24 was never saved (saves at 9, 19, 29...): the state
// can only have come from the peer. Both end bit-identical to an
// uninterrupted run; the report shows round 1's restores as live and
// peer, and the failed round lost 1 step.
func TestTorchPeerHealInProcess(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	script, err := filepath.Abs("testdata/peerheal_train.py")
	if err != nil {
		t.Fatal(err)
	}
	const hold = 25
	run := func(j *job, out string, args ...string) int {
		return j.run(torchTimeout, []string{"PYTHON_EXEC=" + debianPython},
			append([]string{"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--restart-mode", "in-process",
				"--state-dir", filepath.Join(j.dir, "state"), "--state-persist-every", "0", script, "--out", out}, args...)...)
	}

	ref := newJob(t)
	refOut := filepath.Join(ref.dir, "out")
	mkdir(t, refOut)
	if code := run(ref, refOut); code != 0 {
		t.Fatalf("uninterrupted run: exit %d\n%s", code, ref.stderr.String())
	}

	j := newJob(t)
	out := filepath.Join(j.dir, "out")
	mkdir(t, out)
	j.start([]string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
		"--restart-mode", "in-process", "--state-dir", filepath.Join(j.dir, "state"), "--state-persist-every", "0",
		script, "--out", out, "--hold-rank", "1", "--hold-at-step", strconv.Itoa(hold))
	held := filepath.Join(out, "held")
	waitFile(t, held, torchTimeout)
	if err := syscall.Kill(readInt(t, held), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := j.wait(torchTimeout); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	if m := restartModes(j); len(m) != 1 || m[0] != "in-process" {
		t.Fatalf("restart modes %v, want one in-process restart\n%s", m, j.stderr.String())
	}
	read := func(dir string, r int) peerHealResult {
		var x peerHealResult
		readJSON(t, filepath.Join(dir, "rank-"+strconv.Itoa(r)+".json"), &x)
		return x
	}
	for r, want := range []struct{ source string }{{"live"}, {"peer"}} {
		got, refr := read(out, r), read(refOut, r)
		if got.SHA256 != refr.SHA256 {
			t.Errorf("rank %d: final weights %s differ from the uninterrupted run's %s", r, got.SHA256, refr.SHA256)
		}
		if got.Heal == nil || *got.Heal != "peer" || got.Source == nil || *got.Source != want.source ||
			got.ResumedFrom == nil || *got.ResumedFrom != hold-1 {
			t.Errorf("rank %d: heal %v from %v resumed from %v, want a peer heal (%s) of step %d",
				r, val(got.Heal), val(got.Source), val(got.ResumedFrom), want.source, hold-1)
		}
	}
	if got := read(out, 1); got.FromRank == nil || *got.FromRank != 0 || got.Bytes <= 0 {
		t.Errorf("the replacement received %d bytes from rank %v, want rank 0's state", got.Bytes, val(got.FromRank))
	}

	// The launcher recorded each heal (state_restore), and the report
	// shows where round 1's state came from and that the fault lost 1 step.
	var heals []map[string]any
	for _, e := range j.eventsOf(state.EventRestore) {
		if e["round"] == float64(1) {
			heals = append(heals, e)
		}
	}
	if len(heals) != 2 {
		t.Errorf("round 1's state_restore events %v, want one per rank", heals)
	}
	for _, e := range heals {
		want := map[float64]string{0: "live", 1: "peer"}[e["rank"].(float64)]
		if e["source"] != want || e["heal"] != "peer" || e["step"] != float64(hold-1) {
			t.Errorf("state_restore %v, want source %s, heal peer, step %d", e, want, hold-1)
		}
	}
	rep, _ := runReport(t, j.dir, "--event-log", j.events)
	if len(rep.Rounds) != 2 {
		t.Fatalf("report rounds %+v, want 2", rep.Rounds)
	}
	if got := rep.Rounds[1].RestoreSources(); got != "live ×1, peer ×1" {
		t.Errorf("round 1 restored from %q, want live ×1, peer ×1", got)
	}
	if sl := rep.Rounds[0].StepsLost; sl == nil || *sl != 1 {
		t.Errorf("round 0 lost %v steps, want 1 (the failed step)", val(sl))
	}
	if rep.State == nil || rep.State.Restores["peer"] != 1 {
		t.Errorf("report's state account %+v, want 1 restore from a peer", rep.State)
	}
	if t.Failed() {
		evs, _ := os.ReadFile(j.events)
		t.Logf("events:\n%s\nstderr:\n%s", evs, j.stderr.String())
	}
}

// val is a pointer's value, or nil, for messages.
func val[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// readJSON reads path into v or fails the test.
func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v: %s", path, err, strings.TrimSpace(string(b)))
	}
}
