package clientpython

import (
	"os/exec"
	"testing"
)

// TestProtocolUnit runs tests/test_protocol.py: the client refuses, at once
// and without connecting, a rank monitor started by another launcher (nvrx's
// ft_launcher sets the same socket variable for a pickle-framed monitor),
// and connects to ft-launcher's, with or without FT_RANK_MONITOR_PROTOCOL.
func TestProtocolUnit(t *testing.T) {
	cmd := exec.Command(python(t), "-m", "unittest", "tests.test_protocol", "-v")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
