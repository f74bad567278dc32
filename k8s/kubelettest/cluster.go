// Package kubelettest runs pods in real containers for tests: a real
// kubelet (1.35.x, built from the Go module proxy by scripts/k8s-assets.sh)
// per node, each with its own containerd (Debian's 1.6) and runc, and a
// real kube-scheduler, against the control plane of k8s/k8stest. Images are
// built locally (Image) and imported into each containerd: nothing is
// pulled.
//
// Everything is private to the test: each containerd has its own socket,
// root and state folders under a temporary folder (never the system's
// /run/containerd), each kubelet its own root folder, ports and cgroup
// root. Stop kills every process started, the containers and their shims
// included, unmounts what the kubelet and containerd mounted, removes the
// cgroups and restores the kernel settings the kubelet changes.
//
// Pods run with hostNetwork: the CNI configuration given to containerd
// (Debian's bridge plugin) only makes the node report its network ready;
// no pod network or network namespace is created.
package kubelettest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// CNIDir is where Debian's containernetworking-plugins installs the
// plugins.
const CNIDir = "/usr/lib/cni"

// NodeMonitorGracePeriod is how long after its kubelet's last heartbeat
// the node lifecycle controller marks a node NotReady (the default is 50 s;
// the kubelets renew their lease every 2 s).
const NodeMonitorGracePeriod = 10 * time.Second

// PauseImage is the sandbox image every containerd is configured with; the
// caller imports an image of that name (see Start).
const PauseImage = "ftl.local/pause:1"

// ErrNoKubelet is returned when the kubelet or kube-scheduler binary, or
// containerd, runc or the CNI plugins, are missing.
var ErrNoKubelet = errors.New("kubelettest: missing kubelet, kube-scheduler (KUBEBUILDER_ASSETS from `FTL_K8S_KUBELET=1 scripts/k8s-assets.sh`), or containerd, runc, CNI plugins (scripts/deps.sh)")

// Check reports what of the real-container lane is missing here, or nil.
func Check() error {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	var missing []string
	for _, b := range []string{"kubelet", "kube-scheduler"} {
		if st, err := os.Stat(filepath.Join(assets, b)); assets == "" || err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b+" in KUBEBUILDER_ASSETS="+strconv.Quote(assets))
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			missing = append(missing, b)
		}
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if _, err := os.Stat(filepath.Join(CNIDir, p)); err != nil {
			missing = append(missing, filepath.Join(CNIDir, p))
		}
	}
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrNoKubelet, strings.Join(missing, ", "))
	}
	return nil
}

// Cluster is a kube-scheduler and one or more real nodes.
type Cluster struct {
	Env   *k8stest.Env
	Nodes []*Node

	dir    string
	sched  *proc
	kcm    *proc
	sysctl map[string]string
	// absent are the system paths the kubelet and containerd create even
	// when told to use other folders, that did not exist before Start.
	absent []string
	// chains are the iptables chains that existed before Start, per
	// command and table.
	chains map[string]bool
}

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

// Node is one kubelet with its containerd.
type Node struct {
	Name string

	dir        string
	cgroupRoot string
	containerd *proc
	kubelet    *proc
	kubeletCmd []string
}

// proc is a started process and its log.
type proc struct {
	cmd    *exec.Cmd
	log    string
	exited chan struct{}
	err    error
}

// kernelTunables are the sysctls the kubelet sets at start
// (protectKernelDefaults false); Stop puts the old values back.
func kernelTunables() []string {
	return []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
		"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}
}

// Start starts kube-scheduler and nodes kubelets named ftl-node-0, ...,
// each with its own containerd into which the images are imported (one of
// them must be named PauseImage). It waits until every node is Ready.
func Start(ctx context.Context, env *k8stest.Env, nodes int, images []Image) (_ *Cluster, err error) {
	if err := Check(); err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	// Short: containerd's sockets live here (108-byte limit).
	dir, err := os.MkdirTemp("", "klt-")
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	c := &Cluster{Env: env, dir: dir, sysctl: map[string]string{}}
	defer func() {
		if err != nil {
			if serr := c.Stop(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()
	for _, k := range kernelTunables() {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			c.sysctl[k] = strings.TrimSpace(string(b))
		}
	}
	for _, p := range systemPaths() {
		if _, err := os.Lstat(p); os.IsNotExist(err) {
			c.absent = append(c.absent, p)
		}
	}
	c.chains = iptablesChains()
	var archives []string
	for i, img := range images {
		a := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		if err := img.WriteArchive(a); err != nil {
			return nil, err
		}
		archives = append(archives, a)
	}
	kc, err := env.Kubeconfig(dir, "kube-scheduler")
	if err != nil {
		return nil, err
	}
	if c.sched, err = startProc(filepath.Join(dir, "kube-scheduler.log"), filepath.Join(assets, "kube-scheduler"),
		"--kubeconfig="+kc, "--leader-elect=false", "--secure-port=0"); err != nil {
		return nil, err
	}
	// The node lifecycle controller removes the not-ready taint the kubelet
	// registers its node with, and marks a node whose kubelet stopped
	// NotReady (k8stest's controller manager runs only the Job controller
	// and the garbage collector).
	kcmKC, err := env.Kubeconfig(dir, "kubelettest-node-lifecycle")
	if err != nil {
		return nil, err
	}
	if c.kcm, err = startProc(filepath.Join(dir, "kube-controller-manager.log"), filepath.Join(assets, "kube-controller-manager"),
		"--kubeconfig="+kcmKC, "--controllers=nodelifecycle", "--leader-elect=false", "--secure-port=0",
		"--node-monitor-grace-period="+NodeMonitorGracePeriod.String(), "--node-monitor-period=1s"); err != nil {
		return nil, err
	}
	for i := 0; i < nodes; i++ {
		n := &Node{Name: fmt.Sprintf("ftl-node-%d", i), dir: filepath.Join(dir, fmt.Sprintf("n%d", i)),
			cgroupRoot: fmt.Sprintf("/%s-n%d", filepath.Base(dir), i)}
		c.Nodes = append(c.Nodes, n)
		if err := n.start(ctx, env, assets, archives); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx, env, 120*time.Second); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (n *Node) sock() string { return filepath.Join(n.dir, "containerd.sock") }

// ImportImage imports an OCI image archive built elsewhere (buildah's
// oci-archive) into every node's containerd. Such an archive names its
// image only by the org.opencontainers.image.ref.name annotation, which
// ctr reads as a tag: the image is named baseName:<that tag>, so give
// the repository part of the image's name ("localhost/ft-launcher").
func (c *Cluster) ImportImage(ctx context.Context, archive, baseName string) error {
	for _, n := range c.Nodes {
		out, err := exec.CommandContext(ctx, "ctr", "--address", n.sock(), "-n", "k8s.io", "images", "import",
			"--base-name", baseName, archive).CombinedOutput()
		if err != nil {
			return fmt.Errorf("kubelettest: ctr images import %s on %s: %v: %s", archive, n.Name, err, out)
		}
	}
	return nil
}

func (n *Node) start(ctx context.Context, env *k8stest.Env, assets string, archives []string) error {
	for _, d := range []string{"containerd/root", "containerd/state", "net.d", "kubelet", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return fmt.Errorf("kubelettest: %w", err)
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	// The CNI configuration only makes containerd report the network as
	// ready; pods use hostNetwork and never call the plugins.
	cni := fmt.Sprintf(`{"cniVersion":"0.4.0","name":"ftl-%s","plugins":[{"type":"bridge","bridge":"ftlbr-%s","isGateway":false,"ipMasq":false,"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.%d.0/24"}]]}},{"type":"loopback"}]}`,
		filepath.Base(n.dir), filepath.Base(n.dir), 100+len(n.Name))
	if err := os.WriteFile(filepath.Join(n.dir, "net.d", "10-ftl.conflist"), []byte(cni), 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	config := fmt.Sprintf(`version = 2
root = %q
state = %q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  enable_selinux = false
  netns_mounts_under_state_dir = true
  # Lowering oom_score_adj (the sandbox asks for -998) is refused here
  # (EACCES in runc init): keep every container at or above containerd's.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = %q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
[plugins."io.containerd.internal.v1.opt"]
  path = %q
`, filepath.Join(n.dir, "containerd/root"), filepath.Join(n.dir, "containerd/state"), n.sock(), n.sock()+".ttrpc",
		PauseImage, filepath.Join(n.dir, "runc"), CNIDir, filepath.Join(n.dir, "net.d"), filepath.Join(n.dir, "containerd/opt"))
	cfgPath := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	var err error
	if n.containerd, err = startProc(filepath.Join(n.dir, "containerd.log"), "containerd", "--config", cfgPath); err != nil {
		return err
	}
	if err := waitFor(ctx, 30*time.Second, n.containerd, func() bool {
		return exec.Command("ctr", "--address", n.sock(), "version").Run() == nil
	}); err != nil {
		return fmt.Errorf("kubelettest: containerd of %s did not answer: %w", n.Name, err)
	}
	for _, a := range archives {
		if out, err := exec.CommandContext(ctx, "ctr", "--address", n.sock(), "-n", "k8s.io", "images", "import", a).CombinedOutput(); err != nil {
			return fmt.Errorf("kubelettest: ctr images import %s: %v: %s", a, err, out)
		}
	}

	kc, err := env.Kubeconfig(n.dir, "system:node:"+n.Name)
	if err != nil {
		return err
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	kcfg, err := json.Marshal(map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
		"address": "127.0.0.1", "port": port, "readOnlyPort": 0,
		"healthzBindAddress": "127.0.0.1", "healthzPort": healthz,
		"authentication": map[string]any{"anonymous": map[string]any{"enabled": true}, "webhook": map[string]any{"enabled": false}},
		"authorization":  map[string]any{"mode": "AlwaysAllow"},
		// Debian 12's kernels here mount cgroup v1; 1.35 is the last
		// kubelet that still runs on it when told to.
		"cgroupDriver": "cgroupfs", "cgroupRoot": n.cgroupRoot, "failCgroupV1": false,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.sock(),
		"podLogsDir":               filepath.Join(n.dir, "pod-logs"),
		"evictionHard": map[string]string{"memory.available": "1Mi", "nodefs.available": "1%",
			"imagefs.available": "1%", "nodefs.inodesFree": "1%"},
		"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
		"serializeImagePulls":       false,
		"nodeStatusUpdateFrequency": "2s",
		// Renewed every quarter of it: 2 s, well within
		// NodeMonitorGracePeriod.
		"nodeLeaseDurationSeconds": 8,
		"syncFrequency":            "5s",
		"maxPods":                  30,
		"resolvConf":               "",
	})
	if err != nil {
		return fmt.Errorf("kubelettest: kubelet config: %w", err)
	}
	kcfgPath := filepath.Join(n.dir, "kubelet.yaml")
	if err := os.WriteFile(kcfgPath, kcfg, 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	n.kubeletCmd = []string{filepath.Join(assets, "kubelet"), "--config=" + kcfgPath, "--kubeconfig=" + kc,
		"--root-dir=" + filepath.Join(n.dir, "kubelet"), "--cert-dir=" + filepath.Join(n.dir, "kubelet", "pki"), "--hostname-override=" + n.Name, "--v=2"}
	return n.StartKubelet()
}

// StartKubelet (re)starts the node's kubelet after StopKubelet.
func (n *Node) StartKubelet() error {
	if n.kubelet != nil && !n.kubelet.done() {
		return fmt.Errorf("kubelettest: kubelet of %s is running", n.Name)
	}
	p, err := startProc(filepath.Join(n.dir, "kubelet.log"), n.kubeletCmd[0], n.kubeletCmd[1:]...)
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// StopKubelet kills the node's kubelet, as a dead node: its containers
// keep running, and the node turns NotReady once its lease runs out.
func (n *Node) StopKubelet() {
	if n.kubelet != nil {
		n.kubelet.kill(0)
	}
}

// PowerOff stops the node as a power loss would: its kubelet and every
// process of its containers are killed at once (StopKubelet alone leaves
// the containers running). containerd and the shims stay, for Stop to
// clean up; StartKubelet brings the node back.
func (n *Node) PowerOff() {
	n.StopKubelet()
	for i := 0; i < 50; i++ {
		pids := n.cgroupPids()
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// WaitReady waits until the node is Ready in the API and carries no
// NoSchedule taint.
func (n *Node) WaitReady(ctx context.Context, env *k8stest.Env, timeout time.Duration) error {
	err := waitFor(ctx, timeout, n.kubelet, func() bool {
		node, err := env.Clientset.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		for _, t := range node.Spec.Taints {
			if t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute {
				return false
			}
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
				return true
			}
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("kubelettest: node %s not Ready: %w\nkubelet log:\n%s\ncontainerd log:\n%s", n.Name, err, tailFile(n.kubelet.log, 6000), tailFile(n.containerd.log, 2000))
	}
	return nil
}

// Logs returns the end of the node's kubelet and containerd logs.
func (n *Node) Logs() string {
	var b strings.Builder
	if n.kubelet != nil {
		fmt.Fprintf(&b, "kubelet log of %s:\n%s\n", n.Name, tailFile(n.kubelet.log, 6000))
	}
	if n.containerd != nil {
		fmt.Fprintf(&b, "containerd log of %s:\n%s\n", n.Name, tailFile(n.containerd.log, 3000))
	}
	return b.String()
}

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

// Stop stops everything Start started, in the order that leaves nothing
// behind: kubelets, then the containers (by their cgroups), containerd and
// its shims, then the mounts, cgroups and files. It reports what it could
// not clean.
func (c *Cluster) Stop() error {
	var errs []error
	for _, p := range []*proc{c.sched, c.kcm} {
		if p != nil {
			p.kill(5 * time.Second)
		}
	}
	for _, n := range c.Nodes {
		if err := n.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if c.chains != nil {
		if err := removeChains(c.chains); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range c.absent {
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, fmt.Errorf("kubelettest: %w", err))
		}
	}
	for k, v := range c.sysctl {
		if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("kubelettest: restore %s=%s: %w", k, v, err))
		}
	}
	if err := unmountUnder(c.dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("kubelettest: %w", err))
	}
	return errors.Join(errs...)
}

func (n *Node) stop() error {
	var errs []error
	if n.kubelet != nil {
		n.kubelet.kill(10 * time.Second)
	}
	// The containers: every process in the node's cgroups.
	for i := 0; i < 50; i++ {
		pids := n.cgroupPids()
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if n.containerd != nil {
		n.containerd.kill(10 * time.Second)
	}
	// The shims outlive containerd by design; they name its socket.
	for i := 0; i < 50; i++ {
		pids := pidsNaming(n.dir)
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := unmountUnder(n.dir); err != nil {
		errs = append(errs, err)
	}
	if pids := n.cgroupPids(); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("kubelettest: processes %v still in the cgroups of %s", pids, n.Name))
	}
	if pids := pidsNaming(n.dir); len(pids) > 0 {
		errs = append(errs, fmt.Errorf("kubelettest: processes %v of %s still running", pids, n.Name))
	}
	for _, c := range controllers() {
		if err := removeCgroupTree(filepath.Join(c, n.cgroupRoot)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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

// pidsNaming lists the processes whose command line names something under
// dir (containerd's shims: -address <dir>/containerd.sock).
func pidsNaming(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(b, []byte(dir+"/")) {
			pids = append(pids, pid)
		}
	}
	return pids
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

func startProc(logPath, bin string, args ...string) (*proc, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Dies with the test binary, even a killed one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("kubelettest: start %s: %w", filepath.Base(bin), err)
	}
	p := &proc{cmd: cmd, log: logPath, exited: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// kill sends SIGTERM and, after grace (at once when 0), SIGKILL to the
// process group, and waits for the process.
func (p *proc) kill(grace time.Duration) {
	if p.done() {
		return
	}
	pgid := p.cmd.Process.Pid
	if grace > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(grace):
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-p.exited
}

// waitFor polls cond until it holds, p exits, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, p *proc, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return nil
		}
		if p != nil && p.done() {
			return fmt.Errorf("%s exited: %v", filepath.Base(p.cmd.Path), p.err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("kubelettest: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
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
