package configs

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"gopkg.in/yaml.v3"
)

// unimplementedFTKey reports nvrx FaultToleranceConfig fields that drive
// features ft-launcher does not have; they are recognised so the warning says so.
func unimplementedFTKey(k string) bool {
	switch k {
	case "attribution_endpoint", "attribution_stop_action", "attribution_export_url",
		"scheduler_exclusion_dir", "use_infra_group_rank":
		return true
	}
	return false
}

// loadYAML reads --ft-cfg-path, if any, into p.cfg.FT.
func (p *parser) loadYAML() error {
	path := p.cfg.CfgPath
	if path == "" {
		if p.ignoreMissing {
			p.warn("%s has no effect without --ft-cfg-path", p.source["ft-ignore-missing-cfg"])
		}
		return nil
	}
	subj := p.source["ft-cfg-path"]
	data, err := readBounded(path, MaxYAMLBytes)
	if err != nil {
		if p.ignoreMissing && errors.Is(err, os.ErrNotExist) {
			p.warn("%s: %q does not exist; using fault tolerance defaults (--ft-ignore-missing-cfg)", subj, path)
			return nil
		}
		return usageErr(subj, "%s: cannot read %q: %v (must be a readable YAML file of at most 1 MiB)", subj, path, err)
	}
	return p.applyYAML(data, path, subj)
}

// applyYAML applies the fault_tolerance section of a YAML document read
// from path (named subj on the command line).
func (p *parser) applyYAML(data []byte, path, subj string) error {
	root, err := decodeYAML(data)
	if err != nil {
		return usageErr(subj, "%s: %q %v", subj, path, err)
	}
	sec := findFTSection(root, 0)
	if sec == nil {
		p.warn("%s: %q has no fault_tolerance: mapping; using fault tolerance defaults", subj, path)
		return nil
	}
	specs := map[string]ftSpec{}
	for _, sp := range ftSpecs() {
		specs[sp.key] = sp
	}
	for i := 0; i+1 < len(sec.Content); i += 2 {
		k, v := sec.Content[i], sec.Content[i+1]
		sp, ok := specs[k.Value]
		switch {
		case ok:
			if err := setFTNode(&p.cfg.FT, sp, v); err != nil {
				return usageErr("fault_tolerance."+k.Value, "%s: %q: fault_tolerance.%s (line %d): %v", subj, path, k.Value, k.Line, err)
			}
		case k.Value == "verdict_file" || k.Value == "termination_log" || k.Value == "spare_filler":
			// Launcher options, not nvrx fields; they live here so that one
			// file can carry them. Flags and variables still win (applied later).
			dst, what := &p.cfg.VerdictFile, "a path"
			switch k.Value {
			case "termination_log":
				dst = &p.cfg.TerminationLog
			case "spare_filler":
				dst, what = &p.cfg.SpareFiller, "a command line"
			}
			v = resolveAlias(v)
			if v.Kind != yaml.ScalarNode {
				return usageErr("fault_tolerance."+k.Value, "%s: %q: fault_tolerance.%s (line %d): must be %s", subj, path, k.Value, k.Line, what)
			}
			*dst = v.Value
			if v.Tag == "!!null" {
				*dst = ""
			}
			p.source[strings.ReplaceAll(k.Value, "_", "-")] = subj + " fault_tolerance." + k.Value
		case k.Value == "prewarm":
			// A launcher option too (--prewarm), like verdict_file.
			v = resolveAlias(v)
			var err error
			if v.Kind == yaml.ScalarNode {
				p.cfg.Prewarm, p.cfg.PrewarmAuto, err = parsePrewarm(v.Value)
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				return usageErr("fault_tolerance.prewarm", "%s: %q: fault_tolerance.prewarm (line %d): must be auto, off or comma-separated Python module names", subj, path, k.Line)
			}
			p.source["prewarm"] = subj + " fault_tolerance.prewarm"
		case k.Value == "restart_mode" || k.Value == "inprocess_rejoin_timeout":
			// Launcher options too (--restart-mode, --inprocess-rejoin-timeout).
			v = resolveAlias(v)
			var err error
			if v.Kind == yaml.ScalarNode {
				if k.Value == "restart_mode" {
					p.cfg.RestartMode, err = parseRestartMode(v.Value)
				} else {
					p.cfg.InProcessRejoinTimeout, err = parseSeconds(v.Value, true)
				}
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				what := "full or in-process"
				if k.Value != "restart_mode" {
					what = "seconds, 0.001 to 604800"
				}
				return usageErr("fault_tolerance."+k.Value, "%s: %q: fault_tolerance.%s (line %d): must be %s", subj, path, k.Value, k.Line, what)
			}
			p.source[strings.ReplaceAll(k.Value, "_", "-")] = subj + " fault_tolerance." + k.Value
		case k.Value == "agent_store":
			// A launcher option too (--agent-store), like verdict_file.
			// YAML 1.1 would read a bare on/off as a boolean; both forms mean the same.
			v = resolveAlias(v)
			var err error
			if v.Kind == yaml.ScalarNode {
				p.cfg.AgentStore, err = parseOnOff(yamlOnOff(v.Value))
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				return usageErr("fault_tolerance.agent_store", "%s: %q: fault_tolerance.agent_store (line %d): must be on or off", subj, path, k.Line)
			}
			p.source["agent-store"] = subj + " fault_tolerance.agent_store"
		case k.Value == "log_keep_attempts":
			// A launcher option too (--log-keep-attempts), like verdict_file.
			v = resolveAlias(v)
			n, err := parseIntRange(v.Value, 0, MaxCount)
			if v.Kind != yaml.ScalarNode || v.Tag == "!!null" || err != nil {
				return usageErr("fault_tolerance.log_keep_attempts", "%s: %q: fault_tolerance.log_keep_attempts (line %d): must be an integer from 0 to %d (0 keeps every attempt)",
					subj, path, k.Line, MaxCount)
			}
			p.cfg.LogKeepAttempts = n
			p.source["log-keep-attempts"] = subj + " fault_tolerance.log_keep_attempts"
		case unimplementedFTKey(k.Value):
			p.warn("%q line %d: fault_tolerance.%s is not implemented by ft-launcher; ignored", path, k.Line, k.Value)
		default:
			p.warn("%q line %d: unknown key fault_tolerance.%s ignored", path, k.Line, k.Value)
		}
	}
	return nil
}

// decodeYAML parses data into a node tree and refuses documents that
// would exceed MaxYAMLNodes once aliases are expanded: the tree is walked
// through aliases below, and an alias bomb would make that walk
// exponential. (yaml.v3 bounds alias expansion only when decoding into Go
// values, not into a yaml.Node.) The error completes "FILE ...".
func decodeYAML(data []byte) (*yaml.Node, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("is not valid YAML: %v", err)
	}
	if _, err := expandedNodes(&root, MaxYAMLNodes); err != nil {
		return nil, fmt.Errorf("is refused: more than %d YAML nodes once aliases are expanded (alias bomb?); write the values out", MaxYAMLNodes)
	}
	return &root, nil
}

// resolveAlias follows YAML aliases to the node they name.
func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// findFTSection returns the first fault_tolerance mapping, depth-first
// through mappings and lists. A mapping's own keys are checked before its
// children, so a top-level section wins over a nested one.
func findFTSection(n *yaml.Node, depth int) *yaml.Node {
	if n == nil || depth > 64 { // aliases can form cycles
		return nil
	}
	switch n.Kind {
	case yaml.AliasNode:
		return findFTSection(n.Alias, depth+1)
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			if s := findFTSection(c, depth+1); s != nil {
				return s
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			v := n.Content[i+1]
			for v.Kind == yaml.AliasNode && v.Alias != nil {
				v = v.Alias
			}
			if n.Content[i].Value == "fault_tolerance" && v.Kind == yaml.MappingNode {
				return v
			}
		}
		for i := 1; i < len(n.Content); i += 2 {
			if s := findFTSection(n.Content[i], depth+1); s != nil {
				return s
			}
		}
	}
	return nil
}

// yamlOnOff maps YAML booleans (true/false) to on/off.
func yamlOnOff(v string) string {
	switch strings.ToLower(v) {
	case "true":
		return "on"
	case "false":
		return "off"
	}
	return v
}
