package configs

import (
	"github.com/ftlauncher/ft-launcher/slurm"
)

// Relay is the two-level join's settings (--rdzv-conf relay_group and
// relay_port; docs/rendezvous.md, "Relays"): every Group-th node of the
// allocation registers itself and the Group-1 nodes after it in batches.
// A node must know its relay before anything is written, so the topology
// comes from the scheduler: inside a Slurm job, the allocation's node
// names in order and this node's index in it; in a pod of an Indexed Job
// (a JobSet's, an AppWrapper's) or a StatefulSet with a subdomain, the
// pods' DNS names under it and the pod's index.
type Relay struct {
	Group int // nodes per relay; 0: off (every node registers itself)
	Port  int // the relay port, the same on every node
	// Nodes are the allocation's node names (SLURM_JOB_NODELIST
	// expanded) and Index this node's position in it (SLURM_NODEID); in a
	// pod, the FQDNs of pods 0 to Index under the pod's subdomain and
	// Index its JOB_COMPLETION_INDEX or pod ordinal (a pod is not told how
	// many pods follow it, and needs none of their names).
	Nodes []string
	Index int
}

// DefaultRelayPort is relay_port's default.
const DefaultRelayPort = 29402

// relayKeys are the --rdzv-conf keys of the relays.
var relayKeys = []string{"relay_group", "relay_port"}

// RelayNode is the name of this node's relay and whether it is this node.
func (r Relay) RelayNode() (name string, self bool) {
	i := r.Index - r.Index%r.Group
	return r.Nodes[i], i == r.Index
}

// rdzvConfRelay reads and checks the relay keys.
func (p *parser) rdzvConfRelay(r *Rendezvous, confSubj string) error {
	rl := Relay{Port: DefaultRelayPort}
	if err := p.wholeConf(confSubj, "relay_group", 0, 1024, &rl.Group); err != nil {
		return err
	}
	if err := p.wholeConf(confSubj, "relay_port", 1, 65535, &rl.Port); err != nil {
		return err
	}
	if rl.Group == 1 {
		return usageErr(confSubj, "%s relay_group=1: a relay for one node saves nothing; use 0 (off) or 2 to 1024 nodes per relay (64 is a good start)", confSubj)
	}
	if rl.Group == 0 {
		return nil
	}
	sl, k := p.cfg.Slurm, p.cfg.K8s
	podIndex, _ := k.Index()
	inPod := !sl.InJob() && k.InPod && podIndex >= 0 && k.PeerFQDN(0) != ""
	if !inPod && (!sl.InJob() || sl.JobNodeList == "" || sl.NodeID < 0) {
		why := "run inside a Slurm job (SLURM_JOB_NODELIST and SLURM_NODEID set) or a pod of an Indexed Job or a StatefulSet whose pods have a subdomain (a headless Service)"
		if !sl.InJob() && k.InPod {
			why = "this pod's relay is the pod named <job>-<index> under its subdomain: " + podEndpointMissing(k)
		}
		return usageErr(confSubj, "%s relay_group: needs the scheduler's node list, known before anything starts: %s; remove relay_group elsewhere", confSubj, why)
	}
	if p.cfg.JobSecretFile == "" {
		return usageErr(confSubj, "%s relay_group: needs --job-secret-file: a relay writes other nodes' registrations and answers only peers that prove the job secret", confSubj)
	}
	if inPod {
		// Pods 0 to this one: its relay is among them.
		for i := range podIndex + 1 {
			rl.Nodes = append(rl.Nodes, k.PeerFQDN(i))
		}
		rl.Index = podIndex
		r.Relay = rl
		return nil
	}
	nodes, err := slurm.ExpandNodeList(sl.JobNodeList)
	if err != nil {
		return usageErr(confSubj, "%s relay_group: SLURM_JOB_NODELIST: %v", confSubj, err)
	}
	if sl.NodeID >= len(nodes) {
		return usageErr(confSubj, "%s relay_group: SLURM_NODEID %d is outside SLURM_JOB_NODELIST's %d nodes", confSubj, sl.NodeID, len(nodes))
	}
	rl.Nodes, rl.Index = nodes, sl.NodeID
	r.Relay = rl
	return nil
}
