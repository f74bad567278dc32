package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/spawn"
)

// etcdCompanion is the name of the embedded etcd server's program.
const etcdCompanion = "ft-launcher-etcd"

// findEtcdCompanion looks for ft-launcher-etcd beside this executable, then
// on PATH.
func findEtcdCompanion() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), etcdCompanion)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(etcdCompanion)
	if err != nil {
		return "", fmt.Errorf("the embedded etcd rendezvous needs %s beside ft-launcher or on PATH (go build -o DIR/ ./cmd/...), or use --rdzv-backend etcd with your own etcd", etcdCompanion)
	}
	return p, nil
}

// hostEtcd starts the embedded etcd server as a child of this launcher (it
// gets the parent-death signal like a rank) and waits until it serves. The
// returned stop function stops it and removes its data directory.
// member is the etcd member a launcher hosts.
type member struct {
	name, clientURL, peerURL string
	cluster, token           string // "" for a single member
}

func (m member) args(bin string) []string {
	argv := []string{bin, "--client-url", m.clientURL, "--peer-url", m.peerURL}
	if m.cluster != "" {
		// A member serves once a majority is up: the other launchers may
		// start a little later.
		argv = append(argv, "--name", m.name, "--initial-cluster", m.cluster, "--cluster-token", m.token,
			"--ready-timeout", "55s")
	}
	return argv
}

func hostEtcd(ctx context.Context, reaper *spawn.Reaper, log *slog.Logger, m member) (endpoint string, stop func(), err error) {
	clientURL := m.clientURL
	bin, err := findEtcdCompanion()
	if err != nil {
		return "", nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return "", nil, fmt.Errorf("embedded etcd: %w", err)
	}
	// The server makes and removes its own data directory under $TMPDIR
	// (inherited: under Slurm the job's temp dir when the cluster sets
	// one); it gets SIGTERM, not SIGKILL, if this launcher dies, so it can
	// still remove it, and a later start removes a dir left by a SIGKILL.
	g, err := reaper.StartGroup([]spawn.Spec{{LocalRank: -1,
		Argv:        m.args(bin),
		Env:         os.Environ(),
		Stdout:      w,
		DeathSignal: syscall.SIGTERM}})
	w.Close()
	if err != nil {
		r.Close()
		return "", nil, fmt.Errorf("start %s: %w", bin, err)
	}
	stop = func() {
		g.Stop(syscall.SIGTERM, 10*time.Second)
		r.Close()
	}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if ep, ok := strings.CutPrefix(strings.TrimSpace(s), "ready "); ok {
			log.Debug("embedded etcd serves", "endpoint", ep, "pid", g.PIDs()[-1])
			return ep, stop, nil
		}
		stop()
		return "", nil, fmt.Errorf("embedded etcd at %s did not start (see its log above)", clientURL)
	case <-ctx.Done(): // a signal during the set-up
		stop()
		return "", nil, fmt.Errorf("embedded etcd at %s: start abandoned: %w", clientURL, ctx.Err())
	case <-time.After(60 * time.Second):
		stop()
		return "", nil, fmt.Errorf("embedded etcd at %s did not serve within 60s", clientURL)
	}
}
