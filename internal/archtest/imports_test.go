package archtest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/ftlauncher/ft-launcher/"

// TestArrowsPointDown fails when a package depends, directly or through
// others, on a package above it. Each row is one rule of
// docs/architecture.md ("Every arrow points down").
func TestArrowsPointDown(t *testing.T) {
	tests := []struct {
		pkg       string
		forbidden []string
		why       string
	}{
		{"configs", []string{"slurm/resumer", "k8s/appwrapper", "agent"}, "the configuration reads the scheduler's environment, not the outer loop"},
		{"slurm", []string{"slurm/resumer"}, "slurm is the launcher's half; slurm/resumer builds on it"},
		{"k8s", []string{"k8s/appwrapper"}, "k8s is the launcher's half; k8s/appwrapper builds on it"},
		{"cmd/ft-launcher", []string{"slurm/resumer", "k8s/appwrapper", "report"}, "the launcher does not link the outer loop"},
		{"prewarm", []string{"agent"}, "prewarm returns its own *prewarm.Group; cmd/ft-launcher adapts it to the agent"},
		{"monitor/nvrxwire", []string{"configs"}, "the wire codec has its own Config; monitor converts the configuration into it"},
		{"policy", []string{"agent", "rendezvous", "configs"}, "the restart policy is a pure function below its callers"},
		{"cmd/ft-resumer", []string{"k8s/appwrapper"}, "the AppWrapper controller is ft-appwrapper-controller: ft-resumer starts in every Slurm job, and the Kubernetes client packages take some 50 ms to initialise at each start"},
	}
	for _, tt := range tests {
		t.Run(tt.pkg, func(t *testing.T) {
			deps := goListDeps(t, tt.pkg)
			if len(deps) == 0 {
				t.Fatalf("go list -deps %s listed nothing", tt.pkg)
			}
			for _, f := range tt.forbidden {
				if slices.Contains(deps, module+f) {
					t.Errorf("%s depends on %s: %s", tt.pkg, f, tt.why)
				}
			}
		})
	}
}

// goListDeps is `go list -deps` of the module's package pkg (its non-test
// imports, transitively, itself included).
func goListDeps(t *testing.T, pkg string) []string {
	t.Helper()
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}", "./"+pkg)
	cmd.Dir = filepath.Join("..", "..") // the module root
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps ./%s: %v\n%s", pkg, err, stderr)
	}
	return strings.Fields(string(out))
}
