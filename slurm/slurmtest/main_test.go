package slurmtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/internal/runclock"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// The cluster and binaries shared by the tests of this package: one private
// Slurm cluster per test binary (started in TestMain, stopped exactly).
var (
	cluster    *Cluster
	startErr   error
	binDir     string
	repoRoot   string
	clientPath string // client/python, for PYTHONPATH
)

// skipShort skips every test of this package under -short: each one needs
// the real Slurm cluster TestMain starts (docs/testing.md, "The fast lane").
func skipShort(t *testing.T) {
	t.Helper()
	testenv.SkipShort(t, "runs a real Slurm cluster")
}

func TestMain(m *testing.M) {
	flag.Parse()
	allParallelTestsAtOnce()
	if testing.Short() {
		os.Exit(m.Run()) // every test skips: no binaries, no cluster
	}
	code := func() int {
		var err error
		if repoRoot, err = filepath.Abs("../.."); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		clientPath = filepath.Join(repoRoot, "client", "python")
		if binDir, err = os.MkdirTemp("", "ftr-slurmtest-bin-"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(binDir)
		build := exec.Command("go", "build", "-o", binDir+"/", "./cmd/ft-resumer", "./cmd/ft-launcher", "./cmd/ft-launcher-etcd")
		build.Dir = repoRoot
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build:", err)
			return 1
		}
		ctx, cancel := runclock.WithTimeout(context.Background(), 5*time.Minute)
		cluster, startErr = Start(ctx, "", Options{Keep: os.Getenv("SLURMTEST_KEEP") != ""})
		cancel()
		if startErr != nil && !errors.Is(startErr, ErrUnavailable) {
			fmt.Fprintln(os.Stderr, "FAIL: slurm cluster:", startErr)
			return 1
		}
		code := m.Run()
		if cluster != nil {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "FAIL: stopping the slurm cluster:", err)
				code = 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// allParallelTestsAtOnce lets every test of this package that calls
// t.Parallel run at the same time. Those are the walltime tests, which wait
// out a one-minute Slurm time limit, and TestWarningSignal's two cases,
// which wait for Slurm's warning (their ranks asleep, one CPU of the
// cluster's twelve per job): go test's default, -parallel GOMAXPROCS, would
// run only two at a time on the 2-core CI machine, the others waiting their
// turn. The sequential tests are not affected; an explicit -parallel still
// wins.
func allParallelTestsAtOnce() {
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", "8"); err != nil {
			panic(fmt.Sprintf("slurmtest: set -test.parallel: %v", err))
		}
	}
}

// need ends the test when Slurm is not installed or this is not root: a
// skip, or a failure under CI (internal/testenv).
func need(t *testing.T) *Cluster {
	t.Helper()
	if errors.Is(startErr, ErrUnavailable) {
		testenv.Missing(t, testenv.Slurm, startErr.Error())
	}
	if cluster == nil {
		t.Fatal("no cluster")
	}
	return cluster
}

// chain is one ft-resumer chain under test.
type chain struct {
	t      *testing.T
	c      *Cluster
	dir    string
	marker string // TEST_CHAIN_MARKER in every process of its jobs
}

func newChain(t *testing.T, c *Cluster) *chain {
	t.Helper()
	ch := &chain{t: t, c: c, dir: filepath.Join(t.TempDir(), "chain"),
		marker: fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "_"), time.Now().UnixNano())}
	t.Cleanup(ch.cleanup)
	return ch
}

func (ch *chain) env() []string {
	return append(append(ch.c.Env(), "TEST_CHAIN_MARKER="+ch.marker, "PATH="+binDir+":"+os.Getenv("PATH"),
		"PYTHONPATH="+clientPath), hangdump.Env...)
}

// resumer runs ft-resumer to completion.
func (ch *chain) resumer(ctx context.Context, args ...string) (int, string, string) {
	ch.t.Helper()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "ft-resumer"), args...)
	cmd.Env = ch.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		ch.t.Fatalf("ft-resumer %v did not end in time (%v)\n%s\nits stderr:\n%s\n%s", args, err,
			hungReport("TEST_CHAIN_MARKER="+ch.marker, ch.logs), stderr.String(), ch.logs())
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		ch.t.Fatalf("ft-resumer %v: %v", args, err)
	}
	return code, stdout.String(), stderr.String()
}

// hungReport describes the processes whose environment holds kv (a job
// that should have ended): each process, then, in short, the stacks its
// launchers and ranks print on SIGABRT (hangdump.Env is in the jobs'
// environment) as found in output() once srun has forwarded them.
func hungReport(kv string, output func() string) string {
	pids := hangdump.PIDs(kv)
	procs := hangdump.Describe(pids)
	hangdump.Abort(pids)
	time.Sleep(2 * time.Second)
	out := output()
	return fmt.Sprintf("processes of the job:\n%s\nthe launchers' goroutines:\n%s\nthe ranks' Python threads:\n%s",
		procs, hangdump.Goroutines(out), hangdump.Python(out))
}

// startResumer starts ft-resumer in the background.
func (ch *chain) startResumer(args ...string) (*exec.Cmd, *bytes.Buffer) {
	ch.t.Helper()
	cmd := exec.Command(filepath.Join(binDir, "ft-resumer"), args...)
	cmd.Env = ch.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		ch.t.Fatal(err)
	}
	return cmd, &out
}

// waitRun waits for a background ft-resumer run (startResumer) to exit 0
// before ctx ends.
func (ch *chain) waitRun(ctx context.Context, cmd *exec.Cmd, out *bytes.Buffer) {
	ch.t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			ch.t.Fatalf("ft-resumer run: %v\n%s", err, out)
		}
	case <-ctx.Done():
		ch.t.Fatalf("the chain did not end\n%s\n%s", out, ch.logs())
	}
}

// script writes the user's batch script into the test's directory.
func (ch *chain) script(body string) string {
	ch.t.Helper()
	p := filepath.Join(filepath.Dir(ch.dir), "job.sh")
	full := "#!/bin/bash\n#SBATCH -o " + filepath.Join(filepath.Dir(ch.dir), "slurm-%j.out") + "\n" + body
	if err := os.WriteFile(p, []byte(full), 0o755); err != nil {
		ch.t.Fatal(err)
	}
	return p
}

func (ch *chain) state() *resumer.State {
	ch.t.Helper()
	st, err := resumer.LoadState(ch.dir)
	if err != nil {
		ch.t.Fatal(err)
	}
	return st
}

func (ch *chain) status(ctx context.Context) resumer.StatusView {
	ch.t.Helper()
	code, out, errOut := ch.resumer(ctx, "status", "--chain-dir", ch.dir, "--json")
	if code != 0 {
		ch.t.Fatalf("status: %d %s", code, errOut)
	}
	var v resumer.StatusView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		ch.t.Fatalf("status --json: %v\n%s", err, out)
	}
	return v
}

// live lists the chain's jobs Slurm still has pending or running.
func (ch *chain) live(ctx context.Context) []string {
	ch.t.Helper()
	st, err := resumer.LoadState(ch.dir)
	if err != nil {
		return nil
	}
	var ids []string
	for _, j := range st.Jobs {
		ids = append(ids, j.ID)
	}
	if len(ids) == 0 {
		return nil
	}
	out, err := ch.c.Run(ctx, "squeue", "-h", "-o", "%A %T", "-j", strings.Join(ids, ","))
	if err != nil {
		return nil
	}
	var live []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[1] != "COMPLETED" && f[1] != "FAILED" && f[1] != "CANCELLED" && f[1] != "TIMEOUT" {
			live = append(live, l)
		}
	}
	return live
}

// logs returns the chain's job outputs, for failure messages.
func (ch *chain) logs() string {
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(ch.dir), "slurm-*.out"))
	var b strings.Builder
	for _, f := range files {
		out, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "== %s\n%s", filepath.Base(f), out)
	}
	st, _ := os.ReadFile(filepath.Join(ch.dir, resumer.StateFile))
	fmt.Fprintf(&b, "== chain.json\n%s", st)
	return b.String()
}

// cleanup cancels whatever the chain left in Slurm and checks that no
// process of its jobs is left.
func (ch *chain) cleanup() {
	ctx, cancel := runclock.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(ch.dir, resumer.StateFile)); err == nil {
		ch.resumer(ctx, "cancel", "--chain-dir", ch.dir)
	}
	waitFor(ch.t, 90*time.Second, "chain jobs to leave Slurm", func() bool { return len(ch.live(ctx)) == 0 })
	waitFor(ch.t, 30*time.Second, "no process of the chain's jobs", func() bool {
		return len(ProcessesWithEnv("TEST_CHAIN_MARKER="+ch.marker)) == 0
	})
	if ch.t.Failed() {
		ch.t.Logf("chain logs:\n%s", ch.logs())
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Errorf("timeout after %v waiting for %s", limit, what)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ProcessesWithEnv lists live processes whose environment has kv.
func ProcessesWithEnv(kv string) []string {
	return processesWith([]byte(kv + "\x00"))
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ranOutcomes lists the outcomes of the jobs that trained.
func ranOutcomes(v resumer.StatusView) []string {
	var out []string
	for _, j := range v.Jobs {
		if j.Outcome.Ran() {
			out = append(out, string(j.Outcome))
		}
	}
	return out
}

func outcomes(v resumer.StatusView) []string {
	var out []string
	for _, j := range v.Jobs {
		out = append(out, string(j.Outcome))
	}
	return out
}
