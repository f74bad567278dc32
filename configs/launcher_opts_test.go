package configs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVerdictFile: flag > FT_LAUNCHER_VERDICT_FILE > PET_VERDICT_FILE > YAML > default.
func TestVerdictFile(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "ft.yaml")
	writeFile(t, yml, "fault_tolerance:\n  verdict_file: /yaml/v.json\n  rank_heartbeat_timeout: 30\n")
	nullYML := filepath.Join(dir, "null.yaml")
	writeFile(t, nullYML, "fault_tolerance:\n  verdict_file: null\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"default: chosen by the agent", nil, nil, ""},
		{"flag", []string{"--verdict-file", "/f/v.json"}, nil, "/f/v.json"},
		{"underscore flag", []string{"--verdict_file=/f/u.json"}, nil, "/f/u.json"},
		{"PET_VERDICT_FILE", nil, map[string]string{"PET_VERDICT_FILE": "/pet/v.json"}, "/pet/v.json"},
		{"FT_LAUNCHER_VERDICT_FILE beats PET_VERDICT_FILE", nil,
			map[string]string{"PET_VERDICT_FILE": "/pet/v.json", "FT_LAUNCHER_VERDICT_FILE": "/ftl/v.json"}, "/ftl/v.json"},
		{"flag beats the variables", []string{"--verdict-file", "/f/v.json"},
			map[string]string{"PET_VERDICT_FILE": "/pet/v.json", "FT_LAUNCHER_VERDICT_FILE": "/ftl/v.json"}, "/f/v.json"},
		{"YAML", []string{"--ft-cfg-path", yml}, nil, "/yaml/v.json"},
		{"YAML null", []string{"--ft-cfg-path", nullYML}, nil, ""},
		{"variable beats YAML", []string{"--ft-cfg-path", yml}, map[string]string{"FT_LAUNCHER_VERDICT_FILE": "/ftl/v.json"}, "/ftl/v.json"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, append(tt.args, "train.py"), tt.env)
			if c.VerdictFile != tt.want {
				t.Errorf("VerdictFile = %q, want %q", c.VerdictFile, tt.want)
			}
			if len(c.Warnings) != 0 {
				t.Errorf("unexpected warnings %q", c.Warnings)
			}
			if !strings.Contains(c.Effective(), "verdict_file: "+tt.want) {
				t.Errorf("--print-config does not show verdict_file %q", tt.want)
			}
		})
	}
	u := Usage()
	for _, want := range []string{"--verdict-file PATH", "env PET_VERDICT_FILE, FT_LAUNCHER_VERDICT_FILE",
		"JSON verdict written atomically when the launcher exits", "default: verdict.json in the run's log directory", "docs/verdict.md"} {
		if !strings.Contains(strings.Join(strings.Fields(u), " "), want) {
			t.Errorf("Usage() lacks %q", want)
		}
	}
}

func TestVersionFlag(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"--max-restarts", "2", "--version", "x"}, {"--version", "--help"}} {
		if _, err := parse(args, envOf(nil), noGPU(t)); !errors.Is(err, ErrVersion) {
			t.Errorf("%q: got %v, want ErrVersion", args, err)
		}
	}
	c := mustParse(t, []string{"x", "--version"}, nil)
	if !reflect.DeepEqual(c.ScriptArgs, []string{"--version"}) {
		t.Errorf("--version after the script must reach it, got %q", c.ScriptArgs)
	}
}

// TestHelpIsTrue: options stored but not acted on say so, and the help
// cites no document that is not in the repository.
func TestHelpIsTrue(t *testing.T) {
	help := map[string]string{}
	for _, o := range options() {
		help[o.names[0]] = strings.Join(strings.Fields(o.help), " ")
	}
	notActed := "Accepted for nvrx compatibility; not acted on by ft-launcher"
	passed := "Passed through to rank clients only."
	tests := []struct {
		flag, want string
	}{
		{"ft-max-no-progress-cycles", notActed},
		{"ft-min-progress-iterations", notActed},
		{"ft-gpu-memory-reclaim-timeout", notActed},
		{"ft-gpu-memory-tolerance-mb", notActed},
		{"ft-gpu-memory-poll-interval", notActed},
		{"ft-check-remaining-processes", notActed},
		{"ft-cycle-info-dir", notActed},
		{"ft-enable-nic-monitor", notActed},
		{"ft-enable-nic-healthcheck", notActed},
		{"ft-enable-dist-storage-healthcheck", notActed},
		{"ft-storage-health-check-path", notActed},
		{"ft-pci-topo-file", notActed},
		{"ft-link-down-path-template", notActed},
		{"ft-link-state-path-template", notActed},
		{"ft-segment", notActed},
		{"ft-numa-bind-strict", notActed},
		{"ft-restart-check-interval", notActed},
		{"ft-install-exception-hook", passed},
		{"ft-workload-check-interval", passed},
		{"ft-node-health-check-interval", passed},
		{"ft-checkpoint-iteration-file", "ft-launcher only notices it change"},
		{"monitor-interval", "ignored: ft-launcher is event-driven"},
		{"node-rank", "the etcd rendezvous orders nodes by it"},
	}
	for _, tt := range tests {
		if !strings.Contains(help[tt.flag], tt.want) {
			t.Errorf("--%s help %q lacks %q", tt.flag, help[tt.flag], tt.want)
		}
	}
	if strings.Contains(help["node-rank"], "static backend only") {
		t.Errorf("--node-rank help still says static backend only: %q", help["node-rank"])
	}
	u := Usage()
	if m := regexp.MustCompile(`\w+\.md §|reference/`).FindString(u); m != "" {
		t.Errorf("Usage() cites %q", m)
	}
	for _, want := range []string{"--version", "Print the version"} {
		if !strings.Contains(u, want) {
			t.Errorf("Usage() lacks %q", want)
		}
	}
}

// TestSpareAndWalltimeOptions: flag, variable and YAML; defaults; errors.
func TestSpareAndWalltimeOptions(t *testing.T) {
	dir := t.TempDir()
	yml := filepath.Join(dir, "ft.yaml")
	if err := os.WriteFile(yml, []byte("fault_tolerance:\n  spare_filler: python3 filler.py --from-yaml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		filler  string
		reclaim time.Duration
		wt      []syscall.Signal
		err     string
	}{
		{name: "defaults", args: []string{"x"}, reclaim: 30 * time.Second, wt: []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2}},
		{name: "flag", args: []string{"--spare-filler", "sleep 1000", "--spare-filler-reclaim-timeout", "2.5", "--walltime-signals", "USR2", "x"},
			filler: "sleep 1000", reclaim: 2500 * time.Millisecond, wt: []syscall.Signal{syscall.SIGUSR2}},
		{name: "variable", args: []string{"x"}, env: map[string]string{"PET_SPARE_FILLER": "burn"}, filler: "burn",
			reclaim: 30 * time.Second, wt: []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2}},
		{name: "yaml", args: []string{"--ft-cfg-path", yml, "x"}, filler: "python3 filler.py --from-yaml",
			reclaim: 30 * time.Second, wt: []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2}},
		{name: "walltime none", args: []string{"--walltime-signals", "none", "x"}, reclaim: 30 * time.Second},
		{name: "bad reclaim", args: []string{"--spare-filler-reclaim-timeout", "0", "x"}, err: "--spare-filler-reclaim-timeout"},
		{name: "bad walltime signal", args: []string{"--walltime-signals", "USR9", "x"}, err: "--walltime-signals"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.args, func(k string) string { return tc.env[k] }, fakeNet())
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.SpareFiller != tc.filler || c.SpareFillerReclaimTimeout != tc.reclaim || fmt.Sprint(c.WalltimeSignals) != fmt.Sprint(tc.wt) {
				t.Fatalf("filler %q reclaim %v walltime %v", c.SpareFiller, c.SpareFillerReclaimTimeout, c.WalltimeSignals)
			}
		})
	}
}

// TestAgentStoreOption: --agent-store and --agent_store, PET_AGENT_STORE,
// YAML fault_tolerance.agent_store (on/off and YAML booleans); flag > env >
// YAML > default on; a bad value names the allowed ones; --print-config
// shows the value and its source.
func TestAgentStoreOption(t *testing.T) {
	dir := t.TempDir()
	yOff := filepath.Join(dir, "off.yaml")
	writeFile(t, yOff, "fault_tolerance:\n  agent_store: off\n")
	yFalse := filepath.Join(dir, "false.yaml")
	writeFile(t, yFalse, "fault_tolerance:\n  agent_store: false\n")
	yBad := filepath.Join(dir, "bad.yaml")
	writeFile(t, yBad, "fault_tolerance:\n  agent_store: maybe\n")
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		want   bool
		source string
		err    string
	}{
		{name: "default on", want: true, source: "default"},
		{name: "flag off", args: []string{"--agent-store", "off"}, want: false, source: "--agent-store"},
		{name: "underscore flag", args: []string{"--agent_store=off"}, want: false, source: "--agent-store"},
		{name: "flag on, case-insensitive", args: []string{"--agent-store", "ON"}, want: true, source: "--agent-store"},
		{name: "env", env: map[string]string{"PET_AGENT_STORE": "off"}, want: false, source: "PET_AGENT_STORE"},
		{name: "flag over env", args: []string{"--agent-store", "on"}, env: map[string]string{"PET_AGENT_STORE": "off"}, want: true, source: "--agent-store"},
		{name: "yaml", args: []string{"--ft-cfg-path", yOff}, want: false, source: "fault_tolerance.agent_store"},
		{name: "yaml boolean", args: []string{"--ft-cfg-path", yFalse}, want: false, source: "fault_tolerance.agent_store"},
		{name: "env over yaml", args: []string{"--ft-cfg-path", yOff}, env: map[string]string{"PET_AGENT_STORE": "on"}, want: true, source: "PET_AGENT_STORE"},
		{name: "bad flag", args: []string{"--agent-store", "yes"}, err: `--agent-store: invalid value "yes": must be on or off`},
		{name: "bad env", env: map[string]string{"PET_AGENT_STORE": "1"}, err: `PET_AGENT_STORE: invalid value "1": must be on or off`},
		{name: "bad yaml", args: []string{"--ft-cfg-path", yBad}, err: "fault_tolerance.agent_store (line 2): must be on or off"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.err)
			if c == nil {
				return
			}
			if c.AgentStore != tt.want {
				t.Errorf("AgentStore = %v, want %v", c.AgentStore, tt.want)
			}
			checkPrinted(t, c, "agent_store", "\""+onOff(tt.want)+"\"", tt.source)
		})
	}
}

func TestPrewarmImportingOption(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
		err  string
	}{
		{args: []string{"x"}, want: ""},
		{args: []string{"--prewarm-importing", "Wait", "x"}, want: "wait"},
		{args: []string{"x"}, env: map[string]string{"PET_PREWARM_IMPORTING": "stop"}, want: "stop"},
		{args: []string{"--prewarm-importing", "later", "x"}, err: "want auto, wait or stop"},
	} {
		c, err := Parse(tc.args, func(k string) string { return tc.env[k] }, fakeNet())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "prewarm-importing") {
				t.Errorf("%v: err %v, want one naming --prewarm-importing and %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || c.PrewarmImporting != tc.want {
			t.Errorf("%v %v: %q, %v; want %q", tc.args, tc.env, c.PrewarmImporting, err, tc.want)
		}
	}
}

// TestRestartModeOptions: --restart-mode (and its _ spelling),
// PET_RESTART_MODE, YAML fault_tolerance.restart_mode; default full; a bad
// value names the allowed ones; --inprocess-rejoin-timeout likewise.
func TestRestartModeOptions(t *testing.T) {
	dir := t.TempDir()
	yIP := filepath.Join(dir, "ip.yaml")
	writeFile(t, yIP, "fault_tolerance:\n  restart_mode: in-process\n  inprocess_rejoin_timeout: 7.5\n")
	yBad := filepath.Join(dir, "bad.yaml")
	writeFile(t, yBad, "fault_tolerance:\n  restart_mode: partial\n")
	tests := []struct {
		name   string
		args   []string
		env    map[string]string
		mode   string
		rejoin time.Duration
		source string
		err    string
	}{
		{name: "default full", mode: "full", rejoin: 30 * time.Second, source: "default"},
		{name: "flag", args: []string{"--restart-mode", "in-process"}, mode: "in-process", rejoin: 30 * time.Second, source: "--restart-mode"},
		{name: "underscore flag", args: []string{"--restart_mode=In-Process"}, mode: "in-process", rejoin: 30 * time.Second, source: "--restart-mode"},
		{name: "env", env: map[string]string{"PET_RESTART_MODE": "in-process", "PET_INPROCESS_REJOIN_TIMEOUT": "4"}, mode: "in-process", rejoin: 4 * time.Second, source: "PET_RESTART_MODE"},
		{name: "yaml", args: []string{"--ft-cfg-path", yIP}, mode: "in-process", rejoin: 7500 * time.Millisecond, source: "fault_tolerance.restart_mode"},
		{name: "flag over yaml", args: []string{"--ft-cfg-path", yIP, "--restart-mode", "full"}, mode: "full", rejoin: 7500 * time.Millisecond, source: "--restart-mode"},
		{name: "bad flag", args: []string{"--restart-mode", "partial"}, err: `--restart-mode: invalid value "partial": must be full or in-process`},
		{name: "bad env", env: map[string]string{"PET_RESTART_MODE": "x"}, err: `PET_RESTART_MODE: invalid value "x": must be full or in-process`},
		{name: "bad yaml", args: []string{"--ft-cfg-path", yBad}, err: "fault_tolerance.restart_mode (line 2): must be full or in-process"},
		{name: "bad rejoin timeout", args: []string{"--inprocess-rejoin-timeout", "0"}, err: "--inprocess-rejoin-timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.err)
			if c == nil {
				return
			}
			if c.RestartMode != tt.mode || c.InProcessRejoinTimeout != tt.rejoin {
				t.Errorf("mode %q rejoin %v, want %q %v", c.RestartMode, c.InProcessRejoinTimeout, tt.mode, tt.rejoin)
			}
			checkPrinted(t, c, "restart_mode", tt.mode, tt.source)
		})
	}
}

// TestRestartBudgetOptions: --restart-window and --restart-delay (and
// their PET_ variables), with their defaults and bad values.
func TestRestartBudgetOptions(t *testing.T) {
	tests := []struct {
		name          string
		args          []string
		env           map[string]string
		window, delay time.Duration
		err           string
	}{
		{name: "defaults: every restart counts, none waits"},
		{name: "flags", args: []string{"--restart-window", "3600", "--restart_delay=2.5"}, window: time.Hour, delay: 2500 * time.Millisecond},
		{name: "env", env: map[string]string{"PET_RESTART_WINDOW": "60", "PET_RESTART_DELAY": "1"}, window: time.Minute, delay: time.Second},
		{name: "negative window", args: []string{"--restart-window", "-1"}, err: "--restart-window: invalid value \"-1\": must be a number of seconds from 0 to 604800"},
		{name: "delay not a number", args: []string{"--restart-delay", "soon"}, err: "--restart-delay: invalid value \"soon\""},
		{name: "delay past the join timeout", args: []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--restart-delay", "60", "--rdzv-conf", "join_timeout=30"},
			err: "--restart-delay 1m0s is not below the rendezvous join_timeout (30s)"},
		{name: "a delay below the join timeout", args: []string{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29400", "--restart-delay", "20", "--rdzv-conf", "join_timeout=30"}, delay: 20 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.err)
			if c == nil {
				return
			}
			if c.RestartWindow != tt.window || c.RestartDelay != tt.delay {
				t.Errorf("window %v delay %v, want %v %v", c.RestartWindow, c.RestartDelay, tt.window, tt.delay)
			}
		})
	}
}

// parseOrUsageError parses args + "x.py" with env: with wantErr set it
// checks for a usage error containing it and returns nil; else the config.
func parseOrUsageError(t *testing.T, args []string, env map[string]string, wantErr string) *Config {
	t.Helper()
	c, err := parse(append(append([]string{}, args...), "x.py"), envOf(env), noGPU(t))
	if wantErr != "" {
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("got %v, want a usage error containing %q", err, wantErr)
		}
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// checkPrinted: --print-config shows key: value, and its source names source.
func checkPrinted(t *testing.T, c *Config, key, value, source string) {
	t.Helper()
	if want := key + ": " + value + "\n"; !strings.Contains(c.Effective(), want) {
		t.Errorf("--print-config lacks %q:\n%s", want, c.Effective())
	}
	if src := c.Sources[key]; !strings.Contains(src, source) {
		t.Errorf("source of %s = %q, want one naming %q", key, src, source)
	}
}

// TestPrewarmOption: --prewarm (and PET_PREWARM) takes comma-separated
// dotted module names, "off" or nothing for none; a flag taken as its
// value and a bad name are refused with what is allowed.
func TestPrewarmOption(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
		auto bool
		err  string
	}{
		{args: []string{"x"}, want: nil},
		{args: []string{"--prewarm", "auto", "x"}, auto: true},
		{args: []string{"--prewarm", " AUTO", "x"}, auto: true},
		{args: []string{"x"}, env: map[string]string{"PET_PREWARM": "auto"}, auto: true},
		{args: []string{"--prewarm", "auto,torch", "x"}, err: `"auto" is not a Python module name (want auto, off, or dotted names`},
		{args: []string{"--prewarm", "torch, torch.distributed", "x"}, want: []string{"torch", "torch.distributed"}},
		{args: []string{"--prewarm", "off", "x"}, want: nil},
		{args: []string{"x"}, env: map[string]string{"PET_PREWARM": "torch"}, want: []string{"torch"}},
		{args: []string{"--prewarm", "--max-restarts", "3", "x"}, err: `needs a value: auto, off or the Python modules to import ahead, comma-separated (e.g. --prewarm torch,torch.distributed), not the flag "--max-restarts"`},
		{args: []string{"--prewarm", "torch,1x", "x"}, err: `"1x" is not a Python module name (want auto, off, or dotted names`},
	} {
		c, err := Parse(tc.args, func(k string) string { return tc.env[k] }, fakeNet())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "--prewarm") {
				t.Errorf("%v: err %v, want one naming --prewarm and %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(c.Prewarm, tc.want) || c.PrewarmAuto != tc.auto {
			t.Errorf("%v %v: %q auto=%v, %v; want %q auto=%v", tc.args, tc.env, c.Prewarm, c.PrewarmAuto, err, tc.want, tc.auto)
		}
	}
}

// TestPrewarmYAML: fault_tolerance.prewarm takes what --prewarm takes,
// auto included, and a bad value names the key and what is allowed.
func TestPrewarmYAML(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
		auto  bool
		err   string
	}{
		{value: "auto", auto: true},
		{value: "torch,torch.distributed", want: []string{"torch", "torch.distributed"}},
		{value: "off"},
		{value: "torch,auto", err: "fault_tolerance.prewarm (line 2): must be auto, off or comma-separated Python module names"},
	} {
		path := filepath.Join(t.TempDir(), "cfg.yaml")
		writeFile(t, path, "fault_tolerance:\n  prewarm: "+tc.value+"\n")
		c, err := Parse([]string{"--ft-cfg-path", path, "x"}, func(string) string { return "" }, fakeNet())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("prewarm: %s: err %v, want %q", tc.value, err, tc.err)
			}
			continue
		}
		if err != nil || !slices.Equal(c.Prewarm, tc.want) || c.PrewarmAuto != tc.auto {
			t.Errorf("prewarm: %s: %q auto=%v, %v; want %q auto=%v", tc.value, c.Prewarm, c.PrewarmAuto, err, tc.want, tc.auto)
		}
		if tc.auto && !strings.Contains(c.Effective(), "prewarm: auto") {
			t.Errorf("--print-config does not show prewarm: auto:\n%s", c.Effective())
		}
	}
}

// TestStateReplicasOption: --state-replicas defaults to 1 only with
// --state-dir on a job that may have several nodes (and the agent store
// that sets each round's buddies), and a given value is checked against
// the job.
func TestStateReplicasOption(t *testing.T) {
	multi := []string{"--nnodes", "2:3", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "127.0.0.1:2379", "--rdzv-id", "j"}
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    int
		wantErr string
	}{
		{"single node: no buddy", []string{"--state-dir", "/ckpt"}, nil, 0, ""},
		{"several nodes without --state-dir: off", multi, nil, 0, ""},
		{"several nodes with --state-dir: 1", append([]string{"--state-dir", "/ckpt"}, multi...), nil, 1, ""},
		{"agent store off: default off", append([]string{"--state-dir", "/ckpt", "--agent-store", "off"}, multi...), nil, 0, ""},
		{"explicit 2", append([]string{"--state-dir", "/ckpt", "--state-replicas", "2"}, multi...), nil, 2, ""},
		{"explicit 0", append([]string{"--state-dir", "/ckpt", "--state-replicas", "0"}, multi...), nil, 0, ""},
		{"by environment", append([]string{"--state-dir", "/ckpt"}, multi...), map[string]string{"PET_STATE_REPLICAS": "2"}, 2, ""},
		{"more than the other nodes", append([]string{"--state-dir", "/ckpt", "--state-replicas", "3"}, multi...), nil, 0, "at most 2 other nodes"},
		{"above the ring's bound", append([]string{"--state-dir", "/ckpt", "--state-replicas", "5"}, multi...), nil, 0, "--state-replicas"},
		{"without --state-dir", append([]string{"--state-replicas", "1"}, multi...), nil, 0, "needs --state-dir"},
		{"without the agent store", append([]string{"--state-dir", "/ckpt", "--state-replicas", "1", "--agent-store", "off"}, multi...), nil, 0, "needs the launcher's store"},
		{"not a number", []string{"--state-replicas", "x"}, nil, 0, "--state-replicas"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.wantErr)
			if c != nil && c.StateReplicas != tt.want {
				t.Errorf("StateReplicas = %d, want %d", c.StateReplicas, tt.want)
			}
		})
	}
}

// TestStateShmDirOption: --state-shm-dir (and PET_STATE_SHM_DIR) takes an
// absolute directory; a relative one is refused with what is allowed.
func TestStateShmDirOption(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"default: the store uses /dev/shm", []string{"--state-dir", "/ckpt"}, nil, "", ""},
		{"given", []string{"--state-dir", "/ckpt", "--state-shm-dir", "/run/ftl"}, nil, "/run/ftl", ""},
		{"by environment", []string{"--state-dir", "/ckpt"}, map[string]string{"PET_STATE_SHM_DIR": "/run/ftl"}, "/run/ftl", ""},
		{"relative", []string{"--state-dir", "/ckpt", "--state-shm-dir", "shm"}, nil, "", "want an absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.wantErr)
			if c != nil && c.StateShmDir != tt.want {
				t.Errorf("StateShmDir = %q, want %q", c.StateShmDir, tt.want)
			}
		})
	}
}

// TestJobSecretFileOption: --job-secret-file (and PET_JOB_SECRET_FILE)
// takes an absolute path; a relative one is refused with what is allowed.
func TestJobSecretFileOption(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		wantErr string
	}{
		{"default: none", []string{"--state-dir", "/ckpt"}, nil, "", ""},
		{"given", []string{"--state-dir", "/ckpt", "--job-secret-file", "/run/secrets/job"}, nil, "/run/secrets/job", ""},
		{"by environment", []string{"--state-dir", "/ckpt"}, map[string]string{"PET_JOB_SECRET_FILE": "/run/secrets/job"}, "/run/secrets/job", ""},
		{"relative", []string{"--job-secret-file", "secret"}, nil, "", "want an absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := parseOrUsageError(t, tt.args, tt.env, tt.wantErr)
			if c != nil && c.JobSecretFile != tt.want {
				t.Errorf("JobSecretFile = %q, want %q", c.JobSecretFile, tt.want)
			}
		})
	}
}
