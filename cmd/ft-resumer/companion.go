package main

import (
	"fmt"
	"io"
	"os"
	"syscall"

	"github.com/ftlauncher/ft-launcher/internal/cli"
)

// controllerCompanion is the AppWrapper controller's program. It is not
// linked into ft-resumer: client-go and controller-runtime initialise some
// 50 ms of package state at every start of a program that links them, and
// ft-resumer starts in every Slurm job of a chain, between the predecessor's
// end and the user's script (docs/benchmarks.md, "Slurm chain hop"). As
// ft-launcher-etcd is to ft-launcher, it is installed beside ft-resumer.
const controllerCompanion = "ft-appwrapper-controller"

// findCompanion looks for name beside this executable, then on PATH.
func findCompanion(name string) (string, error) {
	p, ok := cli.FindCompanion(name)
	if !ok {
		return "", fmt.Errorf("%s is not installed beside ft-resumer nor on PATH (it comes with ft-resumer in the release, the wheel and the image; from source: go build -o DIR/ ./cmd/...)", name)
	}
	return p, nil
}

// execCompanion replaces this process with the companion program name,
// given args: same process, signals and exit status, as if it had been run
// directly. It returns only when it cannot.
func execCompanion(name string, args []string, stderr io.Writer) int {
	p, err := findCompanion(name)
	if err == nil {
		err = syscall.Exec(p, append([]string{p}, args...), os.Environ())
	}
	fmt.Fprintf(stderr, "ft-resumer: %v\n", err)
	return 127
}
