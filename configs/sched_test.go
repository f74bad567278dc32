package configs

import (
	"reflect"
	"strings"
	"testing"
)

// slurmStep is what srun gives the task on node (1-based) of an n-node step
// of job 77 on n1..n<n>.
func slurmStep(n, node int) map[string]string {
	names := []string{"n1", "n2", "n3"}[:n]
	return map[string]string{
		"SLURM_JOB_ID": "77", "SLURM_NNODES": itoa(n), "SLURM_JOB_NUM_NODES": itoa(n),
		"SLURM_JOB_NODELIST": "n[1-" + itoa(n) + "]", "SLURM_STEP_NODELIST": "n[1-" + itoa(n) + "]",
		"SLURM_PROCID": itoa(node - 1), "SLURMD_NODENAME": names[node-1],
	}
}

func itoa(n int) string { return string(rune('0' + n)) }

func with(env map[string]string, kv ...string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

// TestSlurmDefaults: inside a Slurm step the minimal launch line gets its
// node count, run id, endpoints and local address from the job, and every
// flag or PET_ variable still wins.
func TestSlurmDefaults(t *testing.T) {
	type want struct {
		nnodes    NNodes
		runID     string
		mode      RdzvMode
		endpoints []string
		given     []string
		local     string
		member    int
		by        string
		rank      int
		sources   map[string]string
		warn      string
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want want
	}{
		{"three nodes: a three-member etcd, node 2 hosts member 1", nil, slurmStep(3, 2), want{
			nnodes: NNodes{3, 3}, runID: "77-r0", mode: RdzvEmbedded,
			endpoints: []string{"10.0.1.1:29554", "10.0.1.2:29554", "10.0.1.3:29554"}, given: []string{"n1:29554", "n2:29554", "n3:29554"},
			local: "10.0.1.2", member: 1, by: "endpoint n2:29554 (10.0.1.2) is this node (Slurm node name n2) (member 1 of 3)", rank: 1,
			sources: map[string]string{"nnodes": "Slurm (SLURM_NNODES=3)", "rdzv_id": "Slurm (SLURM_JOB_ID=77, SLURM_RESTART_COUNT=0)",
				"rdzv_endpoint": "Slurm (SLURM_STEP_NODELIST=n[1-3]: first 3 of 3 nodes)", "local_addr": "SLURMD_NODENAME n2", "rdzv_backend": "default"}}},
		{"two nodes: the first hosts", nil, slurmStep(2, 1), want{
			nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, given: []string{"n1:29554"},
			local: "10.0.1.1", member: 0, by: "endpoint n1:29554 (10.0.1.1) is this node (Slurm node name n1)"}},
		{"two nodes: the second does not, and says what it compared", nil, slurmStep(2, 2), want{
			nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, given: []string{"n1:29554"},
			local: "10.0.1.2", member: -1, rank: 1,
			by: "endpoint n1:29554 (10.0.1.1) is not an address of this machine: this node has address 10.0.1.2 (SLURMD_NODENAME n2), host name box, Slurm node name n2, interfaces 127.0.0.1"}},
		{"requeued: a new run id per requeue", nil, with(slurmStep(2, 1), "SLURM_RESTART_COUNT", "2"), want{
			nnodes: NNodes{2, 2}, runID: "77-r2", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, local: "10.0.1.1", member: 0}},
		{"array task", nil, with(slurmStep(2, 1), "SLURM_ARRAY_JOB_ID", "70", "SLURM_ARRAY_TASK_ID", "7"), want{
			nnodes: NNodes{2, 2}, runID: "70_7-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, local: "10.0.1.1", member: 0}},
		{"flags win", []string{"--nnodes", "2:3", "--rdzv-endpoint", "n3:5000", "--rdzv-id", "mine", "--local-addr", "n3", "--node-rank", "9"}, slurmStep(3, 1), want{
			nnodes: NNodes{2, 3}, runID: "mine", mode: RdzvEmbedded, endpoints: []string{"10.0.1.3:5000"}, given: []string{"n3:5000"},
			local: "10.0.1.3", member: 0, by: "--local-addr n3 matches endpoint n3:5000 (10.0.1.3)", rank: 9,
			sources: map[string]string{"nnodes": "--nnodes", "rdzv_id": "--rdzv-id", "rdzv_endpoint": "--rdzv-endpoint", "local_addr": "--local-addr n3, resolved"}}},
		{"PET_ variables win", nil, with(slurmStep(3, 1), "PET_NNODES", "2", "PET_RDZV_ID", "pet", "PET_RDZV_ENDPOINT", "10.0.1.3"), want{
			nnodes: NNodes{2, 2}, runID: "pet", mode: RdzvEmbedded, endpoints: []string{"10.0.1.3:29400"}, local: "10.0.1.1", member: -1,
			sources: map[string]string{"nnodes": "PET_NNODES", "rdzv_id": "PET_RDZV_ID", "rdzv_endpoint": "PET_RDZV_ENDPOINT"}}},
		{"nvrx's Slurm line keeps working", []string{"--rdzv_backend=c10d", "--rdzv_endpoint=n1:29500", "--nnodes=2", "--nproc_per_node=2",
			"--ft-param-rank_heartbeat_timeout=60", "--fault-tol-cfg-path=/nonexistent.yaml", "--ignore-missing-fault-tol-cfg"}, slurmStep(2, 1), want{
			nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29500"}, given: []string{"n1:29500"},
			local: "10.0.1.1", member: 0, by: "endpoint n1:29500 (10.0.1.1) is this node (Slurm node name n1)",
			sources: map[string]string{"rdzv_endpoint": "--rdzv-endpoint", "rdzv_backend": "--rdzv-backend", "nnodes": "--nnodes"},
			warn:    "--ft-param-rank-heartbeat-timeout is deprecated: use --ft-rank-heartbeat-timeout"}},
		{"one node: single-node, named after the job", nil, with(slurmStep(1, 1)), want{
			nnodes: NNodes{1, 1}, runID: "77-r0", mode: RdzvSingleNode, member: -1}},
		{"--standalone keeps its own defaults", []string{"--standalone"}, slurmStep(3, 1), want{
			nnodes: NNodes{1, 1}, mode: RdzvSingleNode, member: -1, sources: map[string]string{"nnodes": "default"}}},
		{"an external etcd is not replaced", []string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "etcd.example:2379"}, slurmStep(2, 1), want{
			nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvExternal, endpoints: []string{"etcd.example:2379"}, local: "10.0.1.1", member: -1}},
		{"outside an srun step: a warning", nil, with(slurmStep(2, 1), "SLURM_STEP_NODELIST", ""), want{
			nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, local: "10.0.1.1", member: 0,
			sources: map[string]string{"rdzv_endpoint": "Slurm (SLURM_JOB_NODELIST=n[1-2]: first 1 of 2 nodes)"},
			warn:    "SLURM_NNODES=2 outside an srun step"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRdzv(t, tt.args, tt.env)
			if err != nil {
				t.Fatal(err)
			}
			w := tt.want
			if c.NNodes != w.nnodes || (w.runID != "" && c.RdzvID != w.runID) || c.Rdzv.Mode != w.mode || c.LocalAddr != w.local {
				t.Errorf("nnodes %v run id %q mode %s local %q; want %v %q %s %q", c.NNodes, c.RdzvID, c.Rdzv.Mode, c.LocalAddr, w.nnodes, w.runID, w.mode, w.local)
			}
			if !reflect.DeepEqual(c.Rdzv.Endpoints, w.endpoints) || (w.given != nil && !reflect.DeepEqual(c.Rdzv.Given, w.given)) {
				t.Errorf("endpoints %v given %v; want %v given %v", c.Rdzv.Endpoints, c.Rdzv.Given, w.endpoints, w.given)
			}
			if c.Rdzv.EtcdMember != w.member || c.Rdzv.HostsEtcd != (w.member >= 0) || (w.by != "" && c.Rdzv.HostsEtcdBy != w.by) {
				t.Errorf("member %d (hosts %v) by %q; want %d by %q", c.Rdzv.EtcdMember, c.Rdzv.HostsEtcd, c.Rdzv.HostsEtcdBy, w.member, w.by)
			}
			if w.rank != 0 && c.InfraRank != w.rank {
				t.Errorf("infra rank %d from %s, want %d", c.InfraRank, c.InfraRankFrom, w.rank)
			}
			checkSourcesAndWarnings(t, c, w.sources, w.warn)
		})
	}
}

// TestAddressErrors: a name that resolves nowhere is a one-line usage error
// naming the flag or variable, before anything starts.
func TestAddressErrors(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		subject string
		want    string
	}{
		{"endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", "nowhere:29400"}, nil, "--rdzv-endpoint",
			`--rdzv-endpoint "nowhere:29400": endpoint nowhere:29400: nowhere does not resolve`},
		{"endpoint from PET_", []string{"--nnodes", "2"}, map[string]string{"PET_RDZV_ENDPOINT": "n1,nowhere"}, "PET_RDZV_ENDPOINT",
			`endpoint nowhere:29400: nowhere does not resolve`},
		{"local address", []string{"--nnodes", "2", "--rdzv-endpoint", "n1", "--local-addr", "nowhere"}, nil, "--local-addr",
			`--local-addr "nowhere": nowhere does not resolve: no such host: give an address of this node or a name that resolves to one`},
		{"master address of a static job", []string{"--nnodes", "2", "--rdzv-backend", "static", "--master-addr", "nowhere"}, nil, "--master-addr/--master-port",
			`endpoint nowhere:29500: nowhere does not resolve`},
		{"Slurm node list", nil, with(slurmStep(2, 1), "SLURM_STEP_NODELIST", "n[2-1]"), "SLURM_STEP_NODELIST",
			`SLURM_STEP_NODELIST: slurm: node list "n[2-1]": bad range "2-1" in "n[2-1]": give --rdzv-endpoint`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRdzv(t, tt.args, tt.env)
			checkUsageError(t, err, tt.subject, tt.want)
		})
	}
}

// TestHostNameMasterAddr: a single-node static job's --master-addr name is
// resolved for the ranks; an unknown one is passed on with a warning.
func TestHostNameMasterAddr(t *testing.T) {
	tests := []struct {
		addr, want, source, warn string
	}{
		{"n2", "10.0.1.2", "--master-addr n2, resolved", ""},
		{"10.0.0.3", "10.0.0.3", "--master-addr", ""},
		{"nowhere", "nowhere", "--master-addr", "--master-addr nowhere: nowhere does not resolve"},
	}
	for _, tt := range tests {
		c, err := parseRdzv(t, []string{"--rdzv-backend", "static", "--master-addr", tt.addr}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c.MasterAddr != tt.want || c.Sources["master_addr"] != tt.source || !strings.Contains(strings.Join(c.Warnings, "\n"), tt.warn) {
			t.Errorf("--master-addr %s: %q from %q, warnings %q; want %q from %q, warning %q", tt.addr, c.MasterAddr, c.Sources["master_addr"], c.Warnings, tt.want, tt.source, tt.warn)
		}
	}
}

func TestSlurmPort(t *testing.T) {
	for id, want := range map[string]int{"": 29400, "abc": 29400, "0": 29400, "77": 29554, "499": 30398, "500": 29400, "123456": 29400 + 2*456} {
		if got := slurmPort(id); got != want {
			t.Errorf("slurmPort(%q) = %d, want %d", id, got, want)
		}
	}
}

// TestPrintConfigSources: --print-config says where each value came from.
func TestPrintConfigSources(t *testing.T) {
	c, err := parseRdzv(t, []string{"--nproc-per-node", "2"}, slurmStep(3, 3))
	if err != nil {
		t.Fatal(err)
	}
	out := c.Effective()
	for _, want := range []string{"\nsources:\n", "  nnodes: Slurm (SLURM_NNODES=3)\n", "  nproc_per_node: --nproc-per-node\n",
		"  local_addr: SLURMD_NODENAME n3\n", "  rdzv_id: Slurm (SLURM_JOB_ID=77, SLURM_RESTART_COUNT=0)\n", "  max_restarts: default\n",
		"  endpoints_given:\n    - n1:29554\n", "  infra_rank_from: SLURM_PROCID\n", "  rdzv_endpoint: n1:29554,n2:29554,n3:29554\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
}

// TestLoopbackHostWarns: a host name that /etc/hosts maps to 127.0.1.1 on
// the hosting node (Debian's default) would put the embedded etcd out of
// the other nodes' reach: the launcher warns.
func TestLoopbackHostWarns(t *testing.T) {
	m := noGPU(t)
	m.net = Network{
		Resolve:  func(string) ([]string, error) { return []string{"127.0.1.1"}, nil },
		LocalIPs: func() []string { return []string{"127.0.0.1", "10.0.0.7"} },
		RouteTo:  func(string) string { return "10.0.0.7" },
		Hostname: func() string { return "box" },
	}
	c, err := parse([]string{"--nnodes", "2", "--rdzv-endpoint", "box", "train.py"}, envOf(nil), m)
	if err != nil {
		t.Fatal(err)
	}
	if !c.Rdzv.HostsEtcd || !strings.Contains(strings.Join(c.Warnings, "\n"), "the embedded etcd will listen on 127.0.1.1:29400, a loopback address, although this node's address is 10.0.0.7") {
		t.Errorf("hosts %v, warnings %q; want hosting with a loopback warning", c.Rdzv.HostsEtcd, c.Warnings)
	}
}

// checkSourcesAndWarnings: each named setting came from the given source,
// and the warnings are empty when warn is, else contain it.
func checkSourcesAndWarnings(t *testing.T, c *Config, sources map[string]string, warn string) {
	t.Helper()
	for k, v := range sources {
		if c.Sources[k] != v {
			t.Errorf("source of %s = %q, want %q", k, c.Sources[k], v)
		}
	}
	if got := strings.Join(c.Warnings, "\n"); (warn == "") != (got == "") || !strings.Contains(got, warn) {
		t.Errorf("warnings %q, want %q", c.Warnings, warn)
	}
}
