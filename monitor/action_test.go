package monitor

import (
	"testing"

	"github.com/ftlauncher/ft-launcher/monitor/nvrxwire"
)

// TestWorkloadActions: the native protocol's names and nvrx's enum values
// map to the same actions; anything else is refused.
func TestWorkloadActions(t *testing.T) {
	tests := []struct {
		name string
		nvrx nvrxwire.WorkloadAction
		want WorkloadAction
	}{
		{"Continue", nvrxwire.WorkloadContinue, ActionContinue},
		{"ExcludeThisNode", nvrxwire.WorkloadExcludeThisNode, ActionExcludeThisNode},
		{"ShutdownWorkload", nvrxwire.WorkloadShutdownWorkload, ActionShutdownWorkload},
	}
	for _, tt := range tests {
		if a, ok := ParseWorkloadAction(tt.name); !ok || a != tt.want || a.String() != tt.name {
			t.Errorf("ParseWorkloadAction(%q) = %q, %v; want %q", tt.name, a, ok, tt.want)
		}
		if a := actionOf(tt.nvrx); a != tt.want {
			t.Errorf("actionOf(%d) = %q, want %q", tt.nvrx, a, tt.want)
		}
	}
	for _, bad := range []string{"", "continue", "Reboot"} {
		if a, ok := ParseWorkloadAction(bad); ok {
			t.Errorf("ParseWorkloadAction(%q) = %q, accepted", bad, a)
		}
	}
	if a := actionOf(nvrxwire.WorkloadAction(7)); a != "" {
		t.Errorf("actionOf(7) = %q, want none", a)
	}
}
