package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/testenv"
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
		{"group-readable, owner can write", write("group", good, 0o640), "", "or 0440 on a file root owns"},
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

// TestReadJobSecretGroupGrant: a secret root owns at mode 0440 with a group
// of this process (a Kubernetes Secret volume with the pod's fsGroup) is
// read; the same file owned by another user, or with a group this process
// is not in, is refused. Changing a file's owner needs root: the suite
// runs as root.
func TestReadJobSecretGroupGrant(t *testing.T) {
	testenv.Require(t, testenv.Root) // to give a file another owner or group
	good := "0123456789abcdef0123456789abcdef\n"
	for _, tc := range []struct {
		name     string
		uid, gid int
		ok       bool
	}{
		{"root's, our group", 0, os.Getegid(), true},
		{"another user's, our group", 65532, os.Getegid(), false},
		{"root's, a group we are not in", 0, 65533, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "job")
			if err := os.WriteFile(p, []byte(good), 0o440); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, tc.uid, tc.gid); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, 0o440); err != nil {
				t.Fatal(err)
			}
			got, err := readJobSecret(p)
			if tc.ok && (err != nil || string(got) != good) {
				t.Fatalf("got %q, %v; want the secret", got, err)
			}
			if !tc.ok && (err == nil || !strings.Contains(err.Error(), "lets other users read the secret")) {
				t.Fatalf("err %v; want the file refused", err)
			}
		})
	}
}

// TestGossipKeyOf: no secret, plain gossip; with one, a 32-byte key (an
// AES-256 key) that differs between run ids and is not the secret.
func TestGossipKeyOf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(p, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	key := func(file, run string) []byte {
		t.Helper()
		cfg := &configs.Config{JobSecretFile: file, RdzvID: run}
		k, err := gossipKeyOf(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if k := key("", "job"); k != nil {
		t.Fatalf("no secret: key %x, want none", k)
	}
	a, a2, b := key(p, "job-a"), key(p, "job-a"), key(p, "job-b")
	if len(a) != 32 || !bytes.Equal(a, a2) || bytes.Equal(a, b) || bytes.Contains([]byte("0123456789abcdef0123456789abcdef"), a) {
		t.Fatalf("keys %x / %x / %x: want 32 bytes, stable per run id, different across run ids", a, a2, b)
	}
}
