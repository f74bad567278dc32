package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
)

// prewarmGateModule is a --prewarm module that makes one standby's import
// last as long as the test wants: every standby sleeps $FTL_GATE_SLEEP
// seconds in it (so that the import the launcher measures, which bounds
// how long a restart waits for a standby, is long), then the standby of
// local rank $FTL_GATE_RANK writes $FTL_GATE_DIR/held-<pid> and waits
// until $FTL_GATE_DIR/open exists (at most 120 s).
const prewarmGateModule = `import os, time
time.sleep(float(os.environ["FTL_GATE_SLEEP"]))
if os.environ.get("LOCAL_RANK") == os.environ["FTL_GATE_RANK"]:
    _d = os.environ["FTL_GATE_DIR"]
    open(os.path.join(_d, "held-%d" % os.getpid()), "w").close()
    _end = time.monotonic() + 120
    while not os.path.exists(os.path.join(_d, "open")) and time.monotonic() < _end:
        time.sleep(0.02)
`

// prewarmHandshakeRank is a real torch rank under the rank monitor: it
// writes $OUT/connecting-<round>-<rank>, opens its monitor session (the
// handshake the peer check guards), writes its pid to
// $OUT/hs-<round>-<rank>, then trains: a gloo process group and steps of
// one all_reduce each, a heartbeat per step. In round 0 it then waits for
// $OUT/go and exits 1 (a crash, so the next round restarts it).
const prewarmHandshakeRank = `import os, time
from ft_launcher_client import RankMonitorClient
rnd, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
out = os.environ["OUT"]
open(os.path.join(out, "connecting-%s-%s" % (rnd, rank)), "w").close()
client = RankMonitorClient()
client.init_workload_monitoring()
with open(os.path.join(out, "hs-%s-%s" % (rnd, rank)), "w") as f:
    f.write(str(os.getpid()))
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
for step in range(5):
    client.start_section("step")
    t = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    assert t.item() == 3, t
    client.send_heartbeat()
    client.end_section("step")
with open(os.path.join(out, "trained-%s-%s" % (rnd, rank)), "w") as f:
    f.write(str(os.getpid()))
if rnd == "0":
    while not os.path.exists(os.path.join(out, "go")):
        time.sleep(0.02)
    os._exit(1)
client.shutdown_workload_monitoring()
`

// peerHold is how long the rank monitor holds a connection whose peer is
// not a registered rank (monitor's pendingPeerWait) before it refuses it.
const peerHold = 3 * time.Second

// TestPrewarmHandoverWhilePeerStandbyImports: a restart where one rank's
// standby is ready and its peer's still imports. The ready standby is
// handed its rank at once and that rank connects to its monitor while the
// launcher still waits (longer than the monitor's hold of an unknown peer)
// for the peer's standby. The rank must pass its handshake: the monitor
// learned its pid before the standby was released. Both ranks then train
// and the job ends after one restart.
func TestPrewarmHandoverWhilePeerStandbyImports(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	j := newJob(t)
	client, err := filepath.Abs(filepath.Join("..", "client", "python"))
	if err != nil {
		t.Fatal(err)
	}
	gate := filepath.Join(j.dir, "gate")
	if err := os.MkdirAll(gate, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(j.dir, "ftl_gate.py"), []byte(prewarmGateModule), 0o644); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(j.dir, "rank.py")
	if err := os.WriteFile(script, []byte(prewarmHandshakeRank), 0o644); err != nil {
		t.Fatal(err)
	}
	// The standbys' measured import (torch and 8 s of sleep) bounds the
	// wait for the held standby well above peerHold plus the margin below.
	j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir, "PYTHONPATH=" + client,
		"FTL_GATE_SLEEP=8", "FTL_GATE_RANK=1", "FTL_GATE_DIR=" + gate},
		"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--monitor-interval", "0.1",
		"--prewarm", torchModules+",ftl_gate", "--prewarm-importing", "wait", script)

	// Standby 0 is ready, standby 1 is held in its import: crash now.
	var ready int
	deadline := time.Now().Add(3 * time.Minute)
	for ready == 0 {
		if _, err := os.Stat(j.events); err != nil {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		for _, e := range j.eventsOf("prewarm_ready") {
			if e["local_rank"] == float64(0) {
				ready = int(e["pid"].(float64))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("standby 0 was not ready within 3m\n%s", j.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFile(t, filepath.Join(j.dir, "trained-0-1"), 3*time.Minute)
	var held []string
	for len(held) == 0 {
		held, _ = filepath.Glob(filepath.Join(gate, "held-*"))
		if time.Now().After(deadline) {
			t.Fatalf("standby 1 did not reach the gate within 3m\n%s", j.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	heldPID := readIntSuffix(t, held[0])
	if err := os.WriteFile(filepath.Join(j.dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// Round 1: rank 0 runs on its standby and connects while the launcher
	// waits for standby 1. Keep the gate shut past the monitor's hold of an
	// unknown peer (and a margin for the accept), then open it.
	waitFile(t, filepath.Join(j.dir, "connecting-1-0"), 2*time.Minute)
	time.Sleep(peerHold + 2*time.Second)
	if err := os.WriteFile(filepath.Join(gate, "open"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	code := j.wait(torchTimeout)
	stderr := j.stderr.String()
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if strings.Contains(stderr, "refusing peer") {
		t.Errorf("the rank monitor refused a peer:\n%s", stderr)
	}
	if n := len(j.eventsOf("restart")); n != 1 {
		t.Errorf("%d restart events, want 1 (the crash's)", n)
	}

	// The mixed case happened: rank 0 warm at once, rank 1 after a wait
	// longer than the monitor's hold of an unknown peer.
	if warm := j.warmRounds()["1"]; len(warm) != 2 {
		t.Errorf("round 1 started on standbys for local ranks %v, want both", warm)
	}
	var waited map[string]any
	for _, f := range j.eventsOf("prewarm_fallback") {
		if f["round"] != "1" {
			continue
		}
		if f["local_rank"] != float64(1) || f["path"] != "waited" {
			t.Errorf("round 1 fallback %v: want only local rank 1's, path waited", f)
			continue
		}
		waited = f
	}
	if waited == nil {
		t.Fatalf("no waited fallback for local rank 1 in round 1: %v", j.eventsOf("prewarm_fallback"))
	}
	if w, _ := waited["wait_ms"].(float64); w < float64((peerHold+time.Second)/time.Millisecond) {
		t.Errorf("round 1 waited %v ms for standby 1: the gate was shut for longer than %s", waited["wait_ms"], peerHold+time.Second)
	}

	// Every rank of round 1 passed its handshake in the standby's process
	// and trained.
	for lr, want := range []int{ready, heldPID} {
		r := fmt.Sprint(lr)
		if got := readInt(t, filepath.Join(j.dir, "hs-1-"+r)); got != want {
			t.Errorf("round 1 rank %s ran its handshake in pid %d, want its standby %d", r, got, want)
		}
		if got := readInt(t, filepath.Join(j.dir, "trained-1-"+r)); got != want {
			t.Errorf("round 1 rank %s trained in pid %d, want its standby %d", r, got, want)
		}
	}
	beats := map[float64]bool{}
	for _, e := range j.eventsOf("rank_first_heartbeat") {
		if fmt.Sprint(e["round"]) == "1" {
			beats[e["local_rank"].(float64)] = true
		}
	}
	if !beats[0] || !beats[1] {
		t.Errorf("round 1's monitors saw a first heartbeat from local ranks %v, want 0 and 1", beats)
	}
	if left := j.waitNoLeftovers(10 * time.Second); len(left) != 0 {
		t.Fatalf("processes left after the launcher exited:\n%s", hangdump.Describe(left))
	}
}
