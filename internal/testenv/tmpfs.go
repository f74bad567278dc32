package testenv

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// Tmpfs mounts a tmpfs of the given size (mount(8)'s size=, e.g. "64k")
// on a fresh directory and returns it; t's cleanup unmounts it (lazily if
// something still holds it) before the directory goes. It needs root
// (CAP_SYS_ADMIN): without, it ends t through Missing.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	Require(t, Root)
	dir := filepath.Join(t.TempDir(), "tmpfs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size); err != nil {
		if errors.Is(err, unix.EPERM) {
			Missing(t, Root, "mount -t tmpfs: "+err.Error()+" (CAP_SYS_ADMIN is needed)")
		}
		t.Fatalf("mount -t tmpfs -o size=%s %s: %v", size, dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, 0); err != nil {
			if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
				t.Errorf("umount %s: %v", dir, err)
			}
		}
	})
	return dir
}

// FillUp writes a file into dir until its file system is full (ENOSPC),
// so that every later write there that needs a new block fails.
func FillUp(t testing.TB, dir string) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("filling %s: %v", dir, err)
			}
			return
		}
	}
}
