package configs

import (
	"fmt"
	"net"
	"slices"
	"strings"
)

// Network is what parsing asks about this node and about host names.
// Production fills it from package rendezvous (DNS, then Slurm's node table
// for names DNS does not know); tests use fakes, so that parsing needs no
// DNS. A nil field knows nothing: names stay as given and no address is
// this machine's.
type Network struct {
	Resolve  func(host string) ([]string, error) // host's addresses, IPv4 first; an IP is its own
	LocalIPs func() []string                     // addresses of this machine's interfaces
	RouteTo  func(ip string) string              // the address this machine sends from to reach ip ("" none)
	Hostname func() string
	// EtcHosts reads /etc/hosts, where the kubelet names a pod with a
	// subdomain (read only in a pod; tests hand in a file of their own).
	EtcHosts func() ([]byte, error)
}

// resolve returns host's addresses; nil (no error) when no resolver is set.
func (n Network) resolve(host string) ([]string, error) {
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil {
		return []string{ip.String()}, nil
	}
	if n.Resolve == nil {
		return nil, nil
	}
	return n.Resolve(host)
}

func (n Network) hostname() string {
	if n.Hostname == nil {
		return ""
	}
	return n.Hostname()
}

// etcHosts returns /etc/hosts; nil (no error) when no reader is set.
func (n Network) etcHosts() ([]byte, error) {
	if n.EtcHosts == nil {
		return nil, nil
	}
	return n.EtcHosts()
}

// localNode is this node as the hosting decision sees it.
type localNode struct {
	addr   string   // the local address, resolved
	from   string   // where addr came from, for messages
	given  string   // --local-addr as given; "" when addr is a default
	names  []string // default only: "host name X", "Slurm node name Y" as kind, name pairs
	kinds  []string
	shared bool     // addr is the scheduler's for this node: other nodes may share this machine
	ifaces []string // addresses of this machine's interfaces
}

// resolveLocalAddr settles --local-addr for a multi-node rendezvous: a
// given name is resolved; when none is given, this node's routable address:
// under Slurm its node name (SLURMD_NODENAME) resolved, in a pod with a
// subdomain the pod's address in /etc/hosts, else the address this machine
// sends from towards the first endpoint, else its host name resolved. cfg.LocalAddr becomes that address (gossip and etcd bind only
// on an IP, and ranks elsewhere must reach MASTER_ADDR).
func (p *parser) resolveLocalAddr(nw Network, firstHost string) (localNode, error) {
	c := p.cfg
	ln := localNode{}
	if nw.LocalIPs != nil {
		ln.ifaces = nw.LocalIPs()
	}
	if c.LocalAddr != "" {
		subj := p.source["local-addr"]
		ips, err := nw.resolve(c.LocalAddr)
		if err != nil {
			return ln, usageErr(subj, "%s %q: %v: give an address of this node or a name that resolves to one", subj, c.LocalAddr, err)
		}
		ln.given, ln.addr, ln.from = c.LocalAddr, c.LocalAddr, subj
		if len(ips) > 0 && ips[0] != c.LocalAddr {
			ln.addr = ips[0]
			p.source["local-addr"] = fmt.Sprintf("%s %s, resolved", subj, c.LocalAddr)
		}
		c.LocalAddr = ln.addr
		return ln, nil
	}
	if h := nw.hostname(); h != "" {
		ln.names, ln.kinds = append(ln.names, h), append(ln.kinds, "host name")
	}
	if name := c.Slurm.NodeName; name != "" {
		ln.names, ln.kinds = append(ln.names, name), append(ln.kinds, "Slurm node name")
		if ips, err := nw.resolve(name); err != nil {
			p.warn("SLURMD_NODENAME %s: %v; choosing this node's address another way", name, err)
		} else if len(ips) > 0 {
			ln.addr, ln.from, ln.shared = ips[0], "SLURMD_NODENAME "+name, true
		}
	}
	if pod := c.K8s.DNS; pod.FQDN != "" {
		// The kubelet's line for this pod: known from its start, unlike
		// cluster DNS, which learns the name once the pod is ready.
		ln.names, ln.kinds = append(ln.names, pod.FQDN), append(ln.kinds, "pod FQDN")
		if ln.addr == "" && len(pod.IPs) > 0 {
			ln.addr, ln.from = pod.IPs[0], "/etc/hosts "+pod.FQDN
		}
	}
	if ln.addr == "" && nw.RouteTo != nil && firstHost != "" {
		if ips, _ := nw.resolve(firstHost); len(ips) > 0 {
			if a := nw.RouteTo(ips[0]); a != "" {
				ln.addr, ln.from = a, "the route to "+ips[0]
			}
		}
	}
	if ln.addr == "" && nw.hostname() != "" {
		if ips, _ := nw.resolve(nw.hostname()); len(ips) > 0 {
			ln.addr, ln.from = ips[0], "host name "+nw.hostname()
		}
	}
	if ln.addr == "" {
		if nw.Resolve != nil {
			return ln, usageErr("--local-addr", "--local-addr is not given and no address of this node was found (no route to %s, host name %q does not resolve): give --local-addr ADDR", firstHost, nw.hostname())
		}
		return ln, nil // no network to ask (tests): the rendezvous picks its default
	}
	c.LocalAddr = ln.addr
	p.source["local-addr"] = ln.from
	return ln, nil
}

// resolveEndpoints resolves the embedded etcd's endpoints to IP:port: the
// etcd listens only on an IP, and its clients and peers need names that
// DNS may not know (Slurm node names) as addresses. The pod's own FQDN is
// its address in /etc/hosts. An endpoint taken from the pod's Kubernetes
// environment that does not resolve yet stays a name, with a warning: the
// index-0 pod may not be scheduled yet (cluster DNS names a pod once it is
// ready), and the rendezvous resolves the name when it connects.
func (p *parser) resolveEndpoints(nw Network, eps []string, subj, given string) ([]string, error) {
	out := make([]string, len(eps))
	for i, ep := range eps {
		h, port, _ := net.SplitHostPort(ep)
		pod := p.cfg.K8s.DNS
		var ips []string
		var err error
		if pod.FQDN != "" && strings.EqualFold(h, pod.FQDN) {
			ips = pod.IPs
		} else {
			ips, err = nw.resolve(h)
		}
		if err != nil && p.podEndpoint != "" {
			p.warn("%s: %s does not resolve yet (%v); the rendezvous resolves it when it connects, for up to connect_timeout", subj, h, err)
			ips, err = nil, nil
		}
		if err != nil {
			return nil, usageErr(subj, "%s %q: endpoint %s: %v", subj, given, ep, err)
		}
		out[i] = ep
		if len(ips) > 0 {
			out[i] = net.JoinHostPort(ips[0], port)
		}
	}
	return out, nil
}

// shown renders an endpoint as given, with its address when it was a name.
func shown(given, resolved string) string {
	if given == resolved {
		return given
	}
	h, _, _ := net.SplitHostPort(resolved)
	return given + " (" + h + ")"
}

// matches reports whether this node hosts the endpoint given as given and
// resolved to resolved, and why. With --local-addr only that address (or
// name) counts, so that launchers sharing a machine agree on one host.
// Without it: this node's host name or Slurm node name, its address, or an
// address of one of its interfaces; loopback addresses too, unless the
// node's address came from Slurm (several nodes may share this machine).
func (ln localNode) matches(given, resolved string) (bool, string) {
	gh, _, _ := net.SplitHostPort(given)
	ip, _, _ := net.SplitHostPort(resolved)
	ep := shown(given, resolved)
	if ln.given != "" {
		if gh == ln.given || ip == ln.addr {
			return true, fmt.Sprintf("--local-addr %s matches endpoint %s", ln.given, ep)
		}
		return false, ""
	}
	for i, n := range ln.names {
		if strings.EqualFold(gh, n) {
			return true, fmt.Sprintf("endpoint %s is this node (%s %s)", ep, ln.kinds[i], n)
		}
	}
	if ln.shared && ip == ln.addr {
		return true, fmt.Sprintf("endpoint %s is this node's address (%s)", ep, ln.from)
	}
	parsed := net.ParseIP(ip)
	if strings.EqualFold(gh, "localhost") || slices.Contains(ln.ifaces, ip) || ip == ln.addr ||
		(!ln.shared && parsed != nil && parsed.IsLoopback()) {
		return true, fmt.Sprintf("endpoint %s is an address of this machine", ep)
	}
	return false, ""
}

// mismatch says why no endpoint is this node's, naming what was compared.
func (ln localNode) mismatch(given, resolved []string) string {
	eps := make([]string, len(given))
	for i := range given {
		eps[i] = shown(given[i], resolved[i])
	}
	list := strings.Join(eps, ",")
	if ln.given != "" {
		if len(eps) == 1 {
			return fmt.Sprintf("--local-addr %s does not match endpoint %s", ln.given, list)
		}
		return fmt.Sprintf("--local-addr %s matches none of the endpoints %s", ln.given, list)
	}
	head := fmt.Sprintf("none of the endpoints %s is an address of this machine", list)
	if len(eps) == 1 {
		head = fmt.Sprintf("endpoint %s is not an address of this machine", list)
	}
	var self []string
	if ln.addr != "" {
		self = append(self, fmt.Sprintf("address %s (%s)", ln.addr, ln.from))
	}
	for i, n := range ln.names {
		self = append(self, ln.kinds[i]+" "+n)
	}
	if len(ln.ifaces) > 0 {
		self = append(self, "interfaces "+strings.Join(ln.ifaces, ","))
	}
	if len(self) == 0 {
		return head
	}
	return head + ": this node has " + strings.Join(self, ", ")
}

// resolveMasterAddr resolves a --master-addr host name where it is the
// address ranks meet at (the static backend on one node): Slurm node
// names need not be in DNS, which is all torch asks. A multi-node static
// job meets at the endpoint built from it, resolved with the others.
func (p *parser) resolveMasterAddr() {
	c := p.cfg
	if c.Rdzv.Mode != RdzvSingleNode || c.RdzvBackend != "static" || c.Standalone || p.source["master-addr"] == "" {
		return
	}
	ips, err := p.net.resolve(c.MasterAddr)
	switch {
	case err != nil:
		p.warn("%s %s: %v; passed to the ranks as given", p.source["master-addr"], c.MasterAddr, err)
	case len(ips) > 0 && ips[0] != c.MasterAddr:
		p.source["master-addr"] = fmt.Sprintf("%s %s, resolved", p.source["master-addr"], c.MasterAddr)
		c.MasterAddr = ips[0]
	}
}
