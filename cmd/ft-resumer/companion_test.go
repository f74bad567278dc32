package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestControllerCompanionMissing: without ft-appwrapper-controller beside
// ft-resumer or on PATH, `ft-resumer appwrapper-controller` says what is
// missing and where it comes from, with status 127 (the shell's "not
// found"). Its success (the controller started through ft-resumer) is
// shown by the Kubernetes tests (integration/k8s, k8s/kubelettest).
func TestControllerCompanionMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // nothing there; the test binary's own folder has no companion either
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"appwrapper-controller", "--help"}, &stdout, &stderr)
	if code != 127 || !strings.Contains(stderr.String(), "ft-appwrapper-controller is not installed beside ft-resumer nor on PATH") {
		t.Errorf("exit %d, stderr %q; want 127 naming the missing program", code, stderr.String())
	}
}
