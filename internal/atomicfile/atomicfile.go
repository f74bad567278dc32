// Package atomicfile writes a file so that readers see either the old
// content or the new, never a torn one: write a temporary file in the same
// directory, fsync it, set its mode, then rename it over the target.
// WriteVolatile skips the fsyncs, for records derived from durable state.
package atomicfile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path with data, creating its directory (0755) if needed.
// The file gets mode perm (before umask is not applied: the mode is set
// explicitly). On error the target is untouched and no temporary file stays.
// The new content survives a crash of the machine once Write returns.
func Write(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, true)
}

// WriteVolatile is Write without its fsyncs: readers still see the old
// content or the new, never a torn file, but after a crash of the machine
// the file may hold the old content. For records that are rebuilt from
// durable state, or that matter only while the machine runs, where two
// fsyncs would sit on a latency path.
func WriteVolatile(path string, data []byte, perm fs.FileMode) error {
	return write(path, data, perm, false)
}

func write(path string, data []byte, perm fs.FileMode, durable bool) error {
	dir := filepath.Dir(path)
	// Renaming a file over a directory fails only at the end, with a
	// puzzling "file exists"; say what is wrong first.
	if st, err := os.Lstat(path); err == nil && st.IsDir() {
		return fmt.Errorf("write %s: the path is a directory, not a file", path)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	fail := func(err error) error {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		return fail(err)
	}
	if err := tmp.Chmod(perm); err != nil {
		return fail(err)
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			return fail(err)
		}
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if !durable {
		return nil
	}
	// The rename is durable only once the directory is synced.
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}
