package configs

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/k8s"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/state"
)

// envOf returns a getenv over m.
func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// noGPU is a machine without NVIDIA devices (an empty /dev) and 7 CPUs.
func noGPU(t *testing.T) machine {
	return machine{devDir: t.TempDir(), numCPU: 7}
}

// withGPUs fakes /dev with n NVIDIA device nodes plus the control nodes a real
// driver creates; no GPU exists on the test machine, so this stands in for one.
func withGPUs(t *testing.T, n int) machine {
	dir := t.TempDir()
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-modeset"}
	for i := 0; i < n; i++ {
		names = append(names, "nvidia"+string(rune('0'+i)))
	}
	for _, name := range names {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return machine{devDir: dir, numCPU: 7}
}

func mustParse(t *testing.T, args []string, env map[string]string) *Config {
	t.Helper()
	c, err := parse(args, envOf(env), noGPU(t))
	if err != nil {
		t.Fatalf("parse(%q): %v", args, err)
	}
	return c
}

func f64(v float64) *float64 { return &v }

// TestTorchrunFlags checks every torchrun flag family in its dash and its
// underscore spelling, and through its PET_ variable.
func TestTorchrunFlags(t *testing.T) {
	tests := []struct {
		flag  string // dash spelling, without --
		value string
		check func(c *Config) bool
	}{
		{"nnodes", "2:4", func(c *Config) bool { return c.NNodes == NNodes{2, 4} && c.Rdzv.Mode == RdzvEmbedded }},
		{"nproc-per-node", "3", func(c *Config) bool { return c.NProcPerNode == 3 && c.NProcSpec == "3" }},
		{"nproc-per-node", "cpu", func(c *Config) bool { return c.NProcPerNode == 7 }},
		{"nproc-per-node", "auto", func(c *Config) bool { return c.NProcPerNode == 7 }},
		{"rdzv-backend", "etcd-v2", func(c *Config) bool { return c.RdzvBackend == "etcd-v2" }},
		{"rdzv-endpoint", "[::1]:2379", func(c *Config) bool { return c.RdzvEndpoint == "[::1]:2379" }},
		{"rdzv-id", "job42", func(c *Config) bool { return c.RdzvID == "job42" }},
		{"rdzv-conf", " join_timeout = 60 ,is_host=1", func(c *Config) bool {
			return reflect.DeepEqual(c.RdzvConf, map[string]string{"join_timeout": "60", "is_host": "1"})
		}},
		{"max-restarts", "5", func(c *Config) bool { return c.MaxRestarts == 5 }},
		{"monitor-interval", "0.5", func(c *Config) bool { return c.MonitorInterval == 500*time.Millisecond }},
		{"start-method", "fork", func(c *Config) bool { return c.StartMethod == "fork" }},
		{"role", "trainer", func(c *Config) bool { return c.Role == "trainer" }},
		{"log-dir", "/tmp/logs", func(c *Config) bool { return c.LogDir == "/tmp/logs" }},
		{"redirects", "3", func(c *Config) bool { return c.Redirects.All == StdBoth && c.Redirects.PerRank == nil }},
		{"tee", "0:1,1:2", func(c *Config) bool {
			return c.Tee.For(0) == StdOut && c.Tee.For(1) == StdErr && c.Tee.For(2) == StdNone
		}},
		{"local-ranks-filter", "0, 2", func(c *Config) bool { return reflect.DeepEqual(c.LocalRanksFilter, []int{0, 2}) }},
		{"node-rank", "3", func(c *Config) bool { return c.NodeRank == 3 }},
		{"master-addr", "10.0.0.1", func(c *Config) bool { return c.MasterAddr == "10.0.0.1" }},
		{"master-port", "1234", func(c *Config) bool { return c.MasterPort == 1234 }},
		{"local-addr", "node7", func(c *Config) bool { return c.LocalAddr == "node7" }},
		{"signals-to-handle", "SIGUSR1,term,2", func(c *Config) bool {
			return reflect.DeepEqual(c.SignalsToHandle, []syscall.Signal{syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT})
		}},
		{"shutdown-timeout", "45", func(c *Config) bool { return c.TermTimeout == 45*time.Second }},
		{"term-timeout", "12.5", func(c *Config) bool { return c.TermTimeout == 12500*time.Millisecond }},
		{"workers-stop-timeout", "3", func(c *Config) bool { return c.WorkersStopTimeout == 3*time.Second }},
		{"rdzv-ca-cert", "/ca.pem", func(c *Config) bool { return c.RdzvCACert == "/ca.pem" }},
		{"rdzv-cert", "/c.pem", func(c *Config) bool { return c.RdzvCert == "/c.pem" }},
		{"rdzv-key", "/k.pem", func(c *Config) bool { return c.RdzvKey == "/k.pem" }},
		{"rdzv-user", "alice", func(c *Config) bool { return c.RdzvUser == "alice" }},
		{"rdzv-password", "s3cret", func(c *Config) bool { return c.RdzvPassword == "s3cret" }},
		{"event-log", "/tmp/ev.jsonl", func(c *Config) bool { return c.EventLog == "/tmp/ev.jsonl" }},
		{"state-dir", "/ckpt", func(c *Config) bool { return c.StateDir == "/ckpt" }},
		{"state-persist-every", "10", func(c *Config) bool { return c.StatePersist == state.Every{Saves: 10} }},
		{"state-persist-every", "90s", func(c *Config) bool { return c.StatePersist == state.Every{Interval: 90 * time.Second} }},
		{"metrics-addr", "127.0.0.1:9400", func(c *Config) bool { return c.MetricsAddr == "127.0.0.1:9400" }},
		{"health-check-cmd", "nvidia-smi -L", func(c *Config) bool { return c.HealthCheckCmd == "nvidia-smi -L" }},
	}
	for _, tt := range tests {
		under := strings.ReplaceAll(tt.flag, "-", "_")
		env := "PET_" + strings.ToUpper(under)
		cases := map[string]struct {
			args []string
			env  map[string]string
		}{
			"dash":        {[]string{"--" + tt.flag, tt.value, "train.py"}, nil},
			"underscore":  {[]string{"--" + under + "=" + tt.value, "train.py"}, nil},
			"environment": {[]string{"train.py"}, map[string]string{env: tt.value}},
		}
		for name, cs := range cases {
			if tt.flag == "nnodes" { // several nodes need a rendezvous endpoint
				cs.env = map[string]string{env: cs.env[env], "PET_RDZV_ENDPOINT": "10.0.0.9"}
				if name != "environment" {
					delete(cs.env, env)
				}
			}
			t.Run(tt.flag+"/"+tt.value+"/"+name, func(t *testing.T) {
				c := mustParse(t, cs.args, cs.env)
				if !tt.check(c) {
					t.Errorf("%v env %v: unexpected config %+v", cs.args, cs.env, c)
				}
			})
		}
	}
}

func TestDefaults(t *testing.T) {
	c := mustParse(t, []string{"train.py"}, nil)
	want := defaultConfig()
	want.NProcPerNode = 1
	want.Script = "train.py"
	want.ScriptArgs = []string{}
	want.PythonExec = "python3"
	want.Rdzv = Rendezvous{Mode: RdzvSingleNode, EtcdMember: -1, MinNodesWait: time.Second, JoinTimeout: 10 * time.Minute, LastCallTimeout: 500 * time.Millisecond,
		ConnectTimeout: 20 * time.Second, LeaseTTL: 6 * time.Second, EtcdLossBound: time.Minute, RejoinWait: 25 * time.Second}
	want.InfraRank, want.InfraRankFrom = -1, "none"
	want.Slurm = slurm.Env{ProcID: -1, NodeID: -1, NNodes: -1, ArrayTaskID: -1, RestartCount: -1, LocalID: -1}
	want.K8s = k8s.Env{CompletionIndex: -1, PodOrdinal: -1, WorkloadResets: -1, JobSetRestartAttempt: -1}
	for k, v := range c.Sources {
		if v != "default" {
			t.Errorf("source of %s is %q with nothing given, want default", k, v)
		}
	}
	if len(c.Sources) == 0 || c.Sources["rdzv_endpoint"] != "default" {
		t.Errorf("sources %v lack the launch options", c.Sources)
	}
	want.Sources = c.Sources
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", c, want)
	}
	if c.NodeRank != -1 || c.RdzvBackend != "c10d" || c.FT.NoRestartExitCode != 93 || c.TermTimeout != 1800*time.Second {
		t.Errorf("unexpected defaults %+v", c)
	}
}

func TestSwitches(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(*Config) bool
	}{
		{"-m", []string{"-m", "pkg.train"}, nil, func(c *Config) bool { return c.Module && c.Script == "pkg.train" }},
		{"--module", []string{"--module", "pkg.train"}, nil, func(c *Config) bool { return c.Module }},
		{"PET_MODULE=1", []string{"pkg.train"}, map[string]string{"PET_MODULE": "1"}, func(c *Config) bool { return c.Module }},
		{"PET_MODULE=0", []string{"pkg.train"}, map[string]string{"PET_MODULE": "0"}, func(c *Config) bool { return !c.Module }},
		{"PET_MODULE=2 is on", []string{"x"}, map[string]string{"PET_MODULE": " 2 "}, func(c *Config) bool { return c.Module }},
		{"--no-python", []string{"--no-python", "/bin/true"}, nil, func(c *Config) bool { return c.NoPython }},
		{"--no_python", []string{"--no_python", "/bin/true"}, nil, func(c *Config) bool { return c.NoPython }},
		{"PET_NO_PYTHON", []string{"/bin/true"}, map[string]string{"PET_NO_PYTHON": "1"}, func(c *Config) bool { return c.NoPython }},
		{"--standalone=false", []string{"--standalone=false", "x"}, nil, func(c *Config) bool { return !c.Standalone }},
		{"flag beats PET_ 0", []string{"--standalone", "x"}, map[string]string{"PET_STANDALONE": "0"}, func(c *Config) bool { return c.Standalone }},
		{"--print-config", []string{"--print-config", "x"}, nil, func(c *Config) bool { return c.PrintConfig }},
		{"--run-path=false", []string{"--run-path=false", "x"}, nil, func(c *Config) bool { return c.Script == "x" }},
		{"PYTHON_EXEC", []string{"x"}, map[string]string{"PYTHON_EXEC": "/usr/bin/python3"}, func(c *Config) bool { return c.PythonExec == "/usr/bin/python3" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustParse(t, tt.args, tt.env); !tt.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestPrecedence(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ft.yaml")
	other := filepath.Join(dir, "other.yaml")
	writeFile(t, cfg, "fault_tolerance:\n  rank_heartbeat_timeout: 111\n  log_level: ERROR\n")
	writeFile(t, other, "fault_tolerance:\n  rank_heartbeat_timeout: 222\n")

	tests := []struct {
		name  string
		args  []string
		env   map[string]string
		check func(*Config) bool
	}{
		{"flag beats env", []string{"--max-restarts", "4", "x"}, map[string]string{"PET_MAX_RESTARTS": "9"},
			func(c *Config) bool { return c.MaxRestarts == 4 }},
		{"env beats default", []string{"x"}, map[string]string{"PET_MAX_RESTARTS": "9"},
			func(c *Config) bool { return c.MaxRestarts == 9 }},
		{"last flag wins", []string{"--max-restarts", "1", "--max_restarts", "2", "x"}, nil,
			func(c *Config) bool { return c.MaxRestarts == 2 }},
		{"term-timeout then shutdown-timeout", []string{"--term-timeout", "10", "--shutdown-timeout", "20", "x"}, nil,
			func(c *Config) bool { return c.TermTimeout == 20*time.Second }},
		{"shutdown flag beats term env", []string{"--shutdown-timeout", "20", "x"}, map[string]string{"PET_TERM_TIMEOUT": "10"},
			func(c *Config) bool { return c.TermTimeout == 20*time.Second }},
		{"yaml beats default", []string{"--ft-cfg-path", cfg, "x"}, nil,
			func(c *Config) bool { return *c.FT.RankHeartbeatTimeout == 111 && c.FT.LogLevel == 40 }},
		{"flag beats yaml", []string{"--ft-rank-heartbeat-timeout=5", "--ft-cfg-path", cfg, "x"}, nil,
			func(c *Config) bool { return *c.FT.RankHeartbeatTimeout == 5 && c.FT.LogLevel == 40 }},
		{"none flag disables yaml timeout", []string{"--ft-cfg-path", cfg, "--ft-rank-heartbeat-timeout", "None", "x"}, nil,
			func(c *Config) bool { return c.FT.RankHeartbeatTimeout == nil }},
		{"PET_FT_CFG_PATH", []string{"x"}, map[string]string{"PET_FT_CFG_PATH": cfg},
			func(c *Config) bool { return *c.FT.RankHeartbeatTimeout == 111 && c.CfgPath == cfg }},
		{"cfg flag beats PET_FT_CFG_PATH", []string{"--ft-cfg-path", other, "x"}, map[string]string{"PET_FT_CFG_PATH": cfg},
			func(c *Config) bool { return *c.FT.RankHeartbeatTimeout == 222 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustParse(t, tt.args, tt.env); !tt.check(c) {
				t.Errorf("unexpected config %+v / %+v", c, c.FT)
			}
		})
	}
}

func TestScriptArgs(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		script     string
		scriptArgs []string
		restarts   int
	}{
		{"launcher-looking args go to the script",
			[]string{"--max-restarts", "1", "train.py", "--max-restarts", "7", "-m", "--nnodes=3", "--", "--help"},
			"train.py", []string{"--max-restarts", "7", "-m", "--nnodes=3", "--", "--help"}, 1},
		{"local_rank macro left for the agent",
			[]string{"train.py", "--local-rank=${local_rank}", "${local_rank}"},
			"train.py", []string{"--local-rank=${local_rank}", "${local_rank}"}, 0},
		{"-- ends options", []string{"--max-restarts=2", "--", "--weird.py", "a"}, "--weird.py", []string{"a"}, 2},
		{"-- then ordinary script", []string{"--", "train.py", "--max-restarts", "3"}, "train.py", []string{"--max-restarts", "3"}, 0},
		{"empty and spaced args kept", []string{"train.py", "", "a b", "-"}, "train.py", []string{"", "a b", "-"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := mustParse(t, tt.args, nil)
			if c.Script != tt.script || !reflect.DeepEqual(c.ScriptArgs, tt.scriptArgs) || c.MaxRestarts != tt.restarts {
				t.Errorf("script %q args %q restarts %d; want %q %q %d", c.Script, c.ScriptArgs, c.MaxRestarts, tt.script, tt.scriptArgs, tt.restarts)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"--max-restarts", "2", "--help", "x"}} {
		if _, err := parse(args, envOf(nil), noGPU(t)); !errors.Is(err, ErrHelp) {
			t.Errorf("%q: got %v, want ErrHelp", args, err)
		}
	}
	c := mustParse(t, []string{"x", "--help"}, nil)
	if !reflect.DeepEqual(c.ScriptArgs, []string{"--help"}) {
		t.Errorf("--help after the script must reach it, got %q", c.ScriptArgs)
	}
}

func TestNProcGPU(t *testing.T) {
	tests := []struct {
		name    string
		gpus    int
		spec    string
		visible string
		want    int
	}{
		{"gpu counts device nodes", 4, "gpu", "", 4},
		{"auto prefers gpus", 2, "auto", "", 2},
		{"auto without gpus is cpu", 0, "auto", "", 7},
		{"visible subset", 4, "gpu", "1,3", 2},
		{"visible stops at a missing index", 2, "gpu", "0,5,1", 1},
		{"visible uuids", 2, "gpu", "GPU-aaaa,GPU-bbbb", 2},
		{"visible -1 hides all, auto falls back", 2, "auto", "-1", 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse([]string{"--nproc-per-node", tt.spec, "x"},
				envOf(map[string]string{"CUDA_VISIBLE_DEVICES": tt.visible}), withGPUs(t, tt.gpus))
			if err != nil {
				t.Fatal(err)
			}
			if c.NProcPerNode != tt.want || c.NProcSpec != tt.spec {
				t.Errorf("got %d (%s), want %d", c.NProcPerNode, c.NProcSpec, tt.want)
			}
		})
	}
}

func TestStandalone(t *testing.T) {
	c := mustParse(t, []string{"--standalone", "--rdzv-backend=static", "--rdzv_id", "mine", "x"}, nil)
	if c.RdzvBackend != "c10d" || c.RdzvEndpoint != "localhost:0" {
		t.Errorf("standalone rendezvous %q %q", c.RdzvBackend, c.RdzvEndpoint)
	}
	if !regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`).MatchString(c.RdzvID) {
		t.Errorf("run id %q is not a random uuid", c.RdzvID)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], "--rdzv-backend") || !strings.Contains(c.Warnings[0], "--rdzv-id") {
		t.Errorf("want one warning naming the ignored flags, got %q", c.Warnings)
	}
	c2 := mustParse(t, []string{"x"}, map[string]string{"PET_STANDALONE": "1"})
	if c2.RdzvEndpoint != "localhost:0" || c2.RdzvID == c.RdzvID || len(c2.Warnings) != 0 {
		t.Errorf("PET_STANDALONE: %q %q %q", c2.RdzvEndpoint, c2.RdzvID, c2.Warnings)
	}
}

// TestIgnoredOptions: options for features not implemented are accepted
// with a warning naming them.
func TestIgnoredOptions(t *testing.T) {
	tests := []struct {
		args []string
		env  map[string]string
		warn string
	}{
		{[]string{"--logs-specs", "mine", "x"}, nil, "--logs-specs"},
		{[]string{"--numa_binding=node", "x"}, nil, "--numa-binding"},
		{[]string{"--virtual-local-rank", "x"}, nil, "--virtual-local-rank"},
		{[]string{"x"}, map[string]string{"PET_VIRTUAL_LOCAL_RANK": "1"}, "PET_VIRTUAL_LOCAL_RANK"},
		{[]string{"--event-log-handler", "console", "x"}, nil, "--event-log-handler"},
		{[]string{"--duplicate_stdout_filters", "a,b", "x"}, nil, "--duplicate-stdout-filters"},
		{[]string{"--ft-per-cycle-applog-prefix", "/tmp/app.log", "x"}, nil, "--ft-per-cycle-applog-prefix"},
		{[]string{"--ft_nvrx_logfile", "/tmp/n.log", "x"}, nil, "--ft-nvrx-logfile"},
		{[]string{"--ft-attribution-endpoint", "localhost", "x"}, nil, "--ft-attribution-endpoint"},
		{[]string{"--ft-node-health-check-endpoint", "/run/nvhcd.sock", "x"}, nil, "--ft-node-health-check-endpoint"},
	}
	for _, tt := range tests {
		c := mustParse(t, tt.args, tt.env)
		if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0], tt.warn) || !strings.Contains(c.Warnings[0], "ignored") {
			t.Errorf("%q: want one 'ignored' warning naming %s, got %q", tt.args, tt.warn, c.Warnings)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestGPUCountMatchesNvidiaSmi cross-checks the /dev/nvidia<N> count behind
// --nproc-per-node gpu against `nvidia-smi -L`. It needs the NVIDIA driver,
// which this project's CI machines do not have (no GPU), so it skips there:
// the one skip allowed under CI (testenv.GPU is hardware).
func TestGPUCountMatchesNvidiaSmi(t *testing.T) {
	testenv.Require(t, testenv.GPU)
	out, err := exec.Command("nvidia-smi", "-L").Output()
	if err != nil {
		t.Fatalf("nvidia-smi -L: %v", err)
	}
	want := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "GPU ") {
			want++
		}
	}
	if got, err := countGPUs("/dev", ""); err != nil || got != want {
		t.Errorf("countGPUs(/dev) = %d, %v; nvidia-smi lists %d GPUs", got, err, want)
	}
}
