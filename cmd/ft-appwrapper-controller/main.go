// Command ft-appwrapper-controller is the AppWrapper controller: the
// Kubernetes rung of the outer loop (workload resets with AppWrapper's
// semantics), run in a cluster in place of the upstream controller
// (docs/kubernetes.md). `ft-resumer appwrapper-controller` runs it: it is a
// program of its own so that ft-resumer, which starts in every Slurm job,
// does not load the Kubernetes client packages.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/ftlauncher/ft-launcher/internal/version"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == "--version" {
		fmt.Fprintln(stdout, version.String("ft-appwrapper-controller"))
		return 0
	}
	return cmdAppWrapperController(ctx, args, stdout, stderr)
}
