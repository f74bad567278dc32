package clientpython

import (
	"testing"
)

// TestPeerHealAPI runs tests/heal_check.py with Debian's python3 and torch:
// four real gloo ranks heal a replacement from a survivor (data parallel
// and declared replica groups, bit-identical), and fall back to the newest
// save in launcher memory when the survivors disagree on the step or a
// replica group has no survivor, each heal leaving its restore note.
func TestPeerHealAPI(t *testing.T) {
	runTorchUnittest(t, "tests.heal_check")
}
