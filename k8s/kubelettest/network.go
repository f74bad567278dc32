package kubelettest

// The pod network and the cluster services a real cluster gives its pods,
// for a test that runs pods as a user's cluster would (Options): each
// node's pods on a bridge of their own, routed by the host to the other
// node's; Services through a real kube-proxy (iptables mode, one for the
// host, which all the nodes share); and cluster DNS from a real CoreDNS
// (its kubernetes plugin), both built from the Go module proxy by
// scripts/k8s-assets.sh. Both run as host processes, as a kubeadm
// cluster's add-ons would run in host-network pods.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s/k8stest"
)

// Options are what Start gives the nodes beyond running containers.
type Options struct {
	// PodNetwork gives pods without hostNetwork a network: node i's pods
	// get addresses in PodCIDR's 10.244.(10+i).0/24 on a bridge of their
	// own, with the bridge as their gateway; the host forwards between
	// the bridges (net.ipv4.ip_forward, restored by Stop).
	PodNetwork bool
	// ServiceAddress, with PodNetwork, runs kube-proxy (Services' cluster
	// IPs) and CoreDNS listening on this address, port 53, as the pods'
	// cluster DNS (cluster domain cluster.local). The address must be
	// assigned to a host interface (AddHostAddress) before the control
	// plane starts on it.
	ServiceAddress string
}

// PodCIDR holds every node's pod subnet.
const PodCIDR = "10.244.0.0/16"

// ClusterDomain is the pods' DNS domain with Options.ServiceAddress.
const ClusterDomain = "cluster.local"

// checkServices reports kube-proxy or coredns missing from assets.
func checkServices(assets string) error {
	var missing []string
	for _, b := range []string{"kube-proxy", "coredns"} {
		if st, err := os.Stat(filepath.Join(assets, b)); err != nil || st.Mode()&0o111 == 0 {
			missing = append(missing, b+" in KUBEBUILDER_ASSETS="+assets)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s", ErrNoKubelet, strings.Join(missing, ", "))
	}
	return nil
}

// cniConfig is node i's CNI configuration. Without a pod network the
// plugins are never called (every pod uses the host network); the
// configuration only makes containerd report the network ready.
func (n *Node) cniConfig(i int, podNetwork bool) string {
	gw := "false"
	if podNetwork {
		gw = "true"
	}
	return fmt.Sprintf(`{"cniVersion":"0.4.0","name":"ftl-%[1]s","plugins":[{"type":"bridge","bridge":%[2]q,"isGateway":%[3]s,"isDefaultGateway":%[3]s,"ipMasq":false,"hairpinMode":true,"ipam":{"type":"host-local","dataDir":%[4]q,"ranges":[[{"subnet":"10.244.%[5]d.0/24"}]]}},{"type":"loopback"}]}`,
		filepath.Base(n.dir), n.bridge(), gw, filepath.Join(n.dir, "cni-ipam"), 10+i)
}

// bridge is the name of the node's pod bridge (15 bytes at most).
func (n *Node) bridge() string { return "ftlbr-" + filepath.Base(n.dir) }

// removeBridge deletes the node's pod bridge, if the bridge plugin made
// one.
func (n *Node) removeBridge() error {
	if _, err := net.InterfaceByName(n.bridge()); err != nil {
		return nil
	}
	if out, err := exec.Command("ip", "link", "del", n.bridge()).CombinedOutput(); err != nil {
		return fmt.Errorf("kubelettest: ip link del %s: %v: %s", n.bridge(), err, out)
	}
	return nil
}

// AddHostAddress puts addr (a /32) on the host's loopback interface,
// labelled label (lo:NAME, at most 15 bytes), and returns the function
// that removes it. The host answers on it from the pods, through their
// gateway, and from nowhere outside the machine. (Loopback rather than a
// dummy interface: the kernels here lack the dummy module.)
func AddHostAddress(label, addr string) (remove func() error, err error) {
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	addrs, err := lo.Addrs()
	if err != nil {
		return nil, fmt.Errorf("kubelettest: %w", err)
	}
	remove = func() error {
		if out, err := exec.Command("ip", "addr", "del", addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
			return fmt.Errorf("kubelettest: ip addr del %s/32 dev lo: %v: %s", addr, err, out)
		}
		return nil
	}
	for _, a := range addrs {
		if ip, _, _ := net.ParseCIDR(a.String()); ip != nil && ip.String() == addr {
			// Ours, left by a test binary that was killed, or someone
			// else's: take it back only when it carries our label.
			out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "lo", "label", label).Output()
			if !strings.Contains(string(out), " "+addr+"/32 ") {
				return nil, fmt.Errorf("kubelettest: %s is already on lo without the label %s: not ours to use", addr, label)
			}
			if err := remove(); err != nil {
				return nil, err
			}
		}
	}
	if out, err := exec.Command("ip", "addr", "add", addr+"/32", "dev", "lo", "label", label).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("kubelettest: ip addr add %s/32 dev lo: %v: %s", addr, err, out)
	}
	return remove, nil
}

// startServices starts kube-proxy and CoreDNS for the cluster.
func (c *Cluster) startServices(ctx context.Context, env *k8stest.Env, assets, addr string) error {
	kc, err := env.Kubeconfig(c.dir, "kubelettest-services")
	if err != nil {
		return err
	}
	healthz, err := freePort()
	if err != nil {
		return err
	}
	metrics, err := freePort()
	if err != nil {
		return err
	}
	// Conntrack settings 0: leave the host's sysctls alone; no NodePorts
	// on 127.0.0.1, which would set route_localnet.
	cfg := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection:
  kubeconfig: %q
hostnameOverride: %s
clusterCIDR: %s
healthzBindAddress: 127.0.0.1:%d
metricsBindAddress: 127.0.0.1:%d
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
`, kc, c.Nodes[0].Name, PodCIDR, healthz, metrics)
	cfgPath := filepath.Join(c.dir, "kube-proxy.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	c.proxyBin = filepath.Join(assets, "kube-proxy")
	if c.proxy, err = startProc(filepath.Join(c.dir, "kube-proxy.log"), c.proxyBin, "--config="+cfgPath, "--v=2"); err != nil {
		return err
	}
	if err := waitFor(ctx, 60*time.Second, c.proxy, func() bool {
		b, _ := os.ReadFile(c.proxy.log)
		return strings.Contains(string(b), "SyncProxyRules complete")
	}); err != nil {
		return fmt.Errorf("kubelettest: kube-proxy did not sync its rules: %w\n%s", err, tailFile(c.proxy.log, 4000))
	}
	corefile := fmt.Sprintf(`%s:53 {
    bind %s
    errors
    kubernetes %s {
        kubeconfig %s
    }
}
`, ClusterDomain, addr, ClusterDomain, kc)
	cf := filepath.Join(c.dir, "Corefile")
	if err := os.WriteFile(cf, []byte(corefile), 0o644); err != nil {
		return fmt.Errorf("kubelettest: %w", err)
	}
	if c.dns, err = startProc(filepath.Join(c.dir, "coredns.log"), filepath.Join(assets, "coredns"), "-conf", cf); err != nil {
		return err
	}
	// Serving once the kubernetes Service's name resolves.
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "udp", net.JoinHostPort(addr, "53"))
	}}
	if err := waitFor(ctx, 60*time.Second, c.dns, func() bool {
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := r.LookupHost(qctx, "kubernetes.default.svc."+ClusterDomain)
		return err == nil
	}); err != nil {
		return fmt.Errorf("kubelettest: CoreDNS does not answer on %s: %w\n%s", addr, err, tailFile(c.dns.log, 4000))
	}
	return nil
}

// ServiceLogs returns the end of kube-proxy's and CoreDNS's logs.
func (c *Cluster) ServiceLogs() string {
	var b strings.Builder
	for _, p := range []struct {
		name string
		p    *proc
	}{{"kube-proxy", c.proxy}, {"CoreDNS", c.dns}} {
		if p.p != nil {
			fmt.Fprintf(&b, "%s log:\n%s\n", p.name, tailFile(p.p.log, 3000))
		}
	}
	return b.String()
}

// stopServices stops CoreDNS and kube-proxy and removes kube-proxy's
// rules (kube-proxy --cleanup).
func (c *Cluster) stopServices() error {
	for _, p := range []*proc{c.dns, c.proxy} {
		if p != nil {
			p.kill(5 * time.Second)
		}
	}
	if c.proxy == nil {
		return nil
	}
	if out, err := exec.Command(c.proxyBin, "--cleanup").CombinedOutput(); err != nil {
		return fmt.Errorf("kubelettest: kube-proxy --cleanup: %v: %s", err, out)
	}
	return nil
}
