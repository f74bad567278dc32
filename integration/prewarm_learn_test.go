package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// learnRank imports torch and ftl_learn_slow (a module nobody names that
// takes 1.5 s to import), writes $OUT/rec-<round>.json (its pid, whether
// the module was imported before its code ran: by its standby), then,
// up to round $LAST, trains for 2 s, writes $OUT/trained-<round> and
// trains on until it dies without running atexit: by os._exit(1)
// ($DEATH=exit) or by the test's SIGKILL ($DEATH=kill). Round 0 dies at
// once; round 1 waits for $OUT/go-1 first (its successor's standby is
// ready then). Round $LAST exits 0.
const learnRank = `import json, os, sys, time

pre = "ftl_learn_slow" in sys.modules
import torch
import ftl_learn_slow  # noqa: F401

rnd = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
out = os.environ["OUT"]
with open(os.path.join(out, "rec-%d.json.tmp" % rnd), "w") as f:
    json.dump({"pid": os.getpid(), "pre": pre}, f)
os.rename(os.path.join(out, "rec-%d.json.tmp" % rnd), os.path.join(out, "rec-%d.json" % rnd))
if rnd == int(os.environ["LAST"]):
    sys.exit(0)
torch.set_num_threads(1)
model = torch.nn.Linear(8, 1)
opt = torch.optim.Adam(model.parameters(), lr=0.01)


def step():
    loss = model(torch.randn(4, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()


t = time.monotonic()
while time.monotonic() - t < 2:
    step()
step()
open(os.path.join(out, "trained-%d" % rnd), "w").close()
while rnd > 0 and not os.path.exists(os.path.join(out, "go-%d" % rnd)):
    step()
    time.sleep(0.02)
if os.environ["DEATH"] == "exit":
    os._exit(1)
while True:
    step()
    time.sleep(0.02)
`

// TestPrewarmAutoLearnsFromACrashedRank: a rank that imports a module
// nobody names and dies 2 s after its imports without running atexit (by
// os._exit, or SIGKILLed from outside) still teaches --prewarm auto the
// module: the list learned after round 0's crash has it, before round 1
// ends; the standby started in round 1 imports it and round 2's rank
// runs on that standby with the module already imported.
func TestPrewarmAutoLearnsFromACrashedRank(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	for _, death := range []string{"exit", "kill"} {
		t.Run(death, func(t *testing.T) {
			j := newJob(t)
			script := filepath.Join(j.dir, "learn_rank.py")
			if err := os.WriteFile(script, []byte(learnRank), 0o644); err != nil {
				t.Fatal(err)
			}
			lib, err := filepath.Abs("testdata/prewarmauto")
			if err != nil {
				t.Fatal(err)
			}
			j.start([]string{"PYTHON_EXEC=" + debianPython, "OUT=" + j.dir, "XDG_STATE_HOME=" + filepath.Join(j.dir, "state"),
				"PYTHONPATH=" + lib, "LAST=2", "DEATH=" + death},
				"--standalone", "--nproc-per-node", "1", "--max-restarts", "2", "--prewarm", "auto", script)
			kill := func(round int) {
				waitFile(t, filepath.Join(j.dir, "trained-"+strconv.Itoa(round)), 2*time.Minute)
				if death != "kill" {
					return
				}
				var rec struct {
					PID int `json:"pid"`
				}
				b, err := os.ReadFile(filepath.Join(j.dir, "rec-"+strconv.Itoa(round)+".json"))
				if err == nil {
					err = json.Unmarshal(b, &rec)
				}
				if err != nil || rec.PID <= 0 {
					t.Fatalf("round %d record %s: %v", round, b, err)
				}
				if err := syscall.Kill(rec.PID, syscall.SIGKILL); err != nil {
					t.Fatalf("SIGKILL round %d's rank %d: %v", round, rec.PID, err)
				}
			}
			kill(0)
			// Learned from round 0's report while round 1 runs: round 1's
			// rank is alive until go-1, and its report is taken only when
			// round 2 starts.
			learned := waitLearned(t, j, "ftl_learn_slow", 2*time.Minute)
			waitStandbyWith(t, j, 2*time.Minute) // round 1's refill: round 2 starts on it
			if err := os.WriteFile(filepath.Join(j.dir, "go-1"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			kill(1)
			if code := j.wait(2 * time.Minute); code != 0 {
				t.Fatalf("exit %d\n%s", code, j.stderr.String())
			}
			if !slices.Contains(learned, "torch") {
				t.Errorf("learned after round 0 %v, want torch and ftl_learn_slow", learned)
			}
			var rec2 struct {
				PID int  `json:"pid"`
				Pre bool `json:"pre"`
			}
			b, err := os.ReadFile(filepath.Join(j.dir, "rec-2.json"))
			if err == nil {
				err = json.Unmarshal(b, &rec2)
			}
			if err != nil {
				t.Fatalf("round 2 record %s: %v", b, err)
			}
			imports, err := os.ReadFile(filepath.Join(j.dir, "slow-imports"))
			if err != nil {
				t.Fatal(err)
			}
			if !rec2.Pre || !strings.Contains(string(imports), strconv.Itoa(rec2.PID)+" standby\n") {
				t.Errorf("round 2's rank (pid %d) started with ftl_learn_slow imported: %v; imports of it:\n%s",
					rec2.PID, rec2.Pre, imports)
			}
			if got := j.warmRounds()["2"]; len(got) != 1 {
				t.Errorf("round 2 not started on a standby: %v", j.eventsOf("prewarm_fallback"))
			}
		})
	}
}

// waitLearned waits for a prewarm_learned event whose list has module and
// returns that list.
func waitLearned(t *testing.T, j *job, module string, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for n := 1; ; n++ {
		for _, e := range j.waitEvents("prewarm_learned", n, time.Until(deadline)) {
			var mods []string
			for _, m := range e["modules"].([]any) {
				mods = append(mods, m.(string))
			}
			if slices.Contains(mods, module) {
				return mods
			}
		}
	}
}

// waitStandbyWith waits until a standby imported ftl_learn_slow (it says so
// in $OUT/slow-imports) and is ready.
func waitStandbyWith(t *testing.T, j *job, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(j.dir, "slow-imports"))
		for _, line := range strings.Split(string(b), "\n") {
			pid, ok := strings.CutSuffix(line, " standby")
			if !ok {
				continue
			}
			for _, e := range j.eventsOf("prewarm_ready") {
				if strconv.FormatFloat(e["pid"].(float64), 'f', -1, 64) == pid {
					return
				}
			}
		}
		select {
		case <-j.done:
			t.Fatalf("launcher exited before a standby imported ftl_learn_slow\n%s", j.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("no standby imported ftl_learn_slow within %s\n%s", timeout, j.stderr.String())
}
