package k8s

import (
	"net"
	"strings"
)

// PodDNS is this pod's DNS name under a headless Service, as the kubelet
// writes it into the pod's /etc/hosts when the pod has a subdomain:
//
//	10.244.1.5	train-3.train.default.svc.cluster.local	train-3
//
// The line exists from the pod's start (cluster DNS learns the name only
// once the pod is ready), so the pod knows its own name and address at once.
type PodDNS struct {
	IPs           []string // the pod's addresses on those lines, IPv4 first
	FQDN          string   // <hostname>.<subdomain>.<namespace>.svc.<cluster domain>
	Subdomain     string   // the headless Service's name
	Namespace     string
	ClusterDomain string // cluster.local by default
}

// Name is the FQDN of the pod with host name host under the same
// subdomain.
func (d PodDNS) Name(host string) string {
	if d.FQDN == "" {
		return ""
	}
	return host + "." + d.Subdomain + "." + d.Namespace + ".svc." + d.ClusterDomain
}

// ParseHosts finds the pod's entry for hostname (its first label counts)
// in the content of /etc/hosts: a line that lists the host name and a name
// "<hostname>.<subdomain>.<namespace>.svc.<domain>". ok is false when
// there is none: the pod has no subdomain, or the file is not the
// kubelet's (hostNetwork pods see the node's).
func ParseHosts(content []byte, hostname string) (d PodDNS, ok bool) {
	host := shortName(strings.ToLower(strings.TrimSpace(hostname)))
	if host == "" {
		return PodDNS{}, false
	}
	var v4, v6 []string
	for _, line := range strings.Split(string(content), "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(strings.ToLower(line))
		if len(f) < 2 {
			continue
		}
		ip := net.ParseIP(f[0])
		if ip == nil {
			continue
		}
		for _, name := range f[1:] {
			labels := strings.Split(strings.TrimSuffix(name, "."), ".")
			if len(labels) < 5 || labels[0] != host || labels[3] != "svc" {
				continue
			}
			fqdn := strings.Join(labels, ".")
			if d.FQDN != "" && d.FQDN != fqdn {
				continue // another subdomain's line: the first one wins
			}
			d = PodDNS{FQDN: fqdn, Subdomain: labels[1], Namespace: labels[2], ClusterDomain: strings.Join(labels[4:], ".")}
			if ip.To4() != nil {
				v4 = append(v4, ip.String())
			} else {
				v6 = append(v6, ip.String())
			}
			break
		}
	}
	if d.FQDN == "" {
		return PodDNS{}, false
	}
	d.IPs = append(v4, v6...)
	return d, true
}
