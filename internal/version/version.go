// Package version says which build a binary is, for every command's
// --version: the release version (set at link time) and the commit it was
// built from.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Version is the release version. scripts/release.sh sets it with
// -ldflags "-X github.com/ftlauncher/ft-launcher/internal/version.Version=V";
// the linker can only set a package-level string variable, so this is one,
// and nothing writes it at run time.
var Version = "0.2.0-dev"

// Commit is the source commit, normally left empty so that it is taken from
// the VCS stamp the go command embeds (vcs.revision); set it with -X where
// the build has no VCS information (a source tarball).
var Commit = ""

// String is the one-line --version output of the command named cmd, e.g.
// "ft-launcher 0.2.0 (commit abc1234, go1.26.8, linux/amd64)".
func String(cmd string) string {
	bi, _ := debug.ReadBuildInfo()
	return format(cmd, Version, Commit, bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

// format builds the line from its parts, so that tests need no special build.
func format(cmd, ver, commit string, bi *debug.BuildInfo, goVer, platform string) string {
	if commit == "" {
		commit = vcsCommit(bi)
	}
	if ver == "" {
		ver = "unknown"
	}
	return fmt.Sprintf("%s %s (commit %s, %s, %s)", cmd, ver, commit, goVer, platform)
}

// vcsCommit is the short vcs.revision of the build, with "+dirty" when the
// work tree had uncommitted changes, or "unknown" when the go command
// recorded none (go run, go test, -buildvcs=false, no git).
func vcsCommit(bi *debug.BuildInfo) string {
	if bi == nil {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	if dirty {
		rev += "+dirty"
	}
	return rev
}
