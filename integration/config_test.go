package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestVersionOfBuiltBinaries: the binaries the harness built answer
// --version in the documented form.
func TestVersionOfBuiltBinaries(t *testing.T) {
	skipShort(t)
	for _, name := range []string{"ft-launcher", "ft-launcher-etcd"} {
		out, err := exec.Command(filepath.Join(filepath.Dir(bins.launcher), name), "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", name, err)
		}
		re := regexp.MustCompile(`^` + name + ` \S+ \(commit ([0-9a-f]{7}(\+dirty)?|unknown), go1\.[0-9.]+\S*, linux/[a-z0-9]+\)\n$`)
		if !re.Match(out) {
			t.Errorf("%s --version printed %q, want e.g. %q", name, out, name+" 0.2.0 (commit abc1234, go1.26.8, linux/amd64)")
		}
	}
}

// TestVersionStamping builds a command the two ways a version reaches it:
// -ldflags -X, as scripts/release.sh does, and the go command's VCS stamp.
func TestVersionStamping(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	build := func(t *testing.T, out string, env []string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", append(append([]string{"build", "-o", out}, args...), "../cmd/ft-resumer")...)
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		v, err := exec.Command(out, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", out, err)
		}
		return string(v)
	}
	t.Run("ldflags", func(t *testing.T) {
		const pkg = "github.com/ftlauncher/ft-launcher/internal/version"
		got := build(t, filepath.Join(dir, "x"), nil, "-trimpath", "-ldflags", "-X "+pkg+".Version=9.9.9-test -X "+pkg+".Commit=feedbee")
		if !regexp.MustCompile(`^ft-resumer 9\.9\.9-test \(commit feedbee, go1\.[0-9.]+\S*, linux/[a-z0-9]+\)\n$`).MatchString(got) {
			t.Errorf("--version printed %q", got)
		}
	})
	t.Run("vcs", func(t *testing.T) {
		want := regexp.MustCompile(`^ft-resumer \S+ \(commit [0-9a-f]{7}(\+dirty)?, `)
		if exec.Command("git", "-C", "..", "rev-parse", "--git-dir").Run() != nil {
			want = regexp.MustCompile(`^ft-resumer \S+ \(commit unknown, `) // a source tree without git
		}
		// GOFLAGS may say -buildvcs=false (this machine's does); ask for it.
		got := build(t, filepath.Join(dir, "y"), []string{"GOFLAGS=-buildvcs=auto"})
		if !want.MatchString(got) {
			t.Errorf("--version printed %q, want it to match %s", got, want)
		}
	})
}

// TestBlankEndpointIsUsageError: an endpoint list with no address exits 2
// with one line (it used to panic with an index out of range), before the
// event log is opened.
func TestBlankEndpointIsUsageError(t *testing.T) {
	skipShort(t)
	for _, ep := range []string{" ", ","} {
		t.Run(strings.TrimSpace(ep), func(t *testing.T) {
			j := newJob(t)
			s := j.script("rank.sh", "exit 0\n")
			code := j.run(time.Minute, nil, "--nnodes", "2", "--rdzv-endpoint", ep, "--no-python", s)
			stderr := j.stderr.String()
			if code != 2 {
				t.Fatalf("exit %d, want 2\n%s", code, stderr)
			}
			if !strings.Contains(stderr, `--rdzv-endpoint "`+ep+`": no address given`) || strings.Contains(stderr, "panic") {
				t.Errorf("stderr %q, want the one-line usage error", stderr)
			}
			if _, err := os.Stat(j.events); err == nil {
				t.Errorf("the event log exists: launch started")
			}
		})
	}
}

// TestPrintConfigShowsRendezvous: --print-config shows the rendezvous as the
// real launcher interprets it, hosting decided by rendezvous.IsLocalEndpoint.
func TestPrintConfigShowsRendezvous(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	code := j.run(time.Minute, []string{"SLURM_PROCID=4"}, "--nnodes", "2", "--rdzv-endpoint", "127.0.0.2", "--local-addr", "127.0.0.2",
		"--rdzv-conf", "last_call_timeout=2,read_timeout=9", "--print-config", "train.py")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	out := j.stdout.String()
	for _, want := range []string{"rendezvous:\n  mode: embedded\n  endpoints:\n    - http://127.0.0.2:29400\n",
		"  hosts_embedded_etcd: true\n  hosts_embedded_etcd_decided_by: --local-addr 127.0.0.2 matches endpoint 127.0.0.2:29400\n",
		"  last_call_timeout: 2\n", "  infra_rank: 4\n  infra_rank_from: SLURM_PROCID\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(j.stderr.String(), "read_timeout: torchrun's key, accepted but not used by ft-launcher") {
		t.Errorf("no warning for read_timeout:\n%s", j.stderr.String())
	}
}
