// Package wheel writes ft-launcher's platform wheel: one file that
// `pip install ft-launcher` turns into the three static commands on the
// environment's PATH and the importable ft_launcher_client package, with no
// compiler, no build step and no package index at install time.
//
// A wheel is a zip file (the binary distribution format, PEP 427): the
// package's files at the root, files for other install locations under
// NAME-VERSION.data/ (scripts/ lands in the environment's bin directory),
// and NAME-VERSION.dist-info/ with METADATA, WHEEL (the tags) and RECORD
// (every file's SHA-256 and size). This package writes it with archive/zip,
// as client/python/_build/backend.py does with Python's zipfile, so that
// building one needs neither setuptools nor the wheel package.
package wheel

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"crypto/sha256"
	"debug/buildinfo"
	"debug/elf"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Name is the distribution name: what `pip install` takes, the same as the
// main command's, so that the name a user types for the install is the
// name of the command they get. Its file-name form is FileName.
const Name = "ft-launcher"

// FileName is Name as wheel file names and the .dist-info directory spell
// it (runs of - _ . become _).
const FileName = "ft_launcher"

// Module is the importable package the wheel carries: the name existing
// training code already imports (the client-only distribution built from
// client/python installs the same package).
const Module = "ft_launcher_client"

// Commands are the binaries the wheel puts on PATH. ft-launcher starts
// ft-launcher-etcd, and ft-resumer ft-appwrapper-controller, from its own
// directory, and pip installs them all into the same bin directory.
var Commands = []string{"ft-launcher", "ft-launcher-etcd", "ft-resumer", "ft-appwrapper-controller"}

// RequiresPython is the oldest interpreter the client supports; the
// binaries need none.
const RequiresPython = ">=3.8"

// platform is one architecture's tags.
type platform struct {
	machine elf.Machine
	// tags are the platform tags, widest first. The binaries are static
	// (no ELF interpreter, no libc), so the only limits are the kernel's
	// and the CPU's:
	//  - manylinux_2_17 (PEP 600) and its legacy alias manylinux2014
	//    (PEP 599, which pip before 20.3 knows): the oldest manylinux
	//    that runs Go's binaries. Its reference system, CentOS 7, has
	//    Linux 3.10, and Go needs 3.2 or later; manylinux2010 (CentOS 6,
	//    Linux 2.6.32) does not, and aarch64 starts at 2014 anyway.
	//  - musllinux_1_1 (PEP 656): Alpine and other musl systems, which
	//    accept no manylinux wheel. The binaries use no musl at all; 1.1
	//    (2014, every Alpine 3) is the floor that musl wheels are built
	//    for, and a pip on musl 1.1 or later accepts it.
	// pip knows manylinux2014 from 19.3, manylinux_2_17 from 20.3 and
	// musllinux from 21.2.
	tags []string
}

var platforms = map[string]platform{
	"amd64": {elf.EM_X86_64, []string{"manylinux_2_17_x86_64", "manylinux2014_x86_64", "musllinux_1_1_x86_64"}},
	"arm64": {elf.EM_AARCH64, []string{"manylinux_2_17_aarch64", "manylinux2014_aarch64", "musllinux_1_1_aarch64"}},
}

// Arches are the Go architectures a wheel can be built for.
func Arches() []string {
	a := make([]string, 0, len(platforms))
	for k := range platforms {
		a = append(a, k)
	}
	slices.Sort(a)
	return a
}

// Tags returns the wheel's full tags for a Go architecture: one
// interpreter-independent tag (py3-none: no Python code needs compiling,
// no ABI) per platform tag.
func Tags(arch string) ([]string, error) {
	p, ok := platforms[arch]
	if !ok {
		return nil, fmt.Errorf("wheel: no platform tags for GOARCH %q (have %v)", arch, Arches())
	}
	out := make([]string, len(p.tags))
	for i, pt := range p.tags {
		out[i] = "py3-none-" + pt
	}
	return out, nil
}

// File returns the wheel's file name: the tags compressed into one
// dotted platform part (PEP 425), so that one file serves glibc and musl.
func File(version, arch string) (string, error) {
	if err := CheckVersion(version); err != nil {
		return "", err
	}
	p, ok := platforms[arch]
	if !ok {
		return "", fmt.Errorf("wheel: no platform tags for GOARCH %q (have %v)", arch, Arches())
	}
	return fmt.Sprintf("%s-%s-py3-none-%s.whl", FileName, version, strings.Join(p.tags, ".")), nil
}

// canonical is PEP 440's canonical public version, with an optional local
// part and no epoch: pip compares versions by these rules, and a name that
// is not canonical would be installed under a spelling different from the
// one the binaries print.
var canonical = regexp.MustCompile(`^(0|[1-9][0-9]*)(\.(0|[1-9][0-9]*))*((a|b|rc)(0|[1-9][0-9]*))?(\.post(0|[1-9][0-9]*))?(\.dev(0|[1-9][0-9]*))?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$`)

// CheckVersion reports whether v can be a wheel's version as it is.
func CheckVersion(v string) error {
	if !canonical.MatchString(v) {
		return fmt.Errorf("wheel: version %q is not a canonical PEP 440 version (such as 0.2.0, 0.2.0rc1, 0.2.0.post1, 0.2.1.dev3)", v)
	}
	return nil
}

// Options says what goes into a wheel.
type Options struct {
	Version string // canonical PEP 440 (CheckVersion)
	Arch    string // GOARCH: amd64 or arm64
	// BinDir holds the Commands, built for Arch, static (CheckStatic).
	BinDir string
	// ModuleDir is the ft_launcher_client package directory
	// (client/python/ft_launcher_client).
	ModuleDir string
	// Readme, when set, is a Markdown file that becomes the long
	// description (what an index shows on the project's page).
	Readme string
	// Time stamps every entry, so that the same inputs give the same
	// bytes (release.sh passes the commit's time). Zip cannot hold times
	// before 1980; earlier ones are raised to it.
	Time time.Time
}

// entry is one file of the wheel.
type entry struct {
	name string
	mode fs.FileMode
	data []byte
}

// Build writes the wheel into dir and returns its path. It checks every
// binary first (CheckStatic): the tags promise glibc and musl systems alike
// that nothing is linked.
func Build(dir string, o Options) (string, error) {
	name, err := File(o.Version, o.Arch)
	if err != nil {
		return "", err
	}
	tags, _ := Tags(o.Arch)
	var files []entry

	mod, err := moduleFiles(o.ModuleDir)
	if err != nil {
		return "", err
	}
	files = append(files, mod...)

	data := FileName + "-" + o.Version + ".data"
	for _, c := range Commands {
		p := filepath.Join(o.BinDir, c)
		if err := checkBinary(p, o.Arch); err != nil {
			return "", err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		// Executable bits: pip gives an installed file exec permission
		// only when its zip entry's Unix mode has them.
		files = append(files, entry{data + "/scripts/" + c, 0o755, b})
	}

	info := FileName + "-" + o.Version + ".dist-info"
	meta, err := metadata(o)
	if err != nil {
		return "", err
	}
	files = append(files, entry{info + "/METADATA", 0o644, meta})
	var wh strings.Builder
	// Root-Is-Purelib false: a wheel with binaries is a platform wheel;
	// its root goes to platlib (the same directory in a venv).
	wh.WriteString("Wheel-Version: 1.0\nGenerator: ft-launcher internal/wheel\nRoot-Is-Purelib: false\n")
	for _, t := range tags {
		wh.WriteString("Tag: " + t + "\n")
	}
	files = append(files, entry{info + "/WHEEL", 0o644, []byte(wh.String())})
	var rec strings.Builder
	for _, f := range files {
		fmt.Fprintf(&rec, "%s,%s,%d\n", f.name, digest(f.data), len(f.data))
	}
	rec.WriteString(info + "/RECORD,,\n")
	files = append(files, entry{info + "/RECORD", 0o644, []byte(rec.String())})

	out := filepath.Join(dir, name)
	if err := writeZip(out, files, o.Time); err != nil {
		return "", err
	}
	return out, nil
}

// moduleFiles reads the package's Python files (subpackages included;
// __pycache__ and anything not .py left out), in a stable order.
func moduleFiles(dir string) ([]entry, error) {
	if _, err := os.Stat(filepath.Join(dir, "__init__.py")); err != nil {
		return nil, fmt.Errorf("wheel: %s is not the %s package: %w", dir, Module, err)
	}
	var files []entry
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "__pycache__" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".py") {
			return nil
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, entry{path.Join(Module, filepath.ToSlash(rel)), 0o644, b})
		return nil
	})
	return files, err
}

// metadata is the core metadata (version 2.1, which every pip that knows
// these tags reads).
func metadata(o Options) ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Metadata-Version: 2.1\nName: %s\nVersion: %s\n", Name, o.Version)
	b.WriteString("Summary: Fault-tolerant launcher for distributed PyTorch (torchrun and nvrx ft_launcher drop-in), static binaries and the ft_launcher_client rank-side package\n")
	b.WriteString("Requires-Python: " + RequiresPython + "\n")
	b.WriteString("Classifier: Operating System :: POSIX :: Linux\n")
	b.WriteString("Classifier: Programming Language :: Go\n")
	b.WriteString("Classifier: Programming Language :: Python :: 3\n")
	b.WriteString("Classifier: Topic :: Scientific/Engineering :: Artificial Intelligence\n")
	if o.Readme != "" {
		readme, err := os.ReadFile(o.Readme)
		if err != nil {
			return nil, err
		}
		b.WriteString("Description-Content-Type: text/markdown\n\n")
		b.Write(readme)
	}
	return b.Bytes(), nil
}

// digest is RECORD's hash: sha256= and the urlsafe base64 digest without
// padding.
func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256=" + base64.RawURLEncoding.EncodeToString(s[:])
}

// zipEpoch is the earliest time a zip entry's MS-DOS time can hold.
var zipEpoch = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

func writeZip(out string, files []entry, stamp time.Time) error {
	if stamp.Before(zipEpoch) {
		stamp = zipEpoch
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".wheel-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	zw := zip.NewWriter(tmp)
	// Best compression: the binaries are most of the wheel, and every
	// install downloads it.
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.BestCompression)
	})
	for _, f := range files {
		h := &zip.FileHeader{Name: f.name, Method: zip.Deflate, Modified: stamp.UTC()}
		h.SetMode(f.mode)
		w, err := zw.CreateHeader(h)
		if err != nil {
			tmp.Close()
			return err
		}
		if _, err := w.Write(f.data); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := zw.Close(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), out)
}

// checkBinary is CheckStatic; the package's tests replace it to build
// wheels from small fake binaries.
var checkBinary = CheckStatic

// CheckStatic reports why the binary at p is not one the wheel's tags may
// carry: an ELF executable for arch with no interpreter and no dynamic
// section (so no libc of the installing system is ever loaded), built by
// the go command with CGO_ENABLED=0 and -trimpath for linux/arch.
func CheckStatic(p, arch string) error {
	want, ok := platforms[arch]
	if !ok {
		return fmt.Errorf("wheel: no platform tags for GOARCH %q (have %v)", arch, Arches())
	}
	f, err := elf.Open(p)
	if err != nil {
		return fmt.Errorf("wheel: %s: not an ELF binary: %w", p, err)
	}
	defer f.Close()
	if f.Machine != want.machine {
		return fmt.Errorf("wheel: %s: built for %v, not linux/%s", p, f.Machine, arch)
	}
	for _, prog := range f.Progs {
		switch prog.Type {
		case elf.PT_INTERP:
			return fmt.Errorf("wheel: %s: has an ELF interpreter (dynamically linked): build it with CGO_ENABLED=0", p)
		case elf.PT_DYNAMIC:
			return fmt.Errorf("wheel: %s: has a dynamic section: build it with CGO_ENABLED=0", p)
		}
	}
	bi, err := buildinfo.ReadFile(p)
	if err != nil {
		return fmt.Errorf("wheel: %s: no Go build information: %w", p, err)
	}
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	for k, v := range map[string]string{"CGO_ENABLED": "0", "GOOS": "linux", "GOARCH": arch, "-trimpath": "true"} {
		if settings[k] != v {
			return fmt.Errorf("wheel: %s: built with %s=%q, want %q", p, k, settings[k], v)
		}
	}
	return nil
}

// Verify reopens a wheel and checks what pip will: every file is in
// RECORD with its right hash and size, RECORD lists nothing absent, and
// the scripts carry executable bits.
func Verify(p string) error {
	zr, err := zip.OpenReader(p)
	if err != nil {
		return err
	}
	defer zr.Close()
	var record *zip.File
	for _, f := range zr.File {
		if strings.HasSuffix(f.Name, ".dist-info/RECORD") {
			record = f
		}
	}
	if record == nil {
		return errors.New("wheel: no RECORD")
	}
	rb, err := readAll(record)
	if err != nil {
		return err
	}
	listed := map[string]string{}
	for _, line := range strings.Split(strings.TrimSuffix(string(rb), "\n"), "\n") {
		parts := strings.Split(line, ",")
		if len(parts) != 3 {
			return fmt.Errorf("wheel: RECORD line %q: want path,hash,size", line)
		}
		listed[parts[0]] = parts[1] + "," + parts[2]
	}
	for _, f := range zr.File {
		if f == record {
			if listed[f.Name] != "," {
				return fmt.Errorf("wheel: RECORD lists itself as %q, want no hash", listed[f.Name])
			}
			delete(listed, f.Name)
			continue
		}
		want, ok := listed[f.Name]
		if !ok {
			return fmt.Errorf("wheel: %s is not in RECORD", f.Name)
		}
		delete(listed, f.Name)
		b, err := readAll(f)
		if err != nil {
			return err
		}
		if got := fmt.Sprintf("%s,%d", digest(b), len(b)); got != want {
			return fmt.Errorf("wheel: %s: RECORD says %s, the file is %s", f.Name, want, got)
		}
		if strings.Contains(f.Name, ".data/scripts/") && f.Mode()&0o111 == 0 {
			return fmt.Errorf("wheel: %s: no executable bit (mode %v)", f.Name, f.Mode())
		}
	}
	for name := range listed {
		return fmt.Errorf("wheel: RECORD lists %s, which the wheel lacks", name)
	}
	return nil
}

func readAll(f *zip.File) ([]byte, error) {
	r, err := f.Open()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return io.ReadAll(r)
}
