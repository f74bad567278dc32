package configs

import (
	"cmp"
	"fmt"
	"strings"

	"gopkg.in/yaml.v3"
)

// Effective renders the merged configuration as YAML for --print-config: a
// fault_tolerance block with nvrx's key names (so the output can be fed back
// through --ft-cfg-path), a launch block with the other settings, keyed by
// the flags' PET_ names in lower case, and a rendezvous block with the
// rendezvous as interpreted (mode, endpoints, hosting, timings, node order),
// and a sources block saying where each launch option came from (flag,
// PET_* variable, the Slurm job, the Kubernetes pod, the YAML file or
// default).
// The etcd password is redacted.
func (c *Config) Effective() string {
	ft := &yaml.Node{}
	if err := ft.Encode(c.FT); err != nil {
		return fmt.Sprintf("# cannot render fault_tolerance: %v\n", err)
	}
	defaults := c.FT.DefaultClocksApply()
	for i := 0; i+1 < len(ft.Content); i += 2 {
		switch ft.Content[i].Value {
		case "rank_termination_signal":
			ft.Content[i+1] = scalar(signalName(c.FT.RankTerminationSignal))
		case "initial_rank_heartbeat_timeout":
			if defaults {
				ft.Content[i+1].LineComment = fmt.Sprintf("default clock: %.0f s to the first heartbeat (default_timeouts)",
					DefaultStartupTimeout.Seconds())
			}
		case "rank_heartbeat_timeout":
			if defaults {
				ft.Content[i+1].LineComment = fmt.Sprintf("default clock: learned in the run after %d intervals, "+
					"safety_factor x the longest, at least %.0f s (default_timeouts)", DefaultLearnIntervals, DefaultLearnedFloor.Seconds())
			}
		}
	}

	launch := &yaml.Node{Kind: yaml.MappingNode}
	add := func(key string, v any) { addKey(launch, key, v) }
	signals := make([]string, len(c.SignalsToHandle))
	for i, s := range c.SignalsToHandle {
		signals[i] = signalName(s)
	}
	password := ""
	if c.RdzvPassword != "" {
		password = "<redacted>"
	}
	add("nnodes", fmt.Sprintf("%d:%d", c.NNodes.Min, c.NNodes.Max))
	add("nproc_per_node", c.NProcPerNode)
	add("nproc_per_node_spec", c.NProcSpec)
	add("rdzv_backend", c.RdzvBackend)
	add("rdzv_endpoint", c.RdzvEndpoint)
	add("rdzv_id", c.RdzvID)
	add("rdzv_conf", c.RdzvConf)
	add("standalone", c.Standalone)
	add("max_restarts", c.MaxRestarts)
	add("restart_window", c.RestartWindow.Seconds())
	add("restart_delay", c.RestartDelay.Seconds())
	add("monitor_interval", c.MonitorInterval.Seconds())
	add("start_method", c.StartMethod)
	add("role", c.Role)
	add("module", c.Module)
	add("no_python", c.NoPython)
	add("log_dir", c.LogDir)
	add("redirects", stdSpecString(c.Redirects))
	add("tee", stdSpecString(c.Tee))
	if c.LocalRanksFilter == nil {
		add("local_ranks_filter", nil) // null: every rank is shown
	} else {
		add("local_ranks_filter", c.LocalRanksFilter)
	}
	add("log_keep_attempts", c.LogKeepAttempts)
	add("node_rank", c.NodeRank)
	add("master_addr", c.MasterAddr)
	add("master_port", c.MasterPort)
	add("local_addr", c.LocalAddr)
	add("signals_to_handle", signals)
	add("term_timeout", c.TermTimeout.Seconds())
	add("workers_stop_timeout", c.WorkersStopTimeout.Seconds())
	add("rdzv_ca_cert", c.RdzvCACert)
	add("rdzv_cert", c.RdzvCert)
	add("rdzv_key", c.RdzvKey)
	add("rdzv_user", c.RdzvUser)
	add("rdzv_password", password)
	add("event_log", c.EventLog)
	add("metrics_addr", c.MetricsAddr)
	add("health_check_cmd", c.HealthCheckCmd)
	add("verdict_file", c.VerdictFile)
	add("termination_log", c.TerminationLog)
	add("state_dir", c.StateDir)
	add("state_persist_every", c.StatePersist.String())
	add("state_replicas", fmt.Sprint(c.StateReplicas))
	add("job_secret_file", c.JobSecretFile) // the path, never the secret
	shm := c.StateShmDir
	if shm == "" {
		shm = "/dev/shm" // state.Options' default
	}
	add("state_shm_dir", shm)
	add("spare_filler", c.SpareFiller)
	add("spare_filler_reclaim_timeout", c.SpareFillerReclaimTimeout.Seconds())
	prewarm := strings.Join(c.Prewarm, ",")
	if c.PrewarmAuto {
		prewarm = "auto"
	}
	add("prewarm", prewarm)
	add("agent_store", onOff(c.AgentStore))
	add("prewarm_importing", cmp.Or(c.PrewarmImporting, "auto"))
	add("restart_mode", c.RestartMode)
	add("inprocess_rejoin_timeout", c.InProcessRejoinTimeout.Seconds())
	wt := make([]string, len(c.WalltimeSignals))
	for i, s := range c.WalltimeSignals {
		wt[i] = signalName(s)
	}
	add("walltime_signals", wt)
	add("ft_cfg_path", c.CfgPath)
	add("python_exec", c.PythonExec)
	add("training_script", c.Script)
	add("training_script_args", c.ScriptArgs)

	sources := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range sortedKeys(c.Sources) {
		addKey(sources, k, c.Sources[k])
	}
	doc := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		scalar("fault_tolerance"), ft,
		scalar("launch"), launch,
		scalar("sources"), sources,
		scalar("rendezvous"), c.rdzvNode(),
	}}
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return fmt.Sprintf("# cannot render configuration: %v\n", err)
	}
	_ = enc.Close()
	return b.String()
}

// rdzvNode renders c.Rdzv and the node order. Timings are in seconds.
func (c *Config) rdzvNode() *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	r := c.Rdzv
	addKey(n, "mode", string(r.Mode))
	if r.Mode != RdzvSingleNode {
		addKey(n, "endpoints", r.ClientURLs())
		if r.Given != nil {
			addKey(n, "endpoints_given", r.Given)
		}
	}
	if r.Mode == RdzvEmbedded {
		addKey(n, "hosts_embedded_etcd", r.HostsEtcd)
		addKey(n, "hosts_embedded_etcd_decided_by", r.HostsEtcdBy)
	}
	for _, t := range rdzvTimings() {
		addKey(n, t.key, t.dst(&r).Seconds())
	}
	addKey(n, "infra_rank", c.InfraRank)
	addKey(n, "infra_rank_from", c.InfraRankFrom)
	return n
}

// addKey appends key: v to the mapping m.
func addKey(m *yaml.Node, key string, v any) {
	n := &yaml.Node{}
	if err := n.Encode(v); err != nil {
		n = scalar(fmt.Sprint(v))
	}
	m.Content = append(m.Content, scalar(key), n)
}

func scalar(s string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
}

// stdSpecString renders a StdSpec in the syntax -r/-t accept.
func stdSpecString(s StdSpec) string {
	if s.PerRank == nil {
		return fmt.Sprint(int(s.All))
	}
	parts := make([]string, 0, len(s.PerRank))
	for r := 0; r <= 9; r++ {
		if v, ok := s.PerRank[r]; ok {
			parts = append(parts, fmt.Sprintf("%d:%d", r, v))
		}
	}
	return strings.Join(parts, ",")
}

// onOff spells an on|off option's value as the user writes it.
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}
