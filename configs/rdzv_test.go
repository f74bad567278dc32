package configs

import (
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fakeHosts is the fake network's name table: "box" is this machine; n1-n3
// are Slurm node names that DNS does not know (the fake resolves them as
// the production resolver does through scontrol).
var fakeHosts = map[string]string{"box": "10.0.0.7", "h": "10.0.0.8", "n1": "10.0.1.1", "n2": "10.0.1.2", "n3": "10.0.1.3"}

// fakeNet is a machine named box whose only interface address is
// 127.0.0.1; every route leaves from 10.0.0.7 but loopback's.
func fakeNet() Network {
	return Network{
		Resolve: func(host string) ([]string, error) {
			if ip, ok := fakeHosts[host]; ok {
				return []string{ip}, nil
			}
			return nil, fmt.Errorf("%s does not resolve: no such host", host)
		},
		LocalIPs: func() []string { return []string{"127.0.0.1"} },
		RouteTo: func(ip string) string {
			if net.ParseIP(ip).IsLoopback() {
				return "127.0.0.1"
			}
			return "10.0.0.7"
		},
		Hostname: func() string { return "box" },
	}
}

func parseRdzv(t *testing.T, args []string, env map[string]string) (*Config, error) {
	t.Helper()
	m := noGPU(t)
	m.net = fakeNet()
	return parse(append(args, "train.py"), envOf(env), m)
}

func TestRendezvousResolved(t *testing.T) {
	defTimings := Rendezvous{JoinTimeout: 10 * time.Minute, LastCallTimeout: 500 * time.Millisecond,
		ConnectTimeout: 20 * time.Second, LeaseTTL: 6 * time.Second, EtcdLossBound: time.Minute, RejoinWait: 25 * time.Second,
		MinNodesWait: time.Second, EtcdMember: -1}
	with := func(f func(r *Rendezvous)) Rendezvous {
		r := defTimings
		f(&r)
		return r
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want Rendezvous
		urls []string
	}{
		{"one node, no endpoint", nil, nil, with(func(r *Rendezvous) { r.Mode = RdzvSingleNode }), []string{}},
		{"standalone wins over several nodes", []string{"--standalone", "--nnodes", "2", "--rdzv-endpoint", "10.0.0.1"}, nil,
			with(func(r *Rendezvous) { r.Mode = RdzvSingleNode }), []string{}},
		{"one node, static with an endpoint", []string{"--rdzv-backend", "static", "--rdzv-endpoint", "10.0.0.1"}, nil,
			with(func(r *Rendezvous) { r.Mode = RdzvSingleNode }), []string{}},
		{"c10d maps to the embedded etcd, default port 29400", []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints = RdzvEmbedded, []string{"10.0.0.1:29400"}
				r.HostsEtcdBy = "endpoint 10.0.0.1:29400 is not an address of this machine: this node has address 10.0.0.7 (the route to 10.0.0.1), host name box, interfaces 127.0.0.1"
			}), []string{"http://10.0.0.1:29400"}},
		{"one node with an endpoint still meets there", []string{"--rdzv-endpoint", "127.0.0.1:1234"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"127.0.0.1:1234"}, true, 0
				r.HostsEtcdBy = "endpoint 127.0.0.1:1234 is an address of this machine"
			}), []string{"http://127.0.0.1:1234"}},
		{"--local-addr decides hosting", []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.2", "--local-addr", "127.0.0.2"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"127.0.0.2:29400"}, true, 0
				r.HostsEtcdBy = "--local-addr 127.0.0.2 matches endpoint 127.0.0.2:29400"
			}), []string{"http://127.0.0.2:29400"}},
		{"is_host=true overrides the address", []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1", "--rdzv-conf", "is_host=TRUE"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"10.0.0.1:29400"}, true, 0
				r.HostsEtcdBy = "--rdzv-conf is_host=TRUE"
			}), nil},
		{"is_host=0 from PET_RDZV_CONF", []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1"}, map[string]string{"PET_RDZV_CONF": "is_host=0"},
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints = RdzvEmbedded, []string{"127.0.0.1:29400"}
				r.HostsEtcdBy = "PET_RDZV_CONF is_host=0"
			}), nil},
		{"static falls back to master addr and port", []string{"--nnodes", "2", "--rdzv-backend", "static", "--master-addr", "10.0.0.5"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints = RdzvEmbedded, []string{"10.0.0.5:29500"}
				r.HostsEtcdBy = "endpoint 10.0.0.5:29500 is not an address of this machine: this node has address 10.0.0.7 (the route to 10.0.0.5), host name box, interfaces 127.0.0.1"
			}), nil},
		{"etcd is external, default port 2379, empty items skipped", []string{"--nnodes", "1:3", "--rdzv-backend", "etcd", "--rdzv-endpoint", " e1 ,, e2:2380,"}, nil,
			with(func(r *Rendezvous) { r.Mode, r.Endpoints = RdzvExternal, []string{"e1:2379", "e2:2380"} }),
			[]string{"http://e1:2379", "http://e2:2380"}},
		{"TLS makes https URLs", []string{"--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "e1", "--rdzv-ca-cert", "/ca.pem"}, nil,
			with(func(r *Rendezvous) { r.Mode, r.Endpoints, r.TLS = RdzvExternal, []string{"e1:2379"}, true }),
			[]string{"https://e1:2379"}},
		{"IPv6 endpoints, loopback is this machine", []string{"--nnodes", "2", "--rdzv-endpoint", "::1,[fe80::1],[fe80::2]:7"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"[::1]:29400", "[fe80::1]:29400", "[fe80::2]:7"}, true, 0
				r.HostsEtcdBy = "endpoint [::1]:29400 is an address of this machine (member 0 of 3)"
			}), nil},
		{"IPv6 endpoints elsewhere", []string{"--nnodes", "2", "--rdzv-endpoint", "[fe80::1],[fe80::2]:7"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints = RdzvEmbedded, []string{"[fe80::1]:29400", "[fe80::2]:7"}
				r.HostsEtcdBy = "none of the endpoints [fe80::1]:29400,[fe80::2]:7 is an address of this machine: this node has address 10.0.0.7 (the route to fe80::1), host name box, interfaces 127.0.0.1"
			}), nil},
		{"a host name is resolved; this machine's name hosts", []string{"--nnodes", "2", "--rdzv-endpoint", "box:7000"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.Given, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"10.0.0.7:7000"}, []string{"box:7000"}, true, 0
				r.HostsEtcdBy = "endpoint box:7000 (10.0.0.7) is this node (host name box)"
			}), []string{"http://10.0.0.7:7000"}},
		{"a host name --local-addr is resolved and matches", []string{"--nnodes", "2", "--rdzv-endpoint", "n2", "--local-addr", "n2"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints, r.Given, r.HostsEtcd, r.EtcdMember = RdzvEmbedded, []string{"10.0.1.2:29400"}, []string{"n2:29400"}, true, 0
				r.HostsEtcdBy = "--local-addr n2 matches endpoint n2:29400 (10.0.1.2)"
			}), nil},
		{"a name --local-addr against an address endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.1.1", "--local-addr", "n2"}, nil,
			with(func(r *Rendezvous) {
				r.Mode, r.Endpoints = RdzvEmbedded, []string{"10.0.1.1:29400"}
				r.HostsEtcdBy = "--local-addr n2 does not match endpoint 10.0.1.1:29400"
			}), nil},
		{"every timing, rounded to the nanosecond", []string{"--nnodes", "2", "--rdzv-endpoint", "h", "--rdzv-conf",
			"join_timeout=60, last_call_timeout=0.001,connect_timeout=2.5,lease_ttl=7,fence_margin=1.5,etcd_loss_bound=604800,rejoin_wait=1e1"}, nil,
			Rendezvous{Mode: RdzvEmbedded, Endpoints: []string{"10.0.0.8:29400"}, Given: []string{"h:29400"}, EtcdMember: -1,
				HostsEtcdBy: "endpoint h:29400 (10.0.0.8) is not an address of this machine: this node has address 10.0.0.7 (the route to 10.0.0.8), host name box, interfaces 127.0.0.1",
				JoinTimeout: time.Minute, LastCallTimeout: time.Millisecond, ConnectTimeout: 2500 * time.Millisecond,
				LeaseTTL: 7 * time.Second, FenceMargin: 1500 * time.Millisecond, EtcdLossBound: 7 * 24 * time.Hour, RejoinWait: 10 * time.Second, MinNodesWait: time.Second}, nil},
		{"rejoin_wait follows --workers-stop-timeout", []string{"--workers-stop-timeout", "3"}, nil,
			with(func(r *Rendezvous) { r.Mode, r.RejoinWait = RdzvSingleNode, 13*time.Second }), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRdzv(t, tt.args, tt.env)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if !reflect.DeepEqual(c.Rdzv, tt.want) {
				t.Errorf("Rdzv =\n %+v\nwant\n %+v", c.Rdzv, tt.want)
			}
			if tt.urls != nil && !reflect.DeepEqual(c.Rdzv.ClientURLs(), tt.urls) {
				t.Errorf("ClientURLs() = %q, want %q", c.Rdzv.ClientURLs(), tt.urls)
			}
		})
	}
}

// TestRendezvousErrors: every bad value is a one-line usage error naming the
// flag or variable, the key and what is allowed.
func TestRendezvousErrors(t *testing.T) {
	const timing = `must be a number of seconds from 0.001 to 604800 (7 days)`
	multi := []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		subject string
		want    string
	}{
		{"not a number", append(multi, "--rdzv-conf", "join_timeout=abc"), nil, "--rdzv-conf", `--rdzv-conf join_timeout="abc": ` + timing},
		{"zero", append(multi, "--rdzv-conf", "last_call_timeout=0"), nil, "--rdzv-conf", `--rdzv-conf last_call_timeout="0": ` + timing},
		{"negative", append(multi, "--rdzv-conf", "connect_timeout=-1"), nil, "--rdzv-conf", `--rdzv-conf connect_timeout="-1": ` + timing},
		{"nan", append(multi, "--rdzv-conf", "lease_ttl=nan"), nil, "--rdzv-conf", `--rdzv-conf lease_ttl="nan": ` + timing},
		{"inf", append(multi, "--rdzv-conf", "etcd_loss_bound=inf"), nil, "--rdzv-conf", `--rdzv-conf etcd_loss_bound="inf": ` + timing},
		{"overflows a duration", append(multi, "--rdzv-conf", "rejoin_wait=1e300"), nil, "--rdzv-conf", `--rdzv-conf rejoin_wait="1e300": ` + timing},
		{"above 7 days", append(multi, "--rdzv-conf", "join_timeout=604801"), nil, "--rdzv-conf", `--rdzv-conf join_timeout="604801": ` + timing},
		{"below a millisecond", append(multi, "--rdzv-conf", "join_timeout=0.0001"), nil, "--rdzv-conf", `--rdzv-conf join_timeout="0.0001": ` + timing},
		{"checked on one node too", []string{"--rdzv-conf", "join_timeout=1d"}, nil, "--rdzv-conf", `--rdzv-conf join_timeout="1d": ` + timing},
		{"from PET_RDZV_CONF", multi, map[string]string{"PET_RDZV_CONF": "lease_ttl=x"}, "PET_RDZV_CONF", `PET_RDZV_CONF lease_ttl="x": ` + timing},
		{"fence_margin of half the lease", append(multi, "--rdzv-conf", "fence_margin=3"), nil, "--rdzv-conf",
			"--rdzv-conf fence_margin=3: must be below half of lease_ttl (6): a node renews its lease every lease_ttl/3"},
		{"is_host not boolean", append(multi, "--rdzv-conf", "is_host=yes"), nil, "--rdzv-conf", `--rdzv-conf is_host="yes": must be 1, 0, true or false`},
		{"is_host 2", append(multi, "--rdzv-conf", "is_host=2"), nil, "--rdzv-conf", `--rdzv-conf is_host="2": must be 1, 0, true or false`},
		{"blank endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", " "}, nil, "--rdzv-endpoint",
			`--rdzv-endpoint " ": no address given: must be host[:port][,host[:port]...]`},
		{"only commas", []string{"--nnodes", "2", "--rdzv-endpoint", ","}, nil, "--rdzv-endpoint",
			`--rdzv-endpoint ",": no address given: must be host[:port][,host[:port]...]`},
		{"blank endpoint, one node", []string{"--rdzv-endpoint", " , "}, nil, "--rdzv-endpoint",
			`--rdzv-endpoint " , ": no address given`},
		{"blank PET_RDZV_ENDPOINT", []string{"--nnodes", "2"}, map[string]string{"PET_RDZV_ENDPOINT": ","}, "PET_RDZV_ENDPOINT",
			`PET_RDZV_ENDPOINT ",": no address given`},
		{"missing endpoint", []string{"--nnodes", "1:2"}, nil, "--rdzv-endpoint",
			"--rdzv-endpoint is required with --nnodes 1:2 and --rdzv-backend c10d: give host[:port] of the rendezvous (default port 29400)"},
		{"missing etcd endpoint", []string{"--nnodes", "2", "--rdzv-backend", "etcd"}, nil, "--rdzv-endpoint",
			"--rdzv-endpoint is required with --nnodes 2:2 and --rdzv-backend etcd: give host[:port] of the rendezvous (default port 2379)"},
		{"scheme", []string{"--nnodes", "2", "--rdzv-endpoint", "http://e1:2379"}, nil, "--rdzv-endpoint",
			`--rdzv-endpoint "http://e1:2379": endpoint "http://e1:2379": give host[:port] without a scheme`},
		{"port not a number", []string{"--nnodes", "2", "--rdzv-endpoint", "e1:abc"}, nil, "--rdzv-endpoint", `endpoint "e1:abc": the port must be 1-65535`},
		{"port 0", []string{"--nnodes", "2", "--rdzv-endpoint", "e1:0"}, nil, "--rdzv-endpoint", `endpoint "e1:0": the port must be 1-65535`},
		{"port too big", []string{"--nnodes", "2", "--rdzv-endpoint", "e1:70000"}, nil, "--rdzv-endpoint", `endpoint "e1:70000": the port must be 1-65535`},
		{"empty port", []string{"--nnodes", "2", "--rdzv-endpoint", "e1:"}, nil, "--rdzv-endpoint", `endpoint "e1:": the port must be 1-65535`},
		{"no host", []string{"--nnodes", "2", "--rdzv-endpoint", ":29400"}, nil, "--rdzv-endpoint", `endpoint ":29400": must be host[:port] with a host name or address`},
		{"unbracketed garbage", []string{"--nnodes", "2", "--rdzv-endpoint", "a:b:c"}, nil, "--rdzv-endpoint", `endpoint "a:b:c": must be host[:port], IPv6 as [addr]:port`},
		{"static fallback port 0", []string{"--nnodes", "2", "--rdzv-backend", "static", "--master-port", "0"}, nil, "--master-addr/--master-port",
			`--master-addr/--master-port "127.0.0.1:0": endpoint "127.0.0.1:0": the port must be 1-65535`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRdzv(t, tt.args, tt.env)
			checkUsageError(t, err, tt.subject, tt.want)
		})
	}
}

func TestRendezvousConfWarnings(t *testing.T) {
	multi := []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.0.1"}
	tests := []struct {
		name  string
		args  []string
		warns []string
	}{
		{"known keys are silent", append(multi, "--rdzv-conf", "join_timeout=5,is_host=1"), nil},
		{"torchrun keys are accepted and not used", append(multi, "--rdzv-conf", "read_timeout=60,keep_alive_max_attempt=3,timeout=9"), []string{
			"--rdzv-conf keep_alive_max_attempt: torchrun's key, accepted but not used by ft-launcher",
			"--rdzv-conf read_timeout: torchrun's key, accepted but not used by ft-launcher",
			"--rdzv-conf timeout: torchrun's key, accepted but not used by ft-launcher",
		}},
		{"torchrun TLS keys point at our flags", append(multi, "--rdzv-conf", "cacert=/ca.pem"), []string{
			"--rdzv-conf cacert: torchrun's key, accepted but not used by ft-launcher (use --rdzv-ca-cert)"}},
		{"unknown keys name the known ones", append(multi, "--rdzv-conf", "join_timout=5"), []string{
			"--rdzv-conf join_timout: unknown key ignored; ft-launcher reads join_timeout, last_call_timeout, connect_timeout, lease_ttl, fence_margin, etcd_loss_bound, rejoin_wait, min_nodes_wait, gossip_probe_interval, gossip_probe_timeout, gossip_suspicion_mult, gossip_indirect_checks, relay_group, relay_port and is_host"}},
		{"is_host with an external etcd", []string{"--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "e1", "--rdzv-conf", "is_host=1"}, []string{
			"--rdzv-conf is_host: no effect with --rdzv-backend etcd"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRdzv(t, tt.args, nil)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(c.Warnings) != len(tt.warns) {
				t.Fatalf("warnings %q, want %q", c.Warnings, tt.warns)
			}
			for i, w := range tt.warns {
				if !strings.HasPrefix(c.Warnings[i], w) {
					t.Errorf("warning %q, want it to start with %q", c.Warnings[i], w)
				}
			}
		})
	}
}

func TestInfraRank(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		rank  int
		from  string
		warns []string
	}{
		{"none", nil, nil, -1, "none", nil},
		{"--node-rank", []string{"--node-rank", "2"}, map[string]string{"SLURM_PROCID": "5"}, 2, "--node-rank", nil},
		{"PET_NODE_RANK", nil, map[string]string{"PET_NODE_RANK": "4", "JOB_COMPLETION_INDEX": "1"}, 4, "PET_NODE_RANK", nil},
		{"SLURM_PROCID before JOB_COMPLETION_INDEX", nil, map[string]string{"SLURM_PROCID": "5", "JOB_COMPLETION_INDEX": "1"}, 5, "SLURM_PROCID", nil},
		{"JOB_COMPLETION_INDEX", nil, map[string]string{"JOB_COMPLETION_INDEX": "1"}, 1, "JOB_COMPLETION_INDEX", nil},
		{"a pod's ordinal orders nodes", nil, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-3"}, 3, "pod ordinal of HOSTNAME=trainer-3", nil},
		{"JOB_COMPLETION_INDEX before the pod ordinal", nil, map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-3", "JOB_COMPLETION_INDEX": "0"}, 0, "JOB_COMPLETION_INDEX", nil},
		{"an ordinal outside a pod is only a host name", nil, map[string]string{"HOSTNAME": "trainer-3"}, -1, "none", nil},
		{"malformed SLURM_PROCID is ignored with a warning", nil, map[string]string{"SLURM_PROCID": "x", "JOB_COMPLETION_INDEX": "2"}, 2, "JOB_COMPLETION_INDEX",
			[]string{`SLURM_PROCID="x" is not an integer >= 0; ignored`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRdzv(t, tt.args, tt.env)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if c.InfraRank != tt.rank || c.InfraRankFrom != tt.from {
				t.Errorf("InfraRank %d from %q, want %d from %q", c.InfraRank, c.InfraRankFrom, tt.rank, tt.from)
			}
			if !reflect.DeepEqual(c.Warnings, tt.warns) {
				t.Errorf("warnings %q, want %q", c.Warnings, tt.warns)
			}
		})
	}
	c, err := parseRdzv(t, nil, map[string]string{"SLURM_JOB_ID": "77", "SLURM_NNODES": "4", "SLURM_STEP_NODELIST": "n[1-3],box",
		"SLURMD_NODENAME": "n2", "KUBERNETES_SERVICE_HOST": "x", "HOSTNAME": "w-1"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Slurm.JobID != "77" || c.Slurm.NNodes != 4 || !c.K8s.InPod || c.K8s.PodOrdinal != 1 {
		t.Errorf("scheduler environment not kept: slurm %+v k8s %+v", c.Slurm, c.K8s)
	}
}

// TestEffectiveRendezvous: --print-config shows the rendezvous as interpreted.
func TestEffectiveRendezvous(t *testing.T) {
	c, err := parseRdzv(t, []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1", "--rdzv-conf", "join_timeout=90"},
		map[string]string{"SLURM_PROCID": "1"})
	if err != nil {
		t.Fatal(err)
	}
	out := c.Effective()
	for _, want := range []string{"\nrendezvous:\n", "  mode: embedded\n", "  endpoints:\n    - http://127.0.0.1:29400\n",
		"  hosts_embedded_etcd: true\n", "  hosts_embedded_etcd_decided_by: endpoint 127.0.0.1:29400 is an address of this machine\n",
		"  join_timeout: 90\n", "  last_call_timeout: 0.5\n", "  rejoin_wait: 25\n", "  infra_rank: 1\n", "  infra_rank_from: SLURM_PROCID\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("Effective() lacks %q:\n%s", want, out)
		}
	}
	c, _ = parseRdzv(t, nil, nil)
	if out := c.Effective(); !strings.Contains(out, "  mode: single-node\n") || strings.Contains(out, "endpoints:") {
		t.Errorf("single-node rendezvous rendered wrong:\n%s", out)
	}
}

// TestEmbeddedMembers: with several endpoints the embedded etcd is a
// cluster; each launcher hosts the member whose endpoint matches it.
func TestEmbeddedMembers(t *testing.T) {
	eps := "127.0.0.2:2400,127.0.0.3:2400,127.0.0.4:2400"
	tests := []struct {
		name   string
		args   []string
		member int
		by     string
		err    string
	}{
		{"second member", []string{"--local-addr", "127.0.0.3", "--rdzv-endpoint", eps}, 1, "--local-addr 127.0.0.3 matches endpoint 127.0.0.3:2400 (member 1 of 3)", ""},
		{"no member", []string{"--local-addr", "127.0.0.9", "--rdzv-endpoint", eps}, -1, "--local-addr 127.0.0.9 matches none of the endpoints " + eps, ""},
		{"is_host ignored with several", []string{"--local-addr", "127.0.0.4", "--rdzv-endpoint", eps, "--rdzv-conf", "is_host=0"}, 2, "--local-addr 127.0.0.4 matches endpoint 127.0.0.4:2400 (member 2 of 3)", ""},
		{"peer port collides", []string{"--rdzv-endpoint", "127.0.0.2:2400,127.0.0.2:2401"}, 0, "", "127.0.0.2:2401 is taken by another member"},
		{"no room for the peer port", []string{"--rdzv-endpoint", "127.0.0.2:65535,127.0.0.3:2400"}, 0, "", "port below 65535"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseRdzv(t, append([]string{"--nnodes", "3:4"}, tc.args...), nil)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.Rdzv.EtcdMember != tc.member || c.Rdzv.HostsEtcd != (tc.member >= 0) || c.Rdzv.HostsEtcdBy != tc.by {
				t.Fatalf("member %d hosts %v by %q", c.Rdzv.EtcdMember, c.Rdzv.HostsEtcd, c.Rdzv.HostsEtcdBy)
			}
		})
	}
}

// checkUsageError: err is a one-line *UsageError about subject (its
// message starts with it) that contains want.
func checkUsageError(t *testing.T, err error, subject, want string) {
	t.Helper()
	var ue *UsageError
	if !errors.As(err, &ue) {
		t.Fatalf("err = %v, want a *UsageError", err)
	}
	if ue.Subject != subject || !strings.Contains(ue.Msg, want) || !strings.HasPrefix(ue.Msg, subject) || strings.Contains(ue.Msg, "\n") {
		t.Errorf("error %q (subject %q), want one line starting with %q containing %q", ue.Msg, ue.Subject, subject, want)
	}
}
