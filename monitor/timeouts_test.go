package monitor

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/stacks"
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

// TestJudgedClockIgnoresPersistedHeartbeat: a heartbeat timeout persisted
// by an earlier launcher is loaded only when the judged default clock does
// not apply (docs/timeouts.md, "Not with the judged default clock"); the
// section timeouts of the file are loaded either way.
func TestJudgedClockIgnoresPersistedHeartbeat(t *testing.T) {
	state := filepath.Join(t.TempDir(), "ft_state.json")
	saved := Timeouts{Heartbeat: 7 * time.Second, HeartbeatCalculated: true}.Clone()
	saved.Sections["step"] = 9 * time.Second
	saved.CalculatedSections["step"] = true
	if err := saveState(state, saved, 0, nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name          string
		stacks        bool
		configured    *float64
		wantHeartbeat time.Duration
	}{
		{name: "stacks, no timeout configured: judged clock", stacks: true, wantHeartbeat: 0},
		{name: "no stacks: loaded", stacks: false, wantHeartbeat: 7 * time.Second},
		{name: "stacks, a timeout configured: loaded", stacks: true, configured: fptr(42), wantHeartbeat: 7 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ft := configs.DefaultFaultTolerance()
			ft.RankHeartbeatTimeout = tc.configured
			o := Options{NLocal: 1, FT: ft, StateFile: state, MinComputedTimeout: -1}
			if tc.stacks {
				c, err := stacks.New()
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				o.Stacks = c
			}
			got := startManager(t, o).Timeouts()
			if got.Heartbeat != tc.wantHeartbeat {
				t.Errorf("heartbeat timeout %v, want %v", got.Heartbeat, tc.wantHeartbeat)
			}
			if got.Sections["step"] != 9*time.Second {
				t.Errorf("step section %v, want the persisted 9s", got.Sections["step"])
			}
		})
	}
}
