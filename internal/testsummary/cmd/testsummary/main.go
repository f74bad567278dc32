// Command testsummary runs `go test -json ...` (or reads its events on
// standard input), prints go test's terse output as the events stream,
// and ends with the failures, the skipped tests with their reasons, the
// number of environment skips and, alone on the last line,
// "N passed, N failed, N skipped". It exits 1 when anything failed: a test,
// a build, a test binary that died, or the command itself.
//
//	testsummary [--state FILE] [--] go test -json ./...
//	testsummary [--state FILE] -          (events on standard input)
//	testsummary --report FILE
//
// With --state, a run appends its count to FILE and prints only its own
// totals; --report prints the report of every run recorded in FILE, so that
// scripts/test.sh ends with one count for all its go test runs.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"

	"github.com/ftlauncher/ft-launcher/internal/testsummary"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testsummary", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "append this run's count to `FILE` and print only its own totals")
	report := fs.String("report", "", "print the report of the runs recorded in `FILE` (by --state)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *report != "" {
		if fs.NArg() > 0 || *state != "" {
			fmt.Fprintln(stderr, "testsummary: --report takes no command and no --state")
			return 2
		}
		res, err := readState(*report)
		if err != nil {
			fmt.Fprintln(stderr, "testsummary:", err)
			return 2
		}
		res.Report(stdout)
		return exitCode(res)
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "testsummary: give a command (go test -json ...), - for events on standard input, or --report FILE")
		return 2
	}
	var res testsummary.Result
	var err error
	if fs.NArg() == 1 && fs.Arg(0) == "-" {
		res, err = testsummary.Stream(stdin, stdout)
	} else {
		res, err = runCommand(fs.Args(), stdout, stderr)
	}
	if err != nil {
		fmt.Fprintln(stderr, "testsummary:", err)
		res.Fail("(testsummary)", err.Error())
	}
	if *state != "" {
		if err := appendState(*state, res); err != nil {
			fmt.Fprintln(stderr, "testsummary:", err)
			return 2
		}
		fmt.Fprintf(stdout, "(this run: passed=%d failed=%d skipped=%d; the total comes at the end)\n", res.Passed, res.Failed, res.Skipped)
	} else {
		res.Report(stdout)
	}
	return exitCode(res)
}

// runCommand runs argv with its standard output read as go test events and
// its standard error passed through. An exit status the events do not
// explain (no failure in them) counts as one failure.
func runCommand(argv []string, stdout, stderr io.Writer) (testsummary.Result, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stderr = stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		return testsummary.Result{}, err
	}
	if err := cmd.Start(); err != nil {
		return testsummary.Result{}, fmt.Errorf("start %s: %w", strings.Join(argv, " "), err)
	}
	res, streamErr := testsummary.Stream(pipe, stdout)
	if streamErr != nil {
		_, _ = io.Copy(io.Discard, pipe)
	}
	waitErr := cmd.Wait()
	if waitErr != nil && res.Failed == 0 && streamErr == nil {
		res.Fail("(command)", fmt.Sprintf("%s: %v, with no failure in its test events", strings.Join(argv, " "), waitErr))
	}
	return res, streamErr
}

func exitCode(res testsummary.Result) int {
	if res.Failed > 0 {
		return 1
	}
	return 0
}

func appendState(path string, res testsummary.Result) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("state file %s: %w", path, err)
	}
	return f.Close()
}

func readState(path string) (testsummary.Result, error) {
	var total testsummary.Result
	f, err := os.Open(path)
	if err != nil {
		return total, fmt.Errorf("no runs recorded: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	runs := 0
	for sc.Scan() {
		var r testsummary.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return total, fmt.Errorf("state file %s, run %d: %w", path, runs+1, err)
		}
		total.Add(r)
		runs++
	}
	if err := sc.Err(); err != nil {
		return total, fmt.Errorf("state file %s: %w", path, err)
	}
	if runs == 0 {
		return total, errors.New("no runs recorded in " + path)
	}
	return total, nil
}
