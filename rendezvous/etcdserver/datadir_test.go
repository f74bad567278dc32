package etcdserver

import (
	"context"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func startServer(t *testing.T) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Start(ctx, Options{ClientURL: "http://127.0.0.1:0", Logger: quiet()})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// deadPid is the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

// fakeDir makes <tmp>/<name> with etcd-like data and, unless pid is 0, an
// owner.lock naming pid.
func fakeDir(t *testing.T, tmp, name string, pid int) string {
	t.Helper()
	p := filepath.Join(tmp, name)
	if err := os.MkdirAll(filepath.Join(p, "data", "member", "wal"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(p, "data", "member", "wal", "0.wal"), make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	if pid != 0 {
		if err := os.WriteFile(filepath.Join(p, lockName), []byte(strconv.Itoa(pid)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// TestStaleDataDirsRemovedAtStart: a start removes the data dirs of dead
// owners (a SIGKILLed server cannot remove its own) and leaves every dir
// whose owner lives (another process or this one), and dirs it cannot
// judge. Its own dir lives under $TMPDIR and goes on Close.
func TestStaleDataDirsRemovedAtStart(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	live := startServer(t) // a live owner in this process
	liveDir := live.owned.path

	// A live owner in another process: flock(1) holds the lock.
	other := fakeDir(t, tmp, dirPrefix+"other", 1)
	holder := exec.Command("flock", filepath.Join(other, lockName), "sleep", "120")
	if err := holder.Start(); err != nil {
		t.Fatalf("flock(1): %v", err)
	}
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	waitLocked(t, other)

	staging := fakeDir(t, tmp, stagingPrefix+"old", 0)
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(staging, old, old); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		dir  string
		kept bool
	}{
		{fakeDir(t, tmp, dirPrefix+"dead", deadPid(t)), false},
		{staging, false},
		{liveDir, true},
		{other, true},
		{fakeDir(t, tmp, dirPrefix+"legacy", 0), true}, // no owner lock: an older launcher's
		{fakeDir(t, tmp, stagingPrefix+"fresh", 0), true},
		{fakeDir(t, tmp, "unrelated", deadPid(t)), true},
	}
	s := startServer(t)
	for _, tc := range tests {
		_, err := os.Stat(tc.dir)
		if kept := err == nil; kept != tc.kept {
			t.Errorf("%s: kept %v, want %v", filepath.Base(tc.dir), kept, tc.kept)
		}
	}
	own := s.owned.path
	if filepath.Dir(own) != tmp {
		t.Errorf("data dir %s is not under $TMPDIR %s", own, tmp)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(own); !os.IsNotExist(err) {
		t.Errorf("%s still there after Close: %v", own, err)
	}
}

// waitLocked waits until dir's owner lock is held by someone else.
func waitLocked(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		f, err := os.Open(filepath.Join(dir, lockName))
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close() // also drops the lock if we got it
		if err != nil {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("flock(1) did not take the lock")
}

// TestAdoptDataDir: a restarted member takes over its dead predecessor's
// dir only when the owner is dead and etcd data is there; every other
// case is an error (the launcher then replaces the member), and a dir
// without data is removed.
func TestAdoptDataDir(t *testing.T) {
	tmp := t.TempDir()
	tests := []struct {
		name     string
		dir      func() string
		ok       bool
		dirAfter bool // the dir exists after the call
	}{
		{"dead owner with data", func() string { return fakeDir(t, tmp, dirPrefix+"dead", deadPid(t)) }, true, true},
		{"gone", func() string { return filepath.Join(tmp, dirPrefix+"gone") }, false, false},
		{"live owner", func() string {
			d, err := newDataDir(tmp) // this process holds its lock
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { d.remove() })
			if err := os.MkdirAll(filepath.Join(d.data(), "member"), 0o700); err != nil {
				t.Fatal(err)
			}
			return d.path
		}, false, true},
		{"no data", func() string {
			p := fakeDir(t, tmp, dirPrefix+"empty", deadPid(t))
			if err := os.RemoveAll(filepath.Join(p, "data")); err != nil {
				t.Fatal(err)
			}
			return p
		}, false, false},
		{"not a member dir", func() string { return fakeDir(t, tmp, "elsewhere", deadPid(t)) }, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir()
			d, err := adoptDataDir(dir)
			if (err == nil) != tt.ok {
				t.Fatalf("adoptDataDir(%s): %v, want ok=%v", dir, err, tt.ok)
			}
			if d != nil {
				b, _ := os.ReadFile(filepath.Join(dir, lockName))
				if string(b) != strconv.Itoa(os.Getpid())+"\n" {
					t.Errorf("owner.lock holds %q after the adopt, want this pid", b)
				}
				if !lockHeld(dir) {
					t.Errorf("the adopted dir's lock is free")
				}
				if err := d.remove(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if _, err := os.Stat(dir); (err == nil) != tt.dirAfter {
				t.Errorf("dir exists after the refused adopt: %v, want %v", err == nil, tt.dirAfter)
			}
		})
	}
}

// lockHeld reports whether another open of dir's lock cannot take
// it (flock locks are per open file: this process's own lock blocks it).
func lockHeld(dir string) bool { return !ownerDead(dir) }
