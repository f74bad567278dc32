package resumer

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"context"
)

// TestMain runs JobScript in a child process when asked: it makes its
// process a child subreaper and reaps every child, which must not happen
// to the test binary itself.
func TestMain(m *testing.M) {
	if dir := os.Getenv("FT_SLURM_TEST_JOBSCRIPT"); dir != "" {
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, ForwardedSignals...)
		js := JobScript{Argv: []string{"/bin/bash", filepath.Join(dir, "job.sh")}, JobDir: dir, Log: os.Stderr, RepeatWindow: 2 * time.Second}
		fmt.Fprintln(os.Stdout, "ready")
		rc, err := js.Run(context.Background(), sigs)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(rc)
	}
	os.Exit(m.Run())
}

// startJobScript runs body as the job script under JobScript in a child
// process and waits until the script has written dir/started.
func startJobScript(t *testing.T, body string) (dir string, cmd *exec.Cmd, wait func() (int, time.Duration)) {
	t.Helper()
	dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "job.sh"), []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cmd = exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "FT_SLURM_TEST_JOBSCRIPT="+dir)
	// A file, not a pipe: a process the script leaves behind keeps a pipe
	// open, and reading it would wait for that process.
	logf, err := os.Create(filepath.Join(dir, "out.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	out := func() string { return readOr(logf.Name()) }
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() {
		_ = cmd.Wait()
		done <- cmd.ProcessState.ExitCode()
	}()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		// The script's own group (its pid) too: it left the runner's.
		if b, err := os.ReadFile(filepath.Join(dir, "pgid")); err == nil {
			var pg int
			if _, err := fmt.Sscan(string(b), &pg); err == nil && pg > 1 {
				_ = syscall.Kill(-pg, syscall.SIGKILL)
			}
		}
		select {
		case c := <-done:
			done <- c
		case <-time.After(10 * time.Second):
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the job script did not start:\n%s", out())
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	wait = func() (int, time.Duration) {
		select {
		case c := <-done:
			done <- c
			return c, time.Since(start)
		case <-time.After(60 * time.Second):
			t.Fatalf("step run did not end:\n%s", out())
			return 0, 0
		}
	}
	return dir, cmd, wait
}

const scriptHead = `echo $$ > "$(dirname "$0")/pgid"
d="$(dirname "$0")"
`

func TestJobScriptForwardsAndRecordsWarnings(t *testing.T) {
	// The script traps USR1 like a NeMo batch script: it must get it (once,
	// although it was sent twice within the repeat window) and the warning
	// must be recorded for the judgement.
	dir, cmd, wait := startJobScript(t, scriptHead+`n=0
trap 'n=$((n+1)); echo $n > "$d/usr1"' USR1
trap 'exit 7' TERM
touch "$d/started"
while :; do sleep 0.05; done
`)
	for i := 0; i < 2; i++ {
		if err := cmd.Process.Signal(syscall.SIGUSR1); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if rc, _ := wait(); rc != 7 {
		t.Errorf("step run exited %d, want the script's 7", rc)
	}
	if got := strings.TrimSpace(readOr(filepath.Join(dir, "usr1"))); got != "1" {
		t.Errorf("the script trapped USR1 %q times, want 1 (a repeat within 2 s is not forwarded)", got)
	}
	if got := readWarning(dir); got != "USR1" {
		t.Errorf("recorded warning %q, want USR1", got)
	}
	if rec := readOr(filepath.Join(dir, WarningFile)); strings.Count(rec, "\n") != 2 || !strings.Contains(rec, "TERM ") {
		t.Errorf("warning record %q, want USR1 then TERM", rec)
	}
}

func TestJobScriptWaitsForStepsAfterAWarning(t *testing.T) {
	// The script itself dies of the warning (no trap), while the process
	// it started (an srun forwarding to a launcher) needs a second to save:
	// step run must not return before that process is done.
	dir, cmd, wait := startJobScript(t, scriptHead+`( trap 'sleep 1; echo saved > "$d/saved"; exit 0' USR2; touch "$d/started"; while :; do sleep 0.05; done ) &
wait
`)
	if err := cmd.Process.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	rc, _ := wait()
	if rc != 128+int(syscall.SIGUSR2) {
		t.Errorf("step run exited %d, want %d (the script died of SIGUSR2)", rc, 128+int(syscall.SIGUSR2))
	}
	if got := strings.TrimSpace(readOr(filepath.Join(dir, "saved"))); got != "saved" {
		t.Errorf("step run returned before the script's child finished saving (saved=%q)", got)
	}
}

func TestJobScriptWithoutWarningDoesNotWaitForOrphans(t *testing.T) {
	// Without a warning, the script's end is the job's end, as in a plain
	// batch script: a background process it left must not hold the job.
	dir, _, wait := startJobScript(t, scriptHead+`sleep 300 &
echo $! > "$d/orphan"
touch "$d/started"
exit 3
`)
	rc, took := wait()
	if rc != 3 {
		t.Errorf("step run exited %d, want 3", rc)
	}
	if took > 20*time.Second {
		t.Errorf("step run took %v: it waited for the orphan", took)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "orphan")); err == nil {
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func readOr(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}
