// Package strict is run by testenv's own tests in a subprocess, with and
// without CI set: each test meets a requirement played as missing.
package strict

import (
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestNeedsSlurm(t *testing.T) {
	testenv.Missing(t, testenv.Slurm, "played missing by testenv's test")
	t.Error("reached after Missing")
}

func TestNeedsGPU(t *testing.T) {
	testenv.Missing(t, testenv.GPU, "played missing by testenv's test")
	t.Error("reached after Missing")
}
