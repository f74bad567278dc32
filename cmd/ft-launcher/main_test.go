package main

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/cmd/ft-launcher/internal/earlysig"
	"github.com/ftlauncher/ft-launcher/configs"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// closedPort returns a local port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// launchTraces are what launch leaves behind once it runs: the event log
// (opened first), the log directory, and the embedded etcd's data directory
// under TMPDIR. run must return before any of them exists on a usage error.
type launchTraces struct{ tmp, events, logs string }

func newTraces(t *testing.T) launchTraces {
	dir := t.TempDir()
	tr := launchTraces{tmp: filepath.Join(dir, "tmp"), events: filepath.Join(dir, "events.jsonl"), logs: filepath.Join(dir, "logs")}
	if err := os.Mkdir(tr.tmp, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", tr.tmp) // the embedded etcd makes its data directory there
	return tr
}

func (tr launchTraces) args() []string {
	return []string{"--event-log", tr.events, "--log-dir", tr.logs}
}

// left lists the traces that exist.
func (tr launchTraces) left(t *testing.T) []string {
	var out []string
	for _, p := range []string{tr.events, tr.logs} {
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	ents, err := os.ReadDir(tr.tmp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		out = append(out, filepath.Join(tr.tmp, e.Name()))
	}
	return out
}

// TestRunRejectsBadRendezvousBeforeLaunch: a bad rendezvous value exits 2
// with a one-line message, before the event log, the log directory or the
// embedded etcd (this launcher would host it: is_host=1) exist.
func TestRunRejectsBadRendezvousBeforeLaunch(t *testing.T) {
	ep := "127.0.0.1:" + strconv.Itoa(closedPort(t))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"join_timeout=abc", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,join_timeout=abc"},
			`--rdzv-conf join_timeout="abc": must be a number of seconds from 0.001 to 604800 (7 days)`},
		{"lease_ttl=0", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,lease_ttl=0"},
			`--rdzv-conf lease_ttl="0": must be a number of seconds`},
		{"connect_timeout=-5", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,connect_timeout=-5"},
			`--rdzv-conf connect_timeout="-5": must be a number of seconds`},
		{"etcd_loss_bound=nan", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,etcd_loss_bound=nan"},
			`--rdzv-conf etcd_loss_bound="nan": must be a number of seconds`},
		{"rejoin_wait=inf", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,rejoin_wait=inf"},
			`--rdzv-conf rejoin_wait="inf": must be a number of seconds`},
		{"last_call_timeout=1e300", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,last_call_timeout=1e300"},
			`--rdzv-conf last_call_timeout="1e300": must be a number of seconds`},
		{"join_timeout above 7 days", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1,join_timeout=700000"},
			`--rdzv-conf join_timeout="700000": must be a number of seconds from 0.001 to 604800 (7 days)`},
		{"is_host=maybe", []string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=maybe"},
			`--rdzv-conf is_host="maybe": must be 1, 0, true or false`},
		{"blank endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", " ", "--rdzv-conf", "is_host=1"},
			`--rdzv-endpoint " ": no address given: must be host[:port][,host[:port]...]`},
		{"comma endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", ",", "--rdzv-conf", "is_host=1"},
			`--rdzv-endpoint ",": no address given`},
		{"missing endpoint", []string{"--nnodes", "2"},
			`--rdzv-endpoint is required with --nnodes 2:2 and --rdzv-backend c10d`},
		{"bad port", []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:99999", "--rdzv-conf", "is_host=1"},
			`--rdzv-endpoint "127.0.0.1:99999": endpoint "127.0.0.1:99999": the port must be 1-65535`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTraces(t)
			var stdout, stderr bytes.Buffer
			args := append(append(tr.args(), tt.args...), "--no-python", "/bin/true")
			if code := run(args, earlysig.Take(), &stdout, &stderr); code != 2 {
				t.Fatalf("run(%q) = %d, want 2; stderr:\n%s", args, code, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			if len(lines) != 2 || !strings.HasPrefix(lines[0], "ft-launcher: ") || !strings.Contains(lines[0], tt.want) ||
				lines[1] != "Run 'ft-launcher --help' for usage." {
				t.Errorf("stderr %q, want the one-line error containing %q and the help hint", stderr.String(), tt.want)
			}
			if left := tr.left(t); len(left) > 0 {
				t.Errorf("run started launching before rejecting the line: %q exist", left)
			}
		})
	}
}

// TestRunLaunchLeavesTraces is the control for the test above: a valid line
// does reach launch, which opens the event log and fails on the unreachable
// etcd with exit 1, not 2.
func TestRunLaunchLeavesTraces(t *testing.T) {
	testenv.SkipShort(t, "runs a launch with real rank processes")
	tr := newTraces(t)
	ep := "127.0.0.1:" + strconv.Itoa(closedPort(t))
	args := append(tr.args(), "--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", ep,
		"--rdzv-conf", "connect_timeout=0.2", "--no-python", "/bin/true")
	var stdout, stderr bytes.Buffer
	if code := run(args, earlysig.Take(), &stdout, &stderr); code != 1 {
		t.Fatalf("run(%q) = %d, want 1; stderr:\n%s", args, code, stderr.String())
	}
	if _, err := os.Stat(tr.events); err != nil {
		t.Errorf("launch did not open the event log: %v", err)
	}
}

func TestRunVersion(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--version"}, earlysig.Take(), &stdout, &stderr); code != 0 {
		t.Fatalf("--version exit %d, stderr %q", code, stderr.String())
	}
	re := regexp.MustCompile(`^ft-launcher \S+ \(commit \S+, go1\.[0-9.]+\S*, [a-z0-9]+/[a-z0-9]+\)\n$`)
	if !re.MatchString(stdout.String()) {
		t.Errorf("--version printed %q, want e.g. \"ft-launcher 0.2.0 (commit abc1234, go1.26.8, linux/amd64)\"", stdout.String())
	}
}

func TestRunHelpAndPrintConfig(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"--help"}, earlysig.Take(), &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "--verdict-file PATH") ||
		!strings.Contains(stdout.String(), "--version") {
		t.Errorf("--help: exit %d, output lacks --verdict-file or --version:\n%s", code, stdout.String())
	}
	stdout.Reset()
	t.Setenv("SLURM_PROCID", "1")
	code := run([]string{"--nnodes", "2", "--rdzv-endpoint", "10.255.255.1", "--rdzv-conf", "join_timeout=90", "--print-config", "x.py"}, earlysig.Take(), &stdout, &stderr)
	if code != 0 {
		t.Fatalf("--print-config exit %d, stderr %q", code, stderr.String())
	}
	for _, want := range []string{"rendezvous:\n  mode: embedded\n  endpoints:\n    - http://10.255.255.1:29400\n  hosts_embedded_etcd: false\n",
		"  join_timeout: 90\n", "  infra_rank: 1\n  infra_rank_from: SLURM_PROCID\n"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("--print-config lacks %q:\n%s", want, stdout.String())
		}
	}
}

// TestSignalsCaughtBeforeHeavyInit: the package that catches signals is
// initialised before the launcher's configuration, logging, gRPC and etcd
// client packages (Go's init order: dependencies first, ties by import
// path), so the window where a SIGTERM kills the launcher by default is
// the runtime's own start only. This test binary links the same packages.
func TestSignalsCaughtBeforeHeavyInit(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	order := map[string]int{}
	for i, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "init" {
			if _, seen := order[f[1]]; !seen {
				order[f[1]] = i
			}
		}
	}
	early, ok := order["github.com/ftlauncher/ft-launcher/cmd/ft-launcher/internal/earlysig"]
	if !ok {
		t.Fatalf("earlysig did not initialise:\n%s", out)
	}
	for _, later := range []string{"log/slog", "github.com/ftlauncher/ft-launcher/configs", "google.golang.org/grpc",
		"go.etcd.io/etcd/client/v3", "github.com/ftlauncher/ft-launcher/rendezvous"} {
		if i, ok := order[later]; ok && i < early {
			t.Errorf("%s initialises before the signals are caught", later)
		}
	}
	if _, ok := order["github.com/ftlauncher/ft-launcher/configs"]; !ok {
		t.Errorf("inittrace does not list configs: the order cannot be checked:\n%s", out)
	}
}

func TestEventBaseNamesTheSlurmJob(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "4242", "SLURM_RESTART_COUNT": "2"}
	cfg, err := configs.Parse([]string{"--standalone", "--no-python", "x"}, func(k string) string { return env[k] }, launcherNetwork(func(k string) string { return env[k] }))
	if err != nil {
		t.Fatal(err)
	}
	b := eventBase(cfg, "n1")
	if b["slurm_job_id"] != "4242" || b["slurm_restart_count"] != 2 || b["node"] != "n1" {
		t.Fatalf("event base %v", b)
	}
	cfg.Slurm.JobID = ""
	if _, ok := eventBase(cfg, "n1")["slurm_job_id"]; ok {
		t.Fatal("slurm_job_id outside Slurm")
	}
}
