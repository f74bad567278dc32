package testenv

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const depsScript = "../../scripts/deps.sh"

// deps runs scripts/deps.sh with args and env added to a clean environment
// (PATH as given or this process's).
func deps(t *testing.T, env []string, args ...string) []string {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bash, append([]string{depsScript}, args...)...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}, env...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("deps.sh %v: %v\n%s%s", args, err, out, stderr)
	}
	return strings.Fields(string(out))
}

// TestDepsListCoversEveryRequirement: scripts/deps.sh --list names every
// Debian package a requirement names, and nothing no requirement needs.
func TestDepsListCoversEveryRequirement(t *testing.T) {
	list := deps(t, nil, "--list")
	pkgs := Packages()
	if len(pkgs) == 0 {
		t.Fatal("no requirement names a package")
	}
	for _, r := range All() {
		for _, p := range r.Info().Packages {
			if !slices.Contains(list, p) {
				t.Errorf("requirement %q needs %s, which scripts/deps.sh --list lacks: %v", r, p, list)
			}
		}
	}
	for _, p := range list {
		if !slices.Contains(pkgs, p) {
			t.Errorf("scripts/deps.sh lists %s, which no testenv requirement names: add it to one, or drop it", p)
		}
	}
}

// TestDepsDryRunOnBareMachine plays a machine without any of the packages
// (an empty PATH and file checks under an empty folder): the dry run would
// install every package the tests need, and installs nothing.
func TestDepsDryRunOnBareMachine(t *testing.T) {
	empty := t.TempDir()
	got := deps(t, []string{"PATH=" + empty, "FTL_DEPS_SYSROOT=" + empty}, "--dry-run")
	want := deps(t, nil, "--list")
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("dry run on a bare machine would install %v; want every package %v", got, want)
	}
	for _, p := range Packages() {
		if !slices.Contains(got, p) {
			t.Errorf("dry run on a bare machine would not install %s", p)
		}
	}
}

// TestDepsDryRunHere: on this machine the dry run names only listed
// packages, and only missing ones (the named packages present here are
// not in it).
func TestDepsDryRunHere(t *testing.T) {
	SkipShort(t, "runs scripts/deps.sh, which checks every package")
	list := deps(t, nil, "--list")
	missing := deps(t, nil, "--dry-run")
	for _, p := range missing {
		if !slices.Contains(list, p) {
			t.Errorf("dry run names %s, not in the list %v", p, list)
		}
	}
	if Check(CGo) == nil && (slices.Contains(missing, "gcc") || slices.Contains(missing, "libc6-dev")) {
		t.Errorf("gcc and the C headers are here, yet the dry run would install them: %v", missing)
	}
}

func TestDepsBadInput(t *testing.T) {
	for _, args := range [][]string{{"--bogus"}, {"--list", "no-such-package"}, {"--dry-run", "no-such-package"}} {
		cmd := exec.Command("bash", append([]string{depsScript}, args...)...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
			t.Errorf("deps.sh %v: %v, want exit status 2\n%s", args, err, out)
		}
		names := strings.Contains(string(out), "allowed") || strings.Contains(string(out), "known:")
		if !strings.Contains(string(out), "deps.sh: unknown") || !names {
			t.Errorf("deps.sh %v: %q does not name the problem and what is allowed", args, out)
		}
	}
}

func TestStrict(t *testing.T) {
	for _, tt := range []struct {
		ci, all string
		want    bool
	}{
		{"", "", false},
		{"true", "", true},
		{"1", "", true},
		{"false", "", false},
		{"0", "", false},
		{"", "1", true},
		{"true", "0", false},
		{"", "0", false},
	} {
		t.Setenv("CI", tt.ci)
		t.Setenv("FTL_REQUIRE_ALL", tt.all)
		if got := Strict(); got != tt.want {
			t.Errorf("CI=%q FTL_REQUIRE_ALL=%q: Strict() = %v, want %v", tt.ci, tt.all, got, tt.want)
		}
	}
}

// TestEveryRequirementSaysHowToGetIt: each message names the requirement
// and either its packages or what else it takes; only the GPU is hardware.
func TestEveryRequirementSaysHowToGetIt(t *testing.T) {
	for _, r := range All() {
		info := r.Info()
		msg := Message(r, "seen")
		if !strings.Contains(msg, string(r)+": seen; to get it: ") {
			t.Errorf("%q: message %q lacks the name, the detail or how to get it", r, msg)
		}
		for _, p := range info.Packages {
			if !strings.Contains(msg, p) {
				t.Errorf("%q: message %q lacks package %s", r, msg, p)
			}
		}
		prefix := MissingPrefix
		if info.Hardware {
			prefix = HardwarePrefix
		}
		if !strings.HasPrefix(msg, prefix) {
			t.Errorf("%q: message %q does not start with %q", r, msg, prefix)
		}
		if info.Hardware != (r == GPU) {
			t.Errorf("%q: Hardware = %v: only a GPU may skip under CI", r, info.Hardware)
		}
	}
}

// TestMissingFailsUnderCI runs a small test package (testdata/strict) whose
// tests meet Slurm and a GPU played as missing: under CI (or
// FTL_REQUIRE_ALL=1) the Slurm test fails naming Slurm and its packages,
// without CI it skips with the same words; the GPU test skips in both.
func TestMissingFailsUnderCI(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "strict.test")
	build := exec.Command("go", "test", "-c", "-o", bin, "./testdata/strict")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build testdata/strict: %v\n%s", err, out)
	}
	slurmWords := Message(Slurm, "played missing by testenv's test")
	for _, tt := range []struct {
		name     string
		env      []string
		wantFail bool
	}{
		{"CI set", []string{"CI=true"}, true},
		{"FTL_REQUIRE_ALL=1", []string{"FTL_REQUIRE_ALL=1"}, true},
		{"neither", nil, false},
		{"CI with FTL_REQUIRE_ALL=0", []string{"CI=true", "FTL_REQUIRE_ALL=0"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(bin, "-test.v")
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, tt.env...)
			out, err := cmd.CombinedOutput()
			s := string(out)
			if tt.wantFail {
				if err == nil {
					t.Fatalf("passed; want a failure:\n%s", s)
				}
				for _, want := range []string{"--- FAIL: TestNeedsSlurm", slurmWords, "fails instead of skipping"} {
					if !strings.Contains(s, want) {
						t.Errorf("output lacks %q:\n%s", want, s)
					}
				}
			} else {
				if err != nil {
					t.Fatalf("%v; want the tests skipped:\n%s", err, s)
				}
				for _, want := range []string{"--- SKIP: TestNeedsSlurm", slurmWords} {
					if !strings.Contains(s, want) {
						t.Errorf("output lacks %q:\n%s", want, s)
					}
				}
			}
			for _, want := range []string{"--- SKIP: TestNeedsGPU", HardwarePrefix + string(GPU)} {
				if !strings.Contains(s, want) {
					t.Errorf("output lacks %q (the GPU skips everywhere):\n%s", want, s)
				}
			}
			if strings.Contains(s, "reached after Missing") {
				t.Errorf("a test went on after Missing:\n%s", s)
			}
		})
	}
}

// TestNoBareEnvironmentSkips: every t.Skip in the repository's tests goes
// through this package, or says on its line or the line above that it is
// "Not an environment skip" (an opt-in measurement, -short), so that no
// environment skip escapes CI's failure.
func TestNoBareEnvironmentSkips(t *testing.T) {
	skip := regexp.MustCompile(`\b\w+\.Skip(f|Now)?\(`)
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") && path != root {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		lines := strings.Split(string(b), "\n")
		for i, l := range lines {
			if !skip.MatchString(l) {
				continue
			}
			marked := strings.Contains(l, "Not an environment skip")
			if i > 0 && strings.Contains(lines[i-1], "Not an environment skip") {
				marked = true
			}
			if !marked {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s:%d: %s\n\tan environment skip goes through internal/testenv (Require or Missing); any other skip says \"// Not an environment skip: why\" on the line above", rel, i+1, strings.TrimSpace(l))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
