package kubelettest

// The host state a node changes outside its temporary folder, and how Stop
// puts it back: the system paths and kernel settings the kubelet touches,
// cgroups, mounts, and the kubelet's iptables chains.

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// systemPaths are created whatever the configuration says: the kubelet's
// device-plugin socket folder (a constant in the kubelet) and containerd
// 1.6's shim socket folder.
func systemPaths() []string { return []string{"/var/lib/kubelet", "/run/containerd"} }

// kubeletChains are the iptables chains the kubelet creates at start (and
// recreates every minute while it runs), with the rules that jump to them.
func kubeletChains() [][2]string {
	return [][2]string{{"mangle", "KUBE-IPTABLES-HINT"}, {"mangle", "KUBE-KUBELET-CANARY"}, {"nat", "KUBE-KUBELET-CANARY"},
		{"filter", "KUBE-KUBELET-CANARY"}, {"filter", "KUBE-FIREWALL"}}
}

// kernelTunables are the sysctls the kubelet sets at start
// (protectKernelDefaults false); Stop puts the old values back.
func kernelTunables() []string {
	return []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}
}

// ipForward is the sysctl a pod network needs (Options.PodNetwork); Stop
// puts its old value back.
const ipForward = "net/ipv4/ip_forward"

// controllers are the cgroup v1 hierarchies the kubelet and runc use.
func controllers() []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

// makeCgroupRoot creates the node's cgroup root in every hierarchy: the
// kubelet refuses a cgroupRoot that does not exist, and puts its kubepods
// tree below it, so two kubelets never share cgroups.
func (n *Node) makeCgroupRoot() error {
	for _, c := range controllers() {
		if _, err := os.Stat(filepath.Join(c, "cgroup.procs")); err != nil {
			continue
		}
		d := filepath.Join(c, n.cgroupRoot)
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("kubelettest: cgroup root: %w", err)
		}
		if filepath.Base(c) == "cpuset" {
			// A new v1 cpuset is empty and refuses tasks until given its
			// parent's CPUs and memory nodes.
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(c, f))
				if err != nil {
					return fmt.Errorf("kubelettest: cgroup root: %w", err)
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("kubelettest: cgroup root %s: %w", f, err)
				}
			}
		}
	}
	return nil
}

// cgroupPids lists the processes in the node's cgroup tree.
func (n *Node) cgroupPids() []int {
	var pids []int
	for _, c := range controllers() {
		_ = filepath.WalkDir(filepath.Join(c, n.cgroupRoot), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					pids = append(pids, pid)
				}
			}
			return nil
		})
	}
	sort.Ints(pids)
	out := pids[:0]
	for i, p := range pids {
		if i == 0 || p != pids[i-1] {
			out = append(out, p)
		}
	}
	return out
}

// removeCgroupTree removes a cgroup folder and its children, deepest first.
func removeCgroupTree(root string) error {
	var dirs []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kubelettest: cgroups under %s: %w", root, err)
	}
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		var rerr error
		for try := 0; try < 20; try++ {
			if rerr = os.Remove(dirs[i]); rerr == nil || os.IsNotExist(rerr) {
				rerr = nil
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if rerr != nil {
			errs = append(errs, fmt.Errorf("kubelettest: remove cgroup: %w", rerr))
		}
	}
	return errors.Join(errs...)
}

// unmountUnder detaches every mount at or below dir, deepest first
// (container root filesystems, sandbox /dev/shm, the kubelet's rshared
// bind mount of its root folder, volumes).
func unmountUnder(dir string) error {
	var errs []error
	for try := 0; try < 5; try++ {
		mps, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = nil
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("kubelettest: unmount %s: %w", mp, err))
			}
		}
	}
	if mps, _ := mountsUnder(dir); len(mps) > 0 {
		errs = append(errs, fmt.Errorf("kubelettest: still mounted: %v", mps))
	}
	return errors.Join(errs...)
}

func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps, sc.Err()
}

// iptablesCommands are the iptables front ends the kubelet uses, when
// installed (Debian's iptables comes with containernetworking-plugins).
func iptablesCommands() []string {
	var out []string
	for _, b := range []string{"iptables", "ip6tables"} {
		if _, err := exec.LookPath(b); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// iptablesChains lists the kubelet's chains that exist now, as
// "command table chain".
func iptablesChains() map[string]bool {
	have := map[string]bool{}
	for _, b := range iptablesCommands() {
		for _, kc := range kubeletChains() {
			if exec.Command(b, "-w", "-t", kc[0], "-S", kc[1]).Run() == nil {
				have[b+" "+kc[0]+" "+kc[1]] = true
			}
		}
	}
	return have
}

// removeChains deletes the kubelet's chains that were not there before
// (before): first the jumps to KUBE-FIREWALL, then each chain's rules and
// the chain.
func removeChains(before map[string]bool) error {
	var errs []error
	for key := range iptablesChains() {
		if before[key] {
			continue
		}
		f := strings.Fields(key)
		b, table, chain := f[0], f[1], f[2]
		if chain == "KUBE-FIREWALL" {
			for _, from := range []string{"INPUT", "OUTPUT"} {
				for exec.Command(b, "-w", "-t", table, "-D", from, "-j", chain).Run() == nil {
				}
			}
		}
		for _, op := range []string{"-F", "-X"} {
			if out, err := exec.Command(b, "-w", "-t", table, op, chain).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("kubelettest: %s -t %s %s %s: %v: %s", b, table, op, chain, err, out))
			}
		}
	}
	return errors.Join(errs...)
}
