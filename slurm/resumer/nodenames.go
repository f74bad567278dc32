package resumer

import (
	"context"
	"path/filepath"
	"sort"
	"strings"

	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/verdict"
)

type nodeVerdict struct {
	file string
	node string // Slurm node name from the file name (verdict-<node>.json), if any
	v    verdict.Verdict
}

func readVerdicts(dir string) []nodeVerdict {
	files, _ := filepath.Glob(filepath.Join(dir, "verdict*.json"))
	sort.Strings(files)
	var out []nodeVerdict
	for _, f := range files {
		v, err := verdict.Read(f)
		if err != nil {
			continue
		}
		node := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "verdict-"), ".json")
		if node == "verdict.json" || node == filepath.Base(f) {
			node = ""
		}
		out = append(out, nodeVerdict{file: f, node: node, v: v})
	}
	return out
}

// slurmNames returns a function that names a host (a host name or
// address, with its rendezvous node id "addr/pid" when known) by its Slurm
// node name: the verdict files' own names (verdict-<node>.json, written on
// that node by `ft-resumer node`; a single-node job's verdict.json is its
// one node's), then, only for what those do not name, Slurm's
// NodeAddr/NodeHostName (scontrol, asked once). What maps to nothing keeps
// its own name.
func (r *Resumer) slurmNames(ctx context.Context, job *ChainJob, nvs []nodeVerdict) func(host, node string) string {
	byAddr := map[string]string{}
	byHost := map[string]map[string]bool{}
	for _, nv := range nvs {
		n := nv.node
		if n == "" && len(job.Nodes) == 1 {
			n = job.Nodes[0]
		}
		if n == "" {
			continue
		}
		if a := addrOf(nv.v.Node); a != "" {
			byAddr[a] = n
		}
		if h := nv.v.Hostname; h != "" {
			if byHost[h] == nil {
				byHost[h] = map[string]bool{}
			}
			byHost[h][n] = true
		}
	}
	var slurmResolve func(string) string
	return func(host, node string) string {
		if n, ok := byAddr[addrOf(node)]; ok && node != "" {
			return n
		}
		if n, ok := byAddr[host]; ok {
			return n
		}
		if ns := byHost[host]; len(ns) == 1 {
			for n := range ns {
				return n
			}
		}
		if slurmResolve == nil {
			nodes, _ := r.Sched.Nodes(ctx)
			slurmResolve = nodeResolver(nodes, nil)
		}
		for _, k := range []string{addrOf(node), host} {
			if n := slurmResolve(k); n != "" {
				return n
			}
		}
		if host == "" {
			return addrOf(node)
		}
		return host
	}
}

// addrOf returns the address part of a rendezvous node id ("addr/pid").
func addrOf(node string) string {
	a, _, _ := strings.Cut(node, "/")
	return a
}

// nodeResolver maps a host name, address or node name to a Slurm node
// name: Slurm's own NodeName/NodeAddr/NodeHostName (a host name only when
// one node has it: fake nodes share one), then the verdict files' names.
func nodeResolver(nodes []slurm.NodeInfo, nvs []nodeVerdict) func(string) string {
	byKey := map[string]string{}
	hostCount := map[string]int{}
	for _, n := range nodes {
		hostCount[n.Hostname]++
	}
	for _, n := range nodes {
		byKey[n.Name] = n.Name
		if n.Addr != "" {
			byKey[n.Addr] = n.Name
		}
		if n.Hostname != "" && hostCount[n.Hostname] == 1 {
			byKey[n.Hostname] = n.Name
		}
	}
	for _, nv := range nvs {
		if nv.node == "" {
			continue
		}
		if a := addrOf(nv.v.Node); a != "" {
			if _, ok := byKey[a]; !ok {
				byKey[a] = nv.node
			}
		}
	}
	return func(k string) string {
		if k == "" {
			return ""
		}
		return byKey[k]
	}
}
