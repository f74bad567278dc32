// Command ft-launcher-etcd is the embedded etcd server of ft-launcher's
// default multi-node rendezvous. The launcher whose address matches the
// rendezvous endpoint starts it (from the directory of its own executable,
// else PATH) as a child that dies with it; users do not run it by hand.
//
// It is a separate program so that the etcd server's code is not linked into
// ft-launcher: its package initialisation alone costs ~10 ms, paid by every
// launch, single-node ones included.
//
// Protocol with the launcher: once the server serves, one line
// "ready <client endpoint> <owned dir>" on stdout (the owned dir is the
// temporary ft-launcher-etcd-XXXX dir, "-" with --data-dir: a launcher
// restarting a dead member passes it to --adopt-dir); SIGTERM or SIGINT stops it cleanly
// and removes its temporary data dir. A server killed outright (SIGKILL)
// leaves the dir; the next start in the same $TMPDIR removes it (its owner
// lock is free once the owner is dead).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/ftlauncher/ft-launcher/internal/version"
	"github.com/ftlauncher/ft-launcher/rendezvous/etcdserver"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("ft-launcher-etcd", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", "", "etcd data directory (\"\": a temporary one under $TMPDIR, removed on exit, or at the next start if this one is killed)")
	clientURL := fs.String("client-url", "http://127.0.0.1:2379", "client URL to listen on and advertise")
	peerURL := fs.String("peer-url", "", "peer URL (\"\": a free port on the client host)")
	ready := fs.Duration("ready-timeout", 30*time.Second, "how long to wait for the server to serve")
	name := fs.String("name", "", "member name in --initial-cluster (with --initial-cluster)")
	cluster := fs.String("initial-cluster", "", "name=peerURL,... of every member: makes this server one member of a cluster (\"\": a single member)")
	token := fs.String("cluster-token", "", "initial cluster token (the run id)")
	state := fs.String("initial-cluster-state", "new", "new (the members bootstrap together) or existing (this member was added to a running cluster)")
	adopt := fs.String("adopt-dir", "", "restart a dead member on its data: the ft-launcher-etcd-XXXX dir its server reported (fails if gone, locked or empty)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {} // help goes to stdout, below; errors get one line
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprintf(stdout, "Usage: ft-launcher-etcd [options]\n\n"+
				"The embedded etcd server of ft-launcher's multi-node rendezvous; the hosting\n"+
				"ft-launcher starts it. Once serving it prints \"ready <client endpoint> <owned dir>\".\n\nOptions:\n%s", fs.FlagUsages())
			return 0
		}
		// pflag prints nothing itself with ContinueOnError.
		fmt.Fprintf(stderr, "ft-launcher-etcd: %v\nRun 'ft-launcher-etcd --help' for usage.\n", err)
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, version.String("ft-launcher-etcd"))
		return 0
	}
	log := slog.New(slog.NewTextHandler(stderr, nil)).With("component", "ft-launcher-etcd")
	// A signal while etcd starts abandons the start (which removes the
	// data directory), so that a launcher signalled during its set-up ends
	// at once; once serving, it stops the server.
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	srv, err := etcdserver.Start(ctx, etcdserver.Options{Dir: *dataDir, ClientURL: *clientURL,
		PeerURL: *peerURL, Logger: log, ReadyTimeout: *ready, Name: *name, InitialCluster: *cluster, ClusterToken: *token,
		ClusterState: *state, Adopt: *adopt})
	if err != nil {
		fmt.Fprintf(stderr, "ft-launcher-etcd: %v\n", err)
		return 1
	}
	owned := srv.OwnedDir()
	if owned == "" {
		owned = "-"
	}
	fmt.Fprintf(stdout, "ready %s %s\n", srv.Endpoint(), owned)
	<-ctx.Done()
	if err := srv.Close(); err != nil {
		fmt.Fprintf(stderr, "ft-launcher-etcd: %v\n", err)
		return 1
	}
	return 0
}
