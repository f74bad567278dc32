package nvrxwire

import "testing"

// TestWorkloadActionString: every member of nvrx's WorkloadAction the
// unpickler accepts has its own name as String(), and nothing else has one.
func TestWorkloadActionString(t *testing.T) {
	members := dataEnums["WorkloadAction"]
	for name, v := range members {
		if got := WorkloadAction(v).String(); got != name {
			t.Errorf("WorkloadAction(%d).String() = %q, want %q", v, got, name)
		}
	}
	if got := WorkloadAction(len(members)).String(); got != "" {
		t.Errorf("an unknown value's String() = %q, want \"\"", got)
	}
}
