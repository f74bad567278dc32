package appwrapper

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestVerdictLostIsNoVerdict: a launcher that could not write its
// termination message exits 73 and leaves it empty or cut (it was opened
// with O_TRUNC); neither is read as a verdict, so an earlier container's
// no_restart or quarantine is not taken for this one's.
func TestVerdictLostIsNoVerdict(t *testing.T) {
	full := message(t, verdict.Verdict{Kind: verdict.NoRestart, ExitCode: 93, Reason: "ShutdownWorkload"})
	for _, msg := range []string{"", full[:len(full)/2]} {
		s := SummarizePods([]corev1.Pod{pod("p0", corev1.PodFailed, exited("c", 73, msg))}, Params{}, nil)
		if len(s.Verdicts) != 0 || s.NoRestart {
			t.Errorf("message %q: verdicts %+v, no_restart %v: want none", msg, s.Verdicts, s.NoRestart)
		}
	}
}
