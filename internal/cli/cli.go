// Package cli holds the flag handling the project's commands share: a
// pflag set that prints --help once, to stdout, and reports a bad flag
// with the command's name and exit status 2.
package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/spf13/pflag"
)

// FlagSet is a flag set named name (the command line a user typed, such as
// "ft-resumer run") whose errors go to stderr.
func FlagSet(name string, stderr io.Writer) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	// --help is printed once, by Parse, to stdout (pflag would print it to
	// stderr first).
	fs.Usage = func() {}
	return fs
}

// Parse parses args; done says the command is to exit with code: 0 after
// --help (printed to stdout), 2 after a bad flag (said on fs's output).
func Parse(fs *pflag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fs.SetOutput(stdout)
			fmt.Fprintf(stdout, "Usage of %s:\n", fs.Name())
			fs.PrintDefaults()
			return 0, true
		}
		fmt.Fprintf(fs.Output(), "%s: %v\n", fs.Name(), err)
		return 2, true
	}
	return 0, false
}

// FindCompanion looks for the program name beside this executable, then on
// PATH: a command's companion program, installed with it (ft-launcher-etcd
// beside ft-launcher, ft-appwrapper-controller beside ft-resumer).
func FindCompanion(name string) (string, bool) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, true
		}
	}
	p, err := exec.LookPath(name)
	return p, err == nil
}
