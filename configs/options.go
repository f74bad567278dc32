package configs

import (
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"

	"github.com/ftlauncher/ft-launcher/state"
)

// optKind says whether an option takes a value or is a switch.
type optKind int

const (
	kindValue  optKind = iota
	kindSwitch         // store_true; its PET_ variable must be an integer
)

// option is one command-line option with its spellings, environment fallback
// and effect. Every '-' in a long name may also be written '_'.
type option struct {
	names      []string // long names without "--"; names[0] is canonical and names the PET_ variable
	legacy     []string // deprecated spellings: accepted with a warning
	short      string
	kind       optKind
	env        bool   // PET_<NAMES[0]> fallback
	altEnv     string // a second variable, preferred over the PET_ one
	deprecated string // non-empty: the whole option is deprecated; this says why
	early      bool   // applied before the YAML file is read (it locates the file)
	group      string
	arg        string // metavar
	def        string // default, for the help text
	help       string
	set        func(p *parser, v string) error
}

// envName is torchrun's PET_<DEST>: the first long name, '-' as '_', upper-cased.
func (o *option) envName() string {
	if !o.env {
		return ""
	}
	return "PET_" + strings.ToUpper(strings.ReplaceAll(o.names[0], "-", "_"))
}

// envNames are the option's variables in the order they are applied, so
// the last one set wins: the PET_ one, then altEnv.
func (o *option) envNames() []string {
	var out []string
	if n := o.envName(); n != "" {
		out = append(out, n)
	}
	if o.altEnv != "" {
		out = append(out, o.altEnv)
	}
	return out
}

// Help groups, in the order Usage prints them.
const (
	grpLaunch = "Launch (torchrun-compatible)"
	grpRdzv   = "Rendezvous"
	grpLogs   = "Worker output"
	grpStop   = "Signals and stopping"
	grpFT     = "Fault tolerance (nvrx ft_launcher --ft-*; no PET_ fallback, as in nvrx)"
	grpOurs   = "ft-launcher additions"
	grpCompat = "Accepted for compatibility (stored or ignored with a warning)"
)

func groupOrder() []string {
	return []string{grpLaunch, grpRdzv, grpLogs, grpStop, grpFT, grpOurs, grpCompat}
}

// ignored builds an option that is accepted but has no effect here.
func ignored(name string, kind optKind, env bool, arg, def, help, why string) *option {
	return &option{names: []string{name}, kind: kind, env: env, group: grpCompat, arg: arg, def: def,
		help: help + " Ignored: " + why + ".",
		set: func(p *parser, v string) error {
			if kind == kindSwitch && v != "true" {
				return nil
			}
			p.warn("%s is accepted but ignored: %s", p.subj, why)
			return nil
		}}
}

// options returns the full option table. It is built per call so that no
// package state is shared between parses.
func options() []*option {
	opts := []*option{
		// Launch.
		{names: []string{"nnodes"}, env: true, group: grpLaunch, arg: "N|MIN:MAX", def: "1:1",
			help: "Number of nodes, or MIN:MAX for an elastic job (MAX-MIN hot spares); 0 < MIN <= MAX <= 65536. Inside a Slurm job: SLURM_NNODES by default. In a Kubernetes pod set PET_NNODES in the pod template (pods are not told their Job's size).",
			set:  func(p *parser, v string) (err error) { p.cfg.NNodes, err = parseNNodes(v); return err }},
		{names: []string{"nproc-per-node"}, env: true, group: grpLaunch, arg: "N|cpu|gpu|auto", def: "1",
			help: "Workers per node (1 to 4096): an integer, cpu (CPU count), gpu (count of /dev/nvidia<N> honouring CUDA_VISIBLE_DEVICES) or auto (gpu if any, else cpu).",
			set: func(p *parser, v string) error {
				if err := checkNProcSpec(v); err != nil {
					return err
				}
				p.cfg.NProcSpec = strings.TrimSpace(v)
				return nil
			}},
		{names: []string{"max-restarts"}, env: true, group: grpLaunch, arg: "N", def: "0",
			help: "Restarts of the whole worker group before giving up; 0 to 1000000000.",
			set: func(p *parser, v string) (err error) {
				p.cfg.MaxRestarts, err = parseIntRange(v, 0, MaxCount)
				return err
			}},
		{names: []string{"restart-window"}, env: true, group: grpLaunch, arg: "SECONDS", def: "0",
			help: "Count only the restarts of the last SECONDS against --max-restarts, so that rare failures spread over a long job do not use up its budget (Nomad's restart interval); 0 (the default): every restart counts. 0 to 604800. See docs/rendezvous.md.",
			set:  func(p *parser, v string) (err error) { p.cfg.RestartWindow, err = parseSeconds(v, false); return err }},
		{names: []string{"restart-delay"}, env: true, group: grpLaunch, arg: "SECONDS", def: "0",
			help: "Wait SECONDS before each restart that spends the budget starts its round (a shared file system or service given time to recover); 0 (the default): at once. A spare's swap does not wait. 0 to 604800.",
			set:  func(p *parser, v string) (err error) { p.cfg.RestartDelay, err = parseSeconds(v, false); return err }},
		{names: []string{"monitor-interval"}, env: true, group: grpLaunch, arg: "SECONDS", def: "0.3",
			help: "Accepted for torchrun compatibility (0.001 to 604800) and ignored: ft-launcher is event-driven and polls nothing (rank exits arrive on SIGCHLD, hangs are acted on at their own deadlines).",
			set:  func(p *parser, v string) (err error) { p.cfg.MonitorInterval, err = parseSeconds(v, true); return err }},
		{names: []string{"start-method"}, env: true, group: grpLaunch, arg: "spawn|fork|forkserver", def: "spawn",
			help: "Accepted for torchrun compatibility; scripts always run as separate processes.",
			set: func(p *parser, v string) error {
				switch v {
				case "spawn", "fork", "forkserver":
					p.cfg.StartMethod = v
					return nil
				}
				return fmt.Errorf("invalid value %q: must be spawn, fork or forkserver", v)
			}},
		{names: []string{"role"}, env: true, group: grpLaunch, arg: "NAME", def: "default",
			help: "Worker role name (ROLE_NAME).",
			set:  func(p *parser, v string) error { p.cfg.Role = v; return nil }},
		{names: []string{"module"}, short: "m", kind: kindSwitch, env: true, group: grpLaunch, def: "off",
			help: "Run the training script as a module: python -u -m SCRIPT.",
			set:  func(p *parser, v string) (err error) { p.cfg.Module, err = p.switchValue(v); return err }},
		{names: []string{"no-python"}, kind: kindSwitch, env: true, group: grpLaunch, def: "off",
			help: "Execute the training script directly, without a python interpreter.",
			set:  func(p *parser, v string) (err error) { p.cfg.NoPython, err = p.switchValue(v); return err }},
		{names: []string{"run-path"}, kind: kindSwitch, env: true, group: grpLaunch, def: "off",
			help: "Not supported (torchrun runs the script in-process with runpy); refused.",
			set: func(p *parser, v string) error {
				on, err := p.switchValue(v)
				if err != nil || !on {
					return err
				}
				return fmt.Errorf("--run-path is not supported: ft-launcher starts every worker as its own process; drop it to run the script with python -u")
			}},

		// Rendezvous.
		{names: []string{"rdzv-backend"}, env: true, group: grpRdzv, arg: "NAME", def: "c10d",
			help: "static, c10d (the embedded/default etcd rendezvous), etcd or etcd-v2.",
			set: func(p *parser, v string) error {
				switch v {
				case "static", "c10d", "etcd", "etcd-v2":
					p.cfg.RdzvBackend = v
					p.explicit["rdzv-backend"] = true
					return nil
				}
				return fmt.Errorf("invalid value %q: must be static, c10d, etcd or etcd-v2", v)
			}},
		{names: []string{"rdzv-endpoint"}, env: true, group: grpRdzv, arg: "HOST[:PORT]", def: "\"\"",
			help: "Rendezvous address(es), comma-separated host[:port]; IPv6 as [addr]:port. Default port 29400 for c10d/static (the embedded etcd, hosted at the first endpoint), 2379 for etcd/etcd-v2. Host names are resolved (DNS, then Slurm's node table). Required with more than one node, except for static, which falls back to --master-addr:--master-port, inside a Slurm step, where c10d defaults to the step's first node (first three with three or more) on port 29400 + 2*(job id mod 500), and in a Kubernetes pod, where c10d defaults to FTL_RDZV_SERVICE, else the index-0 pod's name under the pod's subdomain, port 29400 (docs/kubernetes.md).",
			set: func(p *parser, v string) error {
				p.cfg.RdzvEndpoint = v
				p.explicit["rdzv-endpoint"] = v != ""
				return nil
			}},
		{names: []string{"rdzv-id"}, env: true, group: grpRdzv, arg: "ID", def: "none",
			help: "Run id shared by every node of the job (the default 'none' collides between jobs): 1 to 200 characters of ASCII letters, digits and . _ - + : @, without '..', checked before anything starts. Inside a Slurm job: <job id>-r<SLURM_RESTART_COUNT> (array tasks <array job id>_<task id>-r<N>). In a Kubernetes pod: <AppWrapper>-r<FTL_WORKLOAD_RESETS>, else an Indexed Job's name (<job>-r<JOBSET_RESTART_ATTEMPT> when set).",
			set: func(p *parser, v string) error {
				p.cfg.RdzvID = v
				p.explicit["rdzv-id"] = true
				return nil
			}},
		{names: []string{"rdzv-conf"}, env: true, group: grpRdzv, arg: "K=V,...", def: "\"\"",
			help: "Extra rendezvous settings as key=value pairs (keys and values trimmed, neither empty, no commas in values), checked before anything starts. Timings of the etcd rendezvous, in seconds from 0.001 to 604800 (7 days): join_timeout (default 600), last_call_timeout (0.5), connect_timeout (20), lease_ttl (6: renewed every lease_ttl/3), fence_margin (lease_ttl/5: an active node whose lease could not be renewed kills its ranks this long before the lease can expire, docs/rendezvous.md \"Fencing\"), etcd_loss_bound (60), rejoin_wait (--workers-stop-timeout + 10), min_nodes_wait (1: in a fixed Slurm allocation, MIN == MAX, a restart round short of MIN live nodes, not counting those confirmed lost, ends the job after this, not after join_timeout; a longer wait lets a stalled node come back). The node-loss detector (gossip): gossip_probe_interval (0.2 s, 0.01 to 60), gossip_probe_timeout (0.1 s, shorter than the interval), gossip_suspicion_mult (2, whole number 1 to 100), gossip_indirect_checks (3, 0 to 32); with the defaults a node silent for about 1 s is declared lost (docs/rendezvous.md). The two-level join for large jobs (docs/rendezvous.md, \"Relays\"): relay_group (0: off, the default; 2 to 1024: every relay_group-th node of a Slurm allocation, or pod of an Indexed Job or StatefulSet, registers itself and the nodes after it in batches; needs a Slurm job or such a pod with a subdomain, and --job-secret-file) and relay_port (29402, the same on every node). is_host=1|0|true|false says whether this launcher hosts the embedded etcd (default: whether the first endpoint is this node's address; with several endpoints each launcher hosts the etcd member whose endpoint is its address and is_host is ignored). torchrun's other keys (read_timeout, timeout, close_timeout, keep_alive_interval, ...) are accepted with a warning and not used; unknown keys are ignored with a warning.",
			set:  func(p *parser, v string) (err error) { p.cfg.RdzvConf, err = parseRdzvConf(v); return err }},
		{names: []string{"standalone"}, kind: kindSwitch, env: true, group: grpRdzv, def: "off",
			help: "Single-node job: backend c10d, endpoint localhost:0, random run id; explicit rendezvous values are ignored.",
			set:  func(p *parser, v string) (err error) { p.cfg.Standalone, err = p.switchValue(v); return err }},
		{names: []string{"node-rank"}, env: true, group: grpRdzv, arg: "N", def: "-1 (not given)",
			help: "Rank of this node. The static backend's node rank, and the etcd rendezvous orders nodes by it (else by SLURM_PROCID, else JOB_COMPLETION_INDEX, else a pod's ordinal NAME-N), which decides group ranks; 0 to 65535.",
			set: func(p *parser, v string) (err error) {
				p.cfg.NodeRank, err = parseIntRange(v, 0, MaxNodes-1)
				return err
			}},
		{names: []string{"master-addr"}, env: true, group: grpRdzv, arg: "ADDR", def: "127.0.0.1",
			help: "Static backend: rank 0's address when --rdzv-endpoint is empty.",
			set:  func(p *parser, v string) error { p.cfg.MasterAddr = v; return nil }},
		{names: []string{"master-port"}, env: true, group: grpRdzv, arg: "PORT", def: "29500",
			help: "Static backend: rank 0's port when --rdzv-endpoint is empty; 0-65535.",
			set: func(p *parser, v string) error {
				n, err := parseIntRange(v, 0, 65535)
				if err != nil {
					return fmt.Errorf("invalid value %q: must be a port number 0-65535", v)
				}
				p.cfg.MasterPort = n
				return nil
			}},
		{names: []string{"local-addr"}, env: true, group: grpRdzv, arg: "ADDR", def: "this node's address",
			help: "Address (or host name, resolved) other nodes use to reach this one (MASTER_ADDR when this node is group rank 0); the launcher it matches an endpoint of hosts the embedded etcd. Default with several nodes: SLURMD_NODENAME resolved under Slurm, else the address this machine reaches the first endpoint from, else the host name resolved.",
			set:  func(p *parser, v string) error { p.cfg.LocalAddr = v; return nil }},
		{names: []string{"rdzv-ca-cert"}, env: true, group: grpRdzv, arg: "PATH",
			help: "etcd rendezvous: CA certificate for TLS.",
			set:  func(p *parser, v string) error { p.cfg.RdzvCACert = v; return nil }},
		{names: []string{"rdzv-cert"}, env: true, group: grpRdzv, arg: "PATH",
			help: "etcd rendezvous: client certificate for TLS.",
			set:  func(p *parser, v string) error { p.cfg.RdzvCert = v; return nil }},
		{names: []string{"rdzv-key"}, env: true, group: grpRdzv, arg: "PATH",
			help: "etcd rendezvous: client key for TLS.",
			set:  func(p *parser, v string) error { p.cfg.RdzvKey = v; return nil }},
		{names: []string{"rdzv-user"}, env: true, group: grpRdzv, arg: "USER",
			help: "etcd rendezvous: user name.",
			set:  func(p *parser, v string) error { p.cfg.RdzvUser = v; return nil }},
		{names: []string{"rdzv-password"}, env: true, group: grpRdzv, arg: "PASSWORD",
			help: "etcd rendezvous: password (prefer PET_RDZV_PASSWORD: flags are visible in ps).",
			set:  func(p *parser, v string) error { p.cfg.RdzvPassword = v; return nil }},

		// Worker output.
		{names: []string{"log-dir"}, env: true, group: grpLogs, arg: "DIR", def: "a new temporary directory",
			help: "Base directory of per-rank log files.",
			set:  func(p *parser, v string) error { p.cfg.LogDir = v; return nil }},
		{names: []string{"redirects"}, short: "r", env: true, group: grpLogs, arg: "0-3|RANK:0-3,...", def: "0",
			help: "Send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or per local rank like 0:1,1:2 (single-digit ranks).",
			set:  func(p *parser, v string) (err error) { p.cfg.Redirects, err = parseStdSpec(v); return err }},
		{names: []string{"tee"}, short: "t", env: true, group: grpLogs, arg: "0-3|RANK:0-3,...", def: "0",
			help: "Copy worker streams to log files and the console; same values as --redirects.",
			set:  func(p *parser, v string) (err error) { p.cfg.Tee, err = parseStdSpec(v); return err }},
		{names: []string{"local-ranks-filter"}, env: true, group: grpLogs, arg: "RANK,...", def: "all ranks",
			help: "Show only these local ranks' output on the console (files keep everything).",
			set:  func(p *parser, v string) (err error) { p.cfg.LocalRanksFilter, err = parseRanksFilter(v); return err }},
		{names: []string{"log-keep-attempts"}, env: true, group: grpLogs, arg: "N", def: "0 (keep all)",
			help: "Keep only the last N per-cycle attempt directories of the run's log directory, removing older ones as new cycles start; 0 keeps all, as torchrun. 0 to 1000000000; also YAML fault_tolerance.log_keep_attempts.",
			set: func(p *parser, v string) (err error) {
				p.cfg.LogKeepAttempts, err = parseIntRange(v, 0, MaxCount)
				return err
			}},

		// Signals and stopping.
		{names: []string{"signals-to-handle"}, env: true, group: grpStop, arg: "SIG,...", def: "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
			help: "Signals caught by the launcher and forwarded to the workers. The terminating ones are caught from the launcher's first instant (before this option is read) and a second one while workers stop SIGKILLs them at once.",
			set:  func(p *parser, v string) (err error) { p.cfg.SignalsToHandle, err = parseSignalList(v); return err }},
		{names: []string{"term-timeout"}, env: true, group: grpStop, arg: "SECONDS", def: "1800 (nvrx's)",
			help: "After forwarding a caught signal, wait this long for workers before SIGKILL (a second signal SIGKILLs them at once); 0 to 604800.",
			set:  func(p *parser, v string) (err error) { p.cfg.TermTimeout, err = parseSeconds(v, false); return err }},
		{names: []string{"shutdown-timeout"}, env: true, group: grpStop, arg: "SECONDS", def: "same as --term-timeout",
			help: "torchrun's name for --term-timeout (sets it).",
			set:  func(p *parser, v string) (err error) { p.cfg.TermTimeout, err = parseSeconds(v, false); return err }},
		{names: []string{"workers-stop-timeout"}, env: true, group: grpStop, arg: "SECONDS", def: "15",
			help: "When stopping workers for a restart, wait this long after SIGTERM before SIGKILL; 0 to 604800.",
			set: func(p *parser, v string) (err error) {
				p.cfg.WorkersStopTimeout, err = parseSeconds(v, false)
				return err
			}},

		// Fault tolerance: the file; the fields follow from ftSpecs.
		{names: []string{"ft-cfg-path"}, legacy: []string{"fault-tol-cfg-path"}, env: true, early: true, group: grpFT, arg: "PATH",
			help: "YAML file; its first fault_tolerance: mapping (searched depth-first, so NeMo/Hydra nesting works) sets the fields below.",
			set:  func(p *parser, v string) error { p.cfg.CfgPath = v; return nil }},
		{names: []string{"ft-ignore-missing-cfg"}, legacy: []string{"ignore-missing-fault-tol-cfg"}, kind: kindSwitch, early: true, group: grpFT, def: "off",
			help: "Run with defaults when the --ft-cfg-path file does not exist (warning instead of an error).",
			set:  func(p *parser, v string) (err error) { p.ignoreMissing, err = p.switchValue(v); return err }},

		// ft-launcher additions.
		{names: []string{"event-log"}, env: true, group: grpOurs, arg: "PATH", def: "off",
			help: "Append a JSON-lines event log of launcher phases to PATH.",
			set:  func(p *parser, v string) error { p.cfg.EventLog = v; return nil }},
		{names: []string{"metrics-addr"}, env: true, group: grpOurs, arg: "ADDR", def: "off",
			help: "Serve Prometheus metrics on ADDR, host:port with a port 0-65535 (e.g. 127.0.0.1:9400).",
			set: func(p *parser, v string) error {
				if v != "" {
					if err := checkListenAddr(v); err != nil {
						return err
					}
				}
				p.cfg.MetricsAddr = v
				return nil
			}},
		{names: []string{"state-dir"}, env: true, group: grpOurs, arg: "DIR", def: "off",
			help: "Keep the ranks' training state (ft_launcher_client.state.save) in this launcher's memory, outliving rank restarts, and write it to DIR in the background. See docs/state.md.",
			set:  func(p *parser, v string) error { p.cfg.StateDir = v; return nil }},
		{names: []string{"state-persist-every"}, env: true, group: grpOurs, arg: "N|DURATION", def: "5m",
			help: "With --state-dir: write the newest saves to DIR after every N saves (e.g. 10) or every DURATION with a new save (e.g. 90s); 0 writes only when a rank fails, on a signal and at the end (always done too).",
			set: func(p *parser, v string) (err error) {
				p.cfg.StatePersist, err = state.ParseEvery(v)
				return err
			}},
		{names: []string{"state-replicas"}, env: true, group: grpOurs, arg: "K", def: "1 with several nodes",
			help: "With --state-dir: stream each rank's saves to the next K nodes' launchers, so the ranks taking a lost node's place restore its state from a buddy's memory (0 to min(nodes-1, 4); default 1 when --nnodes allows more than one node, else 0). See docs/state.md.",
			set: func(p *parser, v string) (err error) {
				p.cfg.StateReplicas, err = parseIntRange(v, 0, MaxStateReplicas)
				return err
			}},
		{names: []string{"job-secret-file"}, env: true, group: grpOurs, arg: "PATH", def: "off",
			help: "A file holding a secret shared by every node of the job (the same file everywhere, readable by this user only): the state replication port (--state-replicas) then accepts copies and serves fetches only with frames authenticated with it (HMAC-SHA256), and gossip encrypts and authenticates its packets with a key derived from it (AES-GCM). Without it, only the allowlist of the round's node addresses protects the replication port, and gossip is plain. See docs/security.md.",
			set: func(p *parser, v string) error {
				if !filepath.IsAbs(v) {
					return fmt.Errorf("--job-secret-file %q: want an absolute path to a file holding the job's secret", v)
				}
				p.cfg.JobSecretFile = v
				return nil
			}},
		{names: []string{"state-shm-dir"}, env: true, group: grpOurs, arg: "DIR", def: "/dev/shm",
			help: "With --state-dir: the memory file system (a tmpfs) holding the ranks' state segments; a save that does not fit there or in free memory goes to --state-dir's files instead, with a warning. See docs/state.md.",
			set: func(p *parser, v string) error {
				if !filepath.IsAbs(v) {
					return fmt.Errorf("--state-shm-dir %q: want an absolute path to a directory on a tmpfs, like /dev/shm", v)
				}
				p.cfg.StateShmDir = v
				return nil
			}},
		{names: []string{"health-check-cmd"}, env: true, group: grpOurs, arg: "CMD", def: "off",
			help: "Command run before each rendezvous join; a non-zero exit marks this node unhealthy.",
			set:  func(p *parser, v string) error { p.cfg.HealthCheckCmd = v; return nil }},
		{names: []string{"verdict-file"}, env: true, altEnv: "FT_LAUNCHER_VERDICT_FILE", group: grpOurs, arg: "PATH",
			help: "JSON verdict written atomically when the launcher exits (why it stopped, exit code, restarts used, finished flag, quarantined nodes); default: verdict.json in the run's log directory. See docs/verdict.md. Also YAML fault_tolerance.verdict_file.",
			set:  func(p *parser, v string) error { p.cfg.VerdictFile = v; return nil }},
		{names: []string{"termination-log"}, env: true, altEnv: "FT_LAUNCHER_TERMINATION_LOG", group: grpOurs, arg: "PATH", def: "/dev/termination-log in a Kubernetes pod when it exists, else off",
			help: "Also write the verdict, compacted to at most 4096 bytes (the kubelet's limit), to PATH: the container's termination message, which the pod's status then carries. \"\" disables. Also YAML fault_tolerance.termination_log. See docs/kubernetes.md.",
			set:  func(p *parser, v string) error { p.cfg.TerminationLog = v; return nil }},
		{names: []string{"spare-filler"}, env: true, group: grpOurs, arg: "CMD", def: "off",
			help: "Filler work for this node while it waits as a spare (nodes beyond --nnodes MIN): run as /bin/sh -c CMD in its own process group, with FT_LAUNCHER_FILLER=1 and none of the job's variables, its output in filler.log in the run's log directory, restarted with backoff if it exits. When the spare is promoted the whole filler tree is SIGKILLed at once (no grace: filler is pre-emptible by contract) before the job's ranks start. Also YAML fault_tolerance.spare_filler. See docs/spares.md.",
			set:  func(p *parser, v string) error { p.cfg.SpareFiller = v; return nil }},
		{names: []string{"prewarm"}, env: true, group: grpOurs, arg: "auto|MODULES|off", def: "off",
			help: "Comma-separated Python modules (e.g. torch,torch.distributed) that one standby interpreter per local rank imports ahead of time; a restart hands each rank to its standby instead of starting a new interpreter (no GPU work in the standby; ignored with --no-python). auto: the launcher learns the modules from what the ranks import (recommended; a built-in torch list until it has learned). Costs one imported interpreter per local rank. Also YAML fault_tolerance.prewarm. See docs/prewarm.md.",
			set: func(p *parser, v string) (err error) {
				p.cfg.Prewarm, p.cfg.PrewarmAuto, err = parsePrewarm(v)
				return err
			}},
		{names: []string{"agent-store"}, env: true, group: grpOurs, arg: "on|off", def: "on",
			help: "on: the launcher of group rank 0 serves the ranks' c10d TCPStore at MASTER_ADDR:MASTER_PORT, listening before any rank starts, and ranks get TORCHELASTIC_USE_AGENT_STORE=True (no rank waits on a connect retry; keys reset every round). off: rank 0 hosts the store, as under torchrun --standalone. Also YAML fault_tolerance.agent_store. See docs/agentstore.md.",
			set:  func(p *parser, v string) (err error) { p.cfg.AgentStore, err = parseOnOff(v); return err }},
		{names: []string{"prewarm-importing"}, env: true, group: grpOurs, arg: "auto|wait|stop", def: "auto",
			help: "What a restart does with a --prewarm standby still importing its modules: auto waits for it when its import should end sooner than a cold start would (compared in CPU time with the last standby's import) and stops it otherwise; wait always waits (bounded); stop always stops it and starts the rank cold. See docs/prewarm.md.",
			set: func(p *parser, v string) error {
				switch m := strings.ToLower(strings.TrimSpace(v)); m {
				case "auto", "wait", "stop":
					p.cfg.PrewarmImporting = m
					return nil
				}
				return fmt.Errorf("%q: want auto, wait or stop", v)
			}},
		{names: []string{"restart-mode"}, env: true, group: grpOurs, arg: "full|in-process", def: "full",
			help: "full: a failure restarts every rank. in-process: only the failed rank is replaced; surviving ranks that use ft_launcher_client.inprocess stay in their process, leave the process group and rejoin the next round (a node whose ranks did not all opt in restarts them fully). Also YAML fault_tolerance.restart_mode. See docs/inprocess.md.",
			set:  func(p *parser, v string) (err error) { p.cfg.RestartMode, err = parseRestartMode(v); return err }},
		{names: []string{"inprocess-rejoin-timeout"}, env: true, group: grpOurs, arg: "SECONDS", def: "30",
			help: "With --restart-mode in-process: a survivor that has not rejoined the next round this long after its notice is killed and the job falls back to the full restart. 0.001 to 604800. Also YAML fault_tolerance.inprocess_rejoin_timeout.",
			set: func(p *parser, v string) (err error) {
				p.cfg.InProcessRejoinTimeout, err = parseSeconds(v, true)
				return err
			}},
		{names: []string{"spare-filler-reclaim-timeout"}, env: true, group: grpOurs, arg: "SECONDS", def: "30",
			help: "Bound on reclaiming a promoted spare: the filler tree's exit and, with GPUs, until nvidia-smi shows no process on them and memory below --ft-gpu-memory-tolerance-mb. Past it the spare is quarantined and the next spare takes its place. 0.001 to 604800.",
			set: func(p *parser, v string) (err error) {
				p.cfg.SpareFillerReclaimTimeout, err = parseSeconds(v, true)
				return err
			}},
		{names: []string{"walltime-signals"}, env: true, group: grpStop, arg: "SIG,...|none", def: "SIGUSR1,SIGUSR2",
			help: "The scheduler's pre-walltime warnings (Slurm's --signal=USR1@SECONDS): forwarded to every rank so it can checkpoint, never counted as a failure; the verdict then says walltime. none disables.",
			set: func(p *parser, v string) (err error) {
				if strings.EqualFold(strings.TrimSpace(v), "none") {
					p.cfg.WalltimeSignals = nil
					return nil
				}
				p.cfg.WalltimeSignals, err = parseSignalList(v)
				return err
			}},
		{names: []string{"print-config"}, kind: kindSwitch, group: grpOurs, def: "off",
			help: "Print the effective configuration as YAML (the rendezvous as interpreted included) and exit.",
			set:  func(p *parser, v string) (err error) { p.cfg.PrintConfig, err = p.switchValue(v); return err }},

		// Legacy nvrx options that have no effect any more.
		{names: []string{"restart-policy"}, group: grpCompat, arg: "POLICY", deprecated: "removed in nvrx v0.5; every failure restarts all ranks",
			help: "nvrx <= v0.4 restart policy.", set: deprecatedNoop},
		{names: []string{"ft-restart-policy"}, group: grpCompat, arg: "any-failed|min-healthy", deprecated: "removed in nvrx v0.6; every failure restarts all ranks",
			help: "nvrx v0.5 restart policy.", set: deprecatedNoop},
		{names: []string{"ft-use-infra-group-rank"}, group: grpCompat, arg: "BOOL", deprecated: "nvrx v0.5 only; group ranks come from the rendezvous",
			help: "nvrx v0.5 rank assignment switch.", set: deprecatedNoop},
		{names: []string{"ft-rdzv-impl"}, group: grpCompat, arg: "barrier|legacy", deprecated: "there is one rendezvous implementation",
			help: "nvrx rendezvous implementation choice.", set: deprecatedNoop},

		// torchrun / nvrx options for features not implemented here.
		ignored("event-log-handler", kindValue, true, "NAME", "null", "torchrun events handler.", "use --event-log"),
		ignored("logs-specs", kindValue, false, "NAME", "", "torchrun LogsSpecs plugin.", "plugins are Python entry points"),
		ignored("numa-binding", kindValue, false, "node|socket|exclusive|core-complex", "", "torchrun NUMA binding.", "not implemented"),
		ignored("virtual-local-rank", kindSwitch, true, "", "off", "torchrun virtual local rank.", "not implemented"),
		ignored("duplicate-stdout-filters", kindValue, true, "FILTER,...", "", "torchrun duplicated-output filters.", "not implemented"),
		ignored("duplicate-stderr-filters", kindValue, true, "FILTER,...", "", "torchrun duplicated-output filters.", "not implemented"),
		ignored("ft-node-health-check-endpoint", kindValue, false, "ENDPOINT", "", "nvrx node health service socket.", "use --health-check-cmd"),
		ignored("ft-scheduler-exclusion-dir", kindValue, false, "DIR", "", "nvrx scheduler exclusion decisions.", "not implemented"),
	}
	for _, n := range []string{"ft-per-cycle-applog-prefix", "ft-nvrx-logfile", "ft-enable-log-server", "ft-log-server-port",
		"ft-log-aggregator-count", "ft-log-leaf-max-queue-chunks", "ft-log-server-log-prefix", "ft-log-server-graceful-shutdown-timeout"} {
		opts = append(opts, ignored(n, kindValue, true, "VALUE", "", "nvrx log funnel option.", "the nvrx log funnel is not implemented; see --log-dir"))
	}
	for _, n := range []string{"ft-attribution-endpoint", "ft-attribution-startup-timeout", "ft-attribution-llm-api-key-file",
		"ft-attribution-llm-base-url", "ft-attribution-llm-model", "ft-attribution-analysis-backend", "ft-attribution-stop-action",
		"ft-attribution-log-level", "ft-attribution-export-url"} {
		opts = append(opts, ignored(n, kindValue, true, "VALUE", "", "nvrx failure attribution option.", "attribution is not implemented"))
	}

	defFT := DefaultFaultTolerance()
	for _, sp := range ftSpecs() {
		if sp.flag == "" {
			continue
		}
		o := &option{names: []string{sp.flag}, group: grpFT, arg: sp.arg, def: ftDefault(&defFT, sp.key), help: sp.help,
			set: func(p *parser, v string) error {
				w, err := setFT(&p.cfg.FT, sp, v, false)
				if w != "" {
					p.warn("%s: %s", p.subj, w)
				}
				return err
			}}
		if sp.key == "timeouts_state_file" || sp.key == "termination_grace" || sp.key == "calculate_timeouts" || sp.key == "default_timeouts" || sp.key == "rank_stacks" || sp.key == "same_failure_limit" || sp.key == "node_failure_limit" || strings.HasPrefix(sp.key, "straggler") {
			o.group = grpOurs
		}
		if sp.legacy {
			o.legacy = []string{"ft-param-" + strings.ReplaceAll(sp.key, "_", "-")}
		}
		opts = append(opts, o)
	}
	return opts
}

// deprecatedNoop accepts a removed option; the caller already warned.
func deprecatedNoop(*parser, string) error { return nil }

// ftDefault renders a field's default for the help text.
func ftDefault(ft *FaultTolerance, key string) string {
	switch key {
	case "rank_termination_signal":
		return signalName(ft.RankTerminationSignal)
	case "log_level":
		return logLevelName(ft.LogLevel)
	}
	f, ok := ftField(ft, key)
	if !ok {
		return ""
	}
	switch v := f.Interface().(type) {
	case *float64, *int, *string:
		if f.IsNil() {
			return "none"
		}
	case map[string]*float64:
		if len(v) == 0 {
			return "none"
		}
	case string:
		if v == "" {
			return "off"
		}
	}
	if f.Kind() == reflect.Pointer {
		return fmt.Sprint(f.Elem().Interface())
	}
	return fmt.Sprint(f.Interface())
}

// parseRestartMode parses --restart-mode.
func parseRestartMode(v string) (string, error) {
	switch m := strings.ToLower(strings.TrimSpace(v)); m {
	case RestartFull, RestartInProcess:
		return m, nil
	case "in_process", "inprocess":
		return RestartInProcess, nil
	}
	return "", fmt.Errorf("invalid value %q: must be full or in-process", v)
}

// parseOnOff parses an on|off option such as --agent-store.
func parseOnOff(v string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "on":
		return true, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("invalid value %q: must be on or off", v)
}

// parsePrewarm parses --prewarm: "auto" (learn the modules from the
// ranks), dotted Python module names, comma separated, or "" / "off"
// (none).
func parsePrewarm(v string) (modules []string, auto bool, err error) {
	if strings.EqualFold(strings.TrimSpace(v), "auto") {
		return nil, true, nil
	}
	modules, err = parseModuleList(v)
	return modules, false, err
}

// parseModuleList parses a --prewarm list: dotted Python module names,
// comma separated ("" or "off": none).
func parseModuleList(v string) ([]string, error) {
	v = strings.TrimSpace(v)
	if v == "" || strings.EqualFold(v, "off") {
		return nil, nil
	}
	var out []string
	for _, m := range strings.Split(v, ",") {
		m = strings.TrimSpace(m)
		if strings.HasPrefix(m, "-") {
			// "--prewarm --max-restarts 3": the flag took the next argument.
			return nil, fmt.Errorf("needs a value: auto, off or the Python modules to import ahead, comma-separated "+
				"(e.g. --prewarm torch,torch.distributed), not the flag %q", m)
		}
		if !pyModuleRE.MatchString(m) || strings.EqualFold(m, "auto") {
			return nil, fmt.Errorf("%q is not a Python module name (want auto, off, or dotted names, comma-separated, e.g. torch,torch.distributed)", m)
		}
		out = append(out, m)
	}
	return out, nil
}

var pyModuleRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
