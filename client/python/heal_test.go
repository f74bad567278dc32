package clientpython

import (
	"os/exec"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestPeerHealAPI runs tests/heal_check.py with Debian's python3 and torch:
// four real gloo ranks heal a replacement from a survivor (data parallel
// and declared replica groups, bit-identical), and fall back to the newest
// save in launcher memory when the survivors disagree on the step or a
// replica group has no survivor, each heal leaving its restore note.
func TestPeerHealAPI(t *testing.T) {
	testenv.SkipShort(t, "runs Python client processes")
	testenv.Require(t, testenv.Torch)
	out, err := exec.Command(testenv.DebianPython, "-m", "unittest", "tests.heal_check", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("python peer heal tests: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
