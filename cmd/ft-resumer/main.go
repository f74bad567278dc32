// Command ft-resumer drives the outer fault-tolerance loop across scheduler
// jobs (Slurm auto-resume, Kubernetes workload reset). It is not implemented
// yet: it has its own issue. Only --version and --help work.
package main

import (
	"fmt"
	"io"
	"os"

	"github.com/ftlauncher/ft-launcher/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage: ft-resumer [--version | --help]

ft-resumer will drive the outer fault-tolerance loop across scheduler jobs
(Slurm auto-resume, Kubernetes workload reset). It is not implemented yet;
use ft-launcher.
`

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 {
		switch args[0] {
		case "--version":
			fmt.Fprintln(stdout, version.String("ft-resumer"))
			return 0
		case "-h", "--help":
			fmt.Fprint(stdout, usage)
			return 0
		}
	}
	fmt.Fprintln(stderr, "ft-resumer: not yet implemented (auto-resume and workload reset arrive with their own issue); use ft-launcher")
	return 2
}
