package slurm

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// Scheduler runs Slurm's client commands (scontrol here; sbatch, sacct and
// scancel for the outer loop in slurm/resumer). Env is their environment
// (nil: this process's), e.g. with SLURM_CONF.
type Scheduler struct {
	Env []string
}

// Run runs a Slurm client command and returns its standard output. The
// error names the command and carries what it wrote to standard error.
func (s Scheduler) Run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = s.Env
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w%s", name, strings.Join(args, " "), err, stderrNote(stderr.String()))
	}
	return stdout.String(), nil
}

// stderrNote is ": <what the command said>", or nothing when it said
// nothing (a command that could not start).
func stderrNote(s string) string {
	if s = strings.TrimSpace(s); s == "" {
		return ""
	}
	return ": " + s
}

// NodeInfo is one node from `scontrol show node -o`.
type NodeInfo struct {
	Name       string
	Addr       string
	Hostname   string
	State      string
	Partitions []string
}

// Nodes lists the cluster's nodes.
func (s Scheduler) Nodes(ctx context.Context) ([]NodeInfo, error) {
	out, err := s.Run(ctx, "scontrol", "show", "node", "-o")
	if err != nil {
		return nil, fmt.Errorf("slurm: nodes: %w", err)
	}
	return ParseScontrolNodes(out), nil
}

// ParseScontrolNodes reads `scontrol show node -o`.
func ParseScontrolNodes(out string) []NodeInfo {
	var nodes []NodeInfo
	for _, line := range strings.Split(out, "\n") {
		kv := map[string]string{}
		for _, f := range strings.Fields(line) {
			if k, v, ok := strings.Cut(f, "="); ok {
				kv[k] = v
			}
		}
		if kv["NodeName"] == "" {
			continue
		}
		n := NodeInfo{Name: kv["NodeName"], Addr: kv["NodeAddr"], Hostname: kv["NodeHostName"], State: kv["State"]}
		if p := kv["Partitions"]; p != "" {
			n.Partitions = strings.Split(p, ",")
		}
		nodes = append(nodes, n)
	}
	return nodes
}
