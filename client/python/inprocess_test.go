package clientpython

import (
	"os/exec"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestInProcessAPIUnit runs the unit tests of ft_launcher_client.inprocess
// (tests/test_inprocess.py: a fake FTL1 rank monitor, no torch needed);
// integration/inprocess_test.go runs the API with real torch ranks.
func TestInProcessAPIUnit(t *testing.T) {
	testenv.SkipShort(t, "runs Python client processes")
	cmd := exec.Command(python(t), "-m", "unittest", "tests.test_inprocess", "-v")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python unit tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
