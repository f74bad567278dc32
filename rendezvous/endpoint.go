package rendezvous

import (
	"context"
	"net"
	"os"
	"strings"
	"time"
)

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
