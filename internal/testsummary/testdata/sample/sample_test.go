// Package sample is run by testsummary's own tests with `go test -json`:
// one test of each outcome, the panic last (it ends the binary).
package sample

import (
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

func TestPasses(t *testing.T) { t.Log("fine") }

func TestFails(t *testing.T) { t.Error("sample failure") }

func TestNeedsSlurm(t *testing.T) { testenv.Missing(t, testenv.Slurm, "played missing") }

func TestPanics(t *testing.T) {
	t.Run("inner", func(t *testing.T) {
		var m map[string]int
		m["x"] = 1
	})
}
