package prewarm

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestStandbyImportsAtLowPriority: a standby imports at nice 19, and the
// rank it becomes runs at the launcher's nice value, as a cold rank does.
// It needs the permission to raise a nice value (root here; CI runs as
// root); TestPriorityWithoutCapSysNice covers the launcher without it.
func TestStandbyImportsAtLowPriority(t *testing.T) {
	testenv.SkipShort(t, "starts Python standbys")
	testenv.Require(t, testenv.Root)
	r := newReaper(t)
	st, ev := newStarter(t, r, "json")
	if !st.prio.low {
		// Root without CAP_SYS_NICE (a container's default capabilities).
		testenv.Missing(t, testenv.Root, "with CAP_SYS_NICE: this process cannot raise a lowered nice value ("+st.prio.why+")")
	}
	base := t.TempDir()
	coldRec, _, _ := run(t, warm(st), filepath.Join(base, "1"), recordCase{})
	s := waitReady(t, st, 0)
	if !s.lowered {
		t.Fatal("the standby was not lowered")
	}
	tids, err := procfs.Threads(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, tid := range tids {
		if n, err := niceOf(tid); err != nil || n != standbyNice {
			t.Fatalf("standby thread %d: nice %d (%v), want %d", tid, n, err, standbyNice)
		}
	}
	warmRec, _, _ := run(t, warm(st), filepath.Join(base, "2"), recordCase{})
	if n := len(ev.of(EventWarm)); n != 1 {
		t.Fatalf("%d warm starts, want 1: %v", n, ev.got)
	}
	if warmRec["nice"] != coldRec["nice"] || int(warmRec["nice"].(float64)) != st.prio.base {
		t.Fatalf("nice: warm rank %v, cold rank %v, launcher %d", warmRec["nice"], coldRec["nice"], st.prio.base)
	}
}

// TestSetNiceAll sets every thread of a process with several threads.
func TestSetNiceAll(t *testing.T) {
	testenv.SkipShort(t, "starts Python")
	cmd := exec.Command(python, "-c", `
import sys, threading
ev = threading.Event()
for _ in range(3):
    threading.Thread(target=ev.wait, daemon=True).start()
print("up", flush=True)
sys.stdin.read()
`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); _ = cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "up\n" {
		t.Fatalf("child: %q %v", line, err)
	}
	if err := setNiceAll(cmd.Process.Pid, 7); err != nil {
		t.Fatal(err)
	}
	tids, err := procfs.Threads(cmd.Process.Pid)
	if err != nil || len(tids) != 4 {
		t.Fatalf("threads %v %v, want 4", tids, err)
	}
	for _, tid := range tids {
		if n, err := niceOf(tid); err != nil || n != 7 {
			t.Fatalf("thread %d: nice %d %v, want 7", tid, n, err)
		}
	}
	if err := setNiceAll(1<<22+12345, 7); err == nil {
		t.Fatal("setNiceAll of a process that does not exist: no error")
	}
}

// TestPriorityWithoutCapSysNice runs this test binary again without
// CAP_SYS_NICE (setpriv; RLIMIT_NICE stays 0): the launcher cannot raise
// a lowered thread, so its standbys import at its own priority and the
// warm rank runs at it.
func TestPriorityWithoutCapSysNice(t *testing.T) {
	if os.Getenv("FTL_PRIO_CHILD") == "1" {
		priorityChild(t)
		return
	}
	testenv.SkipShort(t, "starts Python standbys")
	testenv.Require(t, testenv.Root) // to drop CAP_SYS_NICE from a process that has it
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux): %v", err)
	}
	res := filepath.Join(t.TempDir(), "result.json")
	cmd := exec.Command(setpriv, "--inh-caps=-sys_nice", "--bounding-set=-sys_nice",
		os.Args[0], "-test.run=^TestPriorityWithoutCapSysNice$", "-test.v")
	cmd.Env = append(os.Environ(), "FTL_PRIO_CHILD=1", "FTL_PRIO_RESULT="+res)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	b, err := os.ReadFile(res)
	if err != nil {
		t.Fatalf("child wrote no result: %v\n%s", err, out)
	}
	var got struct {
		Low       bool
		Why       string
		Lowered   bool
		Nice      int
		WarmNice  int
		WarmStart int
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Low || !strings.Contains(got.Why, "CAP_SYS_NICE") {
		t.Errorf("probe without CAP_SYS_NICE: low %v, why %q; want not low, naming CAP_SYS_NICE", got.Low, got.Why)
	}
	if got.Lowered || got.Nice != 0 {
		t.Errorf("standby: lowered %v, nice %d; want its launcher's 0", got.Lowered, got.Nice)
	}
	if got.WarmStart != 1 || got.WarmNice != 0 {
		t.Errorf("warm starts %d, warm rank nice %d; want 1 and 0", got.WarmStart, got.WarmNice)
	}
}

func priorityChild(t *testing.T) {
	r := newReaper(t)
	st, ev := newStarter(t, r, "json")
	base := t.TempDir()
	run(t, warm(st), filepath.Join(base, "1"), recordCase{})
	s := waitReady(t, st, 0)
	nice, err := niceOf(s.pid)
	if err != nil {
		t.Fatal(err)
	}
	rec, _, _ := run(t, warm(st), filepath.Join(base, "2"), recordCase{})
	b, err := json.Marshal(map[string]any{"Low": st.prio.low, "Why": st.prio.why, "Lowered": s.lowered,
		"Nice": nice, "WarmNice": int(rec["nice"].(float64)), "WarmStart": len(ev.of(EventWarm))})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(os.Getenv("FTL_PRIO_RESULT"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}
