package configs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestValidateRunIDAccepts: the ids jobs use are kept: Slurm's, UUIDs,
// Kubernetes names, the default and names with - _ . + : @.
func TestValidateRunIDAccepts(t *testing.T) {
	for _, id := range []string{
		"none", "1234567", "1234567-r0", "88_12-r3", "9f1c2e7a-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
		"llama-70b", "exp_3.v2", "team.exp-3", "job-12345-TestX_sub-1732671234567890123",
		"a", "1234+0", "user@exp", "run:2", strings.Repeat("x", MaxRunIDLen),
	} {
		if err := ValidateRunID(id); err != nil {
			t.Errorf("ValidateRunID(%q) = %v, want nil", id, err)
		}
	}
}

// TestBadRunID: every refused run id, from a flag, PET_RDZV_ID or Slurm's
// job id, is a one-line usage error that names where it came from, what is
// wrong and what is allowed.
func TestBadRunID(t *testing.T) {
	allowed := "allowed: 1 to 200 characters of ASCII letters, digits and . _ - + : @, without '..'"
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		subject string
		want    []string
	}{
		{"empty", []string{"--rdzv-id", ""}, nil, "--rdzv-id", []string{"--rdzv-id: empty run id: 1 to 200 characters"}},
		{"too long", []string{"--rdzv-id", strings.Repeat("a", 300)}, nil, "--rdzv-id",
			[]string{"run id of 300 bytes (\"aaaa", "...): longer than 200", allowed}},
		{"one over", []string{"--rdzv-id", strings.Repeat("a", MaxRunIDLen+1)}, nil, "--rdzv-id", []string{"201 bytes", "longer than 200"}},
		{"newline", []string{"--rdzv-id", "job\n1"}, nil, "--rdzv-id", []string{`run id "job\n1" holds a newline (U+000A) at byte 3`, allowed}},
		{"carriage return", []string{"--rdzv-id", "job\r"}, nil, "--rdzv-id", []string{"a control character (U+000D)"}},
		{"NUL", []string{"--rdzv-id", "a\x00b"}, nil, "--rdzv-id", []string{"a control character (U+0000)"}},
		{"escape", []string{"--rdzv-id", "a\x1b[31mb"}, nil, "--rdzv-id", []string{"a control character (U+001B)"}},
		{"DEL", []string{"--rdzv-id", "a\x7f"}, nil, "--rdzv-id", []string{"a control character (U+007F)"}},
		{"right-to-left override", []string{"--rdzv-id", "exp\u202egpj.sh"}, nil, "--rdzv-id", []string{`"exp\u202egpj.sh"`, "a right-to-left override (U+202E)"}},
		{"other non-ASCII", []string{"--rdzv-id", "expé"}, nil, "--rdzv-id", []string{"the non-ASCII character U+00E9"}},
		{"invalid UTF-8", []string{"--rdzv-id", "a\xffb"}, nil, "--rdzv-id", []string{"not valid UTF-8 at byte 1"}},
		{"slash", []string{"--rdzv-id", "team/exp"}, nil, "--rdzv-id", []string{"'/' (a path separator)"}},
		{"traversal", []string{"--rdzv-id", "../../etc"}, nil, "--rdzv-id", []string{"'/' (a path separator) at byte 2"}},
		{"dot dot", []string{"--rdzv-id", ".."}, nil, "--rdzv-id", []string{`run id ".." holds '..'`}},
		{"dot dot inside", []string{"--rdzv-id", "a..b"}, nil, "--rdzv-id", []string{"holds '..'"}},
		{"space", []string{"--rdzv-id", "my run"}, nil, "--rdzv-id", []string{"a space at byte 2"}},
		{"star", []string{"--rdzv-id", "a*"}, nil, "--rdzv-id", []string{"'*' at byte 1"}},
		{"env", nil, map[string]string{"PET_RDZV_ID": "x\ny"}, "PET_RDZV_ID", []string{"PET_RDZV_ID: run id", "a newline"}},
		{"slurm job id", nil, map[string]string{"SLURM_JOB_ID": "7/7", "SLURM_NNODES": "1"}, "Slurm (SLURM_JOB_ID=7/7, SLURM_RESTART_COUNT=0)",
			[]string{"'/' (a path separator)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(append(tt.args, "x.py"), envOf(tt.env), noGPU(t))
			for _, w := range tt.want {
				checkUsageError(t, err, tt.subject, w)
			}
		})
	}
}

// TestStandaloneRunIDValid: the random id --standalone makes passes the
// check, whatever --rdzv-id said.
func TestStandaloneRunIDValid(t *testing.T) {
	c, err := parse([]string{"--standalone", "--rdzv-id", "bad/id", "x.py"}, envOf(nil), noGPU(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := ValidateRunID(c.RdzvID); err != nil {
		t.Errorf("standalone id %q: %v", c.RdzvID, err)
	}
}

// TestVerdictFileDirectory: a --verdict-file (or FT_LAUNCHER_VERDICT_FILE)
// that is a directory is refused before anything starts; a path that does
// not exist yet is fine.
func TestVerdictFileDirectory(t *testing.T) {
	dir := t.TempDir()
	_, err := parse([]string{"--verdict-file", dir, "x.py"}, envOf(nil), noGPU(t))
	checkUsageError(t, err, "--verdict-file", "is a directory: must name a file")
	_, err = parse([]string{"x.py"}, envOf(map[string]string{"FT_LAUNCHER_VERDICT_FILE": dir}), noGPU(t))
	checkUsageError(t, err, "FT_LAUNCHER_VERDICT_FILE", "is a directory")
	if _, err := parse([]string{"--verdict-file", filepath.Join(dir, "new", "verdict.json"), "x.py"}, envOf(nil), noGPU(t)); err != nil {
		t.Errorf("a new verdict path: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
		t.Error("parsing created the verdict's directory")
	}
}
