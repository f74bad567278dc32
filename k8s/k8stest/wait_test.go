package k8stest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWaitBuild: the wait for scripts/test.sh's background build of the
// binaries returns once the build has written its exit status, and a
// failed build is an ErrNoAssets that quotes its log.
func TestWaitBuild(t *testing.T) {
	cases := []struct {
		name    string
		set     bool   // FTL_K8S_ASSETS_DONE set
		status  string // written after 300 ms ("" = never: not set)
		wantErr string
	}{
		{name: "no background build", set: false},
		{name: "built", set: true, status: "0\n"},
		{name: "failed", set: true, status: "1\n", wantErr: "exited 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			done, logf := filepath.Join(dir, "done"), filepath.Join(dir, "log")
			if err := os.WriteFile(logf, []byte("go: cannot build kubelet\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			t.Setenv(EnvAssetsLog, logf)
			t.Setenv(EnvAssetsDone, "")
			if tc.set {
				t.Setenv(EnvAssetsDone, done)
				go func() {
					time.Sleep(300 * time.Millisecond)
					_ = os.WriteFile(done, []byte(tc.status), 0o644)
				}()
			}
			err := waitBuild()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("waitBuild: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrNoAssets) || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "cannot build kubelet") {
				t.Fatalf("waitBuild: %v; want ErrNoAssets, %q and the log's end", err, tc.wantErr)
			}
		})
	}
}
