package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormat(t *testing.T) {
	bi := func(kv ...string) *debug.BuildInfo {
		b := &debug.BuildInfo{}
		for i := 0; i+1 < len(kv); i += 2 {
			b.Settings = append(b.Settings, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return b
	}
	const sha = "abc1234def5678abc1234def5678abc1234def56"
	tests := []struct {
		name   string
		ver    string
		commit string
		bi     *debug.BuildInfo
		want   string
	}{
		{"clean vcs build", "0.2.0", "", bi("vcs.revision", sha, "vcs.modified", "false"),
			"ft-launcher 0.2.0 (commit abc1234, go1.26.8, linux/amd64)"},
		{"dirty vcs build", "0.2.0", "", bi("vcs.revision", sha, "vcs.modified", "true"),
			"ft-launcher 0.2.0 (commit abc1234+dirty, go1.26.8, linux/amd64)"},
		{"commit set by ldflags wins", "1.0.0", "feedbee", bi("vcs.revision", sha),
			"ft-launcher 1.0.0 (commit feedbee, go1.26.8, linux/amd64)"},
		{"no vcs stamp", "0.2.0", "", bi(), "ft-launcher 0.2.0 (commit unknown, go1.26.8, linux/amd64)"},
		{"no build info", "0.2.0", "", nil, "ft-launcher 0.2.0 (commit unknown, go1.26.8, linux/amd64)"},
		{"short revision kept whole", "0.2.0", "", bi("vcs.revision", "abc"), "ft-launcher 0.2.0 (commit abc, go1.26.8, linux/amd64)"},
		{"empty version", "", "", nil, "ft-launcher unknown (commit unknown, go1.26.8, linux/amd64)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := format("ft-launcher", tt.ver, tt.commit, tt.bi, "go1.26.8", "linux/amd64"); got != tt.want {
				t.Errorf("format() = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestString checks the real line: this binary's version, Go and platform.
func TestString(t *testing.T) {
	got := String("ft-resumer")
	if !strings.HasPrefix(got, "ft-resumer "+Version+" (commit ") || !strings.Contains(got, ", go1.") || !strings.HasSuffix(got, ")") {
		t.Errorf("String() = %q, want \"ft-resumer %s (commit ..., go1.N, os/arch)\"", got, Version)
	}
}
