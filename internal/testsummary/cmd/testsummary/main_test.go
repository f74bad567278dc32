package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func lastLine(s string) string {
	all := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return all[len(all)-1]
}

// TestRealGoTest runs `go test -json` on packages that pass, fail, skip
// for a missing requirement, panic and do not build: the output ends with
// the totals, and the exit status is 1.
func TestRealGoTest(t *testing.T) {
	t.Setenv("FTL_REQUIRE_ALL", "0") // the sample's Slurm skip stays a skip under CI
	var out, errOut strings.Builder
	code := run([]string{"go", "test", "-json", "-count=1", "../../testdata/sample", "../../testdata/broken"}, nil, &out, &errOut)
	s := out.String()
	if code != 1 {
		t.Errorf("exit %d; want 1\n%s\n%s", code, s, errOut.String())
	}
	if got, want := lastLine(s), "1 passed, 4 failed, 1 skipped"; got != want {
		// TestFails, TestPanics/inner, TestPanics, and the build failure.
		t.Errorf("last line %q; want %q\n%s", got, want, s)
	}
	for _, w := range []string{"sample failure", "panic: assignment to entry in nil map", "undefinedOnPurpose",
		"[environment] github.com/ftlauncher/ft-launcher/internal/testsummary/testdata/sample TestNeedsSlurm: testenv: missing Slurm: played missing",
		"1 environment skips, 0 hardware skips", "broken: build failed"} {
		if !strings.Contains(s, w) {
			t.Errorf("output lacks %q:\n%s", w, s)
		}
	}
	if strings.Contains(s, "sample_test.go:11: fine") {
		t.Errorf("a passing test's log is shown:\n%s", s)
	}
}

// TestCommandExitCounts: a command that fails without a failed test in its
// events (go vet, a go command error) is one failure.
func TestCommandExitCounts(t *testing.T) {
	var out, errOut strings.Builder
	code := run([]string{"--", "sh", "-c", "echo go: bad flag >&2; exit 3"}, nil, &out, &errOut)
	if code != 1 || lastLine(out.String()) != "0 passed, 1 failed, 0 skipped" {
		t.Errorf("exit %d, output %q; want 1 and one failure", code, out.String())
	}
	if !strings.Contains(out.String(), "exit status 3") || !strings.Contains(errOut.String(), "go: bad flag") {
		t.Errorf("the command's status or stderr is lost: %q / %q", out.String(), errOut.String())
	}
}

// TestStateAndReport: two recorded runs, then one report with their sum.
func TestStateAndReport(t *testing.T) {
	state := filepath.Join(t.TempDir(), "runs.jsonl")
	pass := `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p"}
`
	skip := `{"Action":"run","Package":"q","Test":"TestB"}
{"Action":"output","Package":"q","Test":"TestB","Output":"    b_test.go:3: set X=1 to measure\n"}
{"Action":"skip","Package":"q","Test":"TestB"}
{"Action":"pass","Package":"q"}
`
	for _, in := range []string{pass, skip} {
		var out strings.Builder
		if code := run([]string{"--state", state, "-"}, strings.NewReader(in), &out, &out); code != 0 {
			t.Fatalf("exit %d: %s", code, out.String())
		}
		if strings.Contains(out.String(), " passed, ") {
			t.Errorf("a recorded run printed a totals line of the final shape: %q", out.String())
		}
	}
	var out strings.Builder
	if code := run([]string{"--report", state}, nil, &out, &out); code != 0 {
		t.Errorf("report exit %d", code)
	}
	if got := lastLine(out.String()); got != "1 passed, 0 failed, 1 skipped" {
		t.Errorf("last line %q:\n%s", got, out.String())
	}
	if !strings.Contains(out.String(), "[other] q TestB: set X=1 to measure") {
		t.Errorf("report lacks the skip and its reason:\n%s", out.String())
	}
	// A failed run makes the report fail.
	var o2 strings.Builder
	if code := run([]string{"--state", state, "-"}, strings.NewReader(`{"Action":"fail","Package":"r"}`+"\n"), &o2, &o2); code != 1 {
		t.Errorf("failed run exit %d; want 1", code)
	}
	o2.Reset()
	if code := run([]string{"--report", state}, nil, &o2, &o2); code != 1 || lastLine(o2.String()) != "1 passed, 1 failed, 1 skipped" {
		t.Errorf("report after a failed run: exit %d, %q", code, lastLine(o2.String()))
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"--report", filepath.Join(t.TempDir(), "none")}, {"--report", "x", "go"}, {"--bogus"}} {
		var out strings.Builder
		if code := run(args, nil, &out, &out); code != 2 {
			t.Errorf("%q: exit %d; want 2\n%s", args, code, out.String())
		}
		if out.Len() == 0 {
			t.Errorf("%q: no message", args)
		}
	}
}
