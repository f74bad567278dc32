package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestMetricsEndpointReportsRestarts(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	s := j.script("m.sh", `
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 1; fi
echo up > "$OUT/cycle1"
while [ ! -e "$OUT/release" ]; do sleep 0.05; done
`)
	j.start([]string{"OUT=" + j.dir}, "--standalone", "--nproc-per-node", "1", "--max-restarts", "1",
		"--metrics-addr", addr, "--no-python", s)
	waitFile(t, filepath.Join(j.dir, "cycle1"), generous)
	var body string
	deadline := time.Now().Add(generous)
	for time.Now().Before(deadline) {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			if strings.Contains(body, "ftlauncher_restarts_total 1") {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(j.dir, "release"), nil, 0o644)
	if code := j.wait(generous); code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	for _, want := range []string{"ftlauncher_restarts_total 1", "ftlauncher_current_round 1", "ftlauncher_rounds_total 2"} {
		if !strings.Contains(body, want) {
			t.Fatalf("metrics lack %q:\n%s", want, body)
		}
	}
}

func TestEtcdUnreachableAtStartNamesEndpoint(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	dead := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	s := j.script("never.sh", "echo started > \"$OUT/started\"\n")
	code := j.run(generous, []string{"OUT=" + j.dir}, "--nnodes", "2", "--nproc-per-node", "1",
		"--rdzv-backend", "etcd", "--rdzv-endpoint", dead, "--rdzv-conf", "connect_timeout=2", "--no-python", s)
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, j.stderr.String())
	}
	if !strings.Contains(j.stderr.String(), dead) {
		t.Fatalf("error does not name the endpoint %s:\n%s", dead, j.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(j.dir, "started")); err == nil {
		t.Fatalf("a rank started without a rendezvous")
	}
}

func TestHealthCheckKeepsNodeOut(t *testing.T) {
	skipShort(t)
	c := newCluster(t, embeddedEndpoint(t))
	s := recorder(c, "exit 0\n")
	// MIN 1: node 0 can run alone; node 1 fails its health check.
	c.addNode(nil, "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-conf", "last_call_timeout=2", "--no-python", s)
	c.addNode(nil, "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-conf", "last_call_timeout=2",
		"--health-check-cmd", "echo disk full >&2; exit 3", "--no-python", s)
	codes := c.waitAll(2 * time.Minute)
	if codes[0] != 0 || codes[1] == 0 {
		t.Fatalf("exit codes %v, want [0, non-zero]\n%s", codes, c.stderrs())
	}
	if !strings.Contains(c.nodes[1].stderr.String(), "disk full") {
		t.Fatalf("node 1 does not report its failed health check:\n%s", c.nodes[1].stderr.String())
	}
	for _, r := range readStarts(t, c.dir) {
		if r.node != 0 || r.worldSize != 2 {
			t.Fatalf("unexpected rank start %+v: only node 0 should run, with WORLD_SIZE 2", r)
		}
	}
}

func TestTeeLogLayoutAndRanksFilter(t *testing.T) {
	skipShort(t)
	j := newJob(t)
	logDir := filepath.Join(j.dir, "logs")
	s := j.script("talk.sh", "echo \"out of $LOCAL_RANK\"; echo \"err of $LOCAL_RANK\" >&2\n")
	code := j.run(generous, nil, "--nproc-per-node", "3", "--rdzv-id", "logjob",
		"--log-dir", logDir, "--tee", "3", "--local-ranks-filter", "0,2", "--no-python", s)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, j.stderr.String())
	}
	for _, want := range []string{"[default0]:out of 0", "[default2]:out of 2"} {
		if !strings.Contains(j.stdout.String(), want) {
			t.Errorf("console stdout lacks %q:\n%s", want, j.stdout.String())
		}
	}
	if !strings.Contains(j.stderr.String(), "[default0]:err of 0") {
		t.Errorf("console stderr lacks rank 0's teed line:\n%s", j.stderr.String())
	}
	if strings.Contains(j.stdout.String()+j.stderr.String(), "of 1") {
		t.Errorf("local rank 1 is filtered out but reached the console")
	}
	// Files are written for every rank, filtered or not, in torchrun's layout.
	runs, _ := filepath.Glob(filepath.Join(logDir, "logjob_*"))
	if len(runs) != 1 {
		t.Fatalf("log dirs %v, want one logjob_<rand>", runs)
	}
	for lr := 0; lr < 3; lr++ {
		b, err := os.ReadFile(filepath.Join(runs[0], "attempt_0", fmt.Sprint(lr), "stdout.log"))
		if err != nil || strings.TrimSpace(string(b)) != fmt.Sprintf("out of %d", lr) {
			t.Errorf("rank %d stdout.log = %q, %v", lr, b, err)
		}
	}
}
