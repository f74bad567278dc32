package wheel

import (
	"archive/zip"
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

const clientModule = "../../client/python/ft_launcher_client"

func TestFileNamesCarryGlibcAndMuslTags(t *testing.T) {
	for arch, want := range map[string]string{
		"amd64": "ft_launcher-0.2.0-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.musllinux_1_1_x86_64.whl",
		"arm64": "ft_launcher-0.2.0-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl",
	} {
		got, err := File("0.2.0", arch)
		if err != nil || got != want {
			t.Errorf("File(0.2.0, %s) = %q, %v; want %q", arch, got, err, want)
		}
		// The WHEEL file lists the compressed set expanded, one tag each.
		tags, _ := Tags(arch)
		plat := strings.TrimSuffix(strings.TrimPrefix(want, "ft_launcher-0.2.0-py3-none-"), ".whl")
		var expanded []string
		for _, p := range strings.Split(plat, ".") {
			expanded = append(expanded, "py3-none-"+p)
		}
		if !slices.Equal(tags, expanded) {
			t.Errorf("Tags(%s) = %v, want %v", arch, tags, expanded)
		}
	}
	if _, err := File("0.2.0", "386"); err == nil {
		t.Error("a wheel for 386 has no tags, but File accepted it")
	}
}

func TestVersionMustBeCanonicalPEP440(t *testing.T) {
	for _, v := range []string{"0.2.0", "1", "0.2.0rc1", "0.2.0a3", "0.2.0.post1", "0.2.1.dev3", "0.2.0+local.7", "10.20.30"} {
		if err := CheckVersion(v); err != nil {
			t.Errorf("CheckVersion(%q): %v", v, err)
		}
	}
	// pip would read these under another spelling (0.2.0-rc1 is 0.2.0rc1,
	// v0.2.0 is 0.2.0) or not at all.
	for _, v := range []string{"", "0.2.0-rc1", "v0.2.0", "0.2.0-dev", "0.2.0RC1", "01.2", "0.2.0.", "1!0.2.0", "0.2 0"} {
		if err := CheckVersion(v); err == nil {
			t.Errorf("CheckVersion(%q) accepted a non-canonical version", v)
		}
	}
}

func TestDigestIsRecordsEncoding(t *testing.T) {
	// SHA-256 of nothing, urlsafe base64 without padding, as pip and
	// client/python/_build/backend.py write it.
	if got, want := digest(nil), "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU"; got != want {
		t.Errorf("digest(empty) = %s, want %s", got, want)
	}
}

// fakeBinaries writes stand-ins for the commands and lets Build take them.
func fakeBinaries(t *testing.T) string {
	t.Helper()
	old := checkBinary
	checkBinary = func(string, string) error { return nil }
	t.Cleanup(func() { checkBinary = old })
	dir := t.TempDir()
	for _, c := range Commands {
		if err := os.WriteFile(filepath.Join(dir, c), []byte("binary of "+c+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func build(t *testing.T, o Options) string {
	t.Helper()
	p, err := Build(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func readZip(t *testing.T, p string) map[string]*zip.File {
	t.Helper()
	zr, err := zip.OpenReader(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { zr.Close() })
	m := map[string]*zip.File{}
	for _, f := range zr.File {
		m[f.Name] = f
	}
	return m
}

func content(t *testing.T, f *zip.File) string {
	t.Helper()
	b, err := readAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWheelHoldsCommandsAsScriptsAndTheClient(t *testing.T) {
	bin := fakeBinaries(t)
	readme := filepath.Join(t.TempDir(), "README.md")
	os.WriteFile(readme, []byte("# ft-launcher\n\nLong description.\n"), 0o644)
	p := build(t, Options{Version: "0.2.0", Arch: "arm64", BinDir: bin, ModuleDir: clientModule, Readme: readme, Time: time.Unix(1700000000, 0)})
	if filepath.Base(p) != "ft_launcher-0.2.0-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64.musllinux_1_1_aarch64.whl" {
		t.Errorf("wheel written as %s", p)
	}
	files := readZip(t, p)

	// The binaries: under .data/scripts (pip installs them into the
	// environment's bin directory), executable in the entry's Unix mode,
	// which is where pip takes the exec bit from.
	for _, c := range Commands {
		f := files["ft_launcher-0.2.0.data/scripts/"+c]
		if f == nil {
			t.Fatalf("no script %s in %v", c, keys(files))
		}
		if mode := f.Mode(); mode.Perm() != 0o755 || !mode.IsRegular() || f.ExternalAttrs>>16 == 0 {
			t.Errorf("%s: mode %v, external attributes %#x; want a regular file 0755 in the Unix bits", c, mode, f.ExternalAttrs)
		}
		if got := content(t, f); got != "binary of "+c+"\n" {
			t.Errorf("%s holds %q", c, got)
		}
	}

	// The client: the same files client/python's own backend puts in its
	// wheel (every .py of the package, its subpackages' included), at the
	// root.
	var want, got []string
	filepath.WalkDir(clientModule, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".py") {
			rel, _ := filepath.Rel(clientModule, p)
			want = append(want, Module+"/"+filepath.ToSlash(rel))
		}
		return nil
	})
	if !slices.Contains(want, Module+"/state/__init__.py") {
		t.Errorf("the client's files %v lack the state package", want)
	}
	for name := range files {
		if strings.HasPrefix(name, Module+"/") {
			got = append(got, name)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("client files %v, want %v", got, want)
	}

	wheelFile := content(t, files["ft_launcher-0.2.0.dist-info/WHEEL"])
	for _, line := range []string{"Wheel-Version: 1.0", "Root-Is-Purelib: false",
		"Tag: py3-none-manylinux_2_17_aarch64", "Tag: py3-none-manylinux2014_aarch64", "Tag: py3-none-musllinux_1_1_aarch64"} {
		if !slices.Contains(strings.Split(wheelFile, "\n"), line) {
			t.Errorf("WHEEL lacks %q:\n%s", line, wheelFile)
		}
	}
	meta := content(t, files["ft_launcher-0.2.0.dist-info/METADATA"])
	for _, line := range []string{"Metadata-Version: 2.1", "Name: ft-launcher", "Version: 0.2.0", "Requires-Python: >=3.8",
		"Description-Content-Type: text/markdown", "Long description."} {
		if !slices.Contains(strings.Split(meta, "\n"), line) {
			t.Errorf("METADATA lacks %q:\n%s", line, meta)
		}
	}
	// RECORD last, as PEP 427 recommends: an installer reading the zip
	// in order meets every file before the list that checks them.
	zr, _ := zip.OpenReader(p)
	defer zr.Close()
	if last := zr.File[len(zr.File)-1].Name; last != "ft_launcher-0.2.0.dist-info/RECORD" {
		t.Errorf("last entry %s, want RECORD", last)
	}
	for _, f := range zr.File {
		if !f.Modified.Equal(time.Unix(1700000000, 0)) {
			t.Errorf("%s stamped %v, want the given time", f.Name, f.Modified)
		}
	}
}

func TestSameInputsGiveTheSameWheel(t *testing.T) {
	bin := fakeBinaries(t)
	o := Options{Version: "0.2.0", Arch: "amd64", BinDir: bin, ModuleDir: clientModule, Time: time.Unix(1700000000, 0)}
	a, _ := os.ReadFile(build(t, o))
	b, _ := os.ReadFile(build(t, o))
	if !bytes.Equal(a, b) {
		t.Error("two builds from the same inputs differ")
	}
}

func TestVerifyCatchesWhatPipRejects(t *testing.T) {
	record := func(files ...entry) entry {
		var b strings.Builder
		for _, f := range files {
			b.WriteString(f.name + "," + digest(f.data) + "," + strconv.Itoa(len(f.data)) + "\n")
		}
		b.WriteString("x.dist-info/RECORD,,\n")
		return entry{"x.dist-info/RECORD", 0o644, []byte(b.String())}
	}
	script := entry{"x.data/scripts/ft-launcher", 0o755, []byte("bin")}
	mod := entry{"m/__init__.py", 0o644, []byte("")}
	changed := script
	changed.data = []byte("other")
	notExec := script
	notExec.mode = 0o644
	for name, files := range map[string][]entry{
		"wrong hash":         {changed, mod, record(script, mod)},
		"file not in RECORD": {script, mod, record(script)},
		"RECORD lists more":  {script, record(script, mod)},
		"script not exec":    {notExec, record(notExec)},
		"no RECORD":          {script},
	} {
		p := filepath.Join(t.TempDir(), "x.whl")
		if err := writeZip(p, files, time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := Verify(p); err == nil {
			t.Errorf("%s: Verify passed", name)
		}
	}
	// The same wheel, right, passes.
	p := filepath.Join(t.TempDir(), "ok.whl")
	writeZip(p, []entry{script, mod, record(script, mod)}, time.Time{})
	if err := Verify(p); err != nil {
		t.Errorf("a right wheel: %v", err)
	}
}

func TestBuildRefusesBadInputs(t *testing.T) {
	bin := fakeBinaries(t)
	base := Options{Version: "0.2.0", Arch: "amd64", BinDir: bin, ModuleDir: clientModule}
	for name, o := range map[string]Options{
		"version":        func() Options { o := base; o.Version = "0.2.0-rc1"; return o }(),
		"arch":           func() Options { o := base; o.Arch = "riscv64"; return o }(),
		"missing binary": func() Options { o := base; o.BinDir = t.TempDir(); return o }(),
		"not the module": func() Options { o := base; o.ModuleDir = t.TempDir(); return o }(),
	} {
		if p, err := Build(t.TempDir(), o); err == nil {
			t.Errorf("%s: Build wrote %s", name, p)
		}
	}
}

func TestCheckStaticRejectsLinkedAndForeignBinaries(t *testing.T) {
	text := filepath.Join(t.TempDir(), "script")
	os.WriteFile(text, []byte("#!/bin/sh\n"), 0o755)
	if err := CheckStatic(text, "amd64"); err == nil {
		t.Error("a shell script passed as a static binary")
	}
	// A C program from the system: dynamically linked against glibc, which
	// a musl system does not have.
	if sh, err := exec.LookPath("sh"); err == nil {
		sh, _ = filepath.EvalSymlinks(sh)
		if err := CheckStatic(sh, runtime.GOARCH); err == nil || !strings.Contains(err.Error(), "interpreter") {
			t.Errorf("CheckStatic(%s) = %v, want a complaint about its ELF interpreter", sh, err)
		}
	}
}

func TestCheckStaticAcceptsOnlyTheReleaseBuild(t *testing.T) {
	testenv.SkipShort(t, "runs the go command")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module hello\n\ngo 1.21\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644)
	goBuild := func(out string, env []string, args ...string) string {
		cmd := exec.Command("go", append(append([]string{"build", "-o", out}, args...), ".")...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, b)
		}
		return out
	}
	// amd64 on any host (a cross-build where the host is another):
	// the test needs no particular machine.
	linux := []string{"CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64"}
	release := goBuild(filepath.Join(dir, "release"), linux, "-trimpath")
	if err := CheckStatic(release, "amd64"); err != nil {
		t.Errorf("the release build was refused: %v", err)
	}
	if err := CheckStatic(release, "arm64"); err == nil {
		t.Error("an amd64 binary passed for arm64")
	}
	// Without -trimpath the binary holds the build machine's paths: not
	// what release.sh ships.
	untrimmed := goBuild(filepath.Join(dir, "untrimmed"), linux)
	if err := CheckStatic(untrimmed, "amd64"); err == nil || !strings.Contains(err.Error(), "-trimpath") {
		t.Errorf("CheckStatic(untrimmed) = %v, want a complaint about -trimpath", err)
	}
}

func keys(m map[string]*zip.File) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
