package k8s

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// unset is the Env of a pod that sets none of the optional variables.
func unset(e Env) Env {
	e.WorkloadResets, e.JobSetRestartAttempt = -1, -1
	return e
}

func TestFromEnv(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		want Env
	}{
		{"outside kubernetes", nil, unset(Env{CompletionIndex: -1, PodOrdinal: -1})},
		{"indexed job pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "2", "HOSTNAME": "train-2"},
			unset(Env{InPod: true, CompletionIndex: 2, Hostname: "train-2", PodOrdinal: 2})},
		{"statefulset pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-12"},
			unset(Env{InPod: true, CompletionIndex: -1, Hostname: "trainer-12", PodOrdinal: 12})},
		{"host name as FQDN", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "HOSTNAME": "trainer-4.svc.ns.svc.cluster.local"},
			unset(Env{InPod: true, CompletionIndex: -1, Hostname: "trainer-4.svc.ns.svc.cluster.local", PodOrdinal: 4})},
		{"malformed completion index", map[string]string{"JOB_COMPLETION_INDEX": "two"},
			unset(Env{CompletionIndex: -1, PodOrdinal: -1, Invalid: []string{`JOB_COMPLETION_INDEX="two"`}})},
		{"negative completion index", map[string]string{"JOB_COMPLETION_INDEX": "-1"},
			unset(Env{CompletionIndex: -1, PodOrdinal: -1, Invalid: []string{`JOB_COMPLETION_INDEX="-1"`}})},
		{"appwrapper pod", map[string]string{"KUBERNETES_SERVICE_HOST": "10.0.0.1", "FTL_WORKLOAD": "team-a/llama.70b", "FTL_WORKLOAD_RESETS": "3",
			"JOBSET_RESTART_ATTEMPT": "1", "FTL_RDZV_SERVICE": " rdzv.team-a:2000 "},
			Env{InPod: true, CompletionIndex: -1, PodOrdinal: -1, WorkloadNamespace: "team-a", WorkloadName: "llama.70b", WorkloadResets: 3,
				JobSetRestartAttempt: 1, RdzvService: "rdzv.team-a:2000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FromEnv(func(k string) string { return tt.env[k] }); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FromEnv() =\n %+v\nwant\n %+v", got, tt.want)
			}
		})
	}
}

// TestFromEnvErrors: a malformed variable of ours is an error naming it and
// what it allows.
func TestFromEnvErrors(t *testing.T) {
	tests := []struct {
		name, variable, value, want string
	}{
		{"workload without namespace", "FTL_WORKLOAD", "llama", "must be <namespace>/<name> of the AppWrapper"},
		{"workload with two slashes", "FTL_WORKLOAD", "a/b/c", "must be <namespace>/<name>"},
		{"workload upper case", "FTL_WORKLOAD", "NS/llama", "lower-case letters, digits"},
		{"workload empty name", "FTL_WORKLOAD", "ns/", "must be <namespace>/<name>"},
		{"workload dot in namespace", "FTL_WORKLOAD", "a.b/llama", "a DNS label"},
		{"workload label ends in -", "FTL_WORKLOAD", "ns/llama-.x", "must be <namespace>/<name>"},
		{"workload name too long", "FTL_WORKLOAD", "ns/" + strings.Repeat("a", 254), "must be <namespace>/<name>"},
		{"resets not a number", "FTL_WORKLOAD_RESETS", "x", "must be an integer from 0 to 2147483647: the AppWrapper's status.resettingCount"},
		{"resets negative", "FTL_WORKLOAD_RESETS", "-1", "must be an integer from 0"},
		{"resets beyond int32", "FTL_WORKLOAD_RESETS", "2147483648", "must be an integer from 0 to 2147483647"},
		{"restart attempt", "JOBSET_RESTART_ATTEMPT", "1.5", "jobset.sigs.k8s.io/restart-attempt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := FromEnv(func(k string) string { return map[string]string{tt.variable: tt.value}[k] })
			if len(e.Errors) != 1 {
				t.Fatalf("errors %v, want one", e.Errors)
			}
			err := e.Errors[0]
			if err.Name != tt.variable || err.Value != tt.value || !strings.HasPrefix(err.Error(), tt.variable+"=") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q (%s), want one naming %s and containing %q", err, err.Name, tt.variable, tt.want)
			}
		})
	}
}

func TestRunID(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string
		id, from string
	}{
		{"appwrapper", map[string]string{"FTL_WORKLOAD": "ns/llama", "FTL_WORKLOAD_RESETS": "2", "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "job-1"},
			"llama-r2", "FTL_WORKLOAD=ns/llama, FTL_WORKLOAD_RESETS=2"},
		{"appwrapper before its first reset count", map[string]string{"FTL_WORKLOAD": "ns/llama"}, "llama-r0", "FTL_WORKLOAD=ns/llama, FTL_WORKLOAD_RESETS=0"},
		{"indexed job", map[string]string{"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "train-3"}, "train", "Indexed Job train from HOSTNAME=train-3"},
		{"jobset", map[string]string{"JOB_COMPLETION_INDEX": "0", "HOSTNAME": "js-workers-0-0", "JOBSET_RESTART_ATTEMPT": "4"},
			"js-workers-0-r4", "Indexed Job js-workers-0 from HOSTNAME=js-workers-0-0, JOBSET_RESTART_ATTEMPT=4"},
		{"host name does not carry the index", map[string]string{"JOB_COMPLETION_INDEX": "3", "HOSTNAME": "train-2"}, "", ""},
		{"statefulset: not a job", map[string]string{"KUBERNETES_SERVICE_HOST": "x", "HOSTNAME": "trainer-2"}, "", ""},
		{"nothing", nil, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, from := FromEnv(func(k string) string { return tt.env[k] }).RunID()
			if id != tt.id || from != tt.from {
				t.Errorf("RunID() = %q, %q; want %q, %q", id, from, tt.id, tt.from)
			}
		})
	}
}

func TestIndexAndPeer(t *testing.T) {
	hosts := []byte("# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.0.0.5\ttrain-3.train.ns.svc.cluster.local\ttrain-3\n")
	tests := []struct {
		name       string
		env        map[string]string
		index      int
		from, peer string
	}{
		{"indexed job", map[string]string{"KUBERNETES_SERVICE_HOST": "x", "JOB_COMPLETION_INDEX": "3", "HOSTNAME": "train-3"},
			3, "JOB_COMPLETION_INDEX", "train-0.train.ns.svc.cluster.local"},
		{"statefulset", map[string]string{"KUBERNETES_SERVICE_HOST": "x", "HOSTNAME": "train-3"},
			3, "pod ordinal of HOSTNAME=train-3", "train-0.train.ns.svc.cluster.local"},
		{"ordinal outside a pod means nothing", map[string]string{"HOSTNAME": "train-3"}, -1, "", ""},
		{"index not in the host name", map[string]string{"KUBERNETES_SERVICE_HOST": "x", "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "train-3"},
			1, "JOB_COMPLETION_INDEX", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := FromEnv(func(k string) string { return tt.env[k] })
			e.DNS, _ = ParseHosts(hosts, e.Hostname)
			if n, from := e.Index(); n != tt.index || from != tt.from {
				t.Errorf("Index() = %d, %q; want %d, %q", n, from, tt.index, tt.from)
			}
			if got := e.PeerFQDN(0); got != tt.peer {
				t.Errorf("PeerFQDN(0) = %q, want %q", got, tt.peer)
			}
		})
	}
}

// TestParseHosts reads /etc/hosts files as the kubelet writes them, from
// real files.
func TestParseHosts(t *testing.T) {
	const head = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
	tests := []struct {
		name, content, host string
		want                PodDNS
		ok                  bool
	}{
		{"subdomain", head + "10.244.1.5\ttrain-3.train.default.svc.cluster.local\ttrain-3\n", "train-3",
			PodDNS{IPs: []string{"10.244.1.5"}, FQDN: "train-3.train.default.svc.cluster.local", Subdomain: "train", Namespace: "default", ClusterDomain: "cluster.local"}, true},
		{"dual stack, IPv4 first", head + "fd00::5\ttrain-3.t.ns.svc.k8s.example.com\ttrain-3\n10.0.0.5\ttrain-3.t.ns.svc.k8s.example.com\ttrain-3\n", "train-3",
			PodDNS{IPs: []string{"10.0.0.5", "fd00::5"}, FQDN: "train-3.t.ns.svc.k8s.example.com", Subdomain: "t", Namespace: "ns", ClusterDomain: "k8s.example.com"}, true},
		{"host name as FQDN", head + "10.0.0.5\ttrain-3.t.ns.svc.cluster.local\ttrain-3\n", "train-3.t.ns.svc.cluster.local",
			PodDNS{IPs: []string{"10.0.0.5"}, FQDN: "train-3.t.ns.svc.cluster.local", Subdomain: "t", Namespace: "ns", ClusterDomain: "cluster.local"}, true},
		{"no subdomain", head + "10.0.0.5\ttrain-3-x7k2p\n", "train-3-x7k2p", PodDNS{}, false},
		{"another pod's name", head + "10.0.0.9\ttrain-1.train.ns.svc.cluster.local\n", "train-3", PodDNS{}, false},
		{"not a service name", head + "10.0.0.5\ttrain-3.example.com.x.y\n", "train-3", PodDNS{}, false},
		{"comments and junk", head + "# 10.0.0.1 train-3.t.ns.svc.cluster.local\nnot-an-ip train-3.t.ns.svc.cluster.local\n10.0.0.5 train-3\n", "train-3", PodDNS{}, false},
		{"no host name", head, "", PodDNS{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "hosts")
			if err := os.WriteFile(path, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := ParseHosts(b, tt.host)
			if ok != tt.ok || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseHosts() = %+v, %v; want %+v, %v", got, ok, tt.want, tt.ok)
			}
			if ok && got.Name("train-0") != "train-0."+got.Subdomain+"."+got.Namespace+".svc."+got.ClusterDomain {
				t.Errorf("Name(train-0) = %q", got.Name("train-0"))
			}
		})
	}
}

func TestPodOrdinal(t *testing.T) {
	tests := []struct {
		host string
		n    int
		ok   bool
	}{
		{"trainer-0", 0, true},
		{"my-job-worker-17", 17, true},
		{"trainer", -1, false},
		{"trainer-", -1, false},
		{"-3", -1, false},
		{"trainer-3a", -1, false},
		{"trainer-+3", -1, false},
		{"", -1, false},
		{"trainer-99999999999999999999999", -1, false},
	}
	for _, tt := range tests {
		if n, ok := PodOrdinal(tt.host); n != tt.n || ok != tt.ok {
			t.Errorf("PodOrdinal(%q) = %d, %v; want %d, %v", tt.host, n, ok, tt.n, tt.ok)
		}
	}
}
