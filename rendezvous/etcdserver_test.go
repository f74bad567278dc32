package rendezvous

import (
	"context"
	"fmt"
	"github.com/ftlauncher/ft-launcher/policy"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

const debianEtcd = "/usr/bin/etcd"

// etcdProc is Debian's real etcd server run as a child process.
type etcdProc struct {
	t                  *testing.T
	dir                string
	clientURL, peerURL string
	extra              []string // more server flags (TLS)
	cmd                *exec.Cmd
	done               chan struct{}
}

func startEtcdProc(t *testing.T) *etcdProc {
	t.Helper()
	return startEtcdProcWith(t, "http")
}

// startEtcdProcWith starts etcd with client URLs of the given scheme and
// extra server flags.
func startEtcdProcWith(t *testing.T, scheme string, extra ...string) *etcdProc {
	t.Helper()
	if _, err := os.Stat(debianEtcd); err != nil {
		t.Fatalf("%s is required (Debian package etcd-server): %v", debianEtcd, err)
	}
	cp, err := FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	pp, err := FreePort("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	p := &etcdProc{t: t, dir: filepath.Join(t.TempDir(), "etcd"),
		clientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, cp), peerURL: fmt.Sprintf("http://127.0.0.1:%d", pp), extra: extra}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *etcdProc) start() {
	p.t.Helper()
	args := append([]string{"--name", "ftl", "--data-dir", p.dir,
		"--listen-client-urls", p.clientURL, "--advertise-client-urls", p.clientURL,
		"--listen-peer-urls", p.peerURL, "--initial-advertise-peer-urls", p.peerURL,
		"--initial-cluster", "ftl=" + p.peerURL, "--log-level", "error"}, p.extra...)
	p.cmd = exec.Command(debianEtcd, args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(p.t.TempDir(), "etcd.log"))
	if err != nil {
		p.t.Fatal(err)
	}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("start etcd: %v", err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		cmd.Wait()
		logf.Close()
		close(done)
	}(p.cmd, p.done)
}

func (p *etcdProc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

func TestRealEtcdHappyPathFailAndRestart(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 2, 3, 3, 3)
		o.LeaseTTL = 6 * time.Second // the production default; etcd stays away longer than this
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 3)
	first := groupRanks(as)

	ends := make([]<-chan RoundEnd, 3)
	for i, n := range c.nodes {
		ends[i] = n.Ended(0)
	}
	if d, err := c.nodes[2].Fail(context.Background(), 0, policy.RankCrash, "rank exited 1"); err != nil || !d.Restart {
		t.Fatalf("Fail: %+v %v", d, err)
	}
	for i, ch := range ends {
		if e := waitEnd(t, ch, 10*time.Second); e.Kind != EndRestart || e.Round != 0 {
			t.Fatalf("node %d: %+v", i, e)
		}
	}
	as = nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 3)
	if as[0].Round != 1 || fmt.Sprint(groupRanks(as)) != fmt.Sprint(first) {
		t.Fatalf("round 1 assignment %+v (first ranks %v)", as, first)
	}

	// etcd restarted mid-run, away longer than the fence deadline (at most
	// TTL - TTL/3 - margin after it went: 2.8 s with the default 6 s TTL):
	// no round ends while it is away, but every node fences itself out of
	// round 1 (it cannot prove its lease valid), and once etcd is back their
	// reports end round 1 once, for a stopped node: nothing is quarantined,
	// and round 2 runs on the same nodes.
	for i, n := range c.nodes {
		ends[i] = n.Ended(1)
	}
	p.stop()
	tStop := time.Now()
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndFenced || e.Round != 1 {
			t.Fatalf("node %d: %+v, want EndFenced for round 1 while etcd is away", i, e)
		}
		t.Logf("node %d fenced %v after etcd went away", i, time.Since(tStop).Round(time.Millisecond))
	}
	time.Sleep(time.Until(tStop.Add(7500 * time.Millisecond))) // longer than the 6 s lease TTL
	p.start()
	t.Logf("etcd back after %v", time.Since(tStop))
	tBack := time.Now()
	var wg sync.WaitGroup
	decs := make([]Decision, len(c.nodes))
	errs := make([]error, len(c.nodes))
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			decs[i], errs[i] = n.Fail(ctx, 1, policy.NodeStopped, "fenced")
		}()
	}
	wg.Wait()
	for i := range c.nodes {
		if errs[i] != nil || !decs[i].Restart {
			t.Fatalf("node %d: fenced report: %+v, %v; want a restart", i, decs[i], errs[i])
		}
	}
	t.Logf("fenced reports answered %v after etcd came back: %s", time.Since(tBack), decs[0].Reason)
	as = nextAll(t, c.nodes)
	checkConsistent(t, as, 2, 3)
	if as[0].Round != 2 {
		t.Fatalf("after the fences: round %d, want 2: %+v", as[0].Round, as)
	}
	for i, n := range c.nodes {
		ends[i] = n.Ended(2)
	}
	for i, code := range succeedAll(t, c.nodes, 2) {
		if code != 0 {
			t.Fatalf("node %d exit code %d after etcd restart", i, code)
		}
	}
	for i, ch := range ends {
		if e := waitEnd(t, ch, 5*time.Second); e.Kind != EndJobClosed || e.Code != 0 {
			t.Fatalf("node %d: %+v", i, e)
		}
	}
}

func TestRealEtcdLossBoundClosesJob(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	for i := 0; i < 2; i++ {
		o := c.opts(i, 1, 2, 2, 3)
		o.EtcdLossBound = 2 * time.Second
		o.LeaseTTL = 10 * time.Second // the bound, not the fence (fence_test.go), acts first
		o.ProbeInterval = 250 * time.Millisecond
		c.add(o)
	}
	nextAll(t, c.nodes)
	ends := []<-chan RoundEnd{c.nodes[0].Ended(0), c.nodes[1].Ended(0)}
	p.stop()
	start := time.Now()
	for i, ch := range ends {
		e := waitEnd(t, ch, 15*time.Second)
		if e.Kind != EndJobClosed || e.Code != 1 || !strings.Contains(e.Reason, "unreachable") {
			t.Fatalf("node %d: %+v", i, e)
		}
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Fatalf("closed after %v, before the 2s bound", d)
	}
}
