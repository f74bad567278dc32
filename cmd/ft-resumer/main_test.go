package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestRun(t *testing.T) {
	version := regexp.MustCompile(`^ft-resumer \S+ \(commit \S+, go1\.[0-9.]+\S*, [a-z0-9]+/[a-z0-9]+\)\n$`)
	tests := []struct {
		args   []string
		code   int
		stdout func(string) bool
		stderr string
	}{
		{[]string{"--version"}, 0, version.MatchString, ""},
		{[]string{"--help"}, 0, func(s string) bool { return strings.HasPrefix(s, "Usage: ft-resumer") }, ""},
		{[]string{"-h"}, 0, func(s string) bool { return strings.HasPrefix(s, "Usage: ft-resumer") }, ""},
		{nil, 2, func(s string) bool { return s == "" }, "not yet implemented"},
		{[]string{"--version", "x"}, 2, func(s string) bool { return s == "" }, "not yet implemented"},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := run(tt.args, &stdout, &stderr)
		if code != tt.code || !tt.stdout(stdout.String()) || !strings.Contains(stderr.String(), tt.stderr) {
			t.Errorf("run(%q) = %d, stdout %q, stderr %q; want %d and stderr containing %q", tt.args, code, stdout.String(), stderr.String(), tt.code, tt.stderr)
		}
	}
}
