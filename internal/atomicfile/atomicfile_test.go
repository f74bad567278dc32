package atomicfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writers are both ways to write: what readers see is the same.
var writers = []struct {
	name  string
	write func(string, []byte, os.FileMode) error
}{{"Write", Write}, {"WriteVolatile", WriteVolatile}}

func TestWrite(t *testing.T) {
	tests := []struct {
		name string
		perm os.FileMode
		pre  string // existing content, "" for none
	}{
		{"new file 0644", 0o644, ""},
		{"replace 0600", 0o600, "old content"},
		{"nested dir", 0o640, ""},
	}
	for _, w := range writers {
		for _, tc := range tests {
			t.Run(w.name+"/"+tc.name, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "a", "b", "f.json")
				if tc.pre != "" {
					if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
						t.Fatal(err)
					}
					if err := os.WriteFile(path, []byte(tc.pre), 0o666); err != nil {
						t.Fatal(err)
					}
				}
				if err := w.write(path, []byte("new"), tc.perm); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(path)
				if err != nil || string(got) != "new" {
					t.Fatalf("content %q, %v", got, err)
				}
				st, _ := os.Stat(path)
				if st.Mode().Perm() != tc.perm {
					t.Fatalf("mode %v, want %v", st.Mode().Perm(), tc.perm)
				}
				ents, _ := os.ReadDir(filepath.Dir(path))
				if len(ents) != 1 {
					t.Fatalf("temporary files left: %v", ents)
				}
			})
		}
	}
}

func TestWriteFailsCleanly(t *testing.T) {
	for _, w := range writers {
		t.Run(w.name, func(t *testing.T) { testWriteFailsCleanly(t, w.write) })
	}
}

func testWriteFailsCleanly(t *testing.T, write func(string, []byte, os.FileMode) error) {
	dir := t.TempDir()
	// The target is a directory: rename fails; no temp file may stay.
	target := filepath.Join(dir, "d")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := write(target, []byte("x"), 0o644)
	if err == nil || !strings.Contains(err.Error(), "the path is a directory, not a file") {
		t.Fatalf("writing over a directory: %v, want an error saying it is a directory", err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Fatalf("left behind: %v", ents)
	}
}
