package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestPythonClientInstallsWithPipAndHeartbeats installs client/python with
// pip (no package index needed: the package builds with an in-tree,
// standard-library backend) and runs ranks that import the installed copy.
func TestPythonClientInstallsWithPipAndHeartbeats(t *testing.T) {
	skipShort(t)
	testenv.Require(t, testenv.Pip)
	target := t.TempDir()
	src, _ := filepath.Abs("../client/python")
	pip := exec.Command("python3", "-m", "pip", "install", "--quiet", "--target", target, src)
	pip.Env = append(os.Environ(), "PIP_NO_INDEX=1", "PIP_DISABLE_PIP_VERSION_CHECK=1")
	if out, err := pip.CombinedOutput(); err != nil {
		t.Fatalf("pip install %s: %v\n%s", src, err, out)
	}
	j := newJob(t)
	script := filepath.Join(j.dir, "rank.py")
	os.WriteFile(script, []byte(`import os, sys, time
import ft_launcher_client
from ft_launcher_client import RankMonitorClient
assert ft_launcher_client.__file__.startswith(os.environ["PIP_TARGET_DIR"]), ft_launcher_client.__file__
c = RankMonitorClient()
c.init_workload_monitoring()
for _ in range(10):
    c.send_heartbeat()
    time.sleep(0.02)
c.shutdown_workload_monitoring()
# One write: both ranks share the launcher's stdout, and print's pieces
# (unbuffered) could interleave with the other rank's.
sys.stdout.write("heartbeats sent from %s\n" % ft_launcher_client.__file__)
sys.stdout.flush()
`), 0o644)
	code := j.run(2*time.Minute, []string{"PYTHON_EXEC=" + debianPython, "PYTHONPATH=" + target, "PIP_TARGET_DIR=" + target},
		"--standalone", "--nproc-per-node", "2", "--ft-rank-heartbeat-timeout", "30", script)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, j.stdout.String(), j.stderr.String())
	}
	if !strings.Contains(j.stdout.String(), "heartbeats sent from "+target) {
		t.Fatalf("ranks did not use the pip-installed client:\n%s", j.stdout.String())
	}
}
