package k8s

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// leaseName is the controller's LeaderElectionID.
const leaseName = "appwrapper-controller.ft-launcher.dev"

// replica is one `ft-resumer appwrapper-controller --leader-elect` process.
type replica struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan struct{}
	// exited is when Wait returned; read after done is closed.
	exited time.Time
}

func (r *replica) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Write(p)
}

func (r *replica) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// startReplica starts a replica electing its leader in namespace ns; it is
// killed at the end of t if still running.
func startReplica(t *testing.T, kc, ns string) *replica {
	t.Helper()
	r := &replica{done: make(chan struct{})}
	r.cmd = exec.Command(bins.resumer, "appwrapper-controller", "--kubeconfig", kc,
		"--metrics-bind-address", "0", "--health-probe-bind-address", "0",
		"--leader-elect", "--leader-election-namespace", ns,
		"--webhook-namespace", ns, "--webhook-port", strconv.Itoa(listenPort(t)), "--webhook-cert-dir", t.TempDir())
	r.cmd.Stdout, r.cmd.Stderr = r, r
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.cmd.Wait(); r.exited = time.Now(); close(r.done) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
		if t.Failed() {
			t.Logf("replica %d log:\n%s", r.cmd.Process.Pid, r.log())
		}
	})
	return r
}

// holder is the Lease's holderIdentity, "" when there is no Lease or
// nobody holds it.
func holder(ctx context.Context, ns string) string {
	l := &coordinationv1.Lease{}
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: leaseName}, l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// waitHolder polls the Lease every 10 ms until ok(holder) and returns the
// holder and when it was seen.
func waitHolder(t *testing.T, ns, what string, ok func(string) bool) (string, time.Time) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		h := holder(ctx, ns)
		if ok(h) {
			return h, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; Lease holder %q", what, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCandidate waits until the replica is trying for the Lease (client-go's
// leader election logs it), so that its wait for the Lease starts before
// the leader goes.
func waitCandidate(t *testing.T, r *replica) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(strings.ToLower(r.log()), "attempting to acquire leader lease") {
		if time.Now().After(deadline) {
			t.Fatalf("the standby replica never tried for the Lease; log (%d bytes):\n%s", len(r.log()), r.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaderFailover: two replicas of the controller, leader election on
// (the Deployment's flags). A leader stopped cleanly (SIGTERM: a rollout,
// a drain) releases the Lease as it exits, so the standby leads within its
// retry period (2 s, jittered by client-go up to 4.4 s); a leader killed
// (SIGKILL: a node lost) leaves the Lease to expire (15 s) first. The times are logged, not asserted; what
// is asserted is that the clean stop released the Lease (the standby took
// it before it could have expired) and the process exited.
//
//	FTL_LEADER_ROUNDS=5 go test -count=1 -run TestLeaderFailover -v ./integration/k8s
func TestLeaderFailover(t *testing.T) {
	testenv.SkipShort(t, "two controller processes on a real Kubernetes control plane")
	k8stest.Need(t, env)
	ns := env.Namespace(t)
	kc, err := env.Kubeconfig(t.TempDir(), "appwrapper-controller")
	if err != nil {
		t.Fatal(err)
	}
	rounds := 1
	if n, err := strconv.Atoi(os.Getenv("FTL_LEADER_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	const leaseDuration = 15 * time.Second // controller-runtime's default

	leader := startReplica(t, kc, ns)
	id, _ := waitHolder(t, ns, "the first replica to lead", func(h string) bool { return h != "" })
	var clean, killed []time.Duration
	for round := range rounds {
		for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
			standby := startReplica(t, kc, ns)
			waitCandidate(t, standby)
			sent := time.Now()
			if err := leader.cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			old := id
			var at time.Time
			id, at = waitHolder(t, ns, fmt.Sprintf("the standby to lead after %v", sig), func(h string) bool { return h != "" && h != old })
			took := at.Sub(sent)
			select {
			case <-leader.done:
			case <-time.After(time.Minute):
				t.Fatalf("round %d: the leader had not exited a minute after %v", round, sig)
			}
			exited := leader.exited.Sub(sent)
			if sig == syscall.SIGTERM {
				clean = append(clean, took)
				if took >= leaseDuration {
					t.Errorf("round %d: after SIGTERM the standby led %v later, not before the %v lease could expire: the Lease was not released", round, took, leaseDuration)
				}
				if leader.cmd.ProcessState != nil && !leader.cmd.ProcessState.Success() {
					t.Errorf("round %d: the leader stopped by SIGTERM exited %v; log:\n%s", round, leader.cmd.ProcessState, leader.log())
				}
				t.Logf("round %d: SIGTERM: standby leads after %v (the leader exited %v after the signal)", round, took.Round(time.Millisecond), exited.Round(time.Millisecond))
			} else {
				killed = append(killed, took)
				t.Logf("round %d: SIGKILL: standby leads after %v", round, took.Round(time.Millisecond))
			}
			leader = standby
		}
	}
	t.Logf("failover after SIGTERM: %v; after SIGKILL: %v", clean, killed)
}
