package integration

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
)

// etcdDataDirs lists the embedded etcd data dirs under tmp.
func etcdDataDirs(t *testing.T, tmp string) []string {
	t.Helper()
	ms, err := filepath.Glob(filepath.Join(tmp, "ft-launcher-etcd-*"))
	if err != nil {
		t.Fatal(err)
	}
	return ms
}

// TestEmbeddedEtcdDirRemovedAfterSIGKILL (issues 9, 12): SIGKILL of every
// launcher and of the embedded etcd (what Slurm does to a step) leaves the
// etcd data dir behind, in $TMPDIR; the next job that hosts the embedded
// etcd there removes it at start, and its own dir goes when it ends.
func TestEmbeddedEtcdDirRemovedAfterSIGKILL(t *testing.T) {
	skipShort(t)
	tmp := t.TempDir()
	env := []string{"TMPDIR=" + tmp}

	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := recorder(c, `echo ready >> "$OUT/ready"; exec sleep 120`+"\n")
	for i := 0; i < 2; i++ {
		c.addNode(env, "--nnodes", "2", "--nproc-per-node", "1", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready", 2, generous)
	stale := etcdDataDirs(t, tmp)
	if len(stale) != 1 {
		t.Fatalf("etcd data dirs under $TMPDIR while the job runs: %v, want one", stale)
	}
	pids := []int{etcdCompanionPid(t, c.marker)}
	for _, n := range c.nodes {
		pids = append(pids, n.cmd.Process.Pid)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatalf("SIGKILL %d: %v", pid, err)
		}
	}
	c.waitAll(generous)
	if left := c.nodes[0].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left after SIGKILL: %s", hangdump.Describe(left))
	}
	if _, err := os.Stat(stale[0]); err != nil {
		t.Fatalf("the killed etcd's data dir is already gone (%v): the test shows nothing", err)
	}

	next := newCluster(t, embeddedEndpoint(t))
	next.extra = c.extra
	s = recorder(next, "exit 0\n")
	for i := 0; i < 2; i++ {
		next.addNode(env, "--nnodes", "2", "--nproc-per-node", "1", "--no-python", s)
	}
	for i, code := range next.waitAll(2 * time.Minute) {
		if code != 0 {
			t.Fatalf("next job: node %d exited %d\n%s", i, code, next.stderrs())
		}
	}
	if left := etcdDataDirs(t, tmp); len(left) != 0 {
		t.Fatalf("etcd data dirs left under $TMPDIR after the next job: %v (stale: %s)", left, stale[0])
	}
}
