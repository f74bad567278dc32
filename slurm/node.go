package slurm

import (
	"context"
	"fmt"
	"strings"
)

// NodeAddr returns the address Slurm reaches node name at (its NodeAddr in
// `scontrol show node -o NAME`). Node names need not be in DNS (several
// slurmd on one machine, or a cluster that keeps addresses only in
// slurm.conf); Slurm's own table then is the only place that knows where a
// node is. The address may itself be a host name.
func (s Scheduler) NodeAddr(ctx context.Context, name string) (string, error) {
	out, err := s.Run(ctx, "scontrol", "show", "node", "-o", name)
	if err != nil {
		return "", fmt.Errorf("slurm: address of node %s: %w", name, err)
	}
	for _, n := range ParseScontrolNodes(out) {
		if n.Name == name && n.Addr != "" {
			return n.Addr, nil
		}
	}
	return "", fmt.Errorf("slurm: address of node %s: no NodeAddr in %q", name, strings.TrimSpace(out))
}

// RendezvousHosts picks the nodes that serve the job's rendezvous from its
// node list: the first three when there are at least three (the embedded
// etcd is then a three-member Raft cluster, which survives the loss of any
// one of them), else the first.
func RendezvousHosts(nodes []string) []string {
	if len(nodes) >= 3 {
		return append([]string{}, nodes[:3]...)
	}
	if len(nodes) == 0 {
		return nil
	}
	return []string{nodes[0]}
}
