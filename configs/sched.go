package configs

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/ftlauncher/ft-launcher/slurm"
)

// slurmDefaults fills, inside a Slurm job, what the launch line left unset
// (no flag, no PET_* variable), so that `srun ft-launcher --nproc-per-node
// N train.py` runs a multi-node job with no other flag:
//
//   - --nnodes: SLURM_NNODES (the step's node count under srun), else
//     SLURM_JOB_NUM_NODES;
//   - --rdzv-id: the job, "<job id>-r<SLURM_RESTART_COUNT>" (array tasks
//     "<array job id>_<task id>-r<N>"): a requeued job is a new run with
//     its own rounds (see slurm.Env.RunID);
//   - --rdzv-endpoint (c10d backend, more than one node): the first node of
//     the step's node list, or the first three when it has three or more
//     (a three-member embedded etcd), on slurmPort(job id);
//   - --local-addr: this node's name (SLURMD_NODENAME) resolved, in
//     resolveLocalAddr; the node order is SLURM_PROCID (resolveInfraRank).
//
// --standalone keeps its own defaults. The YAML file sets none of these, so
// the precedence is flag > PET_* > Slurm > YAML > default.
func (p *parser) slurmDefaults() error {
	c := p.cfg
	s := c.Slurm
	if !s.InJob() || c.Standalone {
		return nil
	}
	if p.source["nnodes"] == "" && s.NNodes > 0 {
		if s.NNodes > MaxNodes {
			p.warn("SLURM_NNODES=%d is above %d; --nnodes stays %d:%d", s.NNodes, MaxNodes, c.NNodes.Min, c.NNodes.Max)
		} else {
			c.NNodes = NNodes{Min: s.NNodes, Max: s.NNodes}
			p.source["nnodes"] = fmt.Sprintf("Slurm (SLURM_NNODES=%d)", s.NNodes)
			if s.NNodes > 1 && s.StepNodeList == "" {
				p.warn("SLURM_NNODES=%d outside an srun step (the batch script?): start one ft-launcher per node with srun, or give --nnodes", s.NNodes)
			}
		}
	}
	if p.source["rdzv-id"] == "" {
		c.RdzvID = s.RunID()
		p.source["rdzv-id"] = fmt.Sprintf("Slurm (SLURM_JOB_ID=%s, SLURM_RESTART_COUNT=%d)", s.JobID, max(s.RestartCount, 0))
	}
	if c.NNodes.Max > 1 && p.source["rdzv-endpoint"] == "" && c.RdzvBackend == "c10d" && s.NodeList() != "" {
		variable := "SLURM_JOB_NODELIST"
		if s.StepNodeList != "" {
			variable = "SLURM_STEP_NODELIST"
		}
		nodes, err := slurm.ExpandNodeList(s.NodeList())
		if err != nil {
			return usageErr(variable, "%s: %v: give --rdzv-endpoint", variable, err)
		}
		hosts := slurm.RendezvousHosts(nodes)
		eps := make([]string, len(hosts))
		for i, h := range hosts {
			eps[i] = net.JoinHostPort(h, strconv.Itoa(slurmPort(s.JobID)))
		}
		c.RdzvEndpoint = strings.Join(eps, ",")
		p.source["rdzv-endpoint"] = fmt.Sprintf("Slurm (%s=%s: first %d of %d nodes)", variable, s.NodeList(), len(hosts), len(nodes))
	}
	return nil
}

// slurmPort is the embedded etcd's port in a Slurm job: 29400 (torchrun's
// c10d port) + 2 * (job id mod 500), so in 29400-30399 and even (a member's
// peers use the port above). Jobs sharing a node, and torchrun's own
// default 29400 on it, then rarely collide; every node of the job computes
// the same port. A job id that is not a number gets 29400.
func slurmPort(jobID string) int {
	n, err := strconv.Atoi(jobID)
	if err != nil || n < 0 {
		return defaultEmbeddedPort
	}
	return defaultEmbeddedPort + 2*(n%500)
}

// sources says where each launch option's value came from: the flag or
// variable, the Slurm job, the YAML file, or "default".
func (p *parser) sources() map[string]string {
	out := map[string]string{}
	for _, o := range options() {
		if o.group == grpCompat || o.group == grpFT && o.names[0] != "ft-cfg-path" {
			continue
		}
		key := strings.ReplaceAll(o.names[0], "-", "_")
		if src := p.source[o.names[0]]; src != "" {
			out[key] = src
		} else {
			out[key] = "default"
		}
	}
	return out
}
