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
// By default pods run with hostNetwork: the CNI configuration given to
// containerd (Debian's bridge plugin) only makes the node report its
// network ready; no pod network or network namespace is created. With
// Options (StartWith) pods get a pod network, Services and cluster DNS
// (network.go).
package kubelettest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

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

	dir   string
	sched *proc
	kcm   *proc
	opts  Options
	// proxy and dns are kube-proxy and CoreDNS (Options.ServiceAddress).
	proxy, dns *proc
	proxyBin   string
	sysctl     map[string]string
	// absent are the system paths the kubelet and containerd create even
	// when told to use other folders, that did not exist before Start.
	absent []string
	// chains are the iptables chains that existed before Start, per
	// command and table.
	chains map[string]bool
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

// Start starts kube-scheduler and nodes kubelets named ftl-node-0, ...,
// each with its own containerd into which the images are imported (one of
// them must be named PauseImage). It waits until every node is Ready.
func Start(ctx context.Context, env *k8stest.Env, nodes int, images []Image) (*Cluster, error) {
	return StartWith(ctx, env, nodes, images, Options{})
}

// StartWith is Start with opts.
func StartWith(ctx context.Context, env *k8stest.Env, nodes int, images []Image, opts Options) (_ *Cluster, err error) {
	if err := Check(); err != nil {
		return nil, err
	}
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if opts.ServiceAddress != "" {
		if !opts.PodNetwork {
			return nil, errors.New("kubelettest: Options.ServiceAddress needs PodNetwork")
		}
		if err := checkServices(assets); err != nil {
			return nil, err
		}
	}
	// Short: containerd's sockets live here (108-byte limit).
	dir, err := os.MkdirTemp("", "klt-")
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	c := &Cluster{Env: env, dir: dir, sysctl: map[string]string{}, opts: opts}
	defer func() {
		if err != nil {
			if serr := c.Stop(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()
	tunables := kernelTunables()
	if opts.PodNetwork {
		tunables = append(tunables, ipForward)
	}
	for _, k := range tunables {
		if b, err := os.ReadFile("/proc/sys/" + k); err == nil {
			c.sysctl[k] = strings.TrimSpace(string(b))
		}
	}
	if opts.PodNetwork {
		// The host routes between the nodes' bridges.
		if err := os.WriteFile("/proc/sys/"+ipForward, []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("kubelettest: %s=1: %w", ipForward, err)
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
		if err := n.start(ctx, env, assets, archives, i, opts); err != nil {
			return nil, err
		}
	}
	for _, n := range c.Nodes {
		if err := n.WaitReady(ctx, env, 120*time.Second); err != nil {
			return nil, err
		}
	}
	if opts.ServiceAddress != "" {
		if err := c.startServices(ctx, env, assets, opts.ServiceAddress); err != nil {
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

func (n *Node) start(ctx context.Context, env *k8stest.Env, assets string, archives []string, i int, opts Options) error {
	for _, d := range []string{"containerd/root", "containerd/state", "net.d", "kubelet", "pod-logs"} {
		if err := os.MkdirAll(filepath.Join(n.dir, d), 0o755); err != nil {
			return fmt.Errorf("kubelettest: %w", err)
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return err
	}
	cni := n.cniConfig(i, opts.PodNetwork)
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
	kubeletCfg := map[string]any{
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
	}
	if opts.ServiceAddress != "" {
		kubeletCfg["clusterDNS"] = []string{opts.ServiceAddress}
		kubeletCfg["clusterDomain"] = ClusterDomain
	}
	kcfg, err := json.Marshal(kubeletCfg)
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
	if err := c.stopServices(); err != nil {
		errs = append(errs, err)
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
	if err := n.removeBridge(); err != nil {
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
