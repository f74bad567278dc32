package hangdump

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// testdata/goroutines.txt is the real SIGABRT dump (GOTRACEBACK=all) of a
// small main package with one goroutine blocked on a sync.Mutex and one on
// a channel receive.
func TestGoroutines(t *testing.T) {
	dump, err := os.ReadFile("testdata/goroutines.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, out string
		want      []string
		absent    []string
	}{
		{"one dump", string(dump),
			[]string{"1× [chan receive] main.main.func2", "1× [sync.Mutex.Lock] main.main.func1", "1× [sleep] main.main"},
			[]string{"forcegchelper", "GC sweep wait"}},
		{"two dumps, lines interleaved", interleave(string(dump), string(dump)),
			[]string{"2× [chan receive] main.main.func2", "2× [sleep] main.main"}, nil},
		{"no dump", "time=... level=INFO msg=hello\n",
			[]string{"no goroutine dump"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Goroutines(tc.out)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("summary lacks %q:\n%s", w, got)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(got, a) {
					t.Errorf("summary names runtime goroutine %q:\n%s", a, got)
				}
			}
		})
	}
}

// interleave alternates a's and b's goroutine blocks, as two launchers
// writing to one srun output do.
func interleave(a, b string) string {
	ab, bb := strings.Split(a, "\n\n"), strings.Split(b, "\n\n")
	var out []string
	for i := range ab {
		out = append(out, ab[i], bb[i])
	}
	return strings.Join(out, "\n\n")
}

// A real Python with faulthandler on SIGABRT, found and described by its
// environment (with the zombie child it never waited for), aborted by
// Abort: its threads' tracebacks are extracted.
func TestAbortPythonPrintsTracebacks(t *testing.T) {
	testenv.SkipShort(t, "runs Debian's python3")
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		t.Fatalf("%s: %v (scripts/deps.sh installs it)", py, err)
	}
	marker := "HANGDUMP_TEST=" + strconv.FormatInt(time.Now().UnixNano(), 10)
	cmd := exec.Command(py, "-c", "import os, sys, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(0.2)\nsys.stdout.write('up\\n'); sys.stdout.flush()\ndef parked():\n    time.sleep(60)\nparked()\n")
	cmd.Env = append(append(os.Environ(), marker), Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	buf := make([]byte, 3)
	if _, err := stdout.Read(buf); err != nil {
		t.Fatal(err)
	}
	pids := PIDs(marker)
	if len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("PIDs(%s) = %v, want [%d]", marker, pids, cmd.Process.Pid)
	}
	desc := Describe(pids)
	if !strings.Contains(desc, strconv.Itoa(cmd.Process.Pid)+" ppid="+strconv.Itoa(os.Getpid())) || !strings.Contains(desc, "python3 -c") {
		t.Errorf("Describe: %s", desc)
	}
	if !strings.Contains(desc, "ppid="+strconv.Itoa(cmd.Process.Pid)+" Z ") {
		t.Errorf("Describe does not list the unreaped child:\n%s", desc)
	}
	Abort(pids)
	_ = cmd.Wait()
	got := Python(stderr.String())
	if !strings.Contains(got, "Current thread 0x") || !strings.Contains(got, "in parked") {
		t.Errorf("tracebacks:\n%s\nfrom stderr:\n%s", got, stderr.String())
	}
	if left := PIDs(marker); len(left) != 0 {
		t.Errorf("processes left: %v", left)
	}
}
