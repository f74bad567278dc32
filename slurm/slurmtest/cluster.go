// Package slurmtest runs a private, real Slurm cluster on one machine for
// tests: munged, slurmctld and one slurmd per fake node (n1, n2, ... on
// 127.0.0.2, 127.0.0.3, ...), all from Debian's packages, with their
// configuration, state, sockets and logs under one temporary directory.
//
// The daemons run in the foreground as children of the test binary (so
// their pids are known exactly and a dying test takes them along through the
// parent-death signal) and Stop ends exactly those pids. Nothing
// system-wide is touched: no systemd unit, no /etc/slurm, no /run/munge.
//
// The settings follow what the single-machine Slurm lab found: a short
// cred_expire (a requeued job otherwise waits 121 s), a one-second scheduler
// and backfill interval, MinJobAge=3600 (a dependency on a purged job counts
// as satisfied), ReturnToService=1 (State=DOWN sticks), proctrack/linuxproc
// with task/none (no cgroups or systemd needed), and jobcomp/filetxt so that
// `sacct -c` works without slurmdbd.
package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/hangdump"
)

// Packages are the Debian packages the cluster needs (scripts/deps.sh
// installs them, with every other package the tests need).
var Packages = []string{"munge", "slurmctld", "slurmd", "slurm-client"}

var programs = []string{"munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sacct", "scancel", "srun", "sinfo"}

// ErrUnavailable is returned by Ensure (and Start) when Slurm is not
// installed or this process is not root; tests report it through
// internal/testenv (a skip, or a failure under CI).
var ErrUnavailable = errors.New("slurmtest: Slurm is not available")

// Ensure checks that this process is root (the daemons need it) and that the
// Slurm and munge programs are installed. It installs nothing:
// scripts/deps.sh does (scripts/test.sh runs it first).
func Ensure(ctx context.Context) error {
	if os.Geteuid() != 0 {
		// slurmd must be root to start job steps as their users.
		return fmt.Errorf("%w: the daemons need root (slurmd starts job steps as their users)", ErrUnavailable)
	}
	if missing := missingPrograms(); len(missing) > 0 {
		return fmt.Errorf("%w: %v missing: install %v (scripts/deps.sh does)", ErrUnavailable, missing, Packages)
	}
	return ctx.Err()
}

func missingPrograms() []string {
	var missing []string
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			missing = append(missing, p)
		}
	}
	return missing
}

// Options shape the cluster.
type Options struct {
	Nodes    int // fake nodes (default 3)
	CPUs     int // CPUs advertised per node (default 4)
	MemoryMB int // RealMemory per node (default 4096)
	// CredExpire is munge's credential lifetime in seconds (min 5): a
	// requeued job waits CredExpire+1 s before it may start again.
	CredExpire int
	// Marker is set in the environment of every daemon and client command
	// (and therefore every job), so leftovers can be found by it.
	Marker string
	// Keep leaves the cluster's directory (logs, state) after Stop.
	Keep bool
}

// Node is one fake node.
type Node struct {
	Name string // n1, n2, ...
	Addr string // 127.0.0.2, ...
	Port int
}

// Cluster is a running private cluster.
type Cluster struct {
	Dir      string // everything lives here
	Conf     string // slurm.conf (SLURM_CONF)
	JobsDir  string // 1777 scratch directory for job files
	Nodes    []Node
	Marker   string
	keep     bool
	ctldPort int
	daemons  []*daemon // in start order
}

type daemon struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Env is the environment for Slurm client commands (and, since sbatch
// exports the submitter's environment, for jobs): os.Environ with
// SLURM_CONF and the marker.
func (c *Cluster) Env() []string {
	env := make([]string, 0, len(os.Environ())+2)
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SLURM_") || strings.HasPrefix(kv, "FTL_SLURMTEST_MARKER=") {
			continue // a test running inside a job must not leak its job's identity
		}
		env = append(env, kv)
	}
	return append(env, "SLURM_CONF="+c.Conf, "FTL_SLURMTEST_MARKER="+c.Marker)
}

// Command is a Slurm client command (sbatch, squeue, ...) for this cluster.
func (c *Cluster) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env()
	return cmd
}

// Run runs a client command and returns its trimmed stdout.
func (c *Cluster) Run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := c.Command(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// Start brings a cluster up under a new directory in dir (os.TempDir when
// empty; munged needs every directory above its socket to be o+x, which
// t.TempDir is not) and waits until every node is idle. On error everything
// it started is stopped again.
func Start(ctx context.Context, dir string, o Options) (*Cluster, error) {
	if err := Ensure(ctx); err != nil {
		return nil, err
	}
	if o.Nodes <= 0 {
		o.Nodes = 3
	}
	if o.CPUs <= 0 {
		o.CPUs = 4
	}
	if o.MemoryMB <= 0 {
		o.MemoryMB = 4096
	}
	if o.CredExpire < 5 {
		o.CredExpire = 5
	}
	root, err := os.MkdirTemp(dir, "slurmtest-")
	if err != nil {
		return nil, fmt.Errorf("slurmtest: %w", err)
	}
	c := &Cluster{Dir: root, Conf: filepath.Join(root, "etc", "slurm.conf"), JobsDir: filepath.Join(root, "jobs"), Marker: o.Marker, keep: o.Keep}
	if c.Marker == "" {
		c.Marker = fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano())
	}
	if err := c.start(ctx, o); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

func (c *Cluster) start(ctx context.Context, o Options) error {
	for _, d := range []string{"etc", "run", "log", "state", "spool", "munge/secret", "jobs"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return fmt.Errorf("slurmtest: %w", err)
		}
	}
	// munged refuses a socket directory that others cannot traverse, and a
	// key directory that others can read; jobs may run as any user.
	for p, mode := range map[string]os.FileMode{c.Dir: 0o755, filepath.Join(c.Dir, "munge"): 0o755,
		filepath.Join(c.Dir, "munge/secret"): 0o700, c.JobsDir: 0o1777} {
		if err := os.Chmod(p, mode); err != nil {
			return fmt.Errorf("slurmtest: %w", err)
		}
	}
	ports, err := freePorts(o.Nodes + 1)
	if err != nil {
		return err
	}
	c.ctldPort = ports[0]
	for i := 0; i < o.Nodes; i++ {
		c.Nodes = append(c.Nodes, Node{Name: fmt.Sprintf("n%d", i+1), Addr: fmt.Sprintf("127.0.0.%d", i+2), Port: ports[i+1]})
	}

	key := filepath.Join(c.Dir, "munge/secret/munge.key")
	if out, err := exec.CommandContext(ctx, "mungekey", "--create", "--keyfile="+key).CombinedOutput(); err != nil {
		return fmt.Errorf("slurmtest: mungekey: %w: %s", err, out)
	}
	sock := filepath.Join(c.Dir, "munge/munge.socket")
	if err := c.spawn("munged", "munged", "-F", "--key-file="+key, "--socket="+sock,
		"--pid-file="+filepath.Join(c.Dir, "run/munged.pid"), "--log-file="+filepath.Join(c.Dir, "log/munged.log"),
		"--seed-file="+filepath.Join(c.Dir, "munge/secret/munged.seed")); err != nil {
		return err
	}
	if err := c.waitFor(ctx, 20*time.Second, "munged socket", func() bool { _, err := os.Stat(sock); return err == nil }); err != nil {
		return err
	}
	if err := os.WriteFile(c.Conf, []byte(c.slurmConf(o, sock)), 0o644); err != nil {
		return fmt.Errorf("slurmtest: %w", err)
	}
	// An empty plugstack keeps Debian's /etc/slurm/plugstack.conf.d out.
	if err := os.WriteFile(filepath.Join(c.Dir, "etc/plugstack.conf"), nil, 0o644); err != nil {
		return fmt.Errorf("slurmtest: %w", err)
	}
	if err := c.spawn("slurmctld", "slurmctld", "-D", "-i", "-f", c.Conf); err != nil {
		return err
	}
	for _, n := range c.Nodes {
		if err := os.MkdirAll(filepath.Join(c.Dir, "spool", n.Name), 0o755); err != nil {
			return fmt.Errorf("slurmtest: %w", err)
		}
		// Debian builds slurmd with --enable-multiple-slurmd: -N picks the
		// NodeName (and so its address and port).
		if err := c.spawn("slurmd-"+n.Name, "slurmd", "-D", "-N", n.Name, "-f", c.Conf); err != nil {
			return err
		}
	}
	return c.waitFor(ctx, 60*time.Second, "all nodes idle", func() bool {
		out, err := c.Run(ctx, "sinfo", "-h", "-N", "-o", "%N %T")
		if err != nil {
			return false
		}
		idle := map[string]bool{}
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[1] == "idle" { // "idle*" is not responding
				idle[f[0]] = true
			}
		}
		return len(idle) == len(c.Nodes)
	})
}

func (c *Cluster) slurmConf(o Options, sock string) string {
	host, _ := os.Hostname()
	if i := strings.IndexByte(host, '.'); i > 0 {
		host = host[:i]
	}
	var b strings.Builder
	d := c.Dir
	fmt.Fprintf(&b, `# generated by slurmtest: a private single-machine Slurm cluster
ClusterName=ftltest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]d
SlurmdPort=%[3]d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire (default 120 s) is also how long a requeued job waits to start again
AuthInfo=socket=%[4]s,cred_expire=%[5]d
StateSaveLocation=%[6]s/state
SlurmdSpoolDir=%[6]s/spool/%%n
SlurmctldPidFile=%[6]s/run/slurmctld.pid
SlurmdPidFile=%[6]s/run/slurmd-%%n.pid
SlurmctldLogFile=%[6]s/log/slurmctld.log
SlurmdLogFile=%[6]s/log/slurmd-%%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=%[6]s/etc/plugstack.conf
MailProg=/bin/true
# no systemd, maybe no writable cgroups: track job processes through /proc
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
MpiDefault=none
SwitchType=switch/none
PropagateResourceLimits=NONE
# no slurmdbd: jobcomp/filetxt records every finished job and 'sacct -c' reads it
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=%[6]s/log/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1,sched_min_interval=0,batch_sched_delay=0
# 1: State=DOWN set with scontrol sticks until State=RESUME (2 undoes it at once)
ReturnToService=1
SlurmdParameters=config_overrides
JobRequeue=1
# Preemption by partition tier, the way sites run an "urgent" queue: a job
# in the higher tier takes a lower tier job's CPUs by requeueing it (a job
# submitted with --no-requeue is cancelled instead). Only jobs sent to the
# "urgent" partition preempt, and only a test of preemption sends any.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# keep finished jobs for 1 h: a dependency on a purged job counts as satisfied
MinJobAge=3600
KillWait=5
InactiveLimit=0
Waittime=0
SlurmctldTimeout=30
SlurmdTimeout=60
MessageTimeout=10
`, host, c.ctldPort, c.Nodes[0].Port, sock, o.CredExpire, d)
	for _, n := range c.Nodes {
		fmt.Fprintf(&b, "NodeName=%s NodeHostname=%s NodeAddr=%s Port=%d CPUs=%d RealMemory=%d State=UNKNOWN\n",
			n.Name, host, n.Addr, n.Port, o.CPUs, o.MemoryMB)
	}
	b.WriteString("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1\n")
	b.WriteString("PartitionName=" + UrgentPartition + " Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2\n")
	return b.String()
}

// UrgentPartition is the partition whose jobs preempt (requeue) those of
// the default partition "debug" on the same nodes.
const UrgentPartition = "urgent"

// spawn starts a daemon in the foreground as a child of this process, in its
// own process group (a ^C to the test reaches the test, which then stops the
// daemons in order), with SIGTERM as its parent-death signal.
func (c *Cluster) spawn(name, prog string, args ...string) error {
	cmd := exec.Command(prog, args...)
	cmd.Env = c.Env()
	cmd.Dir = c.Dir
	logf, err := os.OpenFile(filepath.Join(c.Dir, "log", name+".out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("slurmtest: %w", err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("slurmtest: start %s: %w", name, err)
	}
	d := &daemon{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { d.err = cmd.Wait(); close(d.done) }()
	c.daemons = append(c.daemons, d)
	return nil
}

func (c *Cluster) waitFor(ctx context.Context, limit time.Duration, what string, ok func() bool) error {
	deadline := time.Now().Add(limit)
	for {
		if ok() {
			return nil
		}
		for _, d := range c.daemons {
			select {
			case <-d.done:
				return fmt.Errorf("slurmtest: %s exited (%v) while waiting for %s; log: %s", d.name, d.err, what, c.logTail(d.name))
			default:
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("slurmtest: timeout after %v waiting for %s", limit, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("slurmtest: waiting for %s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) logTail(name string) string {
	var out []byte
	for _, f := range []string{name + ".out", name + ".log"} {
		b, _ := os.ReadFile(filepath.Join(c.Dir, "log", f))
		out = append(out, b...)
	}
	return tail(out, 800)
}

// Stop cancels every job still known, waits for their steps to end, then
// stops the daemons it started, newest first: SIGTERM to that pid, SIGKILL
// to that pid only after 15 s. It returns an error naming any job process
// (a process carrying the cluster's marker) still alive afterwards, and
// removes the cluster's directory when all went well (unless Keep).
func (c *Cluster) Stop() error {
	var errs []error
	if c.ctldPort != 0 && c.running("slurmctld") {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		if ids, err := c.Run(ctx, "squeue", "-h", "-o", "%A"); err == nil && ids != "" {
			_, _ = c.Run(ctx, "scancel", strings.Fields(ids)...)
			_ = c.waitFor(ctx, 45*time.Second, "jobs to end", func() bool {
				out, err := c.Run(ctx, "squeue", "-h", "-o", "%A")
				return err == nil && out == ""
			})
		}
		cancel()
	}
	for i := len(c.daemons) - 1; i >= 0; i-- {
		d := c.daemons[i]
		select {
		case <-d.done:
			continue
		default:
		}
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-d.done:
		case <-time.After(15 * time.Second):
			_ = d.cmd.Process.Kill()
			<-d.done
			errs = append(errs, fmt.Errorf("slurmtest: %s ignored SIGTERM for 15 s", d.name))
		}
	}
	c.daemons = nil
	deadline := time.Now().Add(20 * time.Second)
	for {
		left := Leftovers(c.Marker)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			errs = append(errs, fmt.Errorf("slurmtest: processes left behind: %v", left))
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if !c.keep && len(errs) == 0 {
		if err := os.RemoveAll(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("slurmtest: %w", err))
		}
	}
	return errors.Join(errs...)
}

func (c *Cluster) running(name string) bool {
	for _, d := range c.daemons {
		if d.name == name {
			select {
			case <-d.done:
				return false
			default:
				return true
			}
		}
	}
	return false
}

// Leftovers lists "pid comm" of live processes whose environment carries
// FTL_SLURMTEST_MARKER=marker (daemons, slurmstepd and job processes of one
// cluster), skipping zombies and this process.
func Leftovers(marker string) []string {
	return processesWith([]byte("FTL_SLURMTEST_MARKER=" + marker + "\x00"))
}

// processesWith lists "pid comm" of live processes whose environment
// contains want, skipping zombies and this process.
func processesWith(want []byte) []string {
	var left []string
	for _, pid := range hangdump.Matching(func(env []byte) bool { return bytes.Contains(env, want) }) {
		comm, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "comm"))
		left = append(left, fmt.Sprintf("%d %s", pid, strings.TrimSpace(string(comm))))
	}
	return left
}

// freePorts asks the kernel for n distinct free TCP ports.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("slurmtest: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tail(b []byte, n int) string {
	s := strings.TrimSpace(string(b))
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}
