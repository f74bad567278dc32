// Command mkwheel wraps already-built static binaries and the
// ft_launcher_client package into ft-launcher's platform wheel
// (internal/wheel), checks the result as pip will read it, and prints the
// wheel's path. scripts/wheel.sh and scripts/release.sh run it; it builds
// nothing itself, so the binaries are exactly the ones a release ships.
//
//	mkwheel -version 0.2.0 -arch amd64 -bin DIR -module client/python/ft_launcher_client -out DIR [-readme README.md] [-epoch SECONDS]
//	mkwheel -check-version 0.2.0      (exit 2 unless it can be a wheel's version)
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/wheel"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mkwheel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o wheel.Options
	fs.StringVar(&o.Version, "version", "", "canonical PEP 440 `VERSION` (e.g. 0.2.0)")
	fs.StringVar(&o.Arch, "arch", "", "GOARCH of the binaries: amd64 or arm64")
	fs.StringVar(&o.BinDir, "bin", "", "`DIR` holding ft-launcher, ft-launcher-etcd and ft-resumer")
	fs.StringVar(&o.ModuleDir, "module", "", "the ft_launcher_client package `DIR`")
	fs.StringVar(&o.Readme, "readme", "", "Markdown `FILE` for the long description")
	out := fs.String("out", ".", "`DIR` to write the wheel into")
	check := fs.String("check-version", "", "only check that `VERSION` can be a wheel's (release.sh does, before it builds)")
	epoch := fs.Int64("epoch", 0, "entry times, in Unix `SECONDS` (the commit's, for identical rebuilds); 0: 1980-01-01")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *check != "" {
		if err := wheel.CheckVersion(*check); err != nil {
			fmt.Fprintln(stderr, "mkwheel:", strings.TrimPrefix(err.Error(), "wheel: "))
			return 2
		}
		return 0
	}
	if fs.NArg() > 0 || o.Version == "" || o.Arch == "" || o.BinDir == "" || o.ModuleDir == "" {
		fmt.Fprintln(stderr, "mkwheel: -version, -arch, -bin and -module are required, and nothing else")
		fs.Usage()
		return 2
	}
	o.Time = time.Unix(*epoch, 0)
	p, err := wheel.Build(*out, o)
	if err == nil {
		err = wheel.Verify(p)
	}
	if err != nil {
		fmt.Fprintln(stderr, "mkwheel:", strings.TrimPrefix(err.Error(), "wheel: "))
		return 1
	}
	fmt.Fprintln(stdout, p)
	return 0
}
