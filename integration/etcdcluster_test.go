package integration

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// No single rendezvous host: with three --rdzv-endpoint entries the
// launchers on those addresses form a three-member embedded etcd.

// memberEndpoints are three endpoints on 127.0.0.2..4, each with its port
// and port + 1 free.
func memberEndpoints(t *testing.T) string {
	t.Helper()
	var eps []string
	for i := 0; i < 3; i++ {
		host := fmt.Sprintf("127.0.0.%d", 2+i)
		for {
			p := freeTCPPort(t, host)
			if p < 65535 && portFree(host, p+1) {
				eps = append(eps, fmt.Sprintf("%s:%d", host, p))
				break
			}
		}
	}
	return strings.Join(eps, ",")
}

func portFree(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

func TestEmbeddedEtcdClusterSurvivesAMemberHost(t *testing.T) {
	skipShort(t)
	c := newCluster(t, memberEndpoints(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := swapRank(c)
	// Nodes 0, 1, 2 host the members; MIN 2 of MAX 4 leaves two spares.
	for i := 0; i < 4; i++ {
		c.addNodeV(nil, "--nnodes", "2:4", "--nproc-per-node", "1", "--max-restarts", "0", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready0", 2, generous)
	// Kill the node hosting the first member (and its member with it).
	if err := c.nodes[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.nodes[0].wait(generous)
	g0 := checkRound(t, readStarts(t, c.dir), 0, 2)
	if _, ok := g0[0]; !ok {
		t.Fatalf("node 0 (first member, lowest address) was not active in round 0: %v", g0)
	}
	// The job goes on on a spare, with two of three members.
	waitCount(t, filepath.Join(c.dir, "ready"), "ready1", 2, generous)
	g1 := checkRound(t, readStarts(t, c.dir), 1, 2)
	if _, ok := g1[0]; ok {
		t.Fatalf("the killed node ran in round 1: %v", g1)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "finish"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 4; i++ {
		if code := c.nodes[i].wait(2 * time.Minute); code != 0 {
			t.Fatalf("node %d exited %d\n%s", i, code, c.stderrs())
		}
		wantVerdict(t, readVerdict(t, c.verdictPath(i)), verdict.Succeeded, 0)
	}
	if left := c.nodes[1].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left: %s", hangdump.Describe(left))
	}
}

func TestEmbeddedEtcdClusterQuorumLost(t *testing.T) {
	skipShort(t)
	c := newCluster(t, memberEndpoints(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	s := recorder(c, `echo ready0 >> "$OUT/ready"; exec sleep 600`+"\n")
	// Nodes 0 and 1 host two members and are spares (node ranks order the
	// nodes: 2 and 3 run), so losing them ends no round: only the quorum.
	for i := 0; i < 4; i++ {
		c.addNodeV(nil, "--nnodes", "2:4", "--node-rank", strconv.Itoa((i+2)%4), "--nproc-per-node", "1",
			"--rdzv-conf", "etcd_loss_bound=2", "--no-python", s)
	}
	waitCount(t, filepath.Join(c.dir, "ready"), "ready0", 2, generous)
	if g := checkRound(t, readStarts(t, c.dir), 0, 2); len(g) != 2 || g[2] != 0 || g[3] != 1 {
		t.Fatalf("round 0 ran on %v, want nodes 2 and 3", g)
	}
	time.Sleep(500 * time.Millisecond) // the spares are parked and watching
	// Two of the three members go with their hosts: no quorum.
	for _, i := range []int{0, 1} {
		if err := c.nodes[i].cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	killed := time.Now()
	kinds := map[verdict.Kind]int{}
	for i := 2; i < 4; i++ {
		code := c.nodes[i].wait(2 * time.Minute)
		if took := time.Since(killed); took > 30*time.Second {
			t.Errorf("node %d exited %s after quorum was lost", i, took)
		}
		if code != 1 {
			t.Errorf("node %d exited %d, want 1", i, code)
		}
		kinds[readVerdict(t, c.verdictPath(i)).Kind]++
	}
	if len(kinds) != 1 || kinds[verdict.RendezvousLost] != 2 {
		t.Fatalf("verdict kinds of the surviving nodes %v, want rendezvous_lost on both", kinds)
	}
	if left := c.nodes[2].waitNoLeftovers(15 * time.Second); len(left) > 0 {
		t.Fatalf("processes left: %s", hangdump.Describe(left))
	}
}
