package main

import (
	"testing"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestMemberFailuresBounded: the verdict keeps the newest failures, at most
// maxMemberFailures; a nil list (no hosted member) records nothing.
func TestMemberFailuresBounded(t *testing.T) {
	var none *memberFailures
	none.add(verdict.EtcdMemberFailure{PID: 1})
	if got := none.snapshot(); got != nil {
		t.Fatalf("nil list: %v", got)
	}
	f := &memberFailures{}
	for i := range maxMemberFailures + 5 {
		f.add(verdict.EtcdMemberFailure{PID: i})
	}
	got := f.snapshot()
	if len(got) != maxMemberFailures || got[0].PID != 5 || got[len(got)-1].PID != maxMemberFailures+4 {
		t.Fatalf("kept %d entries, PIDs %d..%d; want %d, 5..%d", len(got), got[0].PID, got[len(got)-1].PID, maxMemberFailures, maxMemberFailures+4)
	}
}
