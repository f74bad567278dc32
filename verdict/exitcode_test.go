package verdict

import "testing"

// TestCloseExitCode: a no-restart close exits with the no-restart code,
// every other close kind with 1; a kindless close record is read back to
// the kind its code stands for.
func TestCloseExitCode(t *testing.T) {
	tests := []struct {
		kind Kind
		code int
	}{
		{NoRestart, DefaultNoRestartExitCode},
		{FatalError, 1},
		{RestartBudgetExhausted, 1},
		{NotEnoughNodes, 1},
		{NodeExcluded, 1},
		{RendezvousLost, 1},
	}
	for _, tt := range tests {
		if got := CloseExitCode(tt.kind); got != tt.code {
			t.Errorf("CloseExitCode(%s) = %d, want %d", tt.kind, got, tt.code)
		}
	}
	for code, want := range map[int]Kind{0: Succeeded, DefaultNoRestartExitCode: NoRestart, 1: FatalError, 42: FatalError} {
		if got := CloseKindOf(code); got != want {
			t.Errorf("CloseKindOf(%d) = %s, want %s", code, got, want)
		}
	}
	if DefaultNoRestartExitCode != 93 {
		t.Errorf("DefaultNoRestartExitCode = %d: nvrx's is 93, and outer loops rely on it", DefaultNoRestartExitCode)
	}
}
