package configs

import (
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
)

// TestFTFlags sets every --ft-* field through the dash spelling, nvrx's
// tail-underscore spelling and the full-underscore spelling.
func TestFTFlags(t *testing.T) {
	tests := []struct {
		flag  string
		value string
		check func(ft *FaultTolerance) bool
	}{
		{"ft-workload-check-interval", "2.5", func(f *FaultTolerance) bool { return f.WorkloadCheckInterval == 2.5 }},
		{"ft-initial-rank-heartbeat-timeout", "600", func(f *FaultTolerance) bool { return *f.InitialRankHeartbeatTimeout == 600 }},
		{"ft-rank-heartbeat-timeout", "45", func(f *FaultTolerance) bool { return *f.RankHeartbeatTimeout == 45 }},
		{"ft-rank-heartbeat-timeout", "NULL", func(f *FaultTolerance) bool { return f.RankHeartbeatTimeout == nil }},
		{"ft-rank-heartbeat-timeout", "", func(f *FaultTolerance) bool { return f.RankHeartbeatTimeout == nil }},
		{"ft-rank-section-timeouts", "setup:600,step:180,checkpointing:none", func(f *FaultTolerance) bool {
			return reflect.DeepEqual(f.RankSectionTimeouts, map[string]*float64{"setup": f64(600), "step": f64(180), "checkpointing": nil})
		}},
		{"ft-rank-section-timeouts", "", func(f *FaultTolerance) bool { return len(f.RankSectionTimeouts) == 0 }},
		{"ft-rank-out-of-section-timeout", "300", func(f *FaultTolerance) bool { return *f.RankOutOfSectionTimeout == 300 }},
		{"ft-node-health-check-interval", "9", func(f *FaultTolerance) bool { return f.NodeHealthCheckInterval == 9 }},
		{"ft-safety-factor", "2", func(f *FaultTolerance) bool { return f.SafetyFactor == 2 }},
		{"ft-rank-termination-signal", "sigterm", func(f *FaultTolerance) bool { return f.RankTerminationSignal == syscall.SIGTERM }},
		{"ft-rank-termination-signal", "KILL", func(f *FaultTolerance) bool { return f.RankTerminationSignal == syscall.SIGKILL }},
		{"ft-rank-termination-signal", "10", func(f *FaultTolerance) bool { return f.RankTerminationSignal == syscall.SIGUSR1 }},
		{"ft-log-level", "dbg", func(f *FaultTolerance) bool { return f.LogLevel == 10 }},
		{"ft-log-level", "WARN", func(f *FaultTolerance) bool { return f.LogLevel == 30 }},
		{"ft-log-level", "CRITICAL", func(f *FaultTolerance) bool { return f.LogLevel == 50 }},
		{"ft-log-level", "25", func(f *FaultTolerance) bool { return f.LogLevel == 25 }},
		{"ft-restart-check-interval", "30", func(f *FaultTolerance) bool { return f.RestartCheckInterval == 30 }},
		{"ft-enable-nic-monitor", "on", func(f *FaultTolerance) bool { return f.EnableNicMonitor }}, // not false/0/no
		{"ft-enable-nic-healthcheck", "No", func(f *FaultTolerance) bool { return !f.EnableNicHealthcheck }},
		{"ft-enable-dist-storage-healthcheck", "yes", func(f *FaultTolerance) bool { return f.EnableDistStorageHealthcheck }},
		{"ft-storage-health-check-path", "/lustre,/home", func(f *FaultTolerance) bool { return *f.StorageHealthcheckPath == "/lustre,/home" }},
		{"ft-pci-topo-file", "/etc/topo.xml", func(f *FaultTolerance) bool { return *f.PciTopoFile == "/etc/topo.xml" }},
		{"ft-link-down-path-template", "/sys/{nic}", func(f *FaultTolerance) bool { return *f.LinkDownPathTemplate == "/sys/{nic}" }},
		{"ft-link-state-path-template", "/sys/{nic}/s", func(f *FaultTolerance) bool { return *f.LinkStatePathTemplate == "/sys/{nic}/s" }},
		{"ft-skip-section-response", "maybe", func(f *FaultTolerance) bool { return !f.SkipSectionResponse }}, // true iff true/1/yes
		{"ft-skip-section-response", "TRUE", func(f *FaultTolerance) bool { return f.SkipSectionResponse }},
		{"ft-segment", "4", func(f *FaultTolerance) bool { return *f.Segment == 4 }},
		{"ft-numa-bind-strict", "false", func(f *FaultTolerance) bool { return !f.NumaBindStrict }},
		{"ft-gpu-memory-reclaim-timeout", "0", func(f *FaultTolerance) bool { return f.GpuMemoryReclaimTimeout == 0 }},
		{"ft-gpu-memory-tolerance-mb", "256", func(f *FaultTolerance) bool { return f.GpuMemoryToleranceMB == 256 }},
		{"ft-gpu-memory-poll-interval", "1", func(f *FaultTolerance) bool { return f.GpuMemoryPollInterval == 1 }},
		{"ft-check-remaining-processes", "1", func(f *FaultTolerance) bool { return f.CheckRemainingProcesses }},
		{"ft-max-no-progress-cycles", "-1", func(f *FaultTolerance) bool { return f.MaxNoProgressCycles == -1 }},
		{"ft-min-progress-iterations", "10", func(f *FaultTolerance) bool { return f.MinProgressIterations == 10 }},
		{"ft-checkpoint-iteration-file", "/ckpt/latest.txt", func(f *FaultTolerance) bool { return *f.CheckpointIterationFile == "/ckpt/latest.txt" }},
		{"ft-install-exception-hook", "yes", func(f *FaultTolerance) bool { return f.InstallExceptionHook }},
		{"ft-cycle-info-dir", "/tmp/cycles", func(f *FaultTolerance) bool { return *f.CycleInfoDir == "/tmp/cycles" }},
		{"ft-no-restart-exit-code", "42", func(f *FaultTolerance) bool { return f.NoRestartExitCode == 42 }},
		{"ft-timeouts-state-file", "/tmp/ft_state.json", func(f *FaultTolerance) bool { return f.TimeoutsStateFile == "/tmp/ft_state.json" }},
		{"ft-termination-grace", "7", func(f *FaultTolerance) bool { return f.TerminationGrace == 7 }},
		{"ft-calculate-timeouts", "false", func(f *FaultTolerance) bool { return !f.CalculateTimeouts }},
		{"ft-node-failure-limit", "0", func(f *FaultTolerance) bool { return f.NodeFailureLimit == 0 }},
		{"ft-straggler", "Swap", func(f *FaultTolerance) bool { return f.Straggler == StragglerSwap }},
		{"ft-straggler", "off", func(f *FaultTolerance) bool { return f.Straggler == StragglerOff }},
		{"ft-straggler-threshold", "0.15", func(f *FaultTolerance) bool { return f.StragglerThreshold == 0.15 }},
		{"ft-straggler-window", "60", func(f *FaultTolerance) bool { return f.StragglerWindow == 60 }},
		{"ft-straggler-interval", "2.5", func(f *FaultTolerance) bool { return f.StragglerInterval == 2.5 }},
	}
	for _, tt := range tests {
		tail := "ft-" + strings.ReplaceAll(strings.TrimPrefix(tt.flag, "ft-"), "-", "_")
		spellings := []string{tt.flag, tail, strings.ReplaceAll(tt.flag, "-", "_")}
		for _, sp := range spellings {
			t.Run(sp+"="+tt.value, func(t *testing.T) {
				c := mustParse(t, []string{"--" + sp + "=" + tt.value, "x"}, nil)
				if !tt.check(&c.FT) {
					t.Errorf("--%s=%q: unexpected %+v", sp, tt.value, c.FT)
				}
				if len(c.Warnings) != 0 {
					t.Errorf("unexpected warnings %q", c.Warnings)
				}
			})
		}
	}
}

// TestFTFieldsHaveFlagsOrYAML: every FaultTolerance field is reachable.
func TestFTFieldsReachable(t *testing.T) {
	specs := map[string]bool{}
	for _, sp := range ftSpecs() {
		specs[sp.key] = true
	}
	typ := reflect.TypeOf(FaultTolerance{})
	for i := 0; i < typ.NumField(); i++ {
		if key := typ.Field(i).Tag.Get("yaml"); !specs[key] {
			t.Errorf("field %s (yaml %q) has no ftSpec", typ.Field(i).Name, key)
		}
	}
}

func TestLegacyFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ft.yaml")
	writeFile(t, cfg, "fault_tolerance:\n  rank_out_of_section_timeout: 99\n")
	missing := filepath.Join(dir, "missing.yaml")

	tests := []struct {
		name  string
		args  []string
		warns []string // substrings, one warning each
		check func(*Config) bool
	}{
		{"ft-param underscore field", []string{"--ft-param-rank_section_timeouts=setup:600,step:180", "x"},
			[]string{"deprecated"}, func(c *Config) bool { return *c.FT.RankSectionTimeouts["step"] == 180 }},
		{"ft-param dash field", []string{"--ft-param-rank-out-of-section-timeout", "300", "x"},
			[]string{"deprecated"}, func(c *Config) bool { return *c.FT.RankOutOfSectionTimeout == 300 }},
		{"ft_param full underscore", []string{"--ft_param_enable_nic_monitor", "true", "x"},
			[]string{"deprecated"}, func(c *Config) bool { return c.FT.EnableNicMonitor }},
		{"every ft-param field", []string{
			"--ft-param-workload_check_interval=1", "--ft-param-initial_rank_heartbeat_timeout=2",
			"--ft-param-rank_heartbeat_timeout=3", "--ft-param-node_health_check_interval=4",
			"--ft-param-safety_factor=6", "--ft-param-rank_termination_signal=SIGTERM", "--ft-param-log_level=DEBUG",
			"--ft-param-restart_check_interval=7", "--ft-param-pci-topo-file=/t", "--ft_param_link_down_path_template=/l", "x"},
			[]string{"deprecated", "deprecated", "deprecated", "deprecated", "deprecated", "deprecated", "deprecated", "deprecated", "deprecated", "deprecated"},
			func(c *Config) bool {
				f := c.FT
				return f.WorkloadCheckInterval == 1 && *f.InitialRankHeartbeatTimeout == 2 && *f.RankHeartbeatTimeout == 3 &&
					f.NodeHealthCheckInterval == 4 && f.SafetyFactor == 6 && f.RankTerminationSignal == syscall.SIGTERM &&
					f.LogLevel == 10 && f.RestartCheckInterval == 7 && *f.PciTopoFile == "/t" && *f.LinkDownPathTemplate == "/l"
			}},
		{"fault-tol-cfg-path", []string{"--fault-tol-cfg-path=" + cfg, "x"},
			[]string{"--fault-tol-cfg-path is deprecated"}, func(c *Config) bool { return *c.FT.RankOutOfSectionTimeout == 99 }},
		{"ignore-missing with missing file", []string{"--fault-tol-cfg-path", missing, "--ignore-missing-fault-tol-cfg", "x"},
			[]string{"--fault-tol-cfg-path is deprecated", "--ignore-missing-fault-tol-cfg is deprecated", "does not exist"},
			func(c *Config) bool { return reflect.DeepEqual(c.FT, DefaultFaultTolerance()) }},
		{"ft-ignore-missing-cfg", []string{"--ft-cfg-path", missing, "--ft-ignore-missing-cfg", "x"},
			[]string{"does not exist"}, func(c *Config) bool { return c.FT.RankOutOfSectionTimeout == nil }},
		{"restart-policy", []string{"--restart-policy", "any-failed", "x"}, []string{"--restart-policy is deprecated"}, nil},
		{"restart_policy", []string{"--restart_policy=min-healthy", "x"}, []string{"--restart-policy is deprecated"}, nil},
		{"ft-restart-policy", []string{"--ft-restart-policy", "min-healthy", "x"}, []string{"--ft-restart-policy is deprecated"}, nil},
		{"ft-use-infra-group-rank", []string{"--ft-use-infra-group-rank", "False", "x"}, []string{"--ft-use-infra-group-rank is deprecated"}, nil},
		{"ft-use_infra_group_rank", []string{"--ft-use_infra_group_rank=True", "x"}, []string{"--ft-use-infra-group-rank is deprecated"}, nil},
		{"ft-rdzv-impl legacy", []string{"--ft-rdzv-impl", "legacy", "x"}, []string{"--ft-rdzv-impl is deprecated"}, nil},
		{"NeMo-Framework-Launcher line", []string{"--fault-tol-cfg-path=" + missing, "--ignore-missing-fault-tol-cfg",
			"--rdzv_id=123", "--rdzv_backend=c10d", "--rdzv_endpoint=node1", "--nnodes=2", "--nproc_per_node=1", "--max-restarts=3", "train.py"},
			[]string{"deprecated", "deprecated", "does not exist"}, func(c *Config) bool { return c.RdzvID == "123" && c.MaxRestarts == 3 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.args, nil)
			if len(c.Warnings) != len(tt.warns) {
				t.Fatalf("warnings %q, want %d matching %q", c.Warnings, len(tt.warns), tt.warns)
			}
			for i, w := range tt.warns {
				if !strings.Contains(c.Warnings[i], w) || strings.Contains(c.Warnings[i], "\n") {
					t.Errorf("warning %q does not contain %q", c.Warnings[i], w)
				}
			}
			if tt.check != nil && !tt.check(c) {
				t.Errorf("unexpected config %+v", c.FT)
			}
		})
	}
}

func TestYAML(t *testing.T) {
	tests := []struct {
		name  string
		yaml  string
		warns []string
		check func(*FaultTolerance) bool
	}{
		{"top level", `
fault_tolerance:
  initial_rank_heartbeat_timeout: 600
  rank_heartbeat_timeout: 45.5
  rank_termination_signal: SIGTERM
  log_level: DEBUG
  rank_section_timeouts:
    setup: 600
    step: 180
    checkpointing: null
  enable_nic_monitor: true
  segment: 8
  no_restart_exit_code: 77
`, nil, func(f *FaultTolerance) bool {
			return *f.InitialRankHeartbeatTimeout == 600 && *f.RankHeartbeatTimeout == 45.5 &&
				f.RankTerminationSignal == syscall.SIGTERM && f.LogLevel == 10 && f.EnableNicMonitor &&
				*f.Segment == 8 && f.NoRestartExitCode == 77 &&
				reflect.DeepEqual(f.RankSectionTimeouts, map[string]*float64{"setup": f64(600), "step": f64(180), "checkpointing": nil})
		}},
		{"nemo nesting", `
trainer:
  devices: 8
model:
  optim: {name: adam}
  fault_tolerance:
    rank_termination_signal: 15
    log_level: 30
    rank_out_of_section_timeout: null
    initial_rank_heartbeat_timeout: ~
`, nil, func(f *FaultTolerance) bool {
			return f.RankTerminationSignal == syscall.SIGTERM && f.LogLevel == 30 && f.RankOutOfSectionTimeout == nil
		}},
		{"inside a list, first one wins", `
callbacks:
  - name: checkpoint
  - name: ft
    fault_tolerance:
      safety_factor: 3
  - fault_tolerance:
      safety_factor: 9
`, nil, func(f *FaultTolerance) bool { return f.SafetyFactor == 3 }},
		{"own level before children", `
nested:
  fault_tolerance: {safety_factor: 9}
fault_tolerance: {safety_factor: 4}
`, nil, func(f *FaultTolerance) bool { return f.SafetyFactor == 4 }},
		{"null section skipped", `
fault_tolerance:
model:
  fault_tolerance: {safety_factor: 2}
`, nil, func(f *FaultTolerance) bool { return f.SafetyFactor == 2 }},
		{"alias", `
base: &ft {rank_heartbeat_timeout: 12}
fault_tolerance: *ft
`, nil, func(f *FaultTolerance) bool { return *f.RankHeartbeatTimeout == 12 }},
		{"unknown and unimplemented keys warn", `
fault_tolerance:
  rank_heartbeat_timeout: 5
  made_up_key: 1
  attribution_endpoint: localhost
`, []string{"made_up_key", "attribution_endpoint"}, func(f *FaultTolerance) bool { return *f.RankHeartbeatTimeout == 5 }},
		{"no section", "trainer: {devices: 8}\n", []string{"no fault_tolerance"},
			func(f *FaultTolerance) bool { return reflect.DeepEqual(*f, DefaultFaultTolerance()) }},
		{"empty file", "", []string{"no fault_tolerance"},
			func(f *FaultTolerance) bool { return reflect.DeepEqual(*f, DefaultFaultTolerance()) }},
		{"string none timeout and numeric string", `
fault_tolerance:
  rank_heartbeat_timeout: "none"
  initial_rank_heartbeat_timeout: "30"
  calculate_timeouts: no
  timeouts_state_file: /tmp/state.json
`, nil, func(f *FaultTolerance) bool {
			return f.RankHeartbeatTimeout == nil && *f.InitialRankHeartbeatTimeout == 30 && !f.CalculateTimeouts &&
				f.TimeoutsStateFile == "/tmp/state.json"
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cfg.yaml")
			writeFile(t, path, tt.yaml)
			c := mustParse(t, []string{"--ft-cfg-path", path, "x"}, nil)
			if !tt.check(&c.FT) {
				t.Errorf("unexpected %+v", c.FT)
			}
			if len(c.Warnings) != len(tt.warns) {
				t.Fatalf("warnings %q, want %q", c.Warnings, tt.warns)
			}
			for i, w := range tt.warns {
				if !strings.Contains(c.Warnings[i], w) {
					t.Errorf("warning %q does not contain %q", c.Warnings[i], w)
				}
			}
		})
	}
}

// TestEffective renders the config and feeds the YAML back through
// --ft-cfg-path: the fault_tolerance section must round-trip.
func TestEffective(t *testing.T) {
	c := mustParse(t, []string{"--ft-rank-section-timeouts", "setup:60,step:none", "--ft-rank-termination-signal", "SIGTERM",
		"--ft-rank-heartbeat-timeout", "30", "--ft-segment=2", "--ft-pci-topo-file=/t", "--nnodes", "1:3", "--rdzv-endpoint", "10.0.0.9", "-t", "0:3,1:1",
		"--rdzv-password", "hunter2", "train.py", "--lr", "0.1"}, nil)
	out := c.Effective()
	for _, want := range []string{"fault_tolerance:\n", "rank_termination_signal: SIGTERM", "launch:\n", "nnodes: \"1:3\"",
		"tee: 0:3,1:1", "local_ranks_filter: null", "rdzv_password: <redacted>", "- --lr", "training_script: train.py"} {
		if !strings.Contains(out, want) {
			t.Errorf("Effective() lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "hunter2") {
		t.Errorf("password leaked:\n%s", out)
	}
	path := filepath.Join(t.TempDir(), "effective.yaml")
	writeFile(t, path, out)
	back := mustParse(t, []string{"--ft-cfg-path", path, "x"}, nil)
	if !reflect.DeepEqual(back.FT, c.FT) {
		t.Errorf("round trip:\n got %+v\nwant %+v", back.FT, c.FT)
	}
	if len(back.Warnings) != 0 {
		t.Errorf("round trip warnings %q", back.Warnings)
	}
}
