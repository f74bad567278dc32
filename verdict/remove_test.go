package verdict

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"golang.org/x/sys/unix"
)

// fsImmutableFL is FS_IMMUTABLE_FL (linux/fs.h): on a directory, no entry
// can be added or removed, while the files in it stay writable.
const fsImmutableFL = 0x10

// TestRemove: after a failed write the previous verdict is gone (removed),
// a symlink is removed but not what it points to, a directory and a
// missing path are left alone.
func TestRemove(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, path string)
		wantGone bool // path no longer exists
	}{
		{"old verdict", func(t *testing.T, path string) { writeOld(t, path) }, true},
		{"missing", func(t *testing.T, path string) {}, true},
		{"symlink", func(t *testing.T, path string) {
			target := path + ".target"
			writeOld(t, target)
			if err := os.Symlink(target, path); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if _, err := os.Stat(target); err != nil {
					t.Errorf("the symlink's target went: %v", err)
				}
			})
		}, true},
		{"directory", func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "verdict.json")
			tt.setup(t, path)
			if err := Remove(path); err != nil {
				t.Fatal(err)
			}
			_, err := os.Lstat(path)
			if gone := os.IsNotExist(err); gone != tt.wantGone {
				t.Errorf("gone = %v (%v), want %v", gone, err, tt.wantGone)
			}
		})
	}
}

// TestRemoveEmptiesWhereItCannotRemove: in a directory whose entries
// cannot be removed (immutable, as a read-only directory is for a user)
// the previous verdict is cut to 0 bytes, which no reader takes for a
// verdict.
func TestRemoveEmptiesWhereItCannotRemove(t *testing.T) {
	testenv.Require(t, testenv.Root)
	dir := t.TempDir()
	path := filepath.Join(dir, "verdict.json")
	writeOld(t, path)
	setFlags := func(on bool) error {
		f, err := os.Open(dir)
		if err != nil {
			return err
		}
		defer f.Close()
		flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
		if err != nil {
			return err
		}
		if on {
			flags |= fsImmutableFL
		} else {
			flags &^= fsImmutableFL
		}
		return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
	}
	if err := setFlags(true); err != nil {
		t.Fatalf("make %s immutable (the test's file system must support chattr +i): %v", dir, err)
	}
	t.Cleanup(func() {
		if err := setFlags(false); err != nil {
			t.Errorf("chattr -i %s: %v", dir, err)
		}
	})
	if err := os.Remove(path); err == nil {
		t.Fatal("removal worked in an immutable directory: the test proves nothing")
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Size() != 0 {
		t.Fatalf("stat %v %v: want an empty file", st, err)
	}
	if _, err := Read(path); err == nil {
		t.Error("Read took an empty file for a verdict")
	}
}

// TestRecordsLostField: records_lost is absent when nothing was lost and
// carries the counts otherwise.
func TestRecordsLostField(t *testing.T) {
	path := filepath.Join(t.TempDir(), "verdict.json")
	if err := Write(path, Verdict{Kind: Succeeded}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); strings.Contains(string(b), "records_lost") {
		t.Errorf("records_lost written with nothing lost:\n%s", b)
	}
	lost := &RecordsLost{EventLogEvents: 2, EventLogBytes: 300, RankOutputBytes: 4096}
	if err := Write(path, Verdict{Kind: Succeeded, RecordsLost: lost}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	var raw struct {
		RecordsLost map[string]int64 `json:"records_lost"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"event_log_events": 2, "event_log_bytes": 300, "rank_output_bytes": 4096}
	for k, v := range want {
		if raw.RecordsLost[k] != v {
			t.Errorf("records_lost.%s = %d, want %d (%s)", k, raw.RecordsLost[k], v, b)
		}
	}
	if !lost.Any() || (RecordsLost{}).Any() {
		t.Error("Any")
	}
}

func writeOld(t *testing.T, path string) {
	t.Helper()
	if err := Write(path, Verdict{Kind: Succeeded, RunID: "previous-run"}); err != nil {
		t.Fatal(err)
	}
}
