package configs

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s"
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

// Where a pod's rendezvous endpoint came from (parser.podEndpoint).
const (
	podEndpointSubdomain = "subdomain" // the index-0 pod's FQDN under this pod's subdomain
	podEndpointService   = "service"   // FTL_RDZV_SERVICE
)

// podConnectTimeout is connect_timeout's default when a pod's endpoint
// comes from Kubernetes: pods start in any order, and the index-0 pod,
// which hosts the embedded etcd, may still be waiting for a node or pulling
// its image when the others start. join_timeout's default.
const podConnectTimeout = 10 * time.Minute

// k8sDefaults fills, inside a Kubernetes pod, what the launch line left
// unset (no flag, no PET_* variable), so that `ft-launcher --nproc-per-node
// N train.py` is the whole container command of an Indexed Job, a JobSet or
// an AppWrapper-wrapped Job:
//
//   - node order: JOB_COMPLETION_INDEX, else the pod ordinal of a NAME-N
//     host name (resolveInfraRank, through k8s.Env.Index);
//   - --nnodes: a pod is not told how many pods its Job has, so the pod
//     template sets PET_NNODES; a pod with JOB_COMPLETION_INDEX >= 1 and
//     no node count is refused (it would train alone);
//   - --rdzv-id: the workload, see k8s.Env.RunID ("<appwrapper>-r<resets>",
//     "<job>-r<JOBSET_RESTART_ATTEMPT>" or "<job>");
//   - --rdzv-endpoint (c10d backend, more than one node): FTL_RDZV_SERVICE,
//     else the index-0 pod's FQDN under this pod's subdomain (a headless
//     Service), on port 29400; the index-0 pod hosts the embedded etcd
//     (resolveRendezvous), and connect_timeout defaults to
//     podConnectTimeout;
//   - --local-addr: the pod's address in /etc/hosts (resolveLocalAddr).
//
// --standalone keeps its own defaults, and a Slurm job in a pod (Slinky's
// slurmd pods) is a Slurm job: only slurmDefaults apply. The precedence is
// flag > PET_* > Slurm > Kubernetes > YAML > default. Malformed FTL_* and
// JOBSET_RESTART_ATTEMPT values are refused, in a pod or not.
func (p *parser) k8sDefaults() error {
	c := p.cfg
	k := &c.K8s
	if len(k.Errors) > 0 {
		e := k.Errors[0]
		return usageErr(e.Name, "%s", e.Error())
	}
	var service string
	if k.RdzvService != "" {
		eps, err := parseEndpoints(k.RdzvService, defaultEmbeddedPort)
		if err == nil && len(eps) != 1 {
			err = fmt.Errorf("one name only")
		}
		if err != nil {
			return usageErr(k8s.EnvRdzvService, "%s=%q: %v: give the DNS name of a Service that reaches the index-0 pod, NAME[:PORT] (default port %d)",
				k8s.EnvRdzvService, k.RdzvService, err, defaultEmbeddedPort)
		}
		service = eps[0]
	}

	if !k.InPod {
		for _, v := range []struct{ name, value string }{{k8s.EnvWorkload, k.WorkloadName}, {k8s.EnvRdzvService, k.RdzvService}} {
			if v.value != "" {
				p.warn("%s is set but this is not a Kubernetes pod (KUBERNETES_SERVICE_HOST is unset); ignored", v.name)
			}
		}
		return nil
	}
	if c.Slurm.InJob() || c.Standalone {
		return nil
	}
	if k.Hostname == "" {
		k.SetHostname(p.net.hostname())
	}
	if hosts, err := p.net.etcHosts(); err != nil {
		p.warn("reading /etc/hosts: %v; this pod's subdomain is unknown", err)
	} else {
		k.DNS, _ = k8s.ParseHosts(hosts, k.Hostname)
	}
	if p.source["nnodes"] == "" && k.CompletionIndex >= 1 {
		return usageErr("--nnodes", "--nnodes is not given (default 1), but this pod is JOB_COMPLETION_INDEX=%d of an Indexed Job: "+
			"set PET_NNODES in the pod template to the number of pods (the Job's completions), or give --nnodes; "+
			"for independent single-pod runs give --nnodes 1 or --standalone", k.CompletionIndex)
	}
	if p.source["rdzv-id"] == "" {
		if id, from := k.RunID(); id != "" {
			c.RdzvID = id
			p.source["rdzv-id"] = "Kubernetes (" + from + ")"
		}
	}
	if c.NNodes.Max > 1 && p.source["rdzv-endpoint"] == "" && c.RdzvBackend == "c10d" {
		switch peer := k.PeerFQDN(0); {
		case service != "":
			c.RdzvEndpoint, p.podEndpoint = service, podEndpointService
			p.source["rdzv-endpoint"] = fmt.Sprintf("Kubernetes (%s=%s)", k8s.EnvRdzvService, k.RdzvService)
		case peer != "":
			c.RdzvEndpoint, p.podEndpoint = net.JoinHostPort(peer, strconv.Itoa(defaultEmbeddedPort)), podEndpointSubdomain
			p.source["rdzv-endpoint"] = fmt.Sprintf("Kubernetes (the index-0 pod under subdomain %s: /etc/hosts %s)", k.DNS.Subdomain, k.DNS.FQDN)
		default:
			p.endpointHint = "in a pod, give the pod template a subdomain (spec.subdomain: a headless Service) or set " + k8s.EnvRdzvService + ": " + podEndpointMissing(*k)
		}
	}
	return nil
}

// podEndpointMissing says why no endpoint follows from the pod.
func podEndpointMissing(k k8s.Env) string {
	n, _ := k.Index()
	switch {
	case n < 0:
		return fmt.Sprintf("this pod has no JOB_COMPLETION_INDEX and its host name %q does not end in -N", k.Hostname)
	case k.Base() == "":
		return fmt.Sprintf("its host name %q does not end in -%d", k.Hostname, n)
	}
	return fmt.Sprintf("/etc/hosts has no <host>.<subdomain>.<namespace>.svc.<domain> name for host name %q", k.Hostname)
}

// sources says where each launch option's value came from: the flag or
// variable, the Slurm job, the Kubernetes pod, the YAML file, or "default".
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
