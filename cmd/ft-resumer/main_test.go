package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	version := regexp.MustCompile(`^ft-resumer \S+ \(commit \S+, go1\.[0-9.]+\S*, [a-z0-9]+/[a-z0-9]+\)\n$`)
	empty := func(s string) bool { return s == "" }
	tests := []struct {
		args   []string
		code   int
		stdout func(string) bool
		stderr string
	}{
		{[]string{"--version"}, 0, version.MatchString, ""},
		{[]string{"--help"}, 0, func(s string) bool { return strings.HasPrefix(s, "Usage: ft-resumer") }, ""},
		{[]string{"-h"}, 0, func(s string) bool { return strings.HasPrefix(s, "Usage: ft-resumer") }, ""},
		{nil, 2, empty, "Usage: ft-resumer"},
		{[]string{"--version", "x"}, 2, empty, "unknown command"},
		{[]string{"frobnicate"}, 2, empty, "unknown command"},
		{[]string{"run", "job.sh"}, 2, empty, "--chain-dir is required"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "--job-results-format", "x", "job.sh"}, 2, empty, "nfl or nemo-run"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr"}, 2, empty, "give the batch script"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "a.sh", "b.sh"}, 2, empty, "one script expected"},
		{[]string{"run", "--bogus"}, 2, empty, "unknown flag"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "testdata/noshebang.sh"}, 2, empty, "the first line must be an interpreter line such as #!/bin/bash (sbatch refuses a script without one), not \"#SBATCH -N2\""},
		{[]string{"submit", "--chain-dir", "/nonexistent-ftr", "/nonexistent-ftr/job.sh"}, 2, empty, "no such file"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "--max-submit-rate", "ten", "job.sh"}, 2, empty, "want N/DURATION"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "--max-submit-rate", "5/0s", "job.sh"}, 2, empty, "positive duration"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "--progress-path", "/x/[", "job.sh"}, 2, empty, "--progress-path"},
		{[]string{"run", "--chain-dir", "/nonexistent-ftr", "--deterministic-after", "-1", "job.sh"}, 2, empty, "--deterministic-after"},
		{[]string{"run", "--help"}, 0, func(s string) bool { return strings.Count(s, "--max-jobs") == 1 }, ""},
		{[]string{"step", "run", "--chain-dir", "/x"}, 2, empty, "Usage: ft-resumer step run"},
		{[]string{"status"}, 2, empty, "--chain-dir is required"},
		{[]string{"status", "--chain-dir", "/nonexistent-ftr"}, 1, empty, "no chain"},
		{[]string{"step"}, 2, empty, "Usage: ft-resumer step"},
		{[]string{"node"}, 2, empty, "Usage: ft-resumer node"},
		{[]string{"node", "--", "/nonexistent-ftr/prog"}, 127, empty, "no such file"},
		{[]string{"report", "--help"}, 0, func(s string) bool {
			return strings.HasPrefix(s, "Usage: ft-resumer report") && strings.Contains(s, "--event-log")
		}, ""},
		{[]string{"report"}, 2, empty, "no records: give --event-log, --verdict or --chain-dir"},
		{[]string{"report", "--bogus"}, 2, empty, "unknown flag: --bogus"},
		{[]string{"report", "--event-log", "x", "y"}, 2, empty, `unexpected argument "y"`},
		{[]string{"report", "--event-log", "x", "--rdzv-id", "j"}, 2, empty, "--rdzv-endpoint and --rdzv-id go together"},
		{[]string{"report", "--event-log", "/nonexistent-ftr/ev.jsonl", "--json"}, 1, empty, "/nonexistent-ftr/ev.jsonl"},
		{[]string{"appwrapper"}, 2, empty, "usage: ft-resumer appwrapper generate VALUES"},
		{[]string{"appwrapper", "generate"}, 2, empty, "give one values file"},
		{[]string{"appwrapper", "generate", "/nonexistent-ftr/v.yaml"}, 2, empty, "no such file"},
		{[]string{"appwrapper", "generate", "testdata/values-bad.yaml"}, 2, empty, "testdata/values-bad.yaml: values: nodes is 0"},
		{[]string{"appwrapper", "generate", "testdata/values.yaml"}, 0, func(s string) bool {
			return strings.Contains(s, "kind: AppWrapper") && strings.Contains(s, "completionMode: Indexed")
		}, ""},
	}
	if _, err := os.Stat("/nonexistent-ftr"); err == nil {
		t.Fatal("/nonexistent-ftr exists")
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		t.Setenv("FT_RESUMER_CHAIN", "")
		code := run(context.Background(), tt.args, &stdout, &stderr)
		if code != tt.code || !tt.stdout(stdout.String()) || !strings.Contains(stderr.String(), tt.stderr) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d and stderr containing %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stderr)
		}
	}
	// Nothing was created (or submitted) for the refused scripts.
	if _, err := os.Stat("/nonexistent-ftr"); err == nil {
		t.Error("a refused run created its chain directory")
	}
}
