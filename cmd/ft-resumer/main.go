// Command ft-resumer drives the outer fault-tolerance loop across scheduler
// jobs (Slurm auto-resume, Kubernetes workload reset). It is not implemented
// yet: it has its own issue.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "ft-resumer: not yet implemented (auto-resume and workload reset arrive with their own issue); use ft-launcher")
	os.Exit(2)
}
