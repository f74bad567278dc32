package configs

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// podNet is pod host of a Job or StatefulSet whose pods are named
// <base>-<n> with address 10.0.2.<n>, its /etc/hosts (a real file) as the
// kubelet writes it: with the pod's FQDN under subdomain svc when svc is
// set. Cluster DNS knows only the names in dns.
func podNet(t *testing.T, host, svc string, dns map[string]string) Network {
	t.Helper()
	ip := "10.0.2." + host[strings.LastIndexByte(host, '-')+1:]
	line := ip + "\t" + host
	if svc != "" {
		line = fmt.Sprintf("%s\t%s.%s.ns.svc.cluster.local\t%s", ip, host, svc, host)
	}
	path := filepath.Join(t.TempDir(), "hosts")
	writeFile(t, path, "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"+line+"\n")
	return Network{
		Resolve: func(h string) ([]string, error) {
			if a, ok := dns[h]; ok {
				return []string{a}, nil
			}
			if h == host { // /etc/hosts
				return []string{ip}, nil
			}
			return nil, fmt.Errorf("lookup %s: no such host", h)
		},
		LocalIPs: func() []string { return []string{"127.0.0.1", ip} },
		RouteTo:  func(string) string { return ip },
		Hostname: func() string { return host },
		EtcHosts: func() ([]byte, error) { return os.ReadFile(path) },
	}
}

// pod is the environment of pod host: an Indexed Job's when index >= 0.
func pod(host string, index int, kv ...string) map[string]string {
	env := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "HOSTNAME": host}
	if index >= 0 {
		env["JOB_COMPLETION_INDEX"] = fmt.Sprint(index)
	}
	return with(env, kv...)
}

func parsePod(t *testing.T, args []string, env map[string]string, nw Network) (*Config, error) {
	t.Helper()
	m := noGPU(t)
	m.net = nw
	return parse(append(args, "train.py"), envOf(env), m)
}

// TestK8sDefaults: in a pod of an Indexed Job, a JobSet, an AppWrapper or a
// StatefulSet the minimal launch line gets its run id, node order,
// endpoint and local address from the pod, and every flag, PET_ variable
// or Slurm job still wins.
func TestK8sDefaults(t *testing.T) {
	const fqdn0 = "train-0.train.ns.svc.cluster.local"
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
		from      string
		connect   time.Duration
		sources   map[string]string
		warn      string
	}
	tests := []struct {
		name string
		args []string
		env  map[string]string
		nw   Network
		want want
	}{
		{"indexed job, pod 0 hosts under its own FQDN", nil, pod("train-0", 0, "PET_NNODES", "4"), podNet(t, "train-0", "train", nil), want{
			nnodes: NNodes{4, 4}, runID: "train", mode: RdzvEmbedded, endpoints: []string{"10.0.2.0:29400"}, given: []string{fqdn0 + ":29400"},
			local: "10.0.2.0", member: 0, by: "endpoint " + fqdn0 + ":29400 (10.0.2.0) is this node (pod FQDN " + fqdn0 + ")",
			rank: 0, from: "JOB_COMPLETION_INDEX", connect: podConnectTimeout,
			sources: map[string]string{"nnodes": "PET_NNODES", "rdzv_id": "Kubernetes (Indexed Job train from HOSTNAME=train-0)",
				"rdzv_endpoint": "Kubernetes (the index-0 pod under subdomain train: /etc/hosts " + fqdn0 + ")",
				"local_addr":    "/etc/hosts " + fqdn0, "rdzv_conf": "default"}}},
		{"indexed job, pod 3 before pod 0 is in DNS: the name is kept", nil, pod("train-3", 3, "PET_NNODES", "4"), podNet(t, "train-3", "train", nil), want{
			nnodes: NNodes{4, 4}, runID: "train", mode: RdzvEmbedded, endpoints: []string{fqdn0 + ":29400"}, local: "10.0.2.3", member: -1,
			by:   "endpoint " + fqdn0 + ":29400 is not an address of this machine: this node has address 10.0.2.3 (/etc/hosts train-3.train.ns.svc.cluster.local), host name train-3, pod FQDN train-3.train.ns.svc.cluster.local, interfaces 127.0.0.1,10.0.2.3",
			rank: 3, from: "JOB_COMPLETION_INDEX", connect: podConnectTimeout,
			warn: "Kubernetes (the index-0 pod under subdomain train: /etc/hosts train-3.train.ns.svc.cluster.local): " + fqdn0 + " does not resolve yet (lookup " + fqdn0 + ": no such host); the rendezvous resolves it when it connects"}},
		{"indexed job, pod 3 once pod 0 is in DNS", nil, pod("train-3", 3, "PET_NNODES", "4"), podNet(t, "train-3", "train", map[string]string{fqdn0: "10.0.2.0"}), want{
			nnodes: NNodes{4, 4}, runID: "train", mode: RdzvEmbedded, endpoints: []string{"10.0.2.0:29400"}, given: []string{fqdn0 + ":29400"},
			local: "10.0.2.3", member: -1, rank: 3, connect: podConnectTimeout}},
		{"appwrapper: its name and reset count", nil, pod("train-1", 1, "PET_NNODES", "2", "FTL_WORKLOAD", "team-a/llama", "FTL_WORKLOAD_RESETS", "2"),
			podNet(t, "train-1", "train", nil), want{
				nnodes: NNodes{2, 2}, runID: "llama-r2", mode: RdzvEmbedded, endpoints: []string{fqdn0 + ":29400"}, local: "10.0.2.1", member: -1, rank: 1,
				sources: map[string]string{"rdzv_id": "Kubernetes (FTL_WORKLOAD=team-a/llama, FTL_WORKLOAD_RESETS=2)"}, warn: "does not resolve yet"}},
		{"jobset: the job and its restart attempt", nil, pod("js-workers-0-2", 2, "PET_NNODES", "4", "JOBSET_RESTART_ATTEMPT", "1"),
			podNet(t, "js-workers-0-2", "js", nil), want{
				nnodes: NNodes{4, 4}, runID: "js-workers-0-r1", mode: RdzvEmbedded, endpoints: []string{"js-workers-0-0.js.ns.svc.cluster.local:29400"},
				local: "10.0.2.2", member: -1, rank: 2,
				sources: map[string]string{"rdzv_id": "Kubernetes (Indexed Job js-workers-0 from HOSTNAME=js-workers-0-2, JOBSET_RESTART_ATTEMPT=1)"}, warn: "does not resolve yet"}},
		{"FTL_RDZV_SERVICE: pod 0 hosts on its own address", nil, pod("train-0", 0, "PET_NNODES", "2", "FTL_RDZV_SERVICE", "rdzv"),
			podNet(t, "train-0", "", map[string]string{"rdzv": "10.96.7.7"}), want{
				nnodes: NNodes{2, 2}, runID: "train", mode: RdzvEmbedded, endpoints: []string{"10.0.2.0:29400"}, given: []string{"rdzv:29400"},
				local: "10.0.2.0", member: 0, by: "FTL_RDZV_SERVICE: the index-0 pod hosts (JOB_COMPLETION_INDEX=0), listening on its own address 10.0.2.0:29400",
				connect: podConnectTimeout, sources: map[string]string{"rdzv_endpoint": "Kubernetes (FTL_RDZV_SERVICE=rdzv)", "local_addr": "the route to 10.96.7.7"}}},
		{"FTL_RDZV_SERVICE: the others connect to it", nil, pod("train-2", 2, "PET_NNODES", "3", "FTL_RDZV_SERVICE", "rdzv.ns.svc:3000"),
			podNet(t, "train-2", "train", nil), want{
				nnodes: NNodes{3, 3}, runID: "train", mode: RdzvEmbedded, endpoints: []string{"rdzv.ns.svc:3000"}, local: "10.0.2.2", member: -1,
				by: "FTL_RDZV_SERVICE: the index-0 pod hosts; this pod is JOB_COMPLETION_INDEX=2", warn: "rdzv.ns.svc does not resolve yet"}},
		{"statefulset: the ordinal orders, the run id stays", nil, pod("trainer-1", -1, "PET_NNODES", "2"), podNet(t, "trainer-1", "trainers", nil), want{
			nnodes: NNodes{2, 2}, runID: "none", mode: RdzvEmbedded, endpoints: []string{"trainer-0.trainers.ns.svc.cluster.local:29400"},
			local: "10.0.2.1", member: -1, rank: 1, from: "pod ordinal of HOSTNAME=trainer-1", sources: map[string]string{"rdzv_id": "default"},
			warn: "does not resolve yet"}},
		{"HOSTNAME unset: the host name", nil, with(pod("", 2, "PET_NNODES", "3"), "HOSTNAME", ""), podNet(t, "train-2", "train", nil), want{
			nnodes: NNodes{3, 3}, runID: "train", mode: RdzvEmbedded, endpoints: []string{fqdn0 + ":29400"}, local: "10.0.2.2", member: -1, rank: 2,
			warn: "does not resolve yet"}},
		{"one pod: single node, named after its job", nil, pod("train-0", 0), podNet(t, "train-0", "train", nil), want{
			nnodes: NNodes{1, 1}, runID: "train", mode: RdzvSingleNode, member: -1, sources: map[string]string{"rdzv_endpoint": "default"}, connect: 20 * time.Second}},
		{"flags win", []string{"--nnodes", "2", "--rdzv-endpoint", "10.0.2.9", "--rdzv-id", "mine", "--node-rank", "5"}, pod("train-1", 1, "FTL_RDZV_SERVICE", "rdzv"),
			podNet(t, "train-1", "train", nil), want{
				nnodes: NNodes{2, 2}, runID: "mine", mode: RdzvEmbedded, endpoints: []string{"10.0.2.9:29400"}, local: "10.0.2.1", member: -1, rank: 5,
				connect: 20 * time.Second, sources: map[string]string{"rdzv_id": "--rdzv-id", "rdzv_endpoint": "--rdzv-endpoint", "nnodes": "--nnodes"}}},
		{"PET_ variables win", nil, pod("train-1", 1, "PET_NNODES", "2", "PET_RDZV_ENDPOINT", "10.0.2.9:1234", "PET_RDZV_ID", "pet", "FTL_WORKLOAD", "ns/aw"),
			podNet(t, "train-1", "train", nil), want{
				nnodes: NNodes{2, 2}, runID: "pet", mode: RdzvEmbedded, endpoints: []string{"10.0.2.9:1234"}, local: "10.0.2.1", member: -1, rank: 1,
				sources: map[string]string{"rdzv_id": "PET_RDZV_ID", "rdzv_endpoint": "PET_RDZV_ENDPOINT"}}},
		{"a given connect_timeout stays", []string{"--rdzv-conf", "connect_timeout=5"}, pod("train-1", 1, "PET_NNODES", "2"), podNet(t, "train-1", "train", nil), want{
			nnodes: NNodes{2, 2}, runID: "train", mode: RdzvEmbedded, endpoints: []string{fqdn0 + ":29400"}, local: "10.0.2.1", member: -1, rank: 1,
			connect: 5 * time.Second, warn: "does not resolve yet"}},
		{"an external etcd is not replaced", []string{"--rdzv-backend", "etcd", "--rdzv-endpoint", "etcd.infra:2379"}, pod("train-1", 1, "PET_NNODES", "2"),
			podNet(t, "train-1", "train", nil), want{
				nnodes: NNodes{2, 2}, runID: "train", mode: RdzvExternal, endpoints: []string{"etcd.infra:2379"}, local: "10.0.2.1", member: -1, rank: 1,
				connect: 20 * time.Second}},
		{"--standalone keeps its own defaults", []string{"--standalone"}, pod("train-0", 0, "FTL_WORKLOAD", "ns/aw"), podNet(t, "train-0", "train", nil), want{
			nnodes: NNodes{1, 1}, mode: RdzvSingleNode, member: -1, sources: map[string]string{"rdzv_id": "default"}}},
		{"a Slurm job in a pod is a Slurm job", nil, with(slurmStep(2, 1), "KUBERNETES_SERVICE_HOST", "10.96.0.1", "HOSTNAME", "slurmd-0", "FTL_RDZV_SERVICE", "rdzv"),
			fakeNet(), want{
				nnodes: NNodes{2, 2}, runID: "77-r0", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29554"}, local: "10.0.1.1", member: 0, rank: 0, from: "SLURM_PROCID",
				connect: 20 * time.Second}},
		{"outside a pod the variables are ignored", nil, map[string]string{"FTL_WORKLOAD": "ns/aw", "FTL_RDZV_SERVICE": "rdzv", "PET_NNODES": "2", "PET_RDZV_ENDPOINT": "n1"},
			fakeNet(), want{
				nnodes: NNodes{2, 2}, runID: "none", mode: RdzvEmbedded, endpoints: []string{"10.0.1.1:29400"}, local: "10.0.0.7", member: -1,
				warn: "FTL_WORKLOAD is set but this is not a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset); ignored\nFTL_RDZV_SERVICE is set but this is not a Kubernetes pod"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parsePod(t, tt.args, tt.env, tt.nw)
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
			if (w.rank != 0 || w.from != "") && c.InfraRank != w.rank || w.from != "" && c.InfraRankFrom != w.from {
				t.Errorf("infra rank %d from %q, want %d from %q", c.InfraRank, c.InfraRankFrom, w.rank, w.from)
			}
			if w.connect != 0 && c.Rdzv.ConnectTimeout != w.connect {
				t.Errorf("connect_timeout %v, want %v", c.Rdzv.ConnectTimeout, w.connect)
			}
			checkSourcesAndWarnings(t, c, w.sources, w.warn)
		})
	}
}

// TestK8sErrors: a malformed variable, or a pod that cannot find the others,
// is a one-line usage error naming the variable or flag and what is
// allowed, before anything starts.
func TestK8sErrors(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		nw      Network
		subject string
		want    string
	}{
		{"FTL_WORKLOAD", pod("train-0", 0, "FTL_WORKLOAD", "llama"), podNet(t, "train-0", "train", nil), "FTL_WORKLOAD",
			`FTL_WORKLOAD="llama": must be <namespace>/<name> of the AppWrapper (set by the ft-launcher controller)`},
		{"FTL_WORKLOAD outside a pod", map[string]string{"FTL_WORKLOAD": "Team/x"}, fakeNet(), "FTL_WORKLOAD", `FTL_WORKLOAD="Team/x": must be`},
		{"FTL_WORKLOAD_RESETS", pod("train-0", 0, "FTL_WORKLOAD", "ns/aw", "FTL_WORKLOAD_RESETS", "-2"), podNet(t, "train-0", "train", nil), "FTL_WORKLOAD_RESETS",
			`FTL_WORKLOAD_RESETS="-2": must be an integer from 0 to 2147483647: the AppWrapper's status.resettingCount`},
		{"JOBSET_RESTART_ATTEMPT", pod("train-0", 0, "JOBSET_RESTART_ATTEMPT", "one"), podNet(t, "train-0", "train", nil), "JOBSET_RESTART_ATTEMPT",
			`JOBSET_RESTART_ATTEMPT="one": must be an integer from 0 to 2147483647`},
		{"FTL_RDZV_SERVICE list", pod("train-0", 0, "FTL_RDZV_SERVICE", "a,b"), podNet(t, "train-0", "train", nil), "FTL_RDZV_SERVICE",
			`FTL_RDZV_SERVICE="a,b": one name only: give the DNS name of a Service that reaches the index-0 pod, NAME[:PORT] (default port 29400)`},
		{"FTL_RDZV_SERVICE port", pod("train-0", 0, "FTL_RDZV_SERVICE", "rdzv:99999"), podNet(t, "train-0", "train", nil), "FTL_RDZV_SERVICE",
			`FTL_RDZV_SERVICE="rdzv:99999": endpoint "rdzv:99999": the port must be 1-65535`},
		{"FTL_RDZV_SERVICE scheme", pod("train-0", 0, "FTL_RDZV_SERVICE", "http://rdzv"), podNet(t, "train-0", "train", nil), "FTL_RDZV_SERVICE",
			`give host[:port] without a scheme`},
		{"FTL_RDZV_SERVICE outside a pod", map[string]string{"FTL_RDZV_SERVICE": "rdzv:0"}, fakeNet(), "FTL_RDZV_SERVICE",
			`FTL_RDZV_SERVICE="rdzv:0": endpoint "rdzv:0": the port must be 1-65535`},
		{"index 2 of a job with no node count", pod("train-2", 2), podNet(t, "train-2", "train", nil), "--nnodes",
			`--nnodes is not given (default 1), but this pod is JOB_COMPLETION_INDEX=2 of an Indexed Job: set PET_NNODES in the pod template`},
		{"no subdomain, no service", pod("train-1", 1, "PET_NNODES", "2"), podNet(t, "train-1", "", nil), "--rdzv-endpoint",
			`--rdzv-endpoint is required with --nnodes 2:2 and --rdzv-backend c10d: give host[:port] of the rendezvous (default port 29400); in a pod, give the pod template a subdomain (spec.subdomain: a headless Service) or set FTL_RDZV_SERVICE: /etc/hosts has no <host>.<subdomain>.<namespace>.svc.<domain> name for host name "train-1"`},
		{"no index", pod("train-x", -1, "PET_NNODES", "2"), podNet(t, "train-x", "train", nil), "--rdzv-endpoint",
			`set FTL_RDZV_SERVICE: this pod has no JOB_COMPLETION_INDEX and its host name "train-x" does not end in -N`},
		{"index not in the host name", pod("train-1", 4, "PET_NNODES", "8"), podNet(t, "train-1", "train", nil), "--rdzv-endpoint",
			`its host name "train-1" does not end in -4`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parsePod(t, nil, tt.env, tt.nw)
			checkUsageError(t, err, tt.subject, tt.want)
		})
	}
}

// TestK8sPrintConfig: --print-config says which values came from the pod.
func TestK8sPrintConfig(t *testing.T) {
	c, err := parsePod(t, []string{"--nproc-per-node", "2"}, pod("train-0", 0, "PET_NNODES", "2", "FTL_WORKLOAD", "ns/aw", "FTL_WORKLOAD_RESETS", "1"),
		podNet(t, "train-0", "train", nil))
	if err != nil {
		t.Fatal(err)
	}
	out := c.Effective()
	for _, want := range []string{"  rdzv_id: Kubernetes (FTL_WORKLOAD=ns/aw, FTL_WORKLOAD_RESETS=1)\n",
		"  rdzv_endpoint: 'Kubernetes (the index-0 pod under subdomain train: /etc/hosts train-0.train.ns.svc.cluster.local)'\n",
		"  nnodes: PET_NNODES\n", "  infra_rank_from: JOB_COMPLETION_INDEX\n", "  connect_timeout: 600\n", "  rdzv_id: aw-r1\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("--print-config lacks %q:\n%s", want, out)
		}
	}
}

// TestTerminationLog: flag > FT_LAUNCHER_TERMINATION_LOG > PET_TERMINATION_LOG
// > YAML > in a pod, the kubelet's file when it exists > off.
func TestTerminationLog(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "ft.yaml")
	writeFile(t, yml, "fault_tolerance:\n  termination_log: /yaml/t.log\n")
	nullYML := filepath.Join(dir, "null.yaml")
	writeFile(t, nullYML, "fault_tolerance:\n  termination_log: null\n")
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		kubelets bool // the kubelet's file exists
		want     string
		source   string
	}{
		{"outside a pod: off", nil, nil, true, "", "default"},
		{"in a pod: the kubelet's file", nil, inPod, true, "<dev>/termination-log", "Kubernetes (<dev>/termination-log)"},
		{"in a pod without the file: off", nil, inPod, false, "", "default"},
		{"flag", []string{"--termination-log", "/f/t.log"}, nil, false, "/f/t.log", "--termination-log"},
		{"empty flag disables it in a pod", []string{"--termination-log", ""}, inPod, true, "", "--termination-log"},
		{"underscore flag", []string{"--termination_log=/f/u.log"}, inPod, true, "/f/u.log", "--termination-log"},
		{"PET_TERMINATION_LOG", nil, with(inPod, "PET_TERMINATION_LOG", "/pet/t.log"), true, "/pet/t.log", "PET_TERMINATION_LOG"},
		{"FT_LAUNCHER_TERMINATION_LOG beats PET_TERMINATION_LOG", nil, map[string]string{"PET_TERMINATION_LOG": "/pet/t.log", "FT_LAUNCHER_TERMINATION_LOG": "/ftl/t.log"},
			false, "/ftl/t.log", "FT_LAUNCHER_TERMINATION_LOG"},
		{"flag beats the variables", []string{"--termination-log", "/f/t.log"}, map[string]string{"FT_LAUNCHER_TERMINATION_LOG": "/ftl/t.log"}, false, "/f/t.log", "--termination-log"},
		{"YAML", []string{"--ft-cfg-path", yml}, inPod, true, "/yaml/t.log", "--ft-cfg-path fault_tolerance.termination_log"},
		{"YAML null disables it in a pod", []string{"--ft-cfg-path", nullYML}, inPod, true, "", "--ft-cfg-path fault_tolerance.termination_log"},
		{"variable beats YAML", []string{"--ft-cfg-path", yml}, map[string]string{"FT_LAUNCHER_TERMINATION_LOG": "/ftl/t.log"}, false, "/ftl/t.log", "FT_LAUNCHER_TERMINATION_LOG"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := noGPU(t)
			if tt.kubelets {
				writeFile(t, filepath.Join(m.devDir, "termination-log"), "")
			}
			c, err := parse(append(tt.args, "train.py"), envOf(tt.env), m)
			if err != nil {
				t.Fatal(err)
			}
			want := strings.ReplaceAll(tt.want, "<dev>", m.devDir)
			if c.TerminationLog != want || c.Sources["termination_log"] != strings.ReplaceAll(tt.source, "<dev>", m.devDir) {
				t.Errorf("TerminationLog = %q from %q, want %q from %q", c.TerminationLog, c.Sources["termination_log"], want, tt.source)
			}
			if len(c.Warnings) != 0 {
				t.Errorf("unexpected warnings %q", c.Warnings)
			}
			if !strings.Contains(c.Effective(), "termination_log: "+want) {
				t.Errorf("--print-config does not show termination_log %q", want)
			}
		})
	}
	u := strings.Join(strings.Fields(Usage()), " ")
	for _, want := range []string{"--termination-log PATH", "env PET_TERMINATION_LOG, FT_LAUNCHER_TERMINATION_LOG",
		"/dev/termination-log in a Kubernetes pod when it exists", "at most 4096 bytes", "docs/kubernetes.md"} {
		if !strings.Contains(u, want) {
			t.Errorf("Usage() lacks %q", want)
		}
	}
}
