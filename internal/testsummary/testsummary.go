// Package testsummary reads the event stream of `go test -json`, prints it
// as go test's own terse output would (package lines; a failed test's whole
// output; a skipped test's reason; build errors; panics), and counts the
// tests: passed, failed and skipped, each subtest counted on its own.
//
// Nothing that goes wrong may vanish from the count: a test that was running
// when its test binary died (a panic, a timeout, os.Exit) counts as failed,
// and so does a package that failed with no failed test of its own (a build
// failure, a TestMain or init that exits non-zero).
//
// Skips are sorted by their reason: an environment skip (the requirement
// messages of internal/testenv), a hardware skip (a GPU, which CI machines
// cannot have), or another (an opt-in measurement, -short).
package testsummary

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent, with
// the build events of Go 1.24 and later).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
	Elapsed     float64   // seconds, on a test's pass and fail events
	Time        time.Time // when the event happened (absent: zero)
}

// SkipKind sorts a skip by its reason.
type SkipKind string

// The kinds of skip.
const (
	Environment SkipKind = "environment"
	Hardware    SkipKind = "hardware"
	Other       SkipKind = "other"
)

// Skip is one skipped test.
type Skip struct {
	Package string   `json:"package"`
	Test    string   `json:"test"`
	Reason  string   `json:"reason"`
	Kind    SkipKind `json:"kind"`
}

// Failure is one failed test, or a package that failed outside its tests.
type Failure struct {
	Package string `json:"package"`
	Test    string `json:"test,omitempty"`
	Why     string `json:"why,omitempty"` // set when no test's own failure says it
	// Said is the first line of each of the test's log entries (file:line:
	// message), the first few: a long run's report repeats why each test
	// failed where a reader of its last lines finds it.
	Said []string `json:"said,omitempty"`
}

// Timing is how long one top-level test ran.
type Timing struct {
	Package string  `json:"package"`
	Test    string  `json:"test"`
	Seconds float64 `json:"seconds"`
}

// Result is the count of one or more runs.
type Result struct {
	Passed   int       `json:"passed"`
	Failed   int       `json:"failed"`
	Skipped  int       `json:"skipped"`
	Failures []Failure `json:"failures,omitempty"`
	Skips    []Skip    `json:"skips,omitempty"`
	// Slowest are the longest top-level tests, longest first, at most
	// SlowestKept: the suite has a time budget, and its report says where
	// the time goes.
	Slowest []Timing `json:"slowest,omitempty"`
}

// SlowestKept is how many of the slowest tests a Result keeps.
const SlowestKept = 15

// Add counts o into r.
func (r *Result) Add(o Result) {
	r.Passed += o.Passed
	r.Failed += o.Failed
	r.Skipped += o.Skipped
	r.Failures = append(r.Failures, o.Failures...)
	r.Skips = append(r.Skips, o.Skips...)
	for _, t := range o.Slowest {
		r.timed(t)
	}
}

// timed keeps t if it is among the SlowestKept longest.
func (r *Result) timed(t Timing) {
	i := sort.Search(len(r.Slowest), func(i int) bool { return r.Slowest[i].Seconds < t.Seconds })
	if i >= SlowestKept {
		return
	}
	r.Slowest = slices.Insert(r.Slowest, i, t)
	if len(r.Slowest) > SlowestKept {
		r.Slowest = r.Slowest[:SlowestKept]
	}
}

// Fail counts a failure that the stream did not show (the go command's own
// exit status, say).
func (r *Result) Fail(pkg, why string) {
	r.Failed++
	r.Failures = append(r.Failures, Failure{Package: pkg, Why: why})
}

// Totals is the line a CI reader counts: "N passed, N failed, N skipped".
func (r Result) Totals() string {
	return fmt.Sprintf("%d passed, %d failed, %d skipped", r.Passed, r.Failed, r.Skipped)
}

// Count returns the number of skips of kind k.
func (r Result) Count(k SkipKind) int {
	n := 0
	for _, s := range r.Skips {
		if s.Kind == k {
			n++
		}
	}
	return n
}

// Report writes the failures, the skips with their reasons, the number of
// each kind of skip, and last, alone on its line, the Totals.
func (r Result) Report(w io.Writer) {
	if len(r.Failures) > 0 {
		fmt.Fprintf(w, "\nFailed (%d):\n", len(r.Failures))
		for _, f := range r.Failures {
			line := "  " + f.Package
			if f.Test != "" {
				line += " " + f.Test
			}
			if f.Why != "" {
				line += ": " + f.Why
			}
			fmt.Fprintln(w, line)
			for _, said := range f.Said {
				fmt.Fprintln(w, "      "+said)
			}
		}
	}
	if len(r.Skips) > 0 {
		skips := append([]Skip(nil), r.Skips...)
		order := map[SkipKind]int{Environment: 0, Hardware: 1, Other: 2}
		sort.SliceStable(skips, func(i, j int) bool { return order[skips[i].Kind] < order[skips[j].Kind] })
		fmt.Fprintf(w, "\nSkipped (%d):\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(w, "  [%s] %s %s: %s\n", s.Kind, s.Package, s.Test, s.Reason)
		}
	}
	if len(r.Slowest) > 0 {
		fmt.Fprintf(w, "\nSlowest tests:\n")
		for _, t := range r.Slowest {
			fmt.Fprintf(w, "  %7.1fs %s %s\n", t.Seconds, t.Package, t.Test)
		}
	}
	fmt.Fprintf(w, "\n%d environment skips, %d hardware skips (a GPU: allowed in CI), %d other skips (opt-in or -short)\n",
		r.Count(Environment), r.Count(Hardware), r.Count(Other))
	fmt.Fprintln(w, r.Totals())
}

// test is what is known of one running or ended test.
type test struct {
	name  string
	out   []string
	ended bool
	began time.Time // its last run or cont event: when it last started running
}

// pkg is one package's tests, in the order they started.
type pkg struct {
	tests    map[string]*test
	order    []*test
	failures int // failed tests
}

// Stream reads `go test -json` events from r until EOF, writes the terse
// human output to w as it goes, and returns the count. Lines that are not
// JSON events are copied to w as they are.
func Stream(r io.Reader, w io.Writer) (Result, error) {
	s := &streamer{w: w, pkgs: map[string]*pkg{}}
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			s.line(line)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return s.res, fmt.Errorf("testsummary: reading the go test events: %w", err)
		}
	}
	// A package whose end never came (the go command was killed): its
	// running tests failed, and so did it.
	names := make([]string, 0, len(s.pkgs))
	for name := range s.pkgs {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		const why = "the go test events ended before this package's result (the go command was killed?)"
		s.endPackage(name, true, why, why)
	}
	return s.res, nil
}

type streamer struct {
	w    io.Writer
	pkgs map[string]*pkg
	res  Result
}

func (s *streamer) line(line []byte) {
	var e event
	trimmed := bytes.TrimSpace(line)
	if len(trimmed) == 0 || trimmed[0] != '{' || json.Unmarshal(trimmed, &e) != nil || e.Action == "" {
		s.w.Write(line)
		if line[len(line)-1] != '\n' {
			io.WriteString(s.w, "\n")
		}
		return
	}
	switch {
	case e.Action == "build-output":
		io.WriteString(s.w, e.Output)
	case e.Action == "build-fail":
		// The package's own fail event (FailedBuild) follows and counts it.
	case e.Test == "":
		s.packageEvent(e)
	default:
		s.testEvent(e)
	}
}

func (s *streamer) pkg(name string) *pkg {
	p := s.pkgs[name]
	if p == nil {
		p = &pkg{tests: map[string]*test{}}
		s.pkgs[name] = p
	}
	return p
}

func (s *streamer) packageEvent(e event) {
	switch e.Action {
	case "start":
		s.pkg(e.Package)
	case "output":
		if strings.HasPrefix(e.Output, "FAIL\t"+e.Package) {
			// Before the package's FAIL line: its tests that never ended.
			s.failUnended(e.Package, binaryDied)
		}
		if e.Output != "PASS\n" {
			io.WriteString(s.w, e.Output)
		}
	case "pass", "fail", "skip":
		why := "the test binary failed outside any test (TestMain, init or its exit)"
		if e.FailedBuild != "" {
			why = "build failed (" + e.FailedBuild + ")"
		}
		s.endPackage(e.Package, e.Action == "fail", why, binaryDied)
	}
}

// endPackage closes a package: tests still running when it ended failed
// (unended says why); a failed package with no failed test counts as one
// failure itself (why says what failed).
func (s *streamer) endPackage(name string, failed bool, why, unended string) {
	p := s.failUnended(name, unended)
	delete(s.pkgs, name)
	if failed && p.failures == 0 {
		s.res.Fail(name, why)
	}
}

// binaryDied is why a test did not finish when its package ended.
const binaryDied = "the test binary exited while it ran (a panic, a timeout or os.Exit)"

// failUnended fails the package's tests that started and never ended.
func (s *streamer) failUnended(name, unended string) *pkg {
	p := s.pkg(name)
	for _, t := range p.order {
		if t.ended {
			continue
		}
		t.ended = true
		p.failures++
		s.res.Failed++
		s.res.Failures = append(s.res.Failures, Failure{Package: name, Test: t.name, Why: "did not finish: " + unended, Said: entries(t.out)})
		s.printBlock(t)
		fmt.Fprintf(s.w, "--- FAIL: %s (did not finish: %s)\n", t.name, unended)
	}
	return p
}

func (s *streamer) testEvent(e event) {
	p := s.pkg(e.Package)
	t := p.tests[e.Test]
	if t == nil {
		t = &test{name: e.Test}
		p.tests[e.Test] = t
		p.order = append(p.order, t)
	}
	switch e.Action {
	case "output":
		if t.ended {
			// Late output of an ended test (rare): show it only where
			// it matters.
			if strings.HasPrefix(e.Output, "panic:") || strings.Contains(e.Output, "FAIL") {
				io.WriteString(s.w, e.Output)
			}
			return
		}
		t.out = append(t.out, e.Output)
	case "run", "cont":
		t.began = e.Time
	case "pause":
	case "pass":
		t.ended = true
		t.out = nil
		s.res.Passed++
		s.time(e, t)
	case "fail":
		t.ended = true
		s.time(e, t)
		p.failures++
		s.res.Failed++
		s.res.Failures = append(s.res.Failures, Failure{Package: e.Package, Test: e.Test, Said: entries(t.out)})
		s.printBlock(t)
	case "skip":
		t.ended = true
		s.res.Skipped++
		reason := skipReason(t.out)
		s.res.Skips = append(s.res.Skips, Skip{Package: e.Package, Test: e.Test, Reason: reason, Kind: kindOf(reason)})
		s.printBlock(t)
	}
}

// time records a top-level test's duration (a subtest's is in its parent's):
// its Elapsed, or the time from when it last started running (its run or
// cont event) to its end when that is longer. go test's Elapsed of a test
// whose subtests call t.Parallel leaves them out (0.00s), although they
// run before it ends; the span counts them, and a parallel test's wait
// for the sequential tests (before its cont) is not in it.
func (s *streamer) time(e event, t *test) {
	if strings.Contains(e.Test, "/") {
		return
	}
	secs := e.Elapsed
	if !t.began.IsZero() && !e.Time.IsZero() {
		secs = max(secs, e.Time.Sub(t.began).Seconds())
	}
	s.res.timed(Timing{Package: e.Package, Test: e.Test, Seconds: secs})
}

// printBlock writes a test's output without the run/pause/cont markers.
func (s *streamer) printBlock(t *test) {
	for _, o := range t.out {
		if strings.HasPrefix(o, "=== RUN") || strings.HasPrefix(o, "=== PAUSE") || strings.HasPrefix(o, "=== CONT") || strings.HasPrefix(o, "=== NAME") {
			continue
		}
		io.WriteString(s.w, o)
	}
	t.out = nil
}

// logLine is the start of a t.Log entry: four spaces, file:line, colon.
var logLine = regexp.MustCompile(`^    \S+\.go:\d+: `)

// skipReason is the last log entry before the "--- SKIP" line (t.Skip's
// message), without its file:line.
func skipReason(out []string) string {
	var entry []string
	for _, o := range out {
		for _, l := range strings.SplitAfter(o, "\n") {
			switch {
			case l == "":
			case strings.HasPrefix(l, "--- SKIP"):
				return join(entry)
			case logLine.MatchString(l):
				entry = []string{logLine.ReplaceAllString(l, "")}
			case strings.HasPrefix(l, "        ") && entry != nil:
				entry = append(entry, strings.TrimSpace(l))
			}
		}
	}
	return join(entry)
}

// The bounds of Failure.Said.
const (
	saidEntries = 6
	saidWidth   = 200
)

// entries is the first line of each log entry of a test's output (its
// file:line kept), at most saidEntries of them, each cut to saidWidth.
func entries(out []string) []string {
	var said []string
	for _, o := range out {
		for _, l := range strings.Split(o, "\n") {
			if !logLine.MatchString(l) {
				continue
			}
			if len(said) == saidEntries {
				return append(said, "...")
			}
			l = strings.TrimSpace(l)
			if len(l) > saidWidth {
				l = l[:saidWidth] + "..."
			}
			said = append(said, l)
		}
	}
	return said
}

func join(entry []string) string {
	if len(entry) == 0 {
		return "(no reason given)"
	}
	for i := range entry {
		entry[i] = strings.TrimSpace(entry[i])
	}
	return strings.Join(entry, " ")
}

func kindOf(reason string) SkipKind {
	switch {
	case strings.HasPrefix(reason, testenv.MissingPrefix):
		return Environment
	case strings.HasPrefix(reason, testenv.HardwarePrefix):
		return Hardware
	}
	return Other
}
