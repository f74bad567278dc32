package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/cli"
	"github.com/ftlauncher/ft-launcher/spawn"
)

// etcdCompanion is the name of the embedded etcd server's program.
const etcdCompanion = "ft-launcher-etcd"

// findEtcdCompanion looks for ft-launcher-etcd beside this executable, then
// on PATH.
func findEtcdCompanion() (string, error) {
	p, ok := cli.FindCompanion(etcdCompanion)
	if !ok {
		return "", fmt.Errorf("the embedded etcd rendezvous needs %s beside ft-launcher or on PATH (go build -o DIR/ ./cmd/...), or use --rdzv-backend etcd with your own etcd", etcdCompanion)
	}
	return p, nil
}

// member is the etcd member a launcher hosts.
type member struct {
	name, clientURL, peerURL string
	cluster, token           string // "" for a single member
}

// args is the companion's command line for the member's first start.
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

// companion is one running ft-launcher-etcd process.
type companion struct {
	g        *spawn.Group
	out      *os.File // its stdout, read for the ready line
	endpoint string   // the client endpoint it serves
	dir      string   // its owned data dir ("" if none): what a restart adopts
	pid      int
	started  time.Time // when it served
}

// stop stops the server (SIGTERM: it removes its data dir) and waits.
func (c *companion) stop() {
	c.g.Stop(syscall.SIGTERM, 10*time.Second)
	c.out.Close()
}

// startCompanion starts ft-launcher-etcd with argv as a child of this
// launcher (through the reaper: it gets the parent-death signal like a
// rank, and its exit is reported on c.g.Exits()) and waits until it serves.
// ready bounds the wait.
func startCompanion(ctx context.Context, reaper *spawn.Reaper, argv []string, ready time.Duration) (*companion, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("embedded etcd: %w", err)
	}
	// The server makes and removes its own data directory under $TMPDIR
	// (inherited: under Slurm the job's temp dir when the cluster sets
	// one); it gets SIGTERM, not SIGKILL, if this launcher dies, so it can
	// still remove it, and a later start removes a dir left by a SIGKILL.
	g, err := reaper.StartGroup([]spawn.Spec{{LocalRank: -1,
		Argv:        argv,
		Env:         os.Environ(),
		Stdout:      w,
		DeathSignal: syscall.SIGTERM}})
	w.Close()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	c := &companion{g: g, out: r, pid: g.PIDs()[-1]}
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(r).ReadString('\n')
		line <- s
	}()
	timer := time.NewTimer(ready)
	defer timer.Stop()
	select {
	case s := <-line:
		// "ready <endpoint> <owned dir>" ("-": none); an older companion
		// prints no dir.
		if rest, ok := strings.CutPrefix(strings.TrimRight(s, "\r\n"), "ready "); ok {
			ep, dir, _ := strings.Cut(rest, " ")
			if dir == "-" {
				dir = ""
			}
			c.endpoint, c.dir, c.started = ep, dir, time.Now()
			return c, nil
		}
		c.stop()
		return nil, errors.New("it did not start (see its log above)")
	case <-ctx.Done(): // a signal during the set-up, or the launcher's shutdown
		c.stop()
		return nil, fmt.Errorf("start abandoned: %w", ctx.Err())
	case <-timer.C:
		c.stop()
		return nil, fmt.Errorf("it did not serve within %v", ready)
	}
}

// hostEtcd starts the embedded etcd member m as a child of this launcher
// and waits until it serves; a keeper then watches it and restarts it if it
// dies (etcdmember.go). The returned stop function stops the keeper first
// (no restart during the launcher's shutdown), then the server, which
// removes its data directory. pid is the server's process.
func hostEtcd(ctx context.Context, reaper *spawn.Reaper, log *slog.Logger, m member, k keeperDeps) (endpoint string, pid int, stop func(), err error) {
	bin, err := findEtcdCompanion()
	if err != nil {
		return "", 0, nil, err
	}
	c, err := startCompanion(ctx, reaper, m.args(bin), 60*time.Second)
	if err != nil {
		return "", 0, nil, fmt.Errorf("embedded etcd at %s: %w", m.clientURL, err)
	}
	log.Debug("embedded etcd serves", "endpoint", c.endpoint, "pid", c.pid, "dir", c.dir)
	keeper := newMemberKeeper(ctx, reaper, log, bin, m, c, k)
	return c.endpoint, c.pid, keeper.stop, nil
}
