package monitor

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestSaveStateFile: the computed-timeouts state file is shared by the jobs
// that name it, so it is written world-readable (whatever the umask) and
// atomically, and it round-trips through loadState.
func TestSaveStateFile(t *testing.T) {
	tests := []struct {
		name string
		rel  string // relative to a temp dir; directories are created
		pre  []byte // existing content replaced
	}{
		{name: "new file", rel: "state.json"},
		{name: "new directory", rel: "a/b/state.json"},
		{name: "replaces", rel: "state.json", pre: []byte("old")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, tc.rel)
			if tc.pre != nil {
				if err := os.WriteFile(path, tc.pre, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			to := Timeouts{Heartbeat: 7 * time.Second, HeartbeatCalculated: true}
			if err := saveState(path, to, 3, nil); err != nil {
				t.Fatal(err)
			}
			st, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o644 {
				t.Errorf("mode %v, want 0644", st.Mode().Perm())
			}
			u, err := loadState(path)
			if err != nil {
				t.Fatal(err)
			}
			if u.Heartbeat == nil || durOf(u.Heartbeat.Subsequent) != 7*time.Second {
				t.Errorf("reloaded %+v", u.Heartbeat)
			}
			ents, _ := os.ReadDir(filepath.Dir(path))
			if len(ents) != 1 {
				t.Errorf("temporary files left: %v", ents)
			}
		})
	}
}

// TestSaveStateFileError: a path that cannot be written reports an error and
// leaves no temporary file.
func TestSaveStateFileError(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	if err := os.WriteFile(blocker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := saveState(filepath.Join(blocker, "state.json"), Timeouts{}, 0, nil); err == nil {
		t.Fatal("saveState under a regular file succeeded")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("left behind: %v", ents)
	}
}
