package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestRunVersionAndHelp: both answer on stdout and exit 0 without starting
// a server; a bad flag exits 2.
func TestRunVersionAndHelp(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want *regexp.Regexp
	}{
		{[]string{"--version"}, 0, regexp.MustCompile(`^ft-launcher-etcd \S+ \(commit \S+, go1\.[0-9.]+\S*, [a-z0-9]+/[a-z0-9]+\)\n$`)},
		{[]string{"--help"}, 0, regexp.MustCompile(`(?s)^Usage: ft-launcher-etcd \[options\].*--client-url.*--version`)},
		{[]string{"-h"}, 0, regexp.MustCompile(`^Usage: ft-launcher-etcd`)},
		{[]string{"--no-such-flag"}, 2, regexp.MustCompile(`^$`)},
	}
	for _, tt := range tests {
		var stdout, stderr bytes.Buffer
		code := run(tt.args, &stdout, &stderr)
		if code != tt.code || !tt.want.MatchString(stdout.String()) {
			t.Errorf("run(%q) = %d, stdout %q; want %d and stdout matching %s", tt.args, code, stdout.String(), tt.code, tt.want)
		}
		if tt.code == 2 && !strings.Contains(stderr.String(), "no-such-flag") {
			t.Errorf("run(%q): stderr %q does not name the bad flag", tt.args, stderr.String())
		}
	}
}
