// Package broken does not build, on purpose (testsummary's tests).
package broken

import "testing"

func TestNothing(t *testing.T) { undefinedOnPurpose() }
