package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// aliasBombYAML is a ~400-byte document whose aliases name 9^9 nodes: it
// used to cost seconds to minutes of CPU.
func aliasBombYAML() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		ref := fmt.Sprintf("*a%d", i-1)
		fmt.Fprintf(&b, "a%d: &a%d [%s]\n", i, i, strings.Join([]string{ref, ref, ref, ref, ref, ref, ref, ref, ref}, ","))
	}
	b.WriteString("fault_tolerance:\n  rank_heartbeat_timeout: 5\n")
	return b.String()
}

// TestBadInputExitsTwoBeforeStarting: each bad input of the fault campaign
// and each new bound is refused by the real binary with exit 2,
// one line naming the input and what is allowed, and the help hint; no
// panic, and nothing started or created: no event log, log directory,
// verdict, rank, embedded etcd or socket directory.
func TestBadInputExitsTwoBeforeStarting(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	bomb := filepath.Join(dir, "bomb.yaml")
	huge := filepath.Join(dir, "huge.yaml")
	for p, content := range map[string]string{
		bomb: aliasBombYAML(),
		huge: "fault_tolerance:\n  rank_heartbeat_timeout: 1e300\n",
	} {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A multi-node line that would host the embedded etcd (is_host=1) if it
	// were accepted.
	ep := fmt.Sprintf("127.0.0.1:%d", freeTCPPort(t, "127.0.0.1"))
	multi := func(extra ...string) []string {
		return append([]string{"--nnodes", "2", "--rdzv-endpoint", ep, "--rdzv-conf", "is_host=1"}, extra...)
	}
	const secs = "must be a number of seconds from 0 to 604800 (7 days)"
	tests := []struct {
		name string
		args []string
		env  []string
		want string // the first line of stderr, after "ft-launcher: ", starts with or contains it
	}{
		// From the campaign.
		{"blank endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", " "}, nil, `--rdzv-endpoint " ": no address given: must be host[:port][,host[:port]...]`},
		{"comma endpoint", []string{"--nnodes", "2", "--rdzv-endpoint", ","}, nil, `--rdzv-endpoint ",": no address given`},
		{"term-timeout past 9.2e9 s", []string{"--term-timeout", "1e10"}, nil, `--term-timeout: invalid value "1e10": ` + secs},
		{"workers-stop-timeout past 9.2e9 s", []string{"--workers-stop-timeout", "9.3e9"}, nil, `--workers-stop-timeout: invalid value "9.3e9": ` + secs},
		{"termination grace past 9.2e9 s", []string{"--ft-termination-grace", "1e10"}, nil, `--ft-termination-grace: invalid value "1e10": ` + secs},
		{"heartbeat timeout 1e300", []string{"--ft-rank-heartbeat-timeout", "1e300"}, nil, `--ft-rank-heartbeat-timeout: invalid value "1e300": ` + secs + ", or none/null to disable"},
		{"rdzv-conf nan", multi("--rdzv-conf", "is_host=1,join_timeout=nan"), nil, `--rdzv-conf join_timeout="nan": must be a number of seconds from 0.001 to 604800 (7 days)`},
		{"rdzv-conf inf", multi("--rdzv-conf", "is_host=1,connect_timeout=inf"), nil, `--rdzv-conf connect_timeout="inf": must be a number of seconds`},
		{"rdzv-conf 1e300", multi("--rdzv-conf", "is_host=1,lease_ttl=1e300"), nil, `--rdzv-conf lease_ttl="1e300": must be a number of seconds`},
		{"yaml alias bomb", []string{"--ft-cfg-path", bomb}, nil, `--ft-cfg-path: "` + bomb + `" is refused: more than 100000 YAML nodes once aliases are expanded`},
		{"yaml /dev/zero", []string{"--ft-cfg-path", "/dev/zero"}, nil, `--ft-cfg-path: cannot read "/dev/zero": larger than the limit of 1048576 bytes`},
		// The new bounds.
		{"yaml timeout 1e300", []string{"--ft-cfg-path", huge}, nil, `fault_tolerance.rank_heartbeat_timeout (line 2): invalid value "1e300": ` + secs},
		{"env term-timeout inf", nil, []string{"PET_TERM_TIMEOUT=inf"}, `PET_TERM_TIMEOUT: invalid value "inf": ` + secs},
		{"section timeout inf", []string{"--ft-rank-section-timeouts", "step:inf"}, nil, `--ft-rank-section-timeouts: invalid value "step:inf": section "step": ` + secs},
		{"monitor-interval nan", []string{"--monitor-interval", "nan"}, nil, `--monitor-interval: invalid value "nan": must be a number of seconds from 0.001 to 604800`},
		{"safety factor 1e300", []string{"--ft-safety-factor", "1e300"}, nil, `--ft-safety-factor: invalid value "1e300": must be a number from 0.001 to 1000`},
		{"max-restarts overflow", []string{"--max-restarts", "99999999999999999999"}, nil, `--max-restarts: invalid value "99999999999999999999": must be an integer from 0 to 1000000000`},
		{"nproc-per-node", []string{"--nproc-per-node", "100000"}, nil, `--nproc-per-node: invalid value "100000": must be an integer from 1 to 4096, cpu, gpu or auto`},
		{"nnodes", []string{"--nnodes", "1:70000"}, nil, `--nnodes: invalid value "1:70000": must be N or MIN:MAX with 0 < MIN <= MAX <= 65536`},
		{"node-rank", []string{"--node-rank", "65536"}, nil, `--node-rank: invalid value "65536": must be an integer from 0 to 65535`},
		{"master-port", []string{"--master-port", "65536"}, nil, `--master-port: invalid value "65536": must be a port number 0-65535`},
		{"metrics port", []string{"--metrics-addr", "127.0.0.1:99999"}, nil, `--metrics-addr: invalid value "127.0.0.1:99999": must be host:port with a port 0-65535`},
		{"local rank filter", []string{"--local-ranks-filter", "0,5000"}, nil, `--local-ranks-filter: invalid value "0,5000": must be comma-separated local ranks (integers from 0 to 4095)`},
		{"log-keep-attempts", []string{"--log-keep-attempts", "-1"}, nil, `--log-keep-attempts: invalid value "-1": must be an integer from 0 to 1000000000`},
		{"exit code", []string{"--ft-no-restart-exit-code", "256"}, nil, `--ft-no-restart-exit-code: invalid value "256": must be an integer from 1 to 255`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := newJob(t)
			tmp := filepath.Join(j.dir, "tmp")
			if err := os.Mkdir(tmp, 0o755); err != nil {
				t.Fatal(err)
			}
			vpath := filepath.Join(j.dir, "verdict.json")
			logs := filepath.Join(j.dir, "logs")
			s := j.script("rank.sh", `touch "$OUT/started"`+"\n")
			args := append(append([]string{}, tt.args...), "--verdict-file", vpath, "--log-dir", logs, "--no-python", s)
			code := j.run(generous, append([]string{"OUT=" + j.dir, "TMPDIR=" + tmp}, tt.env...), args...)
			wantUsageRefusal(t, j, code, tt.want, vpath, logs)
			emptyDir(t, tmp)
			if left := j.leftovers(); len(left) > 0 {
				t.Errorf("processes left behind: %v", left)
			}
		})
	}
}

// wantUsageRefusal checks a launch line refused as a usage error: exit 2,
// one line on stderr naming want, the help hint, and nothing created (the
// event log, the verdict at vpath, the log dir, the rank's "started" file).
func wantUsageRefusal(t *testing.T, j *job, code int, want, vpath, logs string) {
	t.Helper()
	stderr := j.stderr.String()
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, stderr)
	}
	lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ft-launcher: ") || !strings.Contains(lines[0], want) ||
		lines[1] != "Run 'ft-launcher --help' for usage." {
		t.Fatalf("stderr:\n%s\nwant one line containing %q and the help hint", stderr, want)
	}
	for _, p := range []string{j.events, vpath, logs, filepath.Join(j.dir, "started")} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s exists: the launcher started before refusing the line", p)
		}
	}
}
