package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadJobSecret: the secret file is read whole; one others may read,
// one too short, or a directory is refused with what is wanted.
func TestReadJobSecret(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := "0123456789abcdef0123456789abcdef\n"
	for _, tc := range []struct {
		name, path, want, wantErr string
	}{
		{"none", "", "", ""},
		{"good", write("good", good, 0o600), good, ""},
		{"read-only", write("ro", good, 0o400), good, ""},
		{"readable by others", write("open", good, 0o644), "", "want 0600 or 0400"},
		{"too short", write("short", "abc\n", 0o600), "", "at least 16 bytes"},
		{"missing", filepath.Join(dir, "nope"), "", "no such file"},
		{"a directory", dir, "", "not a regular file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readJobSecret(tc.path)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || string(got) != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
