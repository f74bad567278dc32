package testsummary

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

// ev is one `go test -json` event line.
func ev(action, pkg, test, output string) string {
	b, err := json.Marshal(event{Action: action, Package: pkg, Test: test, Output: output})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// passing is a test's events when it passes, logging line.
func passing(pkg, test, line string) []string {
	return []string{ev("run", pkg, test, ""), ev("output", pkg, test, "=== RUN   "+test+"\n"),
		ev("output", pkg, test, "    x_test.go:3: "+line+"\n"), ev("output", pkg, test, "--- PASS: "+test+" (0.00s)\n"),
		ev("pass", pkg, test, "")}
}

func skipping(pkg, test string, reason ...string) []string {
	evs := []string{ev("run", pkg, test, ""), ev("output", pkg, test, "=== RUN   "+test+"\n"),
		ev("output", pkg, test, "    x_test.go:9: an earlier log line\n")}
	for i, r := range reason {
		indent := "    x_test.go:10: "
		if i > 0 {
			indent = "        "
		}
		evs = append(evs, ev("output", pkg, test, indent+r+"\n"))
	}
	return append(evs, ev("output", pkg, test, "--- SKIP: "+test+" (0.00s)\n"), ev("skip", pkg, test, ""))
}

func cat(parts ...[]string) string {
	var all []string
	for _, p := range parts {
		all = append(all, p...)
	}
	return strings.Join(all, "\n") + "\n"
}

func lines(l ...string) []string { return l }

func TestStream(t *testing.T) {
	const p = "example.com/m/p"
	start, ok, failPkg := lines(ev("start", p, "", "")), lines(ev("output", p, "", "PASS\n"), ev("output", p, "", "ok  \t"+p+"\t0.1s\n"), ev("pass", p, "", "")),
		lines(ev("output", p, "", "FAIL\t"+p+"\t0.1s\n"), ev("fail", p, "", ""))
	tests := []struct {
		name                    string
		stream                  string
		passed, failed, skipped int
		failures                []string // "Test: why [said]" substrings, in order
		skips                   []Skip
		want, notWant           []string // in the human output
		order                   []string // substrings that appear in this order
	}{
		{name: "pass", stream: cat(start, passing(p, "TestA", "quiet"), passing(p, "TestB", "quiet"), ok), passed: 2,
			want: []string{"ok  \t" + p}, notWant: []string{"=== RUN", "quiet", "--- PASS", "PASS\n"}},
		{name: "fail shows the test's output", stream: cat(start, passing(p, "TestA", "quiet"), lines(
			ev("run", p, "TestB", ""), ev("output", p, "TestB", "=== RUN   TestB\n"), ev("output", p, "TestB", "    x_test.go:4: got 1, want 2\n"),
			ev("output", p, "TestB", "--- FAIL: TestB (0.00s)\n"), ev("fail", p, "TestB", "")), failPkg),
			passed: 1, failed: 1, failures: []string{`TestB:  ["x_test.go:4: got 1, want 2"]`},
			want: []string{"    x_test.go:4: got 1, want 2\n--- FAIL: TestB (0.00s)\n", "FAIL\t" + p}, notWant: []string{"=== RUN", "quiet"}},
		{name: "skips by kind, with their reasons", stream: cat(start,
			skipping(p, "TestSlurm", "testenv: missing Slurm: not on PATH: srun; to get it: apt-get install slurmd"),
			skipping(p, "TestGPU", "testenv: hardware missing (allowed to skip in CI): an NVIDIA GPU with nvidia-smi: none"),
			skipping(p, "TestBench", "set FT_RESUMER_BENCH=1 to measure", "(a long measurement)"),
			lines(ev("run", p, "TestBare", ""), ev("output", p, "TestBare", "--- SKIP: TestBare (0.00s)\n"), ev("skip", p, "TestBare", "")), ok),
			skipped: 4, skips: []Skip{
				{p, "TestSlurm", "testenv: missing Slurm: not on PATH: srun; to get it: apt-get install slurmd", Environment},
				{p, "TestGPU", "testenv: hardware missing (allowed to skip in CI): an NVIDIA GPU with nvidia-smi: none", Hardware},
				{p, "TestBench", "set FT_RESUMER_BENCH=1 to measure (a long measurement)", Other},
				{p, "TestBare", "(no reason given)", Other}},
			want: []string{"--- SKIP: TestSlurm", "x_test.go:10: testenv: missing Slurm"}},
		{name: "build failure", stream: cat(lines(
			`{"ImportPath":"example.com/m/p [example.com/m/p.test]","Action":"build-output","Output":"# example.com/m/p [example.com/m/p.test]\n"}`,
			`{"ImportPath":"example.com/m/p [example.com/m/p.test]","Action":"build-output","Output":"p/x_test.go:3:27: undefined: nope\n"}`,
			`{"ImportPath":"example.com/m/p [example.com/m/p.test]","Action":"build-fail"}`),
			start, lines(ev("output", p, "", "FAIL\t"+p+" [build failed]\n"),
				`{"Action":"fail","Package":"example.com/m/p","FailedBuild":"example.com/m/p [example.com/m/p.test]"}`)),
			failed: 1, failures: []string{": build failed (example.com/m/p [example.com/m/p.test])"},
			want: []string{"p/x_test.go:3:27: undefined: nope\n", "[build failed]"}},
		{name: "panic: the running tests fail, before the package line", stream: cat(start, passing(p, "TestA", "quiet"), lines(
			ev("run", p, "TestPar", ""), ev("output", p, "TestPar", "=== RUN   TestPar\n"), ev("output", p, "TestPar", "=== PAUSE TestPar\n"), ev("pause", p, "TestPar", ""),
			ev("run", p, "TestB", ""), ev("output", p, "TestB", "=== RUN   TestB\n"),
			ev("output", p, "TestB", "panic: runtime error: index out of range [3] with length 3\n"),
			ev("output", p, "TestB", "goroutine 7 [running]:\n")), failPkg),
			passed: 1, failed: 2, failures: []string{"TestPar: did not finish", "TestB: did not finish"},
			order: []string{"panic: runtime error", "--- FAIL: TestB (did not finish", "FAIL\t" + p}},
		{name: "timeout", stream: cat(start, lines(ev("run", p, "TestSlow", ""), ev("output", p, "TestSlow", "=== RUN   TestSlow\n"),
			ev("output", p, "TestSlow", "panic: test timed out after 2s\n"), ev("output", p, "TestSlow", "\trunning tests:\n"),
			ev("output", p, "TestSlow", "\t\tTestSlow (2s)\n")), failPkg),
			failed: 1, failures: []string{"TestSlow: did not finish"}, want: []string{"panic: test timed out after 2s\n\trunning tests:\n"}},
		{name: "TestMain fails outside any test", stream: cat(start, lines(ev("output", p, "", "setup failed\n")), failPkg),
			failed: 1, failures: []string{": the test binary failed outside any test"}, want: []string{"setup failed\n"}},
		{name: "events end mid-test (go test killed)", stream: cat(start, passing(p, "TestA", "quiet"),
			lines(ev("run", p, "TestB", ""), ev("output", p, "TestB", "=== RUN   TestB\n"), ev("output", p, "TestB", "    x_test.go:5: working\n"))),
			passed: 1, failed: 1, failures: []string{"TestB: did not finish: the go test events ended"}, want: []string{"x_test.go:5: working"}},
		{name: "interleaved parallel tests keep their own output", stream: cat(start, lines(
			ev("run", p, "TestX", ""), ev("output", p, "TestX", "=== RUN   TestX\n"), ev("output", p, "TestX", "=== PAUSE TestX\n"),
			ev("run", p, "TestY", ""), ev("output", p, "TestY", "=== RUN   TestY\n"), ev("output", p, "TestY", "=== PAUSE TestY\n"),
			ev("output", p, "TestX", "=== CONT  TestX\n"), ev("output", p, "TestY", "=== CONT  TestY\n"),
			ev("output", p, "TestX", "    x_test.go:1: x one\n"), ev("output", p, "TestY", "    y_test.go:1: y one\n"),
			ev("output", p, "TestX", "    x_test.go:2: x two\n"), ev("output", p, "TestY", "    y_test.go:2: y two\n"),
			ev("output", p, "TestY", "--- PASS: TestY (0.01s)\n"), ev("pass", p, "TestY", ""),
			ev("output", p, "TestX", "--- FAIL: TestX (0.01s)\n"), ev("fail", p, "TestX", "")), failPkg),
			passed: 1, failed: 1, failures: []string{"TestX"},
			want:    []string{"    x_test.go:1: x one\n    x_test.go:2: x two\n--- FAIL: TestX (0.01s)\n"},
			notWant: []string{"y one", "y two", "=== CONT"}},
		{name: "subtests count on their own", stream: cat(start, lines(
			ev("run", p, "TestT", ""), ev("run", p, "TestT/a", ""), ev("pass", p, "TestT/a", ""),
			ev("run", p, "TestT/b", ""), ev("output", p, "TestT/b", "    x_test.go:7: bad\n"), ev("output", p, "TestT/b", "--- FAIL: TestT/b (0.00s)\n"), ev("fail", p, "TestT/b", ""),
			ev("output", p, "TestT", "--- FAIL: TestT (0.00s)\n"), ev("fail", p, "TestT", "")), failPkg),
			passed: 1, failed: 2, failures: []string{"TestT/b", "TestT"}},
		{name: "lines that are not events pass through", stream: "go: downloading example.com/x v1.0.0\n" + cat(start, ok) + "no newline at the end",
			want: []string{"go: downloading example.com/x v1.0.0\n", "no newline at the end\n"}},
		{name: "a package without tests is no skip", stream: cat(lines(ev("start", p, "", ""), ev("output", p, "", "?   \t"+p+"\t[no test files]\n"), ev("skip", p, "", ""))),
			want: []string{"[no test files]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out strings.Builder
			res, err := Stream(strings.NewReader(tt.stream), &out)
			if err != nil {
				t.Fatal(err)
			}
			human := out.String()
			if res.Passed != tt.passed || res.Failed != tt.failed || res.Skipped != tt.skipped {
				t.Errorf("%s; want %d passed, %d failed, %d skipped\n%s", res.Totals(), tt.passed, tt.failed, tt.skipped, human)
			}
			if len(res.Failures) != len(tt.failures) {
				t.Errorf("failures %+v; want %d", res.Failures, len(tt.failures))
			}
			for i, f := range res.Failures {
				if i < len(tt.failures) {
					got := fmt.Sprintf("%s: %s %q", f.Test, f.Why, f.Said)
					if !strings.Contains(got, tt.failures[i]) {
						t.Errorf("failure %d is %q; want %q in it", i, got, tt.failures[i])
					}
				}
			}
			if tt.skips != nil && fmt.Sprint(res.Skips) != fmt.Sprint(tt.skips) {
				t.Errorf("skips\n%+v\nwant\n%+v", res.Skips, tt.skips)
			}
			for _, w := range tt.want {
				if !strings.Contains(human, w) {
					t.Errorf("output lacks %q:\n%s", w, human)
				}
			}
			for _, w := range tt.notWant {
				if strings.Contains(human, w) {
					t.Errorf("output has %q:\n%s", w, human)
				}
			}
			at := 0
			for _, w := range tt.order {
				i := strings.Index(human[at:], w)
				if i < 0 {
					t.Errorf("%q not after the previous one in:\n%s", w, human)
					break
				}
				at += i + len(w)
			}
		})
	}
}

// TestReport: the report lists the failures and the skips by kind, counts
// the environment skips, and ends with the totals alone on the last line.
func TestReport(t *testing.T) {
	var r Result
	r.Add(Result{Passed: 3, Skipped: 1, Skips: []Skip{{"p", "TestBench", "opt-in", Other}}})
	r.Add(Result{Passed: 2, Failed: 1, Skipped: 2, Failures: []Failure{{Package: "q", Test: "TestX", Said: []string{"x_test.go:4: got 1, want 2"}}},
		Skips: []Skip{{"q", "TestGPU", "testenv: hardware missing (allowed to skip in CI): GPU", Hardware}, {"q", "TestSlurm", "testenv: missing Slurm", Environment}}})
	r.Fail("r", "build failed")
	var b strings.Builder
	r.Report(&b)
	out := b.String()
	all := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if last := all[len(all)-1]; last != "5 passed, 2 failed, 3 skipped" {
		t.Errorf("last line %q; want the totals:\n%s", last, out)
	}
	for _, w := range []string{"  q TestX\n      x_test.go:4: got 1, want 2\n", "  r: build failed\n", "1 environment skips, 1 hardware skips", "1 other skips",
		"  [environment] q TestSlurm: testenv: missing Slurm\n", "  [other] p TestBench: opt-in\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("report lacks %q:\n%s", w, out)
		}
	}
	if strings.Index(out, "[environment]") > strings.Index(out, "[hardware]") || strings.Index(out, "[hardware]") > strings.Index(out, "[other]") {
		t.Errorf("skips not listed environment first, then hardware, then other:\n%s", out)
	}
}

// TestEntries: a failure's report keeps the first line of each log entry,
// the first few, each cut short, so that why a test failed is in the last
// lines of a long run.
func TestEntries(t *testing.T) {
	long := strings.Repeat("x", 300)
	tests := []struct {
		name string
		out  []string
		want []string
	}{
		{"none", []string{"=== RUN   TestA\n", "--- FAIL: TestA (0.00s)\n"}, nil},
		{"first lines only", []string{"    a_test.go:7: no launcher hosted it:\n", "        == slurm-1.out\n", "        ...\n",
			"    a_test.go:9: batch script environment:\n        SLURM_JOB_ID=3\n"},
			[]string{"a_test.go:7: no launcher hosted it:", "a_test.go:9: batch script environment:"}},
		{"cut", []string{"    a_test.go:7: " + long + "\n"}, []string{"a_test.go:7: " + long[:200-len("a_test.go:7: ")] + "..."}},
		{"bounded", []string{strings.Repeat("    a_test.go:1: e\n", 8)},
			[]string{"a_test.go:1: e", "a_test.go:1: e", "a_test.go:1: e", "a_test.go:1: e", "a_test.go:1: e", "a_test.go:1: e", "..."}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := entries(tt.out); fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("entries = %q; want %q", got, tt.want)
			}
		})
	}
}

// TestSlowest: the report names the longest top-level tests, longest first,
// across runs and bounded; a subtest's time is in its parent's.
func TestSlowest(t *testing.T) {
	events := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestA/sub"}
{"Action":"pass","Package":"p","Test":"TestA/sub","Elapsed":9}
{"Action":"pass","Package":"p","Test":"TestA","Elapsed":10}
{"Action":"run","Package":"p","Test":"TestB"}
{"Action":"fail","Package":"p","Test":"TestB","Elapsed":30}
{"Action":"fail","Package":"p","Elapsed":40}
`
	res, err := Stream(strings.NewReader(events), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []Timing{{"p", "TestB", 30}, {"p", "TestA", 10}}
	if fmt.Sprint(res.Slowest) != fmt.Sprint(want) {
		t.Fatalf("Slowest = %v; want %v", res.Slowest, want)
	}
	var total Result
	for i := range SlowestKept + 5 {
		total.Add(Result{Slowest: []Timing{{"q", fmt.Sprintf("T%d", i), float64(i)}}})
	}
	total.Add(res)
	if len(total.Slowest) != SlowestKept || total.Slowest[0].Test != "TestB" || total.Slowest[1].Test != "T19" {
		t.Fatalf("Slowest after Add = %v; want %d, TestB then T19 first", total.Slowest, SlowestKept)
	}
	var b strings.Builder
	total.Report(&b)
	if !strings.Contains(b.String(), "Slowest tests:\n     30.0s p TestB\n") {
		t.Errorf("report lacks the slowest tests:\n%s", b.String())
	}
}

// TestSlowestCountsParallelSubtests: a test whose subtests call t.Parallel
// ends with Elapsed 0 although they ran for a minute before it ended; it
// counts from its run event to its end. A parallel test counts from its
// cont event (its wait for the sequential tests is not its time).
func TestSlowestCountsParallelSubtests(t *testing.T) {
	events := `{"Time":"2026-11-28T09:00:00Z","Action":"run","Package":"p","Test":"TestPair"}
{"Time":"2026-11-28T09:00:00.1Z","Action":"run","Package":"p","Test":"TestPair/a"}
{"Time":"2026-11-28T09:00:00.1Z","Action":"pause","Package":"p","Test":"TestPair/a"}
{"Time":"2026-11-28T09:00:00.2Z","Action":"cont","Package":"p","Test":"TestPair/a"}
{"Time":"2026-11-28T09:01:05Z","Action":"pass","Package":"p","Test":"TestPair/a","Elapsed":64.8}
{"Time":"2026-11-28T09:01:06Z","Action":"pass","Package":"p","Test":"TestPair","Elapsed":0}
{"Time":"2026-11-28T09:01:06Z","Action":"run","Package":"p","Test":"TestLate"}
{"Time":"2026-11-28T09:01:06Z","Action":"pause","Package":"p","Test":"TestLate"}
{"Time":"2026-11-28T09:01:07Z","Action":"run","Package":"p","Test":"TestSerial"}
{"Time":"2026-11-28T09:01:10Z","Action":"pass","Package":"p","Test":"TestSerial","Elapsed":3}
{"Time":"2026-11-28T09:01:10Z","Action":"cont","Package":"p","Test":"TestLate"}
{"Time":"2026-11-28T09:01:30Z","Action":"pass","Package":"p","Test":"TestLate","Elapsed":20}
{"Action":"pass","Package":"p","Elapsed":90}
`
	res, err := Stream(strings.NewReader(events), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []Timing{{"p", "TestPair", 66}, {"p", "TestLate", 20}, {"p", "TestSerial", 3}}
	if fmt.Sprint(res.Slowest) != fmt.Sprint(want) {
		t.Fatalf("Slowest = %v; want %v", res.Slowest, want)
	}
}
