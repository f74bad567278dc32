package configs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrors: every bad input gives a one-line *UsageError naming the flag,
// variable or key and what is allowed.
func TestErrors(t *testing.T) {
	dir := t.TempDir()
	yamlFile := func(name, content string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, content)
		return p
	}
	malformed := yamlFile("bad.yaml", "fault_tolerance:\n  rank_heartbeat_timeout: 5\n   log_level: [\n")
	badType := yamlFile("type.yaml", "a: 1\nfault_tolerance:\n  safety_factor: 2\n  rank_heartbeat_timeout: soon\n")
	badSignal := yamlFile("sig.yaml", "fault_tolerance:\n  rank_termination_signal: SIGNOPE\n")
	badLevel := yamlFile("lvl.yaml", "fault_tolerance:\n  log_level: LOUD\n")
	badSections := yamlFile("sec.yaml", "fault_tolerance:\n  rank_section_timeouts: [1, 2]\n")
	badSectionVal := yamlFile("secv.yaml", "fault_tolerance:\n  rank_section_timeouts: {step: fast}\n")
	badBool := yamlFile("bool.yaml", "fault_tolerance:\n  enable_nic_monitor: perhaps\n")
	listValue := yamlFile("list.yaml", "fault_tolerance:\n  safety_factor: [1]\n")
	nullInterval := yamlFile("null.yaml", "fault_tolerance:\n  workload_check_interval: null\n")
	unreadable := filepath.Join(dir, "dir.yaml")
	if err := os.Mkdir(unreadable, 0o700); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string // every one must appear in the message
	}{
		{"unknown flag with suggestion", []string{"--nproc-per-nodes", "2", "x"}, nil, []string{"unknown flag --nproc-per-nodes", "--nproc-per-node"}},
		{"straggler mode", []string{"--ft-straggler", "kill", "x"}, nil, []string{"--ft-straggler", `invalid value "kill": must be report, swap or off`}},
		{"straggler threshold", []string{"--ft-straggler-threshold", "1.5", "x"}, nil, []string{"--ft-straggler-threshold", "must be a fraction from 0.01 to 0.9"}},
		{"straggler interval", []string{"--ft-straggler-interval", "0.01", "x"}, nil, []string{"--ft-straggler-interval", "must be a number of seconds from 0.1 to 3600"}},
		{"node failure limit", []string{"--ft-node-failure-limit", "-1", "x"}, nil, []string{"--ft-node-failure-limit", "must be an integer from 0"}},
		{"abbreviation", []string{"--max-rest", "2", "x"}, nil, []string{"unknown flag --max-rest", "--max-restarts", "abbreviated"}},
		{"unknown flag no suggestion", []string{"--frobnicate", "x"}, nil, []string{"unknown flag --frobnicate", "--help"}},
		{"state persist every bad", []string{"--state-persist-every", "often", "x"}, nil, []string{"--state-persist-every", "count of saves", "duration"}},
		{"unknown short flag", []string{"-q", "x"}, nil, []string{"-q", "-m, -r, -t"}},
		{"no arguments at all", []string{}, nil, []string{"missing training script"}},
		{"flag needs a value", []string{"--max-restarts"}, nil, []string{"--max-restarts requires a value", "N"}},
		{"short flag needs a value", []string{"-t"}, nil, []string{"-t requires a value", "0-3"}},
		{"missing script", []string{"--max-restarts", "2"}, nil, []string{"missing training script"}},
		{"missing script after --", []string{"--"}, nil, []string{"missing training script"}},
		{"bad flag syntax", []string{"---x", "y"}, nil, []string{"---x", "--name"}},
		{"negative restarts", []string{"--max-restarts=-1", "x"}, nil, []string{"--max-restarts", "integer from 0 to 1000000000"}},
		{"negative restarts env", []string{"x"}, map[string]string{"PET_MAX_RESTARTS": "-2"}, []string{"PET_MAX_RESTARTS", "integer from 0 to 1000000000"}},
		{"restarts not int", []string{"--max_restarts", "three", "x"}, nil, []string{"--max-restarts", "\"three\"", "integer from 0 to 1000000000"}},
		{"bad nnodes zero", []string{"--nnodes", "0", "x"}, nil, []string{"--nnodes", "0 < MIN <= MAX"}},
		{"bad nnodes order", []string{"--nnodes", "4:2", "x"}, nil, []string{"--nnodes", "MIN:MAX"}},
		{"bad nnodes shape", []string{"--nnodes", "1:2:3", "x"}, nil, []string{"--nnodes", "N or MIN:MAX"}},
		{"bad nnodes env", []string{"x"}, map[string]string{"PET_NNODES": "a"}, []string{"PET_NNODES", "N or MIN:MAX"}},
		{"bad nproc", []string{"--nproc-per-node", "many", "x"}, nil, []string{"--nproc-per-node", "cpu, gpu or auto"}},
		{"zero nproc", []string{"--nproc_per_node=0", "x"}, nil, []string{"--nproc-per-node", "integer from 1 to 4096"}},
		{"gpu without gpus", []string{"--nproc-per-node", "gpu", "x"}, nil, []string{"--nproc-per-node", "no NVIDIA GPU found", "cpu or auto"}},
		{"gpu without gpus env", []string{"x"}, map[string]string{"PET_NPROC_PER_NODE": "gpu"}, []string{"PET_NPROC_PER_NODE", "no NVIDIA GPU found"}},
		{"bad monitor interval", []string{"--monitor-interval", "1s", "x"}, nil, []string{"--monitor-interval", "seconds from 0.001 to 604800 (7 days)"}},
		{"zero monitor interval", []string{"--monitor-interval", "0", "x"}, nil, []string{"--monitor-interval", "seconds from 0.001 to 604800 (7 days)"}},
		{"bad term timeout", []string{"--term-timeout", "-5", "x"}, nil, []string{"--term-timeout", "seconds from 0 to 604800 (7 days)"}},
		{"bad shutdown timeout", []string{"--shutdown_timeout", "soon", "x"}, nil, []string{"--shutdown-timeout", "seconds from 0 to 604800 (7 days)"}},
		{"bad workers stop timeout", []string{"--workers-stop-timeout", "NaN", "x"}, nil, []string{"--workers-stop-timeout", "seconds from 0 to 604800 (7 days)"}},
		{"bad start method", []string{"--start-method", "exec", "x"}, nil, []string{"--start-method", "spawn, fork or forkserver"}},
		{"bad backend", []string{"--rdzv-backend", "zookeeper", "x"}, nil, []string{"--rdzv-backend", "static, c10d, etcd or etcd-v2"}},
		{"rdzv conf empty key", []string{"--rdzv-conf", "=1", "x"}, nil, []string{"--rdzv-conf", "key=value"}},
		{"rdzv conf empty value", []string{"--rdzv-conf", "a=1,b=", "x"}, nil, []string{"--rdzv-conf", "\"b\"", "must have a value"}},
		{"rdzv conf no equals", []string{"--rdzv-conf", "timeout", "x"}, nil, []string{"--rdzv-conf", "\"timeout\"", "must have a value"}},
		{"rdzv conf empty pair", []string{"--rdzv-conf", "a=1,,b=2", "x"}, nil, []string{"--rdzv-conf", "key=value"}},
		{"bad master port", []string{"--master-port", "70000", "x"}, nil, []string{"--master-port", "0-65535"}},
		{"bad node rank", []string{"--node-rank", "-1", "x"}, nil, []string{"--node-rank", "integer from 0 to 65535"}},
		{"bad redirects", []string{"-r", "4", "x"}, nil, []string{"-r/--redirects", "0 (none), 1 (stdout), 2 (stderr), 3 (both)", "0:1,1:2"}},
		{"bad redirects map", []string{"--redirects", "10:1", "x"}, nil, []string{"--redirects", "single-digit"}},
		{"bad tee", []string{"--tee=0:1,", "x"}, nil, []string{"--tee", "0:1,1:2"}},
		{"bad tee env", []string{"x"}, map[string]string{"PET_TEE": "all"}, []string{"PET_TEE", "0:1,1:2"}},
		{"bad ranks filter", []string{"--local-ranks-filter", "0,a", "x"}, nil, []string{"--local-ranks-filter", "comma-separated local ranks"}},
		{"negative ranks filter", []string{"--local_ranks_filter=-1", "x"}, nil, []string{"--local-ranks-filter", "integers from 0 to 4095"}},
		{"bad signals", []string{"--signals-to-handle", "SIGTERM,SIGFOO", "x"}, nil, []string{"--signals-to-handle", "signal names or numbers"}},
		{"bool env not int", []string{"x"}, map[string]string{"PET_STANDALONE": "true"}, []string{"PET_STANDALONE", "\"true\"", "integer (0 = off, 1 = on)"}},
		{"bool env not int module", []string{"x"}, map[string]string{"PET_MODULE": "yes"}, []string{"PET_MODULE", "integer"}},
		{"switch with bad value", []string{"--standalone=maybe", "x"}, nil, []string{"--standalone", "true or false"}},
		{"module with no-python", []string{"-m", "--no-python", "x"}, nil, []string{"-m/--module", "--no-python", "cannot be used together"}},
		{"in-process without the agent store", []string{"--restart-mode", "in-process", "--agent-store", "off", "x"}, nil,
			[]string{"--restart-mode in-process needs the launcher's store", "--agent-store is off", "use --restart-mode full"}},
		{"in-process without the agent store, env", []string{"--restart-mode", "in-process", "x"}, map[string]string{"PET_AGENT_STORE": "off"},
			[]string{"--restart-mode in-process needs", "PET_AGENT_STORE is off"}},
		{"run-path", []string{"--run-path", "/abs/x.py"}, nil, []string{"--run-path is not supported:"}},
		{"run_path", []string{"--run_path", "/abs/x.py"}, nil, []string{"--run-path is not supported:"}},
		{"run-path env", []string{"x"}, map[string]string{"PET_RUN_PATH": "1"}, []string{"PET_RUN_PATH", "--run-path is not supported:"}},

		{"ft timeout", []string{"--ft-rank-heartbeat-timeout", "soon", "x"}, nil, []string{"--ft-rank-heartbeat-timeout", "seconds from 0 to 604800 (7 days), or none/null"}},
		{"ft timeout negative", []string{"--ft-initial_rank_heartbeat_timeout=-3", "x"}, nil, []string{"--ft-initial-rank-heartbeat-timeout", "seconds from 0 to 604800 (7 days)"}},
		{"ft interval zero", []string{"--ft-workload-check-interval", "0", "x"}, nil, []string{"--ft-workload-check-interval", "seconds from 0.001 to 604800 (7 days)"}},
		{"ft sections", []string{"--ft-rank-section-timeouts", "setup=600", "x"}, nil, []string{"--ft-rank-section-timeouts", "name:seconds"}},
		{"ft sections value", []string{"--ft-rank-section-timeouts", "step:fast", "x"}, nil, []string{"--ft-rank-section-timeouts", "\"step\"", "seconds from 0 to 604800 (7 days), or none"}},
		{"ft signal", []string{"--ft-rank-termination-signal", "SIGNOPE", "x"}, nil, []string{"--ft-rank-termination-signal", "SIGKILL, sigterm, KILL"}},
		{"ft signal number", []string{"--ft-rank-termination-signal", "999", "x"}, nil, []string{"--ft-rank-termination-signal", "number"}},
		{"ft log level", []string{"--ft-log-level", "LOUD", "x"}, nil, []string{"--ft-log-level", "DEBUG, DBG, INFO, WARNING, WARN, ERROR, CRITICAL"}},
		{"ft log level range", []string{"--ft-log-level", "99", "x"}, nil, []string{"--ft-log-level", "0-50"}},
		{"ft strict bool", []string{"--ft-enable-dist-storage-healthcheck", "maybe", "x"}, nil, []string{"--ft-enable-dist-storage-healthcheck", "true/1/yes or false/0/no"}},
		{"ft storage paths", []string{"--ft-storage-health-check-path", "/ok,relative", "x"}, nil, []string{"--ft-storage-health-check-path", "absolute paths"}},
		{"ft exit code", []string{"--ft-no-restart-exit-code", "300", "x"}, nil, []string{"--ft-no-restart-exit-code", "integer from 1 to 255"}},
		{"ft int", []string{"--ft-min-progress-iterations", "x1", "x"}, nil, []string{"--ft-min-progress-iterations", "integer from 0 to 1000000000"}},
		{"ft segment", []string{"--ft_segment", "0", "x"}, nil, []string{"--ft-segment", "integer from 1 to 65536, or none"}},
		{"legacy ft-param bad value", []string{"--ft-param-rank_heartbeat_timeout", "x1", "x"}, nil, []string{"--ft-param-rank-heartbeat-timeout", "seconds from 0 to 604800 (7 days)"}},

		{"yaml unreadable", []string{"--ft-cfg-path", filepath.Join(dir, "nope.yaml"), "x"}, nil, []string{"--ft-cfg-path", "nope.yaml", "cannot read"}},
		{"yaml unreadable env", []string{"x"}, map[string]string{"PET_FT_CFG_PATH": filepath.Join(dir, "nope.yaml")}, []string{"PET_FT_CFG_PATH", "nope.yaml"}},
		{"yaml is a directory", []string{"--ft-cfg-path", unreadable, "--ft-ignore-missing-cfg", "x"}, nil, []string{"--ft-cfg-path", "dir.yaml", "cannot read"}},
		{"yaml malformed", []string{"--ft-cfg-path", malformed, "x"}, nil, []string{"--ft-cfg-path", "bad.yaml", "not valid YAML", "line 3"}},
		{"yaml wrong type", []string{"--ft-cfg-path", badType, "x"}, nil, []string{"fault_tolerance.rank_heartbeat_timeout", "line 4", "\"soon\"", "seconds from 0 to 604800 (7 days), or none/null"}},
		{"yaml bad signal", []string{"--ft-cfg-path", badSignal, "x"}, nil, []string{"fault_tolerance.rank_termination_signal", "line 2", "SIGKILL, sigterm, KILL"}},
		{"yaml bad level", []string{"--ft-cfg-path", badLevel, "x"}, nil, []string{"fault_tolerance.log_level", "line 2", "DEBUG"}},
		{"yaml sections not a mapping", []string{"--ft-cfg-path", badSections, "x"}, nil, []string{"fault_tolerance.rank_section_timeouts", "line 2", "mapping of section name"}},
		{"yaml section value", []string{"--ft-cfg-path", badSectionVal, "x"}, nil, []string{"fault_tolerance.rank_section_timeouts", "\"step\"", "seconds from 0 to 604800 (7 days), or null"}},
		{"yaml bad bool", []string{"--ft-cfg-path", badBool, "x"}, nil, []string{"fault_tolerance.enable_nic_monitor", "line 2", "true/1/yes or false/0/no"}},
		{"yaml list for number", []string{"--ft-cfg-path", listValue, "x"}, nil, []string{"fault_tolerance.safety_factor", "line 2", "not a list"}},
		{"yaml null for interval", []string{"--ft-cfg-path", nullInterval, "x"}, nil, []string{"fault_tolerance.workload_check_interval", "seconds from 0.001 to 604800 (7 days)", "cannot be disabled"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(tt.args, envOf(tt.env), noGPU(t))
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("%q: got %v (%T), want *UsageError", tt.args, err, err)
			}
			msg := ue.Error()
			t.Log(msg)
			if strings.Contains(msg, "\n") || msg == "" {
				t.Errorf("message is not one line: %q", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message %q lacks %q", msg, w)
				}
			}
		})
	}
}

// TestUsageMentionsEveryFlag: the help text names every registered flag,
// every legacy spelling and every PET_ variable.
func TestUsageMentionsEveryFlag(t *testing.T) {
	u := Usage()
	for _, o := range options() {
		for _, n := range append(append([]string{}, o.names...), o.legacy...) {
			if !strings.Contains(u, "--"+n) {
				t.Errorf("Usage() does not mention --%s", n)
			}
		}
		if o.short != "" && !strings.Contains(u, "-"+o.short+", --"+o.names[0]) {
			t.Errorf("Usage() does not mention -%s", o.short)
		}
		if env := o.envName(); env != "" && !strings.Contains(u, env) {
			t.Errorf("Usage() does not mention %s", env)
		}
	}
	for _, want := range []string{"-h, --help", "PYTHON_EXEC", "Precedence", "fault_tolerance:", "none, null or ''"} {
		if !strings.Contains(u, want) {
			t.Errorf("Usage() lacks %q", want)
		}
	}
}
