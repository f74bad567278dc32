package configs

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/k8s"
	"github.com/ftlauncher/ft-launcher/slurm"
	"github.com/ftlauncher/ft-launcher/state"
	"github.com/spf13/pflag"
)

// ErrHelp is returned by Parse when -h/--help appears before the training
// script. The caller prints Usage() and exits 0.
var ErrHelp = errors.New("help requested")

// ErrVersion is returned by Parse when --version appears before the
// training script. The caller prints the version and exits 0.
var ErrVersion = errors.New("version requested")

// UsageError is bad command-line, environment or YAML input. Error() is one
// line that names the flag, PET_ variable or YAML key and what is allowed.
// The caller prints it and exits with ExitUsage (2).
type UsageError struct {
	Subject string // the flag (--nnodes), variable (PET_NNODES) or key at fault
	Msg     string // the whole one-line message, starting with Subject
}

func (e *UsageError) Error() string { return e.Msg }

func usageErr(subject, format string, args ...any) *UsageError {
	msg := fmt.Sprintf(format, args...)
	msg = strings.Join(strings.Fields(strings.ReplaceAll(msg, "\n", " ")), " ")
	return &UsageError{Subject: subject, Msg: msg}
}

// Parse parses args (without argv[0]) with env lookups through getenv
// (os.Getenv in production, a map in tests); nw resolves host names and
// knows this machine's addresses, which decide the local address and
// whether this launcher hosts the embedded etcd (a zero Network resolves
// nothing and no endpoint is local, so only --rdzv-conf is_host makes a
// host). Precedence is flag > PET_* variable > the Slurm job (see
// slurmDefaults) > the Kubernetes pod (see k8sDefaults) > YAML
// (--ft-cfg-path) > default. An empty variable counts as unset.
//
// It returns ErrHelp when help was asked for, and a *UsageError on bad input.
// Config.PythonExec is $PYTHON_EXEC or else the bare name "python3", which the
// agent resolves through PATH. Warnings (deprecated or ignored options,
// unknown YAML keys) are collected in Config.Warnings for the caller to log.
func Parse(args []string, getenv func(string) string, nw Network) (*Config, error) {
	return parse(args, getenv, machine{devDir: "/dev", numCPU: runtime.NumCPU(), net: nw})
}

// machine is what parsing looks at beyond the arguments: --nproc-per-node
// cpu/gpu/auto count devices and a pod's termination log is
// devDir/termination-log (tests point devDir at a directory of fake device
// nodes because no GPU exists here), and the rendezvous asks the network
// about host names and this machine's addresses.
type machine struct {
	devDir string
	numCPU int
	net    Network
}

// parser holds one parse's state.
type parser struct {
	cfg           *Config
	getenv        func(string) string
	subj          string            // source of the value being applied, for messages
	source        map[string]string // option name -> source of its last value
	explicit      map[string]bool   // rendezvous values given by the user
	net           Network
	ignoreMissing bool
	podEndpoint   string // podEndpointSubdomain or podEndpointService: the endpoint came from the pod (k8sDefaults)
	endpointHint  string // why the pod gave no endpoint, for the missing-endpoint error
}

// occurrence is one option found on the command line.
type occurrence struct {
	opt   *option
	name  string // the name the user typed, normalized to dashes
	value string
}

func (p *parser) warn(format string, args ...any) {
	p.cfg.Warnings = append(p.cfg.Warnings, strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " "))
}

// switchValue reads the value pflag hands a switch: "true" when bare,
// or whatever followed '=' (--standalone=false).
func (p *parser) switchValue(v string) (bool, error) { return parseFlagBool(v) }

func defaultConfig() *Config {
	return &Config{
		NNodes:                    NNodes{Min: 1, Max: 1},
		NProcSpec:                 "1",
		RdzvBackend:               "c10d",
		RdzvID:                    "none",
		RdzvConf:                  map[string]string{},
		MonitorInterval:           300 * time.Millisecond,
		StartMethod:               "spawn",
		Role:                      "default",
		NodeRank:                  -1,
		MasterAddr:                "127.0.0.1",
		MasterPort:                29500,
		SignalsToHandle:           []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT},
		WalltimeSignals:           []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2},
		SpareFillerReclaimTimeout: 30 * time.Second,
		TermTimeout:               1800 * time.Second,
		WorkersStopTimeout:        15 * time.Second,
		StatePersist:              state.Every{Interval: 5 * time.Minute},
		FT:                        DefaultFaultTolerance(),
		AgentStore:                true,
		RestartMode:               RestartFull,
		InProcessRejoinTimeout:    30 * time.Second,
	}
}

// dashes lets every '_' in a long flag name stand for '-', which covers
// torchrun's and nvrx's underscore aliases (--nproc_per_node,
// --ft-rank_heartbeat_timeout, --ft_segment) in one rule.
func dashes(_ *pflag.FlagSet, name string) pflag.NormalizedName {
	return pflag.NormalizedName(strings.ReplaceAll(name, "_", "-"))
}

// noValue satisfies pflag.Value; ParseAll hands values to us instead.
type noValue struct{}

func (noValue) String() string   { return "" }
func (noValue) Set(string) error { return nil }
func (noValue) Type() string     { return "string" }

func parse(args []string, getenv func(string) string, m machine) (*Config, error) {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	p := &parser{cfg: defaultConfig(), getenv: getenv, source: map[string]string{}, explicit: map[string]bool{}, net: m.net}
	opts := options()

	fs := pflag.NewFlagSet("ft-launcher", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SetInterspersed(false) // the first positional is the script; the rest belongs to it
	fs.SetNormalizeFunc(dashes)
	byName := map[string]*option{}
	for _, o := range opts {
		for i, n := range append(append([]string{}, o.names...), o.legacy...) {
			short := ""
			if i == 0 {
				short = o.short
			}
			f := fs.VarPF(noValue{}, n, short, "")
			if o.kind == kindSwitch {
				f.NoOptDefVal = "true"
			}
			byName[n] = o
		}
	}
	fs.BoolP("help", "h", false, "")
	fs.Bool("version", false, "")

	var occs []occurrence
	err := fs.ParseAll(args, func(f *pflag.Flag, v string) error {
		switch f.Name {
		case "help":
			return ErrHelp
		case "version":
			return ErrVersion
		}
		occs = append(occs, occurrence{opt: byName[f.Name], name: f.Name, value: v})
		return nil
	})
	if err != nil {
		return nil, flagError(err, byName)
	}

	// The file location comes first (it may come from any layer); then the
	// YAML, then every other option's PET_ variable, then its flags.
	for _, early := range []bool{true, false} {
		if err := p.applyEnv(opts, early); err != nil {
			return nil, err
		}
		if err := p.applyFlags(occs, early); err != nil {
			return nil, err
		}
		if early {
			if err := p.loadYAML(); err != nil {
				return nil, err
			}
		}
	}
	if err := p.finish(fs.Args(), m); err != nil {
		return nil, err
	}
	return p.cfg, nil
}

func (p *parser) applyEnv(opts []*option, early bool) error {
	for _, o := range opts {
		if o.early != early {
			continue
		}
		for _, name := range o.envNames() {
			v := p.getenv(name)
			if v == "" {
				continue
			}
			if o.kind == kindSwitch {
				on, err := parsePETBool(v)
				if err != nil {
					return usageErr(name, "%s: %v", name, err)
				}
				v = fmt.Sprint(on)
			}
			if err := p.apply(o, name, v); err != nil {
				return err
			}
		}
	}
	return nil
}

func (p *parser) applyFlags(occs []occurrence, early bool) error {
	for _, oc := range occs {
		if oc.opt.early != early {
			continue
		}
		subj := "--" + oc.name
		if oc.opt.short != "" && oc.name == oc.opt.names[0] {
			subj = "-" + oc.opt.short + "/--" + oc.name
		}
		for _, l := range oc.opt.legacy {
			if l == oc.name {
				p.warn("%s is deprecated: use --%s", subj, oc.opt.names[0])
			}
		}
		if oc.opt.deprecated != "" {
			p.warn("%s is deprecated and ignored: %s", subj, oc.opt.deprecated)
		}
		if err := p.apply(oc.opt, subj, oc.value); err != nil {
			return err
		}
	}
	return nil
}

// apply runs o's setter and names the source in any error.
func (p *parser) apply(o *option, subj, v string) error {
	p.subj = subj
	if err := o.set(p, v); err != nil {
		msg := err.Error()
		if strings.HasPrefix(msg, subj) { // already names its flag
			return usageErr(subj, "%s", msg)
		}
		return usageErr(subj, "%s: %s", subj, msg)
	}
	p.source[o.names[0]] = subj
	return nil
}

// finish applies the rules that involve several options.
func (p *parser) finish(positional []string, m machine) error {
	c := p.cfg
	if len(positional) == 0 || positional[0] == "" {
		return usageErr("training_script", "missing training script: give it after the options (ft-launcher [options] SCRIPT [ARGS...]); "+
			"with -m it is a module name, with --no-python an executable; use -- before a script whose name starts with '-'")
	}
	c.Script = positional[0]
	c.ScriptArgs = append([]string{}, positional[1:]...)

	if c.Module && c.NoPython {
		return usageErr("--no-python", "-m/--module and --no-python cannot be used together: -m runs a python module, --no-python runs an executable directly; pick one")
	}
	if c.RestartMode == RestartInProcess && !c.AgentStore {
		// Survivors rebuild their process group against the launcher's
		// store; with the rank-0 store a surviving rank 0 cannot bind it
		// again, so every restart would be a full one.
		subj := p.sourceOr("restart-mode", "--restart-mode")
		return usageErr(subj, "%s in-process needs the launcher's store (--agent-store on, the default), but %s is off: "+
			"survivors rebuild their process group against it; use --restart-mode full with --agent-store off",
			subj, p.sourceOr("agent-store", "--agent-store"))
	}
	if c.Standalone {
		var overridden []string
		for _, k := range []string{"rdzv-backend", "rdzv-endpoint", "rdzv-id"} {
			if p.explicit[k] {
				overridden = append(overridden, p.source[k])
			}
		}
		if len(overridden) > 0 {
			p.warn("--standalone: ignoring %s (standalone uses c10d at localhost:0 with a random run id)", strings.Join(overridden, ", "))
		}
		c.RdzvBackend = "c10d"
		c.RdzvEndpoint = "localhost:0"
		id, err := randomID()
		if err != nil {
			return fmt.Errorf("--standalone: making a run id: %w", err)
		}
		c.RdzvID = id
	}

	n, err := resolveNProc(c.NProcSpec, p.getenv, m.devDir, m.numCPU)
	if err == nil && n > MaxNProcPerNode {
		err = fmt.Errorf("value %s resolved to %d workers: at most %d per node; give an integer", c.NProcSpec, n, MaxNProcPerNode)
	}
	if err != nil {
		subj := p.sourceOr("nproc-per-node", "--nproc-per-node")
		return usageErr(subj, "%s: %v", subj, err)
	}
	c.NProcPerNode = n

	c.PythonExec = p.getenv("PYTHON_EXEC")
	if c.PythonExec == "" {
		c.PythonExec = "python3"
	}
	c.Slurm = slurm.FromEnv(p.getenv)
	c.K8s = k8s.FromEnv(p.getenv)
	for _, bad := range append(append([]string{}, c.Slurm.Invalid...), c.K8s.Invalid...) {
		p.warn("%s is not an integer >= 0; ignored", bad)
	}
	if err := p.slurmDefaults(); err != nil {
		return err
	}
	if err := p.k8sDefaults(); err != nil {
		return err
	}
	if err := p.validateRunID(); err != nil {
		return err
	}
	if err := p.validateVerdictFile(); err != nil {
		return err
	}
	p.terminationLog(m.devDir)
	p.resolveInfraRank()
	if err := p.resolveRendezvous(); err != nil {
		return err
	}
	if c.Rdzv.Mode != RdzvSingleNode && c.RestartDelay >= c.Rdzv.JoinTimeout {
		// The nodes wait the delay before they join the next round, and a
		// node that joins sooner (a launcher started again) gives up
		// after join_timeout.
		subj := p.sourceOr("restart-delay", "--restart-delay")
		return usageErr(subj, "%s %s is not below the rendezvous join_timeout (%s): the nodes would give up on the round the delay holds back; lower it, or raise --rdzv-conf join_timeout",
			subj, c.RestartDelay, c.Rdzv.JoinTimeout)
	}
	p.resolveMasterAddr()
	if err := p.resolveStateReplicas(); err != nil {
		return err
	}
	c.Sources = p.sources()
	return nil
}

// MaxStateReplicas is the largest --state-replicas: the rendezvous gives
// each node the replica receivers of its next 4 nodes only, which keeps its
// rank entry small at thousands of nodes (docs/state.md).
const MaxStateReplicas = 4

// resolveStateReplicas defaults --state-replicas (1 with --state-dir on a
// job that may have several nodes, else 0) and checks a given value
// against the job: replication needs the state store, the launcher's
// agent store (its per-round hook sets the buddies) and a peer.
func (p *parser) resolveStateReplicas() error {
	c := p.cfg
	subj := p.sourceOr("state-replicas", "")
	if subj == "" {
		c.StateReplicas = 0
		if c.StateDir != "" && c.NNodes.Max > 1 && c.AgentStore {
			c.StateReplicas = 1
		}
		return nil
	}
	if c.StateReplicas == 0 {
		return nil
	}
	switch {
	case c.StateDir == "":
		return usageErr(subj, "%s %d needs --state-dir: only the launcher-held state is replicated; give --state-dir DIR or drop %s",
			subj, c.StateReplicas, subj)
	case !c.AgentStore:
		return usageErr(subj, "%s %d needs the launcher's store (--agent-store on, the default): it sets each round's buddies before the ranks start",
			subj, c.StateReplicas)
	case c.StateReplicas > c.NNodes.Max-1:
		return usageErr(subj, "%s %d: a node has at most %d other nodes (--nnodes %d:%d); allowed 0 to %d",
			subj, c.StateReplicas, c.NNodes.Max-1, c.NNodes.Min, c.NNodes.Max, min(c.NNodes.Max-1, MaxStateReplicas))
	}
	return nil
}

// terminationLog defaults --termination-log, in a pod, to the file the
// kubelet mounts for the container's termination message, when it exists
// (terminationMessagePath may move it: then give the flag).
func (p *parser) terminationLog(devDir string) {
	if p.source["termination-log"] != "" || !p.cfg.K8s.InPod {
		return
	}
	path := filepath.Join(devDir, "termination-log")
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		p.cfg.TerminationLog = path
		p.source["termination-log"] = "Kubernetes (" + path + ")"
	}
}

// randomID returns a version-4 UUID string, as torchrun's --standalone uses.
func randomID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// flagError turns pflag's errors into one-line usage errors.
func flagError(err error, byName map[string]*option) error {
	if errors.Is(err, ErrHelp) || errors.Is(err, ErrVersion) {
		return err
	}
	var notExist *pflag.NotExistError
	var needsValue *pflag.ValueRequiredError
	var syntax *pflag.InvalidSyntaxError
	switch {
	case errors.As(err, &notExist):
		if sh := notExist.GetSpecifiedShortnames(); sh != "" {
			name := "-" + notExist.GetSpecifiedName()[:1]
			return usageErr(name, "unknown flag %s (in -%s): the short flags are -m, -r, -t and -h; see --help", name, sh)
		}
		name := "--" + notExist.GetSpecifiedName()
		if s, prefix := suggest(notExist.GetSpecifiedName(), byName); s != "" {
			if prefix {
				return usageErr(name, "unknown flag %s: did you mean --%s? (abbreviated flags are not accepted; see --help)", name, s)
			}
			return usageErr(name, "unknown flag %s: did you mean --%s? (see --help)", name, s)
		}
		return usageErr(name, "unknown flag %s: see --help for the accepted flags", name)
	case errors.As(err, &needsValue):
		name := needsValue.GetSpecifiedName()
		if sh := needsValue.GetSpecifiedShortnames(); sh != "" {
			name = name[:1]
		}
		o := byName[string(dashes(nil, name))]
		if o == nil && len(name) == 1 {
			for _, x := range byName {
				if x.short == name {
					o = x
				}
			}
		}
		subj := "--" + name
		if len(name) == 1 {
			subj = "-" + name
		}
		if o != nil {
			return usageErr(subj, "%s requires a value: %s", subj, o.arg)
		}
		return usageErr(subj, "%s requires a value", subj)
	case errors.As(err, &syntax):
		return usageErr(syntax.GetSpecifiedFlag(), "bad flag syntax %q: flags are --name, --name=value or --name value", syntax.GetSpecifiedFlag())
	}
	return usageErr("", "%v", err)
}

// suggest returns the known flag closest to name: the flag it is a prefix
// of when that is unique (abbreviations are not accepted), or one within a
// small edit distance.
func suggest(name string, byName map[string]*option) (flag string, prefix bool) {
	name = string(dashes(nil, name))
	var prefixOf []string
	best, bestD := "", 1<<30
	for _, k := range sortedKeys(byName) {
		if strings.HasPrefix(k, name) {
			prefixOf = append(prefixOf, k)
		}
		if d := editDistance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	if len(prefixOf) == 1 {
		return prefixOf[0], true
	}
	limit := 2
	if len(name) < 6 {
		limit = 1
	}
	if bestD <= limit {
		return best, false
	}
	return "", false
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// sourceOr names where option name's value came from (a flag, a PET_
// variable, a YAML key), or def when it is the default.
func (p *parser) sourceOr(name, def string) string {
	if s := p.source[name]; s != "" {
		return s
	}
	return def
}
