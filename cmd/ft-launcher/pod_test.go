package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/ftclient"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestTerminationLogInPod runs the real ft-launcher binary as a pod's
// container command would (KUBERNETES_SERVICE_HOST set, an Indexed Job's
// index and host name) with --termination-log in a temporary directory: the
// termination message it leaves is the verdict, as verdict.Parse reads it,
// on the ranks' end and on a failed set-up alike. A rank's own exit code 93
// is a failure like any other; the no-restart verdict (exit 93) comes from
// a rank's ShutdownWorkload request, made here by this test binary run as
// the rank (see TestMain).
func TestTerminationLogInPod(t *testing.T) {
	if testing.Short() {
		// Not an environment skip: -short leaves out the slower tests.
		t.Skip("-short: builds the launcher")
	}
	bin := filepath.Join(t.TempDir(), "ft-launcher")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	closed := "127.0.0.1:" + strconv.Itoa(closedPort(t))
	tests := []struct {
		name  string
		args  []string
		env   []string
		code  int
		kinds []verdict.Kind
	}{
		{"a rank asks for no restart", []string{"--max-restarts", "2", "--no-python", os.Args[0], "-test.run=^$"},
			[]string{"FTL_TEST_RANK_ACTION=ShutdownWorkload"}, 93, []verdict.Kind{verdict.NoRestart}},
		{"a rank fails", []string{"--no-python", "/bin/sh", "-c", "exit 3"}, nil, 1, []verdict.Kind{verdict.RestartBudgetExhausted}},
		{"the rendezvous cannot be set up", []string{"--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", closed,
			"--rdzv-conf", "connect_timeout=0.2", "--no-python", "/bin/true"}, nil, 1, []verdict.Kind{verdict.RendezvousLost, verdict.FatalError}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			termLog := filepath.Join(dir, "termination-log")
			// The kubelet creates the file before the container starts.
			if err := os.WriteFile(termLog, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			vfile := filepath.Join(dir, "verdict.json")
			args := append([]string{"--termination-log", termLog, "--verdict-file", vfile, "--log-dir", filepath.Join(dir, "logs")}, tt.args...)
			cmd := exec.Command(bin, args...)
			cmd.Env = append(podlessEnviron(), "TMPDIR="+dir, "KUBERNETES_SERVICE_HOST=10.96.0.1",
				"HOSTNAME=train-0", "JOB_COMPLETION_INDEX=0")
			cmd.Env = append(cmd.Env, tt.env...)
			out, err := cmd.CombinedOutput()
			if ee := (*exec.ExitError)(nil); err != nil && !errors.As(err, &ee) {
				t.Fatal(err)
			}
			if code := cmd.ProcessState.ExitCode(); code != tt.code {
				t.Fatalf("exit %d, want %d\n%s", code, tt.code, out)
			}
			b, err := os.ReadFile(termLog)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) == 0 || len(b) > verdict.TerminationMessageLimit {
				t.Fatalf("termination log of %d bytes, want 1 to %d\n%s", len(b), verdict.TerminationMessageLimit, out)
			}
			msg, err := verdict.Parse(b)
			if err != nil {
				t.Fatalf("termination log: %v\n%s", err, b)
			}
			file, err := verdict.Read(vfile)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(tt.kinds, msg.Kind) || msg.ExitCode != tt.code || msg.RunID != "train" ||
				msg.Kind != file.Kind || msg.Reason != file.Reason || !msg.EndedAt.Equal(file.EndedAt) {
				t.Errorf("termination message %+v\nverdict file %+v\nwant kind %v, exit %d, run id train (the Indexed Job's name)", msg, file, tt.kinds, tt.code)
			}
		})
	}
}

// podlessEnviron is this process's environment without the variables of a
// scheduler or a launch line, so that only the test's own count.
func podlessEnviron() []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "SLURM_") || strings.HasPrefix(name, "PET_") || strings.HasPrefix(name, "FTL_") ||
			strings.HasPrefix(name, "FT_LAUNCHER_") || strings.HasPrefix(name, "KUBERNETES_") || strings.HasPrefix(name, "JOB") ||
			name == "HOSTNAME" || name == "TMPDIR" {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// TestMain runs this test binary as a rank when FTL_TEST_RANK_ACTION is
// set (TestTerminationLogInPod starts it under the launcher): a helper
// process, not a test, so it never shows as a skipped test.
func TestMain(m *testing.M) {
	if action := os.Getenv("FTL_TEST_RANK_ACTION"); action != "" {
		rankAsks(action)
	}
	os.Exit(m.Run())
}

// rankAsks is the rank: it asks the launcher to shut the workload down,
// as an nvrx rank's ShutdownWorkload does, and waits to be stopped.
func rankAsks(action string) {
	signal.Reset() // the launcher's early signal catcher is linked in: die by SIGTERM like a rank
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ftclient.RequestWorkloadAction(ctx, "", rank, action, "loss is NaN"); err != nil {
		fmt.Fprintln(os.Stderr, "rank:", err)
		os.Exit(5)
	}
	time.Sleep(time.Minute) // until the launcher stops the ranks
	os.Exit(6)
}

// TestReadHead: the launcher reads /etc/hosts through readHead, bounded.
func TestReadHead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts")
	content := "127.0.0.1\tlocalhost\n10.0.2.3\ttrain-3.train.ns.svc.cluster.local\ttrain-3\n"
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		limit int64
		want  string
	}{{1 << 20, content}, {9, "127.0.0.1"}} {
		if b, err := readHead(path, tt.limit); err != nil || string(b) != tt.want {
			t.Errorf("readHead(limit %d) = %q, %v; want %q", tt.limit, b, err, tt.want)
		}
	}
	if _, err := readHead(filepath.Join(t.TempDir(), "missing"), 10); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}
