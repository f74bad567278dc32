package configs

import (
	"fmt"
	"reflect"
	"testing"
)

// TestRelayConf: relay_group and relay_port are read inside a Slurm job
// with a job secret, the node list expanded; anything else is a usage
// error that names the key and what is allowed.
func TestRelayConf(t *testing.T) {
	multi := []string{"--nnodes", "4", "--rdzv-endpoint", "10.0.0.1", "--job-secret-file", "/run/secrets/job"}
	slurmEnv := func(nodeID string) map[string]string {
		return map[string]string{"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3],gpu07", "SLURM_NODEID": nodeID}
	}
	t.Run("off by default", func(t *testing.T) {
		c, err := parseRdzv(t, multi, slurmEnv("1"))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(c.Rdzv.Relay, Relay{}) {
			t.Fatalf("Relay = %+v, want off", c.Rdzv.Relay)
		}
	})
	for _, tt := range []struct {
		name, conf, nodeID string
		want               Relay
		relay              string
		self               bool
	}{
		{"a member", "relay_group=2", "1", Relay{Group: 2, Port: DefaultRelayPort, Nodes: []string{"n1", "n2", "n3", "gpu07"}, Index: 1}, "n1", false},
		{"a relay", "relay_group=2,relay_port=4000", "2", Relay{Group: 2, Port: 4000, Nodes: []string{"n1", "n2", "n3", "gpu07"}, Index: 2}, "n3", true},
		{"a group larger than the job", "relay_group=64", "3", Relay{Group: 64, Port: DefaultRelayPort, Nodes: []string{"n1", "n2", "n3", "gpu07"}, Index: 3}, "n1", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseRdzv(t, append(multi, "--rdzv-conf", tt.conf), slurmEnv(tt.nodeID))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Rdzv.Relay, tt.want) {
				t.Fatalf("Relay = %+v, want %+v", c.Rdzv.Relay, tt.want)
			}
			if name, self := c.Rdzv.Relay.RelayNode(); name != tt.relay || self != tt.self {
				t.Fatalf("RelayNode() = %s, %v; want %s, %v", name, self, tt.relay, tt.self)
			}
		})
	}
	for _, tt := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"not a number", append(multi, "--rdzv-conf", "relay_group=many"), slurmEnv("0"), `--rdzv-conf relay_group="many": must be a whole number from 0 to 1024`},
		{"too large", append(multi, "--rdzv-conf", "relay_group=2000"), slurmEnv("0"), `--rdzv-conf relay_group="2000": must be a whole number from 0 to 1024`},
		{"one", append(multi, "--rdzv-conf", "relay_group=1"), slurmEnv("0"), "--rdzv-conf relay_group=1: a relay for one node saves nothing; use 0 (off) or 2 to 1024"},
		{"port 0", append(multi, "--rdzv-conf", "relay_group=2,relay_port=0"), slurmEnv("0"), `--rdzv-conf relay_port="0": must be a whole number from 1 to 65535`},
		{"outside Slurm", append(multi, "--rdzv-conf", "relay_group=2"), nil, "--rdzv-conf relay_group: needs the scheduler's node list, known before anything starts: run inside a Slurm job"},
		{"no job secret", []string{"--nnodes", "4", "--rdzv-endpoint", "10.0.0.1", "--rdzv-conf", "relay_group=2"}, slurmEnv("0"),
			"--rdzv-conf relay_group: needs --job-secret-file"},
		{"node id outside the list", append(multi, "--rdzv-conf", "relay_group=2"), slurmEnv("4"), "--rdzv-conf relay_group: SLURM_NODEID 4 is outside SLURM_JOB_NODELIST's 4 nodes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseRdzv(t, tt.args, tt.env)
			checkUsageError(t, err, "--rdzv-conf", tt.want)
		})
	}
}

// TestRelayConfInPod: in a pod of an Indexed Job or a StatefulSet with a
// subdomain, a node's relay is the pod <name>-<index> under it (the index
// rounded down to the group); a pod without a subdomain or an index is a
// usage error that says which is missing.
func TestRelayConfInPod(t *testing.T) {
	args := []string{"--rdzv-conf", "relay_group=4", "--job-secret-file", "/run/secrets/job"}
	fqdn := func(i int) string { return fmt.Sprintf("train-%d.train.ns.svc.cluster.local", i) }
	for _, tt := range []struct {
		name  string
		index int
		relay string
		self  bool
	}{
		{"a member", 5, fqdn(4), false},
		{"a relay", 4, fqdn(4), true},
		{"pod 0", 0, fqdn(0), true},
		{"a StatefulSet's pod, by its ordinal", -6, fqdn(4), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// index < 0: a StatefulSet's pod, its ordinal -index in its host
			// name and no JOB_COMPLETION_INDEX.
			n, env := tt.index, -1
			if n >= 0 {
				env = n
			} else {
				n = -n
			}
			host := fmt.Sprintf("train-%d", n)
			c, err := parsePod(t, args, pod(host, env, "PET_NNODES", "8"), podNet(t, host, "train", nil))
			if err != nil {
				t.Fatal(err)
			}
			rl := c.Rdzv.Relay
			if rl.Group != 4 || rl.Port != DefaultRelayPort || rl.Index != n || len(rl.Nodes) != n+1 || rl.Nodes[0] != fqdn(0) {
				t.Fatalf("Relay = %+v", rl)
			}
			if name, self := rl.RelayNode(); name != tt.relay || self != tt.self {
				t.Fatalf("RelayNode() = %s, %v; want %s, %v", name, self, tt.relay, tt.self)
			}
		})
	}
	for _, tt := range []struct {
		name string
		env  map[string]string
		nw   Network
		want string
	}{
		{"no subdomain", pod("train-5", 5, "PET_NNODES", "8"), podNet(t, "train-5", "", nil),
			`relay_group: needs the scheduler's node list, known before anything starts: this pod's relay is the pod named <job>-<index> under its subdomain: /etc/hosts has no <host>.<subdomain>`},
		{"no index", pod("trainer", -1, "PET_NNODES", "8"), podNet(t, "trainer", "trainer", nil),
			`this pod's relay is the pod named <job>-<index> under its subdomain: this pod has no JOB_COMPLETION_INDEX and its host name "trainer" does not end in -N`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parsePod(t, args, tt.env, tt.nw)
			checkUsageError(t, err, "--rdzv-conf", tt.want)
		})
	}
}
