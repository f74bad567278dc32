package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindCompanion(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ftl-companion-test"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, tt := range []struct {
		name string
		want string // "" for not found
	}{
		{"ftl-companion-test", filepath.Join(dir, "ftl-companion-test")},
		{"ftl-companion-missing", ""},
	} {
		got, ok := FindCompanion(tt.name)
		if ok != (tt.want != "") || got != tt.want {
			t.Errorf("FindCompanion(%q) = %q, %v; want %q", tt.name, got, ok, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		args     []string
		code     int
		done     bool
		out, err string
	}{
		{[]string{"--n", "3"}, 0, false, "", ""},
		{[]string{"--help"}, 0, true, "Usage of prog sub:", ""},
		{[]string{"--bogus"}, 2, true, "", "prog sub: unknown flag: --bogus"},
	} {
		var stdout, stderr bytes.Buffer
		fs := FlagSet("prog sub", &stderr)
		fs.Int("n", 1, "a number")
		code, done := Parse(fs, tt.args, &stdout)
		if code != tt.code || done != tt.done || !strings.Contains(stdout.String(), tt.out) || !strings.Contains(stderr.String(), tt.err) {
			t.Errorf("%v: code %d done %v, stdout %q stderr %q", tt.args, code, done, stdout.String(), stderr.String())
		}
		if tt.args[0] == "--help" && stderr.Len() > 0 {
			t.Errorf("--help wrote to stderr: %q", stderr.String())
		}
	}
}
