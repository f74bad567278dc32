package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"
)

// Resolver turns host names into IP addresses for everything that takes an
// address (rendezvous endpoints, --local-addr, --master-addr): the embedded
// etcd listens only on an IP, gossip advertises only an IP, and ranks of
// other nodes must reach MASTER_ADDR. DNS (and /etc/hosts) first; a name
// DNS does not know goes to NodeAddr, the scheduler's node table (under
// Slurm, `scontrol show node`: node names need not be in DNS).
type Resolver struct {
	NodeAddr func(ctx context.Context, name string) (string, error) // nil: DNS only
	Timeout  time.Duration                                          // per lookup; 0 means 5 s
}

// Resolve returns host's addresses, IPv4 first (host itself when it is an
// IP). The error names every source that was asked.
func (r Resolver) Resolve(host string) ([]string, error) {
	host = strings.Trim(host, "[]")
	if ip := net.ParseIP(host); ip != nil {
		return []string{ip.String()}, nil
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ips, dnsErr := lookup(ctx, host)
	if dnsErr == nil {
		return ips, nil
	}
	if r.NodeAddr == nil {
		return nil, fmt.Errorf("%s does not resolve: %w", host, dnsErr)
	}
	addr, err := r.NodeAddr(ctx, host)
	if err == nil {
		if ip := net.ParseIP(addr); ip != nil {
			return []string{ip.String()}, nil
		}
		if ips, err = lookup(ctx, addr); err == nil {
			return ips, nil
		}
		err = fmt.Errorf("its NodeAddr %s: %w", addr, err)
	}
	return nil, fmt.Errorf("%s does not resolve: DNS: %v; scheduler: %w", host, dnsErr, err)
}

// lookup asks DNS (and /etc/hosts) for host's addresses, IPv4 first.
func lookup(ctx context.Context, host string) ([]string, error) {
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err == nil && len(addrs) == 0 {
		err = errors.New("no address")
	}
	if err != nil {
		return nil, err
	}
	var v4, v6 []string
	for _, a := range addrs {
		if a.IP.To4() != nil {
			v4 = append(v4, a.IP.String())
		} else {
			v6 = append(v6, a.IP.String())
		}
	}
	return append(v4, v6...), nil
}

// LocalIPs lists the addresses of this machine's interfaces.
func LocalIPs() []string {
	addrs, _ := net.InterfaceAddrs()
	var out []string
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			out = append(out, n.IP.String())
		}
	}
	return out
}

// RouteTo returns the address this machine would send from to reach ip:
// a UDP "connect" picks the route and sends nothing. "" when there is none.
func RouteTo(ip string) string {
	c, err := net.Dial("udp", net.JoinHostPort(ip, "9"))
	if err != nil {
		return ""
	}
	defer c.Close()
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok && !a.IP.IsUnspecified() {
		return a.IP.String()
	}
	return ""
}

// IsLocalEndpoint reports whether this launcher should host the etcd server
// named by endpoint ("host:port" or a URL). The rule:
//   - when localAddr is set, the endpoint is local only if its host equals
//     localAddr (after resolving a hostname endpoint to IPs); this lets
//     several launchers on one machine, bound to 127.0.0.2, 127.0.0.3, ...,
//     agree that exactly one of them hosts;
//   - otherwise it is local when its host is "localhost", a loopback IP,
//     this machine's hostname, or an address of one of its interfaces.
func IsLocalEndpoint(endpoint string, localAddr string) bool {
	host := endpointHost(endpoint)
	if host == "" {
		return false
	}
	ips := hostIPs(host)
	if localAddr != "" {
		if host == localAddr {
			return true
		}
		for _, ip := range ips {
			if ip.String() == localAddr {
				return true
			}
		}
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if hn, err := os.Hostname(); err == nil && strings.EqualFold(hn, host) {
		return true
	}
	ifAddrs, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range ifAddrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

func endpointHost(endpoint string) string {
	s := endpoint
	if i := strings.Index(s, "://"); i >= 0 {
		s = s[i+3:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		s = s[:i]
	}
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return strings.Trim(s, "[]")
}

func hostIPs(host string) []net.IP {
	if ip := net.ParseIP(host); ip != nil {
		return []net.IP{ip}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return nil
	}
	out := make([]net.IP, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.IP)
	}
	return out
}
