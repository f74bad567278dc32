package configs

import (
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s"
)

// RdzvMode says how this launcher meets the others.
type RdzvMode string

// Rendezvous modes.
const (
	// RdzvSingleNode: one node, no rendezvous server (--standalone, or one
	// node without an endpoint, or one node with the static backend).
	RdzvSingleNode RdzvMode = "single-node"
	// RdzvEmbedded: the etcd rendezvous on an etcd that one of the launchers
	// starts (--rdzv-backend c10d or static, what existing scripts pass).
	RdzvEmbedded RdzvMode = "embedded"
	// RdzvExternal: the etcd rendezvous on the user's etcd cluster
	// (--rdzv-backend etcd or etcd-v2).
	RdzvExternal RdzvMode = "external"
)

// Default rendezvous ports when an endpoint has none.
const (
	defaultEmbeddedPort = 29400 // torchrun's c10d port
	defaultEtcdPort     = 2379  // etcd's client port
)

// Bounds of the --rdzv-conf timings: below a millisecond a timer is
// meaningless, and a week is longer than any wait a job should make.
const (
	minRdzvTiming = time.Millisecond
	maxRdzvTiming = 7 * 24 * time.Hour
)

// Rendezvous is the interpreted, validated rendezvous part of the launch
// line: --rdzv-backend, --rdzv-endpoint and --rdzv-conf together, with every
// default filled in. The timings apply to the etcd rendezvous only.
type Rendezvous struct {
	Mode RdzvMode
	// Endpoints are host:port with the default port added; nil in
	// single-node mode. The embedded etcd's are resolved to IP:port
	// (Given keeps them as given when that changed them); an external
	// etcd's stay as given (its TLS certificate names them).
	Endpoints []string
	Given     []string
	TLS       bool // https: --rdzv-ca-cert or --rdzv-cert was given

	// HostsEtcd says this launcher starts the embedded etcd (embedded mode
	// only); HostsEtcdBy says what decided it. EtcdMember is the index in
	// Endpoints of the member this launcher hosts (-1: none). With several
	// endpoints the embedded etcd is a Raft cluster of that many members,
	// member i served at Endpoints[i] (clients) and its port + 1 (peers),
	// hosted by the launcher whose address matches Endpoints[i].
	HostsEtcd   bool
	HostsEtcdBy string
	EtcdMember  int

	JoinTimeout     time.Duration // an open round must close within this
	LastCallTimeout time.Duration // straggler wait once MIN nodes are present and MAX > MIN
	ConnectTimeout  time.Duration // etcd unreachable at start: give up after this
	LeaseTTL        time.Duration // membership lease, backstop for node loss
	FenceMargin     time.Duration // an active node stops its ranks this long before its lease can expire (0: lease_ttl/5)
	EtcdLossBound   time.Duration // etcd unreachable mid-run longer than this ends the job
	RejoinWait      time.Duration // a restart round waits this long for the previous round's nodes
	MinNodesWait    time.Duration // in a fixed allocation (Slurm, MIN == MAX), a restart round short of MIN nodes ends the job after this
	Gossip          Gossip        // the node-loss detector's timings (gossip_* keys)
	Relay           Relay         // the two-level join (relay_* keys); Group 0: off
}

// ClientURLs are the endpoints as etcd client URLs.
func (r Rendezvous) ClientURLs() []string {
	scheme := "http://"
	if r.TLS {
		scheme = "https://"
	}
	out := make([]string, len(r.Endpoints))
	for i, e := range r.Endpoints {
		out[i] = scheme + e
	}
	return out
}

// rdzvTiming is one --rdzv-conf timing key and where its value goes.
type rdzvTiming struct {
	key string
	dst func(*Rendezvous) *time.Duration
	def time.Duration // 0: computed (rejoin_wait)
}

// rdzvTimings lists the timing keys ft-launcher reads. join_timeout and
// last_call_timeout are torchrun's and nvrx's keys; the others are ours.
func rdzvTimings() []rdzvTiming {
	return []rdzvTiming{
		{"join_timeout", func(r *Rendezvous) *time.Duration { return &r.JoinTimeout }, 10 * time.Minute},
		{"last_call_timeout", func(r *Rendezvous) *time.Duration { return &r.LastCallTimeout }, 500 * time.Millisecond},
		{"connect_timeout", func(r *Rendezvous) *time.Duration { return &r.ConnectTimeout }, 20 * time.Second},
		{"lease_ttl", func(r *Rendezvous) *time.Duration { return &r.LeaseTTL }, 6 * time.Second},
		{"fence_margin", func(r *Rendezvous) *time.Duration { return &r.FenceMargin }, 0},
		{"etcd_loss_bound", func(r *Rendezvous) *time.Duration { return &r.EtcdLossBound }, 60 * time.Second},
		{"rejoin_wait", func(r *Rendezvous) *time.Duration { return &r.RejoinWait }, 0},
		{"min_nodes_wait", func(r *Rendezvous) *time.Duration { return &r.MinNodesWait }, time.Second},
	}
}

// knownRdzvConfKeys names the keys ft-launcher reads, for messages.
func knownRdzvConfKeys() string {
	var keys []string
	for _, t := range rdzvTimings() {
		keys = append(keys, t.key)
	}
	keys = append(keys, gossipKeys...)
	keys = append(keys, relayKeys...)
	return strings.Join(keys, ", ") + " and is_host"
}

// torchrunOnlyRdzvConf are keys torchrun's rendezvous backends read and
// ft-launcher does not; the value says what to use instead, if anything.
func torchrunOnlyRdzvConf() map[string]string {
	return map[string]string{
		"read_timeout":           "",
		"timeout":                "",
		"close_timeout":          "",
		"heartbeat_timeout":      "",
		"keep_alive_interval":    "",
		"keep_alive_max_attempt": "",
		"store_type":             "",
		"use_libuv":              "",
		"etcd_prefix":            "",
		"rank":                   "use --node-rank",
		"protocol":               "https is used when --rdzv-ca-cert or --rdzv-cert is given",
		"cacert":                 "use --rdzv-ca-cert",
		"cert":                   "use --rdzv-cert",
		"key":                    "use --rdzv-key",
	}
}

// resolveRendezvous interprets the rendezvous options once every layer is
// merged. It fails with a *UsageError before anything is started.
func (p *parser) resolveRendezvous() error {
	c := p.cfg
	r := Rendezvous{TLS: c.RdzvCACert != "" || c.RdzvCert != "", EtcdMember: -1}
	confSubj := p.source["rdzv-conf"]
	if confSubj == "" {
		confSubj = "--rdzv-conf"
	}
	// Every key is checked whatever the mode, so that a typo fails the same
	// way on a laptop as on the cluster.
	p.warnUnusedRdzvConf(confSubj)
	if err := p.rdzvConfTimings(&r, confSubj); err != nil {
		return err
	}
	if err := p.rdzvConfGossip(&r, confSubj); err != nil {
		return err
	}
	if err := p.rdzvConfRelay(&r, confSubj); err != nil {
		return err
	}
	isHost, hasIsHost := false, false
	if v, ok := c.RdzvConf["is_host"]; ok {
		switch strings.ToLower(v) {
		case "1", "true":
			isHost = true
		case "0", "false":
		default:
			return usageErr(confSubj, "%s is_host=%q: must be 1, 0, true or false", confSubj, v)
		}
		hasIsHost = true
	}

	endpoint := c.RdzvEndpoint
	switch {
	case c.Standalone, c.NNodes.Max == 1 && endpoint == "", c.NNodes.Max == 1 && c.RdzvBackend == "static":
		r.Mode = RdzvSingleNode
	case c.RdzvBackend == "etcd" || c.RdzvBackend == "etcd-v2":
		r.Mode = RdzvExternal
	default:
		r.Mode = RdzvEmbedded
	}
	if r.Mode == RdzvSingleNode {
		c.Rdzv = r
		return nil
	}

	epSubj := p.source["rdzv-endpoint"]
	defPort := defaultEmbeddedPort
	if r.Mode == RdzvExternal {
		defPort = defaultEtcdPort
	}
	if endpoint == "" && c.RdzvBackend == "static" {
		// torchrun's static backend meets at rank 0's MASTER_ADDR:MASTER_PORT.
		endpoint = net.JoinHostPort(c.MasterAddr, strconv.Itoa(c.MasterPort))
		epSubj = "--master-addr/--master-port"
	}
	if endpoint == "" {
		hint := ""
		if p.endpointHint != "" {
			hint = "; " + p.endpointHint
		}
		return usageErr("--rdzv-endpoint", "--rdzv-endpoint is required with --nnodes %d:%d and --rdzv-backend %s: give host[:port] of the rendezvous (default port %d)%s",
			c.NNodes.Min, c.NNodes.Max, c.RdzvBackend, defPort, hint)
	}
	eps, err := parseEndpoints(endpoint, defPort)
	if err != nil {
		return usageErr(epSubj, "%s %q: %v", epSubj, endpoint, err)
	}
	r.Endpoints = eps
	firstHost, _, _ := net.SplitHostPort(eps[0])
	ln, err := p.resolveLocalAddr(p.net, firstHost)
	if err != nil {
		return err
	}
	if r.Mode == RdzvEmbedded {
		if r.Endpoints, err = p.resolveEndpoints(p.net, eps, epSubj, endpoint); err != nil {
			return err
		}
		if !slices.Equal(r.Endpoints, eps) {
			r.Given = eps
		}
	}

	switch {
	case r.Mode == RdzvExternal:
		if hasIsHost {
			p.warn("%s is_host: no effect with --rdzv-backend %s (the etcd cluster is yours; no launcher hosts one)", confSubj, c.RdzvBackend)
		}
	case hasIsHost && len(eps) == 1:
		r.HostsEtcd, r.HostsEtcdBy = isHost, confSubj+" is_host="+c.RdzvConf["is_host"]
	default:
		if hasIsHost {
			p.warn("%s is_host: ignored with %d endpoints: each launcher hosts the etcd member whose endpoint matches its address", confSubj, len(eps))
		}
		if len(eps) > 1 {
			if err := checkMemberPorts(eps); err != nil {
				return usageErr(epSubj, "%s %q: %v", epSubj, endpoint, err)
			}
		}
		if n, from := c.K8s.Index(); p.podEndpoint == podEndpointService && len(eps) == 1 && n >= 0 {
			r.HostsEtcd, r.HostsEtcdBy = p.serviceHost(&r, eps, n, from)
			break
		}
		r.HostsEtcd, r.HostsEtcdBy = hostedMember(&r, eps, ln)
		p.warnLoopbackHost(r, ln)
	}
	if r.HostsEtcd && r.EtcdMember < 0 {
		r.EtcdMember = 0
	}
	c.Rdzv = r
	return nil
}

// serviceHost decides hosting for an endpoint that is a Service
// (FTL_RDZV_SERVICE): the pod of index n == 0 hosts. Matching addresses
// cannot decide it: a ClusterIP is no pod's address, and cluster DNS names
// the pods behind a headless Service only once they are ready, later than
// this. The host listens on its own address, where the Service sends the
// others.
func (p *parser) serviceHost(r *Rendezvous, given []string, n int, from string) (bool, string) {
	if n != 0 {
		return false, fmt.Sprintf("%s: the index-0 pod hosts; this pod is %s=%d", k8s.EnvRdzvService, from, n)
	}
	_, port, _ := net.SplitHostPort(given[0])
	if ip := net.ParseIP(p.cfg.LocalAddr); ip != nil {
		r.Endpoints = []string{net.JoinHostPort(ip.String(), port)}
		r.Given = given
	}
	r.EtcdMember = 0
	return true, fmt.Sprintf("%s: the index-0 pod hosts (%s=0), listening on its own address %s", k8s.EnvRdzvService, from, r.Endpoints[0])
}

// hostedMember finds the endpoint this launcher hosts: the first that
// names this node (see localNode.matches). given are the endpoints as given.
func hostedMember(r *Rendezvous, given []string, ln localNode) (bool, string) {
	for i, ep := range r.Endpoints {
		if ok, why := ln.matches(given[i], ep); ok {
			r.EtcdMember = i
			if len(given) > 1 {
				why += fmt.Sprintf(" (member %d of %d)", i, len(given))
			}
			return true, why
		}
	}
	return false, ln.mismatch(given, r.Endpoints)
}

// warnLoopbackHost warns when this node hosts the embedded etcd on a
// loopback address although it has a routable one: a host name that
// /etc/hosts maps to 127.0.1.1 (Debian's default) resolves elsewhere to
// the node's real address, where nothing would listen.
func (p *parser) warnLoopbackHost(r Rendezvous, ln localNode) {
	if !r.HostsEtcd || r.EtcdMember < 0 || p.cfg.NNodes.Max < 2 {
		return
	}
	h, _, _ := net.SplitHostPort(r.Endpoints[r.EtcdMember])
	ip, self := net.ParseIP(h), net.ParseIP(ln.addr)
	if ip != nil && ip.IsLoopback() && self != nil && !self.IsLoopback() {
		p.warn("the embedded etcd will listen on %s, a loopback address, although this node's address is %s: other nodes cannot reach it; give --rdzv-endpoint as a routable address (a host name that /etc/hosts maps to 127.0.1.1?)",
			r.Endpoints[r.EtcdMember], ln.addr)
	}
}

// checkMemberPorts: each member of a multi-member embedded etcd takes its
// endpoint's port for clients and the next one for its peers.
func checkMemberPorts(eps []string) error {
	used := map[string]bool{}
	for _, ep := range eps {
		h, ps, _ := net.SplitHostPort(ep)
		port, _ := strconv.Atoi(ps)
		if port >= 65535 {
			return fmt.Errorf("endpoint %s: a member's peer port is its client port + 1; use a port below 65535", ep)
		}
		for _, k := range []string{net.JoinHostPort(h, ps), net.JoinHostPort(h, strconv.Itoa(port+1))} {
			if used[k] {
				return fmt.Errorf("endpoint %s: %s is taken by another member (members use their port and port + 1)", ep, k)
			}
			used[k] = true
		}
	}
	return nil
}

// warnUnusedRdzvConf warns about each --rdzv-conf key ft-launcher does
// not read: torchrun's own keys, with a hint where one of our flags does the
// job, and unknown keys, with the list of known ones.
func (p *parser) warnUnusedRdzvConf(confSubj string) {
	known := map[string]bool{"is_host": true}
	for _, t := range rdzvTimings() {
		known[t.key] = true
	}
	for _, k := range append(slices.Clone(gossipKeys), relayKeys...) {
		known[k] = true
	}
	torchrunOnly := torchrunOnlyRdzvConf()
	for _, k := range sortedKeys(p.cfg.RdzvConf) {
		if known[k] {
			continue
		}
		if hint, ok := torchrunOnly[k]; ok {
			msg := fmt.Sprintf("%s %s: torchrun's key, accepted but not used by ft-launcher", confSubj, k)
			if hint != "" {
				msg += " (" + hint + ")"
			}
			p.warn("%s", msg)
			continue
		}
		p.warn("%s %s: unknown key ignored; ft-launcher reads %s", confSubj, k, knownRdzvConfKeys())
	}
}

// rdzvConfTimings sets every timing of r: the --rdzv-conf value, checked,
// else its default.
func (p *parser) rdzvConfTimings(r *Rendezvous, confSubj string) error {
	for _, t := range rdzvTimings() {
		d := t.def
		if v, ok := p.cfg.RdzvConf[t.key]; ok {
			var err error
			if d, err = parseRdzvTiming(v); err != nil {
				return usageErr(confSubj, "%s %s=%q: %v", confSubj, t.key, v, err)
			}
		} else if t.key == "connect_timeout" && p.podEndpoint != "" {
			d = podConnectTimeout
		} else if t.key == "rejoin_wait" {
			// Long enough for a node to stop its ranks (the SIGTERM grace)
			// and come back, so that it keeps its group rank.
			d = p.cfg.WorkersStopTimeout + 10*time.Second
		}
		*t.dst(r) = d
	}
	if r.FenceMargin != 0 && r.FenceMargin*2 >= r.LeaseTTL {
		return usageErr(confSubj, "%s fence_margin=%v: must be below half of lease_ttl (%v): a node renews its lease every lease_ttl/3",
			confSubj, r.FenceMargin.Seconds(), r.LeaseTTL.Seconds())
	}
	return nil
}

// parseRdzvTiming parses a --rdzv-conf timing: finite seconds within bounds.
func parseRdzvTiming(v string) (time.Duration, error) {
	bad := fmt.Errorf("must be a number of seconds from %g to %g (7 days)", minRdzvTiming.Seconds(), maxRdzvTiming.Seconds())
	f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < minRdzvTiming.Seconds() || f > maxRdzvTiming.Seconds() {
		return 0, bad
	}
	return time.Duration(math.Round(f * float64(time.Second))), nil
}

// parseEndpoints splits a comma list of host[:port] (IPv6 as [addr]:port or
// a bare address), adds defPort where a port is missing and checks each.
// Empty items are skipped; a list with none left is an error.
func parseEndpoints(s string, defPort int) ([]string, error) {
	var out []string
	for _, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		if strings.Contains(e, "://") {
			return nil, fmt.Errorf("endpoint %q: give host[:port] without a scheme (https is used when --rdzv-ca-cert or --rdzv-cert is given)", e)
		}
		host, port, err := net.SplitHostPort(e)
		if err != nil {
			// No port: a host name, an IPv4 address, or a bare or bracketed IPv6 address.
			host, port = strings.TrimSuffix(strings.TrimPrefix(e, "["), "]"), strconv.Itoa(defPort)
			if strings.Contains(host, ":") && net.ParseIP(host) == nil {
				return nil, fmt.Errorf("endpoint %q: must be host[:port], IPv6 as [addr]:port", e)
			}
		}
		if host == "" || strings.ContainsAny(host, " []/") {
			return nil, fmt.Errorf("endpoint %q: must be host[:port] with a host name or address", e)
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("endpoint %q: the port must be 1-65535", e)
		}
		out = append(out, net.JoinHostPort(host, port))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no address given: must be host[:port][,host[:port]...]")
	}
	return out, nil
}

// resolveInfraRank picks the node's rank as the infrastructure knows it,
// which the etcd rendezvous uses to order nodes: --node-rank, else
// SLURM_PROCID, else JOB_COMPLETION_INDEX, else, in a pod, the ordinal of
// a StatefulSet-style host name NAME-N; -1 when none is known.
func (p *parser) resolveInfraRank() {
	c := p.cfg
	n, from := c.K8s.Index()
	switch {
	case c.NodeRank >= 0:
		c.InfraRank, c.InfraRankFrom = c.NodeRank, p.source["node-rank"]
	case c.Slurm.ProcID >= 0:
		c.InfraRank, c.InfraRankFrom = c.Slurm.ProcID, "SLURM_PROCID"
	case n >= 0:
		c.InfraRank, c.InfraRankFrom = n, from
	default:
		c.InfraRank, c.InfraRankFrom = -1, "none"
	}
}
