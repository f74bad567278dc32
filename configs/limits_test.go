package configs

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestNumericBounds: every numeric input refuses values past its bound,
// nan and inf with a one-line usage error naming the input and the bound,
// and accepts the bound itself.
func TestNumericBounds(t *testing.T) {
	const secs = "seconds from 0 to 604800 (7 days)"
	const posSecs = "seconds from 0.001 to 604800 (7 days)"
	bad := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		// Durations above ~9.2e9 s used to wrap negative (SIGKILL with no grace).
		{"term-timeout wraps", []string{"--term-timeout", "1e10"}, nil, secs},
		{"term-timeout 7 days + 1", []string{"--term-timeout", "604801"}, nil, secs},
		{"term-timeout nan", []string{"--term-timeout", "nan"}, nil, secs},
		{"term-timeout inf", []string{"--term-timeout", "inf"}, nil, secs},
		{"term-timeout env", nil, map[string]string{"PET_TERM_TIMEOUT": "1e300"}, secs},
		{"shutdown-timeout", []string{"--shutdown-timeout", "9.3e9"}, nil, secs},
		{"workers-stop-timeout", []string{"--workers-stop-timeout", "1e19"}, nil, secs},
		{"workers-stop-timeout -inf", []string{"--workers-stop-timeout", "-Inf"}, nil, secs},
		{"monitor-interval tiny", []string{"--monitor-interval", "1e-12"}, nil, posSecs},
		{"monitor-interval huge", []string{"--monitor-interval", "1e300"}, nil, posSecs},
		{"ft heartbeat timeout", []string{"--ft-rank-heartbeat-timeout", "1e300"}, nil, secs + ", or none/null"},
		{"ft initial heartbeat timeout", []string{"--ft-initial-rank-heartbeat-timeout", "inf"}, nil, secs},
		{"ft out-of-section timeout", []string{"--ft-rank-out-of-section-timeout", "nan"}, nil, secs},
		{"ft section timeout", []string{"--ft-rank-section-timeouts", "step:1e10"}, nil, secs + ", or none"},
		{"ft termination grace", []string{"--ft-termination-grace", "1e10"}, nil, secs},
		{"ft workload check interval", []string{"--ft-workload-check-interval", "0.0001"}, nil, posSecs},
		{"ft node health check interval", []string{"--ft-node-health-check-interval", "1e300"}, nil, posSecs},
		{"ft restart check interval", []string{"--ft-restart-check-interval", "inf"}, nil, posSecs},
		{"ft gpu reclaim timeout", []string{"--ft-gpu-memory-reclaim-timeout", "1e10"}, nil, secs},
		{"ft gpu poll interval", []string{"--ft-gpu-memory-poll-interval", "0"}, nil, posSecs},
		{"ft safety factor", []string{"--ft-safety-factor", "1e300"}, nil, "number from 0.001 to 1000"},
		{"ft gpu tolerance", []string{"--ft-gpu-memory-tolerance-mb", "inf"}, nil, "MB from 0 to 1e+12"},
		{"ft segment", []string{"--ft-segment", "65537"}, nil, "integer from 1 to 65536"},
		{"ft max no progress cycles", []string{"--ft-max-no-progress-cycles", "9223372036854775807"}, nil, "integer from -1000000000 to 1000000000"},
		{"ft min progress iterations", []string{"--ft-min-progress-iterations", "1000000001"}, nil, "integer from 0 to 1000000000"},
		{"ft exit code", []string{"--ft-no-restart-exit-code", "0"}, nil, "integer from 1 to 255"},
		{"max-restarts overflow", []string{"--max-restarts", "99999999999999999999"}, nil, "integer from 0 to 1000000000"},
		{"max-restarts past bound", []string{"--max-restarts", "1000000001"}, nil, "integer from 0 to 1000000000"},
		{"nproc-per-node", []string{"--nproc-per-node", "4097"}, nil, "integer from 1 to 4096"},
		{"nnodes", []string{"--nnodes", "65537"}, nil, "0 < MIN <= MAX <= 65536"},
		{"nnodes max", []string{"--nnodes", "1:100000"}, nil, "0 < MIN <= MAX <= 65536"},
		{"node-rank", []string{"--node-rank", "65536"}, nil, "integer from 0 to 65535"},
		{"master-port", []string{"--master-port", "65536"}, nil, "port number 0-65535"},
		{"local-ranks-filter", []string{"--local-ranks-filter", "0,4096"}, nil, "integers from 0 to 4095"},
		{"metrics-addr port", []string{"--metrics-addr", "127.0.0.1:70000"}, nil, "port 0-65535"},
		{"metrics-addr no port", []string{"--metrics-addr", "127.0.0.1"}, nil, "host:port"},
		{"log-keep-attempts negative", []string{"--log-keep-attempts", "-1"}, nil, "integer from 0 to 1000000000"},
		{"log-keep-attempts env", nil, map[string]string{"PET_LOG_KEEP_ATTEMPTS": "x"}, "integer from 0 to 1000000000"},
		{"rdzv-conf 1e300", []string{"--rdzv-conf", "join_timeout=1e300"}, nil, "from 0.001 to 604800 (7 days)"},
		{"rdzv-conf nan", []string{"--rdzv-conf", "lease_ttl=nan"}, nil, "from 0.001 to 604800 (7 days)"},
	}
	for _, tt := range bad {
		t.Run("refused/"+tt.name, func(t *testing.T) {
			args := append(append([]string{}, tt.args...), "x.py")
			_, err := parse(args, envOf(tt.env), noGPU(t))
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Fatalf("parse(%q) = %v, want a *UsageError", args, err)
			}
			if strings.Contains(ue.Msg, "\n") || !strings.Contains(ue.Msg, tt.want) || !strings.HasPrefix(ue.Msg, ue.Subject) || ue.Subject == "" {
				t.Errorf("message %q (subject %q): want one line starting with the input's name and containing %q", ue.Msg, ue.Subject, tt.want)
			}
		})
	}

	good := []struct {
		name  string
		args  []string
		check func(c *Config) error
	}{
		{"term-timeout at the bound", []string{"--term-timeout", "604800"}, func(c *Config) error {
			return wantEq(c.TermTimeout, 7*24*time.Hour)
		}},
		{"workers-stop-timeout 0", []string{"--workers-stop-timeout", "0"}, func(c *Config) error { return wantEq(c.WorkersStopTimeout, time.Duration(0)) }},
		{"monitor-interval 1 ms", []string{"--monitor-interval", "0.001"}, func(c *Config) error { return wantEq(c.MonitorInterval, time.Millisecond) }},
		{"heartbeat timeout at the bound", []string{"--ft-rank-heartbeat-timeout", "604800"}, func(c *Config) error {
			return wantEq(*c.FT.RankHeartbeatTimeout, float64(604800))
		}},
		{"max-restarts at the bound", []string{"--max-restarts", "1000000000"}, func(c *Config) error { return wantEq(c.MaxRestarts, 1000000000) }},
		{"nnodes at the bound", []string{"--nnodes", "1:65536", "--rdzv-endpoint", "10.0.0.1"}, func(c *Config) error { return wantEq(c.NNodes.Max, 65536) }},
		{"nproc at the bound", []string{"--nproc-per-node", "4096"}, func(c *Config) error { return wantEq(c.NProcPerNode, 4096) }},
		{"node-rank at the bound", []string{"--node-rank", "65535"}, func(c *Config) error { return wantEq(c.NodeRank, 65535) }},
		{"safety factor at the bound", []string{"--ft-safety-factor", "1000"}, func(c *Config) error { return wantEq(c.FT.SafetyFactor, float64(1000)) }},
		{"metrics-addr any host", []string{"--metrics-addr", ":0"}, func(c *Config) error { return wantEq(c.MetricsAddr, ":0") }},
		{"log-keep-attempts", []string{"--log_keep_attempts", "3"}, func(c *Config) error { return wantEq(c.LogKeepAttempts, 3) }},
	}
	for _, tt := range good {
		t.Run("accepted/"+tt.name, func(t *testing.T) {
			c, err := parse(append(append([]string{}, tt.args...), "x.py"), envOf(nil), noGPU(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.check(c); err != nil {
				t.Error(err)
			}
		})
	}
}

func wantEq[T comparable](got, want T) error {
	if got != want {
		return fmt.Errorf("got %v, want %v", got, want)
	}
	return nil
}

// TestResolvedNProcBound: cpu resolving past MaxNProcPerNode is refused.
func TestResolvedNProcBound(t *testing.T) {
	_, err := parse([]string{"--nproc-per-node", "cpu", "x.py"}, envOf(nil), machine{devDir: t.TempDir(), numCPU: MaxNProcPerNode + 1})
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "--nproc-per-node: value cpu resolved to 4097 workers: at most 4096") {
		t.Fatalf("got %v, want the resolved count refused", err)
	}
}

// TestLogKeepAttemptsPrecedence: flag > PET_LOG_KEEP_ATTEMPTS > YAML > 0.
func TestLogKeepAttemptsPrecedence(t *testing.T) {
	dir := t.TempDir()
	y := filepath.Join(dir, "ft.yaml")
	writeFile(t, y, "fault_tolerance:\n  log_keep_attempts: 4\n")
	badY := filepath.Join(dir, "bad.yaml")
	writeFile(t, badY, "fault_tolerance:\n  log_keep_attempts: -1\n")
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want int
		err  string
	}{
		{"default keeps all", nil, nil, 0, ""},
		{"yaml", []string{"--ft-cfg-path", y}, nil, 4, ""},
		{"env over yaml", []string{"--ft-cfg-path", y}, map[string]string{"PET_LOG_KEEP_ATTEMPTS": "2"}, 2, ""},
		{"flag over env", []string{"--ft-cfg-path", y, "--log-keep-attempts", "1"}, map[string]string{"PET_LOG_KEEP_ATTEMPTS": "2"}, 1, ""},
		{"bad yaml", []string{"--ft-cfg-path", badY}, nil, 0, "fault_tolerance.log_keep_attempts (line 2): must be an integer from 0 to 1000000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parse(append(append([]string{}, tt.args...), "x.py"), envOf(tt.env), noGPU(t))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("got %v, want an error containing %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.LogKeepAttempts != tt.want {
				t.Errorf("LogKeepAttempts = %d, want %d", c.LogKeepAttempts, tt.want)
			}
			if !strings.Contains(c.Effective(), fmt.Sprintf("log_keep_attempts: %d\n", tt.want)) {
				t.Errorf("--print-config lacks log_keep_attempts: %d", tt.want)
			}
		})
	}
}

// aliasBomb returns a YAML document of a few hundred bytes whose aliases
// expand to 9^levels nodes.
func aliasBomb(levels int) string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= levels; i++ {
		ref := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.Join([]string{ref, ref, ref, ref, ref, ref, ref, ref, ref}, ", "))
	}
	b.WriteString("fault_tolerance:\n  rank_heartbeat_timeout: 5\n")
	return b.String()
}

// TestYAMLLimits: the file is read up to MaxYAMLBytes and documents past
// MaxYAMLNodes with aliases expanded are refused; modest aliasing and a
// file at the size limit are fine.
func TestYAMLLimits(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		writeFile(t, p, content)
		return p
	}
	padded := "fault_tolerance:\n  rank_heartbeat_timeout: 7\n"
	padded += strings.Repeat("#", MaxYAMLBytes-len(padded)-1) + "\n"
	tests := []struct {
		name string
		path string
		want string // "" accepted
	}{
		{"alias bomb", file("bomb.yaml", aliasBomb(9)), "more than 100000 YAML nodes once aliases are expanded"},
		{"alias bomb smaller", file("bomb6.yaml", aliasBomb(6)), "more than 100000 YAML nodes"}, // 9^6 = 531441
		{"modest aliases", file("aliases.yaml", aliasBomb(3)), ""},                              // 9^3 = 729
		{"/dev/zero", "/dev/zero", "larger than the limit of 1048576 bytes"},
		{"one byte too many", file("big.yaml", padded+"\n"), "larger than the limit of 1048576 bytes"},
		{"at the limit", file("limit.yaml", padded), ""},
		{"deep nesting", file("deep.yaml", strings.Repeat("[", 20000)+strings.Repeat("]", 20000)), "not valid YAML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.path == "/dev/zero" {
				testenv.Require(t, testenv.DevZero)
			}
			done := make(chan struct{})
			var c *Config
			var err error
			go func() { c, err = parse([]string{"--ft-cfg-path", tt.path, "x.py"}, envOf(nil), noGPU(t)); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second): // generous: it takes milliseconds
				t.Fatal("the YAML loader did not return")
			}
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.FT.RankHeartbeatTimeout == nil {
					t.Error("the fault_tolerance section was not applied")
				}
				return
			}
			var ue *UsageError
			if !errors.As(err, &ue) || !strings.Contains(ue.Msg, tt.want) || !strings.HasPrefix(ue.Msg, "--ft-cfg-path: ") || strings.Contains(ue.Msg, "\n") {
				t.Fatalf("got %v, want a one-line --ft-cfg-path error containing %q", err, tt.want)
			}
		})
	}
}

// FuzzYAML: no document makes the loader panic or walk past its limits;
// every refusal is a one-line usage error naming --ft-cfg-path.
func FuzzYAML(f *testing.F) {
	for _, s := range []string{
		"fault_tolerance:\n  rank_heartbeat_timeout: 5\n  rank_section_timeouts: {setup: 600, step: null}\n",
		"model:\n  fault_tolerance: &ft\n    safety_factor: 2\n    log_keep_attempts: 3\nother: *ft\n",
		"fault_tolerance:\n  verdict_file: /tmp/v.json\n  rank_termination_signal: SIGTERM\n  log_level: DEBUG\n",
		aliasBomb(4),
		"- [a, &x {fault_tolerance: {segment: 4}}]\n- *x\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxYAMLBytes {
			return // refused by the read before parsing
		}
		p := &parser{cfg: defaultConfig(), getenv: envOf(nil), source: map[string]string{}, explicit: map[string]bool{}}
		err := p.applyYAML(data, "fuzz.yaml", "--ft-cfg-path")
		if err == nil {
			return
		}
		var ue *UsageError
		if !errors.As(err, &ue) || !strings.HasPrefix(ue.Msg, "--ft-cfg-path: ") || strings.Contains(ue.Msg, "\n") {
			t.Fatalf("error %q (%T) is not a one-line --ft-cfg-path usage error", err, err)
		}
	})
}

// FuzzParse: no command line makes Parse panic; every refusal is a
// one-line usage error. Lines naming a YAML file are skipped (a fuzzed path
// could name a FIFO); TestYAMLLimits and FuzzYAML cover the file.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"--nnodes\x002:4\x00--rdzv-endpoint\x00a:1,b\x00x.py",
		"--standalone\x00--nproc_per_node=gpu\x00--term-timeout\x001e10\x00x.py\x00--lr",
		"--rdzv-conf\x00join_timeout=nan,is_host=1\x00--nnodes\x002\x00--rdzv-endpoint\x00 \x00x",
		"--ft-rank-section-timeouts\x00a:1,b:none\x00-r\x000:1,1:2\x00--local-ranks-filter\x000,1\x00x",
		"-m\x00--no-python\x00--max-restarts\x00-1\x00--signals-to-handle\x00SIGUSR1,9\x00x",
	} {
		f.Add(s)
	}
	dev := f.TempDir()
	f.Fuzz(func(t *testing.T, line string) {
		args := strings.Split(line, "\x00")
		for _, a := range args {
			if l := strings.ToLower(a); strings.Contains(l, "cfg") || strings.Contains(l, "fault") {
				return
			}
		}
		_, err := parse(args, envOf(nil), machine{devDir: dev, numCPU: 4})
		if err == nil || errors.Is(err, ErrHelp) || errors.Is(err, ErrVersion) {
			return
		}
		var ue *UsageError
		if !errors.As(err, &ue) || strings.Contains(ue.Msg, "\n") || ue.Msg == "" {
			t.Fatalf("parse(%q): %q (%T) is not a one-line usage error", args, err, err)
		}
	})
}
