package integration

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestHostileRankCannotDisableHangDetection: local rank 1 sends timeouts
// updates carrying 0, a negative value, null, NaN, inf or 1e300 (natively and
// as nvrx pickles) in every cycle while local rank 0 hangs. With a 3 s
// heartbeat timeout both hangs (cycle 0 and, after the restart, cycle 1)
// are still caught, long before the hung rank's own 3,600 s sleep.
func TestHostileRankCannotDisableHangDetection(t *testing.T) {
	skipShort(t)
	worker, err := filepath.Abs("testdata/hostile_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ proto, value string }{
		{"native", "zero"}, {"native", "negative"}, {"native", "null"}, {"native", "1e300"},
		{"nvrx", "zero"}, {"nvrx", "negative"}, {"nvrx", "null"}, {"nvrx", "nan"}, {"nvrx", "inf"}, {"nvrx", "1e300"},
	}
	for _, tc := range cases {
		t.Run(tc.proto+"-"+tc.value, func(t *testing.T) {
			t.Parallel()
			j := newJob(t)
			start := time.Now()
			code := j.run(3*time.Minute, []string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "2",
				"--max-restarts", "1", "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "3",
				worker, tc.proto, tc.value, filepath.Join(j.dir, "sent"))
			if code == 0 {
				t.Fatalf("exit 0, want a failure after two hangs\n%s", j.stderr.String())
			}
			hangs := j.eventsOf("rank_hang")
			if len(hangs) != 2 {
				t.Fatalf("rank_hang events %v, want one per cycle\n%s", hangs, j.stderr.String())
			}
			for _, h := range hangs {
				if h["timeout_kind"] != "heartbeat" || h["rank"] != float64(0) {
					t.Fatalf("rank_hang %v, want rank 0's heartbeat timeout", h)
				}
			}
			if took := time.Since(start); took > 100*time.Second {
				t.Fatalf("the job took %v: a hang went undetected for a long time", took)
			}
		})
	}
}

// TestSIGKILLedLauncherLeavesNoRankDescendants: each rank leaves a child in
// its process group, a setsid'd child and a double-forked daemon; after
// SIGKILL of the launcher none survives (its cgroup is killed by the
// guardian), and the next launcher removes the dead one's socket dir.
func TestSIGKILLedLauncherLeavesNoRankDescendants(t *testing.T) {
	skipShort(t)
	if os.Geteuid() != 0 {
		testenv.Missing(t, testenv.Cgroups, "running as uid "+strconv.Itoa(os.Geteuid())+": cgroups are writable only by root; without them a SIGKILLed launcher's setsid'd and double-forked descendants survive (docs/architecture.md)")
	}
	j := newJob(t)
	s := j.script("descendants.sh", `sleep 1000 &
setsid sleep 1000 &
sh -c 'sleep 1000 &'
touch "$READY.$LOCAL_RANK"
exec sleep 1000
`)
	ready := filepath.Join(j.dir, "ready")
	j.start([]string{"READY=" + ready}, "--standalone", "--nproc-per-node", "2", "--no-python", s)
	for r := 0; r < 2; r++ {
		waitFile(t, ready+"."+strconv.Itoa(r), 60*time.Second)
	}
	if n := len(j.leftovers()); n < 8 {
		t.Fatalf("%d processes of the job before the kill, want at least 8 (launcher, 2 ranks, 6 descendants)", n)
	}
	launcher := j.cmd.Process.Pid
	sockDirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "ftl-mon-"+strconv.Itoa(launcher)+"-*"))
	if len(sockDirs) != 1 {
		t.Fatalf("socket dirs of the launcher: %v, want 1", sockDirs)
	}
	_ = j.cmd.Process.Kill()
	<-j.done
	if left := j.waitNoLeftovers(20 * time.Second); len(left) > 0 {
		t.Fatalf("processes left after SIGKILL of the launcher:\n%s", hangdump.Describe(left))
	}
	// The next launcher removes the dead one's socket dir.
	j2 := newJob(t)
	if code := j2.run(time.Minute, nil, "--standalone", "--nproc-per-node", "1", "--no-python", "/bin/true"); code != 0 {
		t.Fatalf("second launcher exit %d\n%s", code, j2.stderr.String())
	}
	if _, err := os.Stat(sockDirs[0]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale socket dir %s not removed by the next launcher: %v", sockDirs[0], err)
	}
}

// vmRSS returns a process's resident set in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestHostileSectionNamesAndConnectionFlood: a rank opening and closing
// 100,000 distinct section names (nvrx pickles) grows the launcher by far
// less than the 215 MB this once cost, and is logged once; 2,000
// connections from a process that is not a rank are refused with a bounded
// number of log lines.
func TestHostileSectionNamesAndConnectionFlood(t *testing.T) {
	skipShort(t)
	worker, err := filepath.Abs("testdata/hostile_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t)
	out := filepath.Join(j.dir, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	j.start([]string{"PYTHON_EXEC=" + debianPython}, "--standalone", "--nproc-per-node", "1",
		"--ft-rank-heartbeat-timeout", "600", worker, "sections", "100000", out)
	waitFile(t, filepath.Join(out, "sock0"), 60*time.Second)
	before := vmRSS(t, j.cmd.Process.Pid)
	waitFile(t, filepath.Join(out, "done0"), 3*time.Minute)
	grew := vmRSS(t, j.cmd.Process.Pid) - before
	if grew > 64<<20 {
		t.Errorf("launcher RSS grew by %d MB for 100,000 section names", grew>>20)
	}
	sock, err := os.ReadFile(filepath.Join(out, "sock0"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 2000; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("unix", string(sock))
			if err != nil {
				return
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, _ = c.Read(make([]byte, 1)) // until the launcher closes it
		}()
	}
	wg.Wait()
	_ = j.cmd.Process.Signal(syscall.SIGTERM)
	j.wait(time.Minute)
	logs := j.stderr.String()
	t.Logf("RSS growth %d KB; refused-section lines %d; refused-connection lines %d",
		grew>>10, strings.Count(logs, "kind=section"), strings.Count(logs, "refusing"))
	if n := strings.Count(logs, "kind=section"); n != 1 {
		t.Errorf("refused section names logged %d times, want once", n)
	}
	if n := strings.Count(logs, "refusing"); n < 1 || n > 10 {
		t.Errorf("2,000 refused connections logged %d lines, want 1 to 10", n)
	}
}
