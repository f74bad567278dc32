package configs

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ftSpec describes one FaultTolerance field: how it is spelled as a flag and
// in YAML, and how its value is checked. The Go field is found through its
// yaml tag, so the struct in config.go stays the single list of fields.
type ftSpec struct {
	key      string // nvrx field name and YAML key
	flag     string // flag name without "--"; "" when the field is YAML-only
	legacy   bool   // nvrx <= v0.4 also spelled it --ft-param-<key>
	arg      string // metavar in the help text
	help     string
	positive bool     // numbers must be > 0 (periods and factors)
	rule     boolRule // for bool fields given as text
}

// Help suffixes for fields ft-launcher stores but does not act on. The
// whole FaultTolerance is sent to nvrx rank clients, so these reach them.
const (
	passedThrough = " Passed through to rank clients only."
	notActedOn    = " Accepted for nvrx compatibility; not acted on by ft-launcher (passed through to rank clients only)."
)

// ftSpecs lists every field in nvrx's order, then ft-launcher's additions.
func ftSpecs() []ftSpec {
	return []ftSpec{
		{key: "workload_check_interval", flag: "ft-workload-check-interval", legacy: true, arg: "SECONDS", positive: true,
			help: "nvrx's period of rank-monitor timeout checks; ft-launcher checks each timeout at its own deadline instead." + passedThrough},
		{key: "initial_rank_heartbeat_timeout", flag: "ft-initial-rank-heartbeat-timeout", legacy: true, arg: "SECONDS|none",
			help: "Longest wait from a rank's init to its first heartbeat; none disables."},
		{key: "rank_heartbeat_timeout", flag: "ft-rank-heartbeat-timeout", legacy: true, arg: "SECONDS|none",
			help: "Longest gap between two heartbeats; none disables."},
		{key: "rank_section_timeouts", flag: "ft-rank-section-timeouts", legacy: true, arg: "NAME:SECONDS,...",
			help: "Per-section timeouts, e.g. setup:600,step:180,checkpointing:none; '' clears. Key warmup applies to step during warm-up iterations."},
		{key: "rank_out_of_section_timeout", flag: "ft-rank-out-of-section-timeout", legacy: true, arg: "SECONDS|none",
			help: "Longest time with no section open; none disables."},
		{key: "node_health_check_interval", flag: "ft-node-health-check-interval", legacy: true, arg: "SECONDS", positive: true,
			help: "nvrx's period of node health checks while ranks run; ft-launcher checks node health before each rendezvous join (--health-check-cmd)." + passedThrough},
		{key: "safety_factor", flag: "ft-safety-factor", legacy: true, arg: "FACTOR", positive: true,
			help: "Multiplier applied to observed timings when timeouts are calculated."},
		{key: "rank_termination_signal", flag: "ft-rank-termination-signal", legacy: true, arg: "SIGNAL",
			help: "Signal sent to a hung rank: a name (SIGKILL, sigterm, KILL) or a number."},
		{key: "log_level", flag: "ft-log-level", legacy: true, arg: "LEVEL",
			help: "DEBUG, DBG, INFO, WARNING, WARN, ERROR, CRITICAL or an integer 0-50."},
		{key: "restart_check_interval", flag: "ft-restart-check-interval", legacy: true, arg: "SECONDS", positive: true,
			help: "nvrx no longer uses it." + notActedOn},
		{key: "enable_nic_monitor", flag: "ft-enable-nic-monitor", legacy: true, arg: "BOOL", rule: boolNotFalse,
			help: "nvrx: watch the NIC link_downed counter (anything but false/0/no is true)." + notActedOn},
		{key: "enable_nic_healthcheck", flag: "ft-enable-nic-healthcheck", arg: "BOOL", rule: boolNotFalse,
			help: "nvrx: pre-rendezvous NIC link-state check (anything but false/0/no is true)." + notActedOn},
		{key: "enable_dist_storage_healthcheck", flag: "ft-enable-dist-storage-healthcheck", arg: "BOOL", rule: boolStrict,
			help: "nvrx: pre-rendezvous distributed storage check: true/1/yes or false/0/no." + notActedOn},
		{key: "storage_healthcheck_path", flag: "ft-storage-health-check-path", arg: "PATH,...",
			help: "nvrx: comma-separated absolute paths checked before each rendezvous." + notActedOn},
		{key: "pci_topo_file", flag: "ft-pci-topo-file", legacy: true, arg: "PATH",
			help: "nvrx: GPU-NIC topology file for the NIC monitor." + notActedOn},
		{key: "link_down_path_template", flag: "ft-link-down-path-template", legacy: true, arg: "TEMPLATE",
			help: "nvrx: sysfs template of the link_downed counter." + notActedOn},
		{key: "link_state_path_template", flag: "ft-link-state-path-template", arg: "TEMPLATE",
			help: "nvrx: sysfs template of the NIC link state." + notActedOn},
		{key: "skip_section_response", flag: "ft-skip-section-response", arg: "BOOL", rule: boolOnlyTrue,
			help: "Monitors do not answer heartbeat/section messages (true iff true/1/yes)."},
		{key: "segment", flag: "ft-segment", arg: "N",
			help: "nvrx: hot-spare segment size (NVLink domain)." + notActedOn},
		{key: "numa_bind_strict", flag: "ft-numa-bind-strict", arg: "BOOL", rule: boolNotFalse,
			help: "nvrx: numactl --membind instead of --localalloc." + notActedOn},
		{key: "gpu_memory_reclaim_timeout", flag: "ft-gpu-memory-reclaim-timeout", arg: "SECONDS",
			help: "nvrx: after stopping ranks, wait up to this long for GPU memory to be freed (0 disables)." + notActedOn},
		{key: "gpu_memory_tolerance_mb", flag: "ft-gpu-memory-tolerance-mb", arg: "MB",
			help: "nvrx: GPU memory still in use that counts as freed." + notActedOn},
		{key: "gpu_memory_poll_interval", flag: "ft-gpu-memory-poll-interval", arg: "SECONDS", positive: true,
			help: "nvrx: poll period of the GPU memory wait." + notActedOn},
		{key: "check_remaining_processes", flag: "ft-check-remaining-processes", arg: "BOOL", rule: boolNotFalse,
			help: "nvrx: log processes left behind after ranks stopped (ft-launcher always sweeps and kills them)." + notActedOn},
		{key: "max_no_progress_cycles", flag: "ft-max-no-progress-cycles", arg: "N",
			help: "nvrx: restart cycles without checkpoint progress before exiting with the no-restart code (<= 0 disables)." + notActedOn},
		{key: "min_progress_iterations", flag: "ft-min-progress-iterations", arg: "N",
			help: "nvrx: iterations that count as progress." + notActedOn},
		{key: "checkpoint_iteration_file", flag: "ft-checkpoint-iteration-file", arg: "PATH",
			help: "File holding the last checkpointed iteration (one integer). ft-launcher only notices it change during a cycle, as a sign that the cycle saved a checkpoint (which lets calculated timeouts trust its timing); also passed through to rank clients."},
		{key: "install_exception_hook", flag: "ft-install-exception-hook", arg: "BOOL", rule: boolNotFalse,
			help: "Ask rank clients to install an exception hook that exits the rank." + passedThrough},
		{key: "num_warmup_iterations", arg: "N",
			help: "Iterations that use the warmup section timeout (YAML only, as in nvrx)."},
		{key: "cycle_info_dir", flag: "ft-cycle-info-dir", arg: "DIR",
			help: "nvrx: directory for per-cycle info files." + notActedOn},
		{key: "no_restart_exit_code", flag: "ft-no-restart-exit-code", arg: "CODE",
			help: "Exit code meaning 'do not requeue this job' (1-255)."},
		{key: "timeouts_state_file", flag: "ft-timeouts-state-file", arg: "PATH",
			help: "File where calculated timeouts are kept across runs ('' disables)."},
		{key: "termination_grace", flag: "ft-termination-grace", arg: "SECONDS",
			help: "Grace between a non-SIGKILL hang signal and SIGKILL."},
		{key: "calculate_timeouts", flag: "ft-calculate-timeouts", arg: "BOOL", rule: boolStrict,
			help: "Calculate heartbeat and section timeouts from observed timing: true/1/yes or false/0/no."},
		{key: "default_timeouts", flag: "ft-default-timeouts", arg: "BOOL", rule: boolStrict,
			help: "With no rank timeout configured, hold ranks that heartbeat to the launcher's default clocks (30 min start-up, a step timeout learned in the run, at least 60 s): true/1/yes or false/0/no."},
		{key: "same_failure_limit", flag: "ft-same-failure-limit", arg: "N",
			help: "Stop the job with the no-restart exit code when the same rank fails the same way (the same exception at the same place, or the same fatal signal) in N consecutive rounds (0: never)."},
		{key: "node_failure_limit", flag: "ft-node-failure-limit", arg: "N",
			help: "Take a node out when its own ranks failed in ways that point at the node (a fatal signal, a hang, an exit with no explanation, a hardware or driver error) in N of its latest N+1 rounds: a hot spare takes its place, and the Slurm chain and the AppWrapper controller keep the next job off it (0: never)."},
		{key: "straggler", flag: "ft-straggler", arg: "report|swap|off",
			help: "What to do about a node whose ranks are slower than the other nodes' (measured from the CPU each rank demands between samples): report (metric, events, ft-resumer report), swap (also swap it for a standing hot spare at its next state save), off."},
		{key: "straggler_threshold", flag: "ft-straggler-threshold", arg: "FRACTION",
			help: "A node is slow when its slowest rank works at less than 1 - FRACTION of the pace of the other nodes' slowest ranks (0.01-0.9)."},
		{key: "straggler_window", flag: "ft-straggler-window", arg: "SECONDS", positive: true,
			help: "Speeds are averaged over this many seconds; a node slow for half of it is a straggler."},
		{key: "straggler_interval", flag: "ft-straggler-interval", arg: "SECONDS", positive: true,
			help: "Seconds between two samples of the ranks' speed; each node writes one small record to the rendezvous per interval."},
		{key: "rank_stacks", flag: "ft-rank-stacks", arg: "BOOL", rule: boolStrict,
			help: "Install a hook in Python ranks so that a hang's report holds every rank's stack, taken before the kill, and a death by SIGSEGV or SIGABRT its stack: true/1/yes or false/0/no."},
	}
}

// ftField returns the settable field of ft whose yaml tag is key.
func ftField(ft *FaultTolerance, key string) (reflect.Value, bool) {
	v := reflect.ValueOf(ft).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if t.Field(i).Tag.Get("yaml") == key {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

// setFT stores the textual value s into the field described by sp. A
// non-empty warning is returned when s is accepted but has no effect.
// null marks a YAML null, which fields that cannot be disabled refuse.
func setFT(ft *FaultTolerance, sp ftSpec, s string, null bool) (warning string, err error) {
	f, ok := ftField(ft, sp.key)
	if !ok {
		return "", fmt.Errorf("internal error: no field for %s", sp.key)
	}
	switch sp.key {
	case "rank_termination_signal":
		sig, err := parseSignal(s)
		if err != nil || null {
			return "", fmt.Errorf("invalid value %q: must be a signal name (SIGKILL, sigterm, KILL) or number", s)
		}
		ft.RankTerminationSignal = sig
		return "", nil
	case "log_level":
		lv, err := parseLogLevel(s)
		if err != nil || null {
			return "", fmt.Errorf("invalid value %q: must be DEBUG, DBG, INFO, WARNING, WARN, ERROR, CRITICAL or an integer 0-50", s)
		}
		ft.LogLevel = lv
		return "", nil
	case "rank_section_timeouts":
		m, err := parseSectionTimeouts(s)
		if err != nil {
			return "", err
		}
		ft.RankSectionTimeouts = m
		return "", nil
	case "straggler":
		v := strings.ToLower(strings.TrimSpace(s))
		if null || (v != StragglerReport && v != StragglerSwap && v != StragglerOff) {
			return "", fmt.Errorf("invalid value %q: must be report, swap or off", s)
		}
		ft.Straggler = v
		return "", nil
	case "storage_healthcheck_path":
		if null || s == "" {
			ft.StorageHealthcheckPath = nil
			return "", nil
		}
		p, err := parseAbsPathList(s)
		if err != nil {
			return "", err
		}
		ft.StorageHealthcheckPath = &p
		return "", nil
	}

	lo, hi, allowed := floatBounds(sp)
	switch f.Interface().(type) {
	case float64:
		if isNone(s) {
			if null {
				return "", fmt.Errorf("invalid value null: %s (this setting cannot be disabled)", allowed)
			}
			return "value " + strconv.Quote(s) + " ignored: this setting cannot be disabled", nil
		}
		v, err := parseFloat(s)
		if err != nil || v < lo || v > hi {
			return "", fmt.Errorf("invalid value %q: %s", s, allowed)
		}
		f.SetFloat(v)
	case *float64:
		if null || isNone(s) {
			f.Set(reflect.Zero(f.Type()))
			return "", nil
		}
		v, err := parseFloat(s)
		if err != nil || checkSeconds(v, false) != nil {
			return "", fmt.Errorf("invalid value %q: %s, or none/null to disable", s, allowedSeconds(false))
		}
		f.Set(reflect.ValueOf(&v))
	case bool:
		if null {
			return "", fmt.Errorf("invalid value null: must be true or false")
		}
		b, err := parseRuleBool(s, sp.rule)
		if err != nil {
			return "", err
		}
		f.SetBool(b)
	case int:
		v, err := strconv.Atoi(strings.TrimSpace(s))
		lo, hi := 0, MaxCount
		switch sp.key {
		case "max_no_progress_cycles":
			lo = -MaxCount // <= 0 disables
		case "no_restart_exit_code":
			lo, hi = 1, 255
		}
		if err != nil || null || v < lo || v > hi {
			return "", fmt.Errorf("invalid value %q: must be an integer from %d to %d", s, lo, hi)
		}
		f.SetInt(int64(v))
	case *int: // segment: a node count
		if null || isNone(s) {
			f.Set(reflect.Zero(f.Type()))
			return "", nil
		}
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v <= 0 || v > MaxNodes {
			return "", fmt.Errorf("invalid value %q: must be an integer from 1 to %d, or none", s, MaxNodes)
		}
		f.Set(reflect.ValueOf(&v))
	case string:
		if null {
			s = ""
		}
		f.SetString(s)
	case *string:
		if null || s == "" {
			f.Set(reflect.Zero(f.Type()))
			return "", nil
		}
		v := s
		f.Set(reflect.ValueOf(&v))
	default:
		return "", fmt.Errorf("internal error: unsupported type %s for %s", f.Type(), sp.key)
	}
	return "", nil
}

// setFTNode stores a YAML value. Scalars go through setFT so YAML and flags
// accept the same spellings; rank_section_timeouts takes a mapping.
func setFTNode(ft *FaultTolerance, sp ftSpec, n *yaml.Node) error {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if sp.key == "rank_section_timeouts" {
		if n.Tag == "!!null" {
			ft.RankSectionTimeouts = map[string]*float64{}
			return nil
		}
		if n.Kind != yaml.MappingNode {
			return fmt.Errorf("must be a mapping of section name to seconds or null, like {setup: 600, step: null}")
		}
		m := map[string]*float64{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			for v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			if v.Kind == yaml.ScalarNode && (v.Tag == "!!null" || isNone(v.Value)) {
				m[k.Value] = nil
				continue
			}
			x, err := parseFloat(v.Value)
			if err == nil {
				err = checkSeconds(x, false)
			}
			if v.Kind != yaml.ScalarNode || err != nil {
				return fmt.Errorf("section %q: %s, or null", k.Value, allowedSeconds(false))
			}
			m[k.Value] = &x
		}
		ft.RankSectionTimeouts = m
		return nil
	}
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("must be a single value, not a %s; %s", kindName(n.Kind), sp.help)
	}
	rule := sp.rule
	if _, ok := ftFieldKind(ft, sp.key).(bool); ok {
		rule = boolStrict // YAML booleans are true/false; strings must be unambiguous
	}
	sp.rule = rule
	_, err := setFT(ft, sp, n.Value, n.Tag == "!!null")
	return err
}

// floatBounds are the bounds of a float64 field and the message that
// states them: seconds unless the field is a factor or a size.
func floatBounds(sp ftSpec) (lo, hi float64, allowed string) {
	switch sp.key {
	case "safety_factor":
		return MinPositiveSeconds, MaxSafetyFactor, fmt.Sprintf("must be a number from %g to %d", MinPositiveSeconds, MaxSafetyFactor)
	case "gpu_memory_tolerance_mb":
		return 0, MaxMB, fmt.Sprintf("must be a number of MB from 0 to %g", float64(MaxMB))
	case "straggler_threshold":
		return 0.01, 0.9, "must be a fraction from 0.01 to 0.9"
	case "straggler_interval":
		// Each node writes a record to etcd per interval: a few per
		// second at most.
		return 0.1, 3600, "must be a number of seconds from 0.1 to 3600"
	}
	if sp.positive {
		return MinPositiveSeconds, MaxSeconds, allowedSeconds(true)
	}
	return 0, MaxSeconds, allowedSeconds(false)
}

func ftFieldKind(ft *FaultTolerance, key string) any {
	f, ok := ftField(ft, key)
	if !ok {
		return nil
	}
	return f.Interface()
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "value"
}
