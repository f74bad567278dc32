// Package testenv names what of the machine a test needs (Slurm, cgroups,
// network and PID namespaces, the Kubernetes control plane, Debian's
// python3-torch, ...) and decides what a test does when it is missing: it
// skips, saying what is missing and how to get it, except under CI (CI set)
// or with FTL_REQUIRE_ALL=1, where it fails with the same words. Only
// hardware that CI machines cannot have (a GPU) may skip there.
//
// Every environment skip in the repository goes through Require or Missing,
// so that a CI run cannot turn green with a whole suite skipped, and the
// test summarizer (internal/testsummary) can tell environment skips from the
// others by their prefix. scripts/deps.sh installs every Debian package named
// here; a test in this package checks that its list covers them all.
package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The skip and failure messages start with one of these prefixes.
const (
	// MissingPrefix starts the message of a missing requirement.
	MissingPrefix = "testenv: missing "
	// HardwarePrefix starts the message of absent hardware that CI
	// machines cannot have: the only skip allowed under CI.
	HardwarePrefix = "testenv: hardware missing (allowed to skip in CI): "
)

// Requirement is one thing of the machine some tests need.
type Requirement string

// The requirements. Info gives each one's packages and how to get it.
const (
	Root          Requirement = "root"
	Slurm         Requirement = "Slurm"
	Cgroups       Requirement = "writable cgroups"
	CgroupV2Kill  Requirement = "a writable cgroup v2 hierarchy with cgroup.kill"
	NetNamespaces Requirement = "network namespaces"
	PIDNamespaces Requirement = "PID namespaces"
	ControlPlane  Requirement = "the Kubernetes control plane binaries"
	Torch         Requirement = "Debian's python3 with PyTorch"
	SystemPython  Requirement = "Debian's python3"
	Pip           Requirement = "python3 with pip"
	Venv          Requirement = "Debian's python3 with venv and ensurepip"
	Etcd          Requirement = "Debian's etcd"
	Procps        Requirement = "procps (ps, pgrep, pkill)"
	CGo           Requirement = "a C compiler and the C library headers"
	Chromium      Requirement = "headless Chromium"
	DevFull       Requirement = "/dev/full"
	DevZero       Requirement = "/dev/zero"
	GPU           Requirement = "an NVIDIA GPU with nvidia-smi"
	Buildah       Requirement = "buildah"
)

// RealContainers is k8s/kubelettest's lane: a kubelet and kube-scheduler in
// KUBEBUILDER_ASSETS, containerd, runc and the CNI plugins.
const RealContainers Requirement = "a kubelet, kube-scheduler, containerd, runc and the CNI plugins"

// DebianPython is Debian's interpreter: the python3 first on PATH may be
// another one without Debian's packages.
const DebianPython = "/usr/bin/python3"

// All lists every requirement.
func All() []Requirement {
	return []Requirement{Root, Slurm, Cgroups, CgroupV2Kill, NetNamespaces, PIDNamespaces, ControlPlane, RealContainers,
		Torch, SystemPython, Pip, Venv, Etcd, Procps, CGo, Chromium, DevFull, DevZero, GPU, Buildah}
}

// Info is what is known of a requirement.
type Info struct {
	// Packages are the Debian packages that provide it (scripts/deps.sh
	// installs them).
	Packages []string
	// How says what else it takes: root, a kernel feature, a build step.
	How string
	// Hardware is set for what CI machines cannot have: it may skip
	// under CI.
	Hardware bool
	// Slow is set for what makes a test slow (a cluster, a daemon, a
	// heavy interpreter, namespaces, a browser): Require skips such a test
	// under `go test -short`, the fast lane (docs/testing.md).
	Slow bool
	// check reports it missing; nil where only the test can tell.
	check func() error
}

// Info returns what is known of r.
func (r Requirement) Info() Info {
	switch r {
	case Root:
		return Info{How: "run the tests as root (CI does)", check: checkRoot}
	case Slurm:
		return Info{Packages: []string{"munge", "slurmctld", "slurmd", "slurm-client"}, Slow: true,
			How:   "run as root: slurmd starts job steps as their users",
			check: asRoot("munged", "slurmctld", "slurmd", "sbatch", "srun")}
	case Cgroups:
		return Info{Slow: true, How: "run as root on a machine with cgroup v2 (cgroup.kill: kernel 5.14 or later) or the cgroup v1 freezer"}
	case CgroupV2Kill:
		return Info{Slow: true, How: "run as root on a machine with a cgroup v2 hierarchy (/sys/fs/cgroup or /sys/fs/cgroup/unified) and kernel 5.14 or later"}
	case NetNamespaces:
		return Info{Packages: []string{"iproute2"}, Slow: true, How: "run as root (CAP_NET_ADMIN and CAP_SYS_ADMIN)", check: asRoot("ip")}
	case PIDNamespaces:
		return Info{Packages: []string{"util-linux"}, Slow: true, How: "run as root (unshare --pid)", check: asRoot("unshare")}
	case ControlPlane:
		return Info{Slow: true, How: "build them once with `export KUBEBUILDER_ASSETS=$(scripts/k8s-assets.sh)` (scripts/test.sh does; about 9 minutes the first time)"}
	case RealContainers:
		return Info{Packages: []string{"containerd", "runc", "containernetworking-plugins"}, Slow: true,
			How: "run as root; build the kubelet and kube-scheduler with `export KUBEBUILDER_ASSETS=$(FTL_K8S_KUBELET=1 scripts/k8s-assets.sh)` (k8s/kubelettest.Check says what is missing)"}
	case Torch:
		return Info{Packages: []string{"python3-torch"}, Slow: true, check: func() error {
			out, err := exec.Command(DebianPython, "-c", "import torch").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s -c 'import torch': %v: %s", DebianPython, err, lastLine(out))
			}
			return nil
		}}
	case SystemPython:
		return Info{Packages: []string{"python3"}, check: func() error {
			_, err := os.Stat(DebianPython)
			return err
		}}
	case Pip:
		return Info{Packages: []string{"python3-pip"}, Slow: true, check: func() error {
			out, err := exec.Command("python3", "-m", "pip", "--version").CombinedOutput()
			if err != nil {
				return fmt.Errorf("python3 -m pip --version: %v: %s", err, lastLine(out))
			}
			return nil
		}}
	case Venv:
		// Debian splits ensurepip (and the pip wheel it installs) out of
		// the standard library: without python3-venv, `python3 -m venv`
		// fails. ensurepip.version() reads the bundled wheel.
		return Info{Packages: []string{"python3-venv"}, Slow: true, check: func() error {
			out, err := exec.Command(DebianPython, "-c", "import ensurepip, venv; ensurepip.version()").CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s -c 'import ensurepip, venv': %v: %s", DebianPython, err, lastLine(out))
			}
			return nil
		}}
	case Etcd:
		return Info{Packages: []string{"etcd-server"}, Slow: true, check: func() error { return lookPaths("etcd") }}
	case Procps:
		return Info{Packages: []string{"procps"}, check: func() error { return lookPaths("ps", "pgrep", "pkill") }}
	case CGo:
		return Info{Packages: []string{"gcc", "libc6-dev"}, How: "go test -race builds with cgo",
			check: func() error {
				if err := lookPaths("gcc"); err != nil {
					return err
				}
				_, err := os.Stat("/usr/include/stdlib.h")
				return err
			}}
	case Chromium:
		return Info{Packages: []string{"chromium"}, Slow: true, check: func() error { return lookPaths("chromium") }}
	case DevFull:
		return Info{How: "a Linux /dev with the full device (mknod -m 666 /dev/full c 1 7)", check: func() error {
			f, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
			if err == nil {
				f.Close()
			}
			return err
		}}
	case DevZero:
		return Info{How: "a Linux /dev with the zero device (mknod -m 666 /dev/zero c 1 5)", check: func() error {
			_, err := os.Stat("/dev/zero")
			return err
		}}
	case Buildah:
		return Info{Packages: []string{"buildah"}, Slow: true, How: "run as root (scripts/image.sh builds with vfs storage and chroot isolation)",
			check: asRoot("buildah")}
	case GPU:
		return Info{Hardware: true, How: "a GPU host with the NVIDIA driver; CI machines have none",
			check: func() error { return lookPaths("nvidia-smi") }}
	}
	panic(fmt.Sprintf("testenv: unknown requirement %q", string(r)))
}

// Strict reports whether a missing requirement fails the test: CI is set
// (and not "false" or "0"), or FTL_REQUIRE_ALL=1. FTL_REQUIRE_ALL=0 turns
// it off even under CI.
func Strict() bool {
	switch os.Getenv("FTL_REQUIRE_ALL") {
	case "1":
		return true
	case "0":
		return false
	}
	ci := os.Getenv("CI")
	return ci != "" && ci != "false" && ci != "0"
}

// Check reports why r is missing here, or nil. A requirement only the test
// can tell (cgroups, the control plane) checks as present.
func Check(r Requirement) error {
	if c := r.Info().check; c != nil {
		return c()
	}
	return nil
}

// Require ends t when one of reqs is missing: a skip, or a failure under
// CI or FTL_REQUIRE_ALL=1 (see Missing). Under `go test -short` it also
// skips a test that needs a slow requirement (Info.Slow), present or not.
func Require(t testing.TB, reqs ...Requirement) {
	t.Helper()
	for _, r := range reqs {
		if r.Info().Slow {
			SkipShort(t, "needs "+string(r))
		}
	}
	for _, r := range reqs {
		if err := Check(r); err != nil {
			Missing(t, r, err.Error())
		}
	}
}

// ShortSuffix ends the message of a test skipped by `go test -short`.
const ShortSuffix = ": -short"

// SkipShort skips t under `go test -short`, the fast lane of pure and
// fake-driven tests (docs/testing.md); why says what makes t slow (real
// processes, a cluster, etcd, long timers). The full suite, without
// -short, runs it.
func SkipShort(t testing.TB, why string) {
	t.Helper()
	if testing.Short() {
		t.Skip(why + ShortSuffix)
	}
}

// Missing ends t because r is missing here (detail says what was seen): a
// skip naming r and how to get it, or the same words as a failure under CI
// or FTL_REQUIRE_ALL=1, except for hardware CI cannot have.
func Missing(t testing.TB, r Requirement, detail string) {
	t.Helper()
	msg := Message(r, detail)
	if Strict() && !r.Info().Hardware {
		t.Fatal(msg + " (fails instead of skipping: CI or FTL_REQUIRE_ALL=1 is set)")
	}
	t.Skip(msg)
}

// Message is the skip or failure text for r missing: the prefix, r, what
// was seen and how to get it.
func Message(r Requirement, detail string) string {
	info := r.Info()
	var b strings.Builder
	if info.Hardware {
		b.WriteString(HardwarePrefix)
	} else {
		b.WriteString(MissingPrefix)
	}
	b.WriteString(string(r))
	if detail = strings.TrimSpace(detail); detail != "" {
		b.WriteString(": " + detail)
	}
	var how []string
	if len(info.Packages) > 0 {
		how = append(how, "apt-get install "+strings.Join(info.Packages, " ")+" (scripts/deps.sh installs every package the tests need)")
	}
	if info.How != "" {
		how = append(how, info.How)
	}
	if len(how) > 0 {
		b.WriteString("; to get it: " + strings.Join(how, "; "))
	}
	return b.String()
}

// Packages returns every Debian package any requirement names, each once,
// in the order of All.
func Packages() []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range All() {
		for _, p := range r.Info().Packages {
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out
}

func checkRoot() error {
	if id := os.Geteuid(); id != 0 {
		return fmt.Errorf("running as uid %d, not root", id)
	}
	return nil
}

// asRoot checks for the programs on PATH and for root.
func asRoot(progs ...string) func() error {
	return func() error {
		if err := lookPaths(progs...); err != nil {
			return err
		}
		return checkRoot()
	}
}

// lookPaths reports the programs not found on PATH.
func lookPaths(progs ...string) error {
	var missing []string
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	if len(missing) > 0 {
		return errors.New("not on PATH: " + strings.Join(missing, ", "))
	}
	return nil
}

func lastLine(out []byte) string {
	s := strings.TrimSpace(string(out))
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
