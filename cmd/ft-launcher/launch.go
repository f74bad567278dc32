package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/agentstore"
	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/filler"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/metrics"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/prewarm"
	"github.com/ftlauncher/ft-launcher/ranklogs"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/spawn"
	"github.com/ftlauncher/ft-launcher/stacks"
	"github.com/ftlauncher/ft-launcher/tcpstore"
)

// launch sets up every part of the node agent, runs it, and tears every part
// down again in reverse order, whatever happened. Every exit after the
// configuration was accepted goes through one path: an agent.Outcome, whose
// ExitCode is the exit code and whose verdict is written to the verdict file
// and the termination log.
//
// sigs are the handled signals. During the set-up the first one cancels
// the set-up (an etcd connect may otherwise wait connect_timeout) and ends
// the launcher with a signaled verdict; once the agent runs it reads them.
func launch(ctx context.Context, cfg *configs.Config, log *slog.Logger, sigs <-chan os.Signal, stderr io.Writer) int {
	setupCtx, cancelSetup := context.WithCancel(ctx)
	defer cancelSetup()
	guard := guardSetup(sigs, cancelSetup)
	defer guard.end()

	environ := os.Environ()
	if !workerReady(cfg, stderr) {
		return configs.ExitUsage
	}
	host, _ := os.Hostname()
	rec := &verdictRecorder{cfg: cfg, log: log, host: host, node: nodeName(cfg, host), started: time.Now()}

	ev, err := eventlog.Open(cfg.EventLog, eventBase(cfg, rec.node))
	if err != nil {
		fmt.Fprintf(stderr, "ft-launcher: --event-log %s: %v\n", cfg.EventLog, err)
		return configs.ExitUsage
	}
	defer ev.Close()
	ev.ReportTo(log.With("component", "eventlog"))
	rec.ev = ev

	ls := &listeners{} // every socket set up below: one record once set up
	met := serveMetrics(ctx, cfg, log, ls)
	logs, err := ranklogs.New(ranklogs.Options{Metrics: met, Log: log.With("component", "ranklogs"),
		LogDir: cfg.LogDir, RunID: cfg.RdzvID, Role: cfg.Role,
		Redirects: cfg.Redirects, Tee: cfg.Tee, LocalRanksFilter: cfg.LocalRanksFilter, KeepAttempts: cfg.LogKeepAttempts,
		PrefixTemplate: os.Getenv("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"),
		Console:        os.Stdout, ConsoleErr: os.Stderr,
	})
	if err != nil {
		return rec.setupFailed("prepare the log directory", err)
	}
	rec.logDir = logs.Dir()
	rec.logs = logs

	cg := contain(log)
	reaper, err := spawn.NewReaper(log.With("component", "spawn"))
	if err != nil {
		return rec.setupFailed("start the process reaper", err)
	}
	defer reaper.Close()
	cgroup := ""
	if cg != nil {
		reaper.Keep(cg.Guardian) // not an orphan for the sweeps to kill
		cgroup = cg.Dir
	}

	st, err := openState(cfg, ev, log)
	if err != nil {
		return rec.setupFailed("start the state store", err)
	}
	if st != nil {
		environ = append(environ, st.Env()...)
		rec.state = st
		defer st.Close(context.Background()) // idempotent after rec.write's
	}
	// The prewarm starter, made below, learns each rank's first heartbeat
	// from the monitor's records: its refill need not wait any longer.
	var training atomic.Pointer[prewarm.Starter]
	monEvents := func(rec eventlog.Record) {
		ev.Emit(rec)
		if hb, ok := rec.(eventlog.RankFirstHeartbeatEvent); ok {
			if st := training.Load(); st != nil {
				st.RankTraining(hb.Round, hb.LocalRank)
			}
		}
	}
	monOpts := monitor.Options{NLocal: cfg.NProcPerNode, FT: cfg.FT, OnEvent: monEvents,
		StateFile: cfg.FT.TimeoutsStateFile, Logger: log.With("component", "monitor"), Metrics: met}
	var hookDirs []string // the launcher's own PYTHONPATH entries, left out of prewarm's command keys
	var stk *stacks.Collector
	if cfg.FT.RankStacks {
		// Every rank gets the hook, --no-python too: such a rank is often
		// a shell script that runs Python.
		stk, err = stacks.New()
		if err != nil {
			log.Warn("rank stacks off: the hook could not be written", "err", err)
		} else {
			defer stk.Close()
			if gpuNode() {
				// torch keeps no flight recorder unless asked (buffer 0);
				// on a GPU node the launcher asks, for the hang's stacks.
				stk.SetFlightRecorderDefault(flightRecorderEntries)
			}
			environ = stk.Env(environ)
			monOpts.Stacks = stk
			hookDirs = append(hookDirs, stk.HookDir())
		}
	}
	mon, err := monitor.New(monOpts)
	if err != nil {
		return rec.setupFailed("start the rank monitors", err)
	}
	defer mon.Close()
	for i := range cfg.NProcPerNode {
		ls.own(listenRankMonitor, "unix", mon.RankSocket(i), "")
	}
	ls.own(listenWorkloadControl, "unix", mon.LauncherSocket(), "")
	repl, err := listenReplicas(ctx, cfg, st, ev, log)
	if err != nil {
		return rec.setupFailed("start the state replica receiver", err)
	}
	if repl != nil {
		defer repl.Close() // after the agent: its ranks are stopped by then
		ls.own(listenStateReplication, "tcp", repl.Addr(), "")
	}

	// The local parts above take milliseconds; the rendezvous may wait on
	// etcd (or start it), so a signal is checked before and cancels it.
	if sig := guard.caught(); sig != nil {
		return rec.signaled(sig)
	}
	var store *agentstore.Host
	if cfg.AgentStore {
		store = agentstore.New(ctx, agentstore.Options{Logger: log.With("component", "agent-store"), Events: ev,
			Store: tcpstore.Options{Limits: storeLimits(cfg.NProcPerNode)}})
		defer store.Close() // after the agent: its ranks are stopped by then
		ls.own(listenAgentStore, "tcp", net.JoinHostPort(agentstore.BindHost(agentStoreHost(cfg)), "0"), agentStoreWhen)
	}
	// The agent's context: a part the node must not run without that
	// failed for good (the fence watchdog) ends the node through it.
	agentCtx, abortAgent := context.WithCancelCause(ctx)
	defer abortAgent(nil)
	var wd *fence.Watchdog // multi-node only: a frozen launcher's ranks are killed beside it
	if cfg.Rdzv.Mode != configs.RdzvSingleNode {
		rec.fence = &fenceRecord{}
		wd = startFence(reaper, ev, met, rec.fence, func(reason string) { abortAgent(&agent.Abort{Reason: reason}) }, log)
		defer wd.Close() // after the agent and the rendezvous: the ranks are stopped by then
	}
	rec.etcdMember = &memberFailures{}
	rdzv, cleanup, err := newRendezvous(setupCtx, cfg, log, reaper, met, store, keeperDeps{events: ev, failures: rec.etcdMember}, wd, repl.Addr(), ls)
	if err != nil {
		if sig := guard.end(); sig != nil {
			return rec.signaled(sig)
		}
		return rec.setupFailed("rendezvous set-up failed", err)
	}
	defer cleanup()
	ls.rendezvous(rdzv)
	if n, ok := rdzv.(interface{ NodeID() string }); ok {
		rec.node = n.NodeID() // the id peers use in their records of this node
	}
	if x, ok := rdzv.(stackSharer); ok && monOpts.Stacks != nil {
		mon.SetStackExchange(shareStacks(x, rec.node, log))
	}
	if sig := guard.end(); sig != nil {
		return rec.signaled(sig)
	}

	var ranks agent.RankStarter = agent.SpawnRanks{Reaper: reaper}
	var spareStandbys agent.SpareStandbys // a parked spare keeps standbys too
	if cfg.PrewarmAuto && cfg.NoPython {
		log.Info("--prewarm auto is ignored with --no-python: the ranks do not run Python")
	}
	if (len(cfg.Prewarm) > 0 || cfg.PrewarmAuto) && !cfg.NoPython {
		o := prewarm.Options{Reaper: reaper, Modules: cfg.Prewarm, HookDirs: hookDirs,
			Logger: log.With("component", "prewarm"), OnEvent: ev.Emit,
			Importing: prewarm.Importing(cfg.PrewarmImporting),
			// A rank handed to its standby runs before StartGroup returns
			// (it may wait seconds for other ranks' standbys) and so before
			// the agent's BeginCycle: its monitor must know its pid first,
			// and the fence watchdog must guard it from then on (a frozen
			// launcher during that wait is fenced like any other).
			Started: func(localRank, pid int) {
				mon.Expect(localRank, pid)
				wd.Guard(pid) // a standby leads its own process group
			}}
		if cfg.PrewarmAuto {
			l, err := prewarm.NewLearner(prewarm.DefaultStateFile(os.Getenv))
			if err != nil {
				log.Warn("prewarm auto: the learned modules cannot be read; learning again", "err", err)
			}
			o.Auto = l
		}
		st, err := prewarm.NewStarter(o)
		if err != nil {
			return rec.setupFailed("prewarm", err)
		}
		defer st.Close() // before the reaper closes: kills the standbys
		training.Store(st)
		ranks, spareStandbys = prewarmRanks{st}, st
		rec.prewarm = st.AutoSummary
	}
	if wd != nil {
		ranks = fencedRanks{RankStarter: ranks, wd: wd}
	}
	ls.emit(ev, log)
	book := newLedgerBook(cfg, rdzv, ev, rec.node, host, log)
	deps := agent.Deps{Config: cfg, Logger: log.With("component", "agent"), Events: ev, Metrics: met,
		Ranks: ranks, Logs: logs, Monitors: mon, Rdzv: rdzv, Signals: sigs,
		Hostname: host, NodeID: rec.node, Environ: environ, CallTimeout: callTimeout(cfg),
		Ledger: book, WalltimeSignals: osSignals(cfg.WalltimeSignals), SpareStandbys: spareStandbys}
	if os.Getenv("SLURM_JOB_ID") != "" {
		// slurmstepd signals every process of the step: a rank may exit on
		// the pre-walltime warning before this launcher reads its own.
		deps.WalltimeSettle = walltimeSettle
	}
	if stk != nil {
		deps.Evidence = stk
	}
	if x, ok := rdzv.(agent.SpeedExchange); ok {
		deps.Speed = x // the etcd rendezvous: each node's ranks' speed, judged job-wide
	}
	deps.SpeedInterval = time.Duration(cfg.FT.StragglerInterval * float64(time.Second))
	if store != nil {
		deps.Store = store
		if repl != nil {
			if err := repl.start(ctx, rec.node); err != nil {
				return rec.setupFailed("start the state replicas", err)
			}
			deps.Store = replicaStore{Store: store, ctx: ctx, repl: repl}
		}
	}
	if st != nil {
		deps.Monitors = stateMonitors{Manager: mon, st: st}
	}
	if cfg.SpareFiller != "" {
		deps.Spare = newFiller(cfg, reaper, logs.Dir(), cgroup, environ, ev, log)
	}
	return rec.write(agent.New(deps).Run(agentCtx))
}

// newLedgerBook is this node's book of leases: in the job's etcd when the
// rendezvous has one, and in the event log.
func newLedgerBook(cfg *configs.Config, rdzv rendezvous.Rendezvous, ev *eventlog.Log, node, host string, log *slog.Logger) *ledger.Book {
	var store ledger.Store
	if s, ok := rdzv.(interface{ LedgerStore() ledger.Store }); ok {
		store = s.LedgerStore()
	}
	onErr := func(err error) { log.Warn("ledger", "err", err) }
	return ledger.NewBook(cfg.RdzvID, node, host, onErr, store, ledgerEvents{ev})
}

// ledgerEvents writes ledger records to the JSON-lines event log.
type ledgerEvents struct{ ev *eventlog.Log }

func (l ledgerEvents) Put(_ context.Context, r ledger.Record) error {
	l.ev.Emit(eventlog.LedgerEvent{Record: r})
	return nil
}

// contain moves the launcher into a cgroup of its own where cgroups are
// writable, so nothing of a rank outlives it, even SIGKILLed; it returns
// the containment (nil where none).
func contain(log *slog.Logger) *spawn.Containment {
	c, err := spawn.Contain(log.With("component", "spawn"))
	if err != nil {
		log.Debug("rank processes not contained in a cgroup", "err", err)
		return nil
	}
	return c
}

// newFiller is the --spare-filler work of this node while it is a spare.
func newFiller(cfg *configs.Config, reaper *spawn.Reaper, logDir, cgroup string, environ []string, ev *eventlog.Log, log *slog.Logger) *filler.Filler {
	logPath := os.DevNull
	if logDir != "" {
		logPath = filler.LogPath(logDir)
	}
	o := filler.Options{Command: cfg.SpareFiller, Env: environ, LogPath: logPath, CgroupParent: cgroup,
		ReclaimTimeout: cfg.SpareFillerReclaimTimeout, Logger: log.With("component", "filler"),
		OnEvent: ev.Emit}
	if hasNvidiaSMI() {
		run := func(ctx context.Context, argv []string) ([]byte, error) {
			out, ex, err := reaper.Run(ctx, argv, os.Environ())
			if err == nil && ex.Failed() {
				err = fmt.Errorf("%s", ex)
			}
			return out, err
		}
		o.GPUCheck = filler.NvidiaSMICheck(run, cfg.FT.GpuMemoryToleranceMB)
	}
	return filler.New(reaper, o)
}

func osSignals(s []syscall.Signal) []os.Signal {
	out := make([]os.Signal, len(s))
	for i, x := range s {
		out[i] = x
	}
	return out
}

// eventBase are the fields of every event: the node and run, and the
// scheduler's job when there is one (so a record names the Slurm job).
func eventBase(cfg *configs.Config, node string) map[string]any {
	base := map[string]any{"node": node, "run_id": cfg.RdzvID}
	if cfg.Slurm.InJob() {
		base["slurm_job_id"] = cfg.Slurm.JobID
		if cfg.Slurm.RestartCount >= 0 {
			base["slurm_restart_count"] = cfg.Slurm.RestartCount
		}
	}
	return base
}

// workerReady resolves the worker interpreter (a usage error when it is
// missing) and prints torchrun's OMP_NUM_THREADS notice.
func workerReady(cfg *configs.Config, stderr io.Writer) bool {
	if !cfg.NoPython {
		py, err := exec.LookPath(cfg.PythonExec)
		if err != nil {
			fmt.Fprintf(stderr, "ft-launcher: python interpreter %q not found on PATH (set PYTHON_EXEC, or use --no-python): %v\n", cfg.PythonExec, err)
			return false
		}
		cfg.PythonExec = py
	}
	if os.Getenv("OMP_NUM_THREADS") == "" && cfg.NProcPerNode > 1 {
		fmt.Fprintln(stderr, "*****************************************\n"+
			"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed. \n"+
			"*****************************************")
	}
	return true
}

// serveMetrics starts the Prometheus endpoint of --metrics-addr (nil
// Metrics, which record nothing, without it) and records its listener in
// ls. An address that cannot be bound is logged; the job runs without
// the endpoint.
func serveMetrics(ctx context.Context, cfg *configs.Config, log *slog.Logger, ls *listeners) *metrics.Metrics {
	if cfg.MetricsAddr == "" {
		return nil
	}
	met := metrics.New()
	ln, err := metrics.Listen(cfg.MetricsAddr)
	if err != nil {
		log.Error("metrics endpoint", "addr", cfg.MetricsAddr, "err", err)
		return met
	}
	ls.own(listenMetrics, "tcp", ln.Addr().String(), "")
	go func() {
		if err := met.ServeOn(ctx, ln); err != nil {
			log.Error("metrics endpoint", "addr", cfg.MetricsAddr, "err", err)
		}
	}()
	return met
}

// setupGuard watches the handled signals while the launcher sets up, until
// the agent takes them over.
type setupGuard struct {
	stop     chan struct{}
	done     chan struct{}
	stopOnce sync.Once
	sig      os.Signal // the signal taken, if any; written before done closes
}

// guardSetup starts watching sigs: the first signal is kept and cancels
// the set-up through cancel.
func guardSetup(sigs <-chan os.Signal, cancel context.CancelFunc) *setupGuard {
	g := &setupGuard{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		select {
		case s := <-sigs:
			g.sig = s
			close(g.done) // before cancel: whoever sees the set-up cancelled finds the signal in caught()
			cancel()
		case <-g.stop:
			close(g.done)
		}
	}()
	return g
}

// caught returns the signal taken so far, without ending the watch.
func (g *setupGuard) caught() os.Signal {
	select {
	case <-g.done:
		return g.sig
	default:
		return nil
	}
}

// end stops the watch and returns the signal it took, if any; after end no
// signal is taken from the channel, so the agent gets every later one.
func (g *setupGuard) end() os.Signal {
	g.stopOnce.Do(func() { close(g.stop) })
	<-g.done
	return g.sig
}

// callTimeout bounds the agent's short rendezvous calls: the rendezvous
// gives up by itself at the etcd loss bound; this is the backstop.
func callTimeout(cfg *configs.Config) time.Duration {
	if cfg.Rdzv.Mode == configs.RdzvSingleNode {
		return 10 * time.Second
	}
	return cfg.Rdzv.EtcdLossBound + 10*time.Second
}

func nodeName(cfg *configs.Config, host string) string {
	if cfg.LocalAddr != "" {
		return cfg.LocalAddr
	}
	return host
}

// newRendezvous picks the rendezvous for the launch line: Local for a single
// node (nothing external), else the etcd backend, hosting an embedded etcd
// when this launcher's address is the endpoint's.
// With the agent store, each round's MASTER_PORT is its server's, bound
// before the round is handed out.
func newRendezvous(ctx context.Context, cfg *configs.Config, log *slog.Logger, reaper *spawn.Reaper, met *metrics.Metrics, store *agentstore.Host, keep keeperDeps, wd *fence.Watchdog, replicaAddr string, ls *listeners) (rendezvous.Rendezvous, func(), error) {
	if cfg.Rdzv.Mode == configs.RdzvSingleNode { // decided and validated at parse time
		addr, port := singleNodeMaster(cfg)
		l := rendezvous.NewLocal(cfg.RdzvID, cfg.NProcPerNode, cfg.MaxRestarts, addr, port).WithMetrics(met).
			WithRestartBudget(cfg.RestartWindow, cfg.RestartDelay)
		if store != nil {
			l.WithMasterPort(func(round int) (int, error) { return store.Port(addr, round) })
		}
		return l, func() {}, nil
	}
	return newEtcdRendezvous(ctx, cfg, log, reaper, met, store, keep, wd, replicaAddr, ls)
}

// singleNodeMaster is the MASTER_ADDR and MASTER_PORT of a single-node
// job (port 0: picked per round).
func singleNodeMaster(cfg *configs.Config) (addr string, port int) {
	addr, port = cfg.MasterAddr, cfg.MasterPort
	if cfg.Standalone || cfg.RdzvBackend != "static" {
		addr, port = "127.0.0.1", 0
	}
	if cfg.LocalAddr != "" && !cfg.Standalone {
		addr = cfg.LocalAddr
	}
	return addr, port
}

// advertisedAddr is the address a node of a multi-node job gives its
// peers: --local-addr, else its host name.
func advertisedAddr(cfg *configs.Config) string {
	if cfg.LocalAddr != "" {
		return cfg.LocalAddr
	}
	h, _ := os.Hostname()
	return h
}

// agentStoreHost is the host the agent store's server is advertised at
// (agentstore.BindHost says what it binds).
func agentStoreHost(cfg *configs.Config) string {
	if cfg.Rdzv.Mode == configs.RdzvSingleNode {
		addr, _ := singleNodeMaster(cfg)
		return addr
	}
	return advertisedAddr(cfg)
}

// healthCheck returns the pre-join node health check, or nil.
func healthCheck(cfg *configs.Config, reaper *spawn.Reaper, log *slog.Logger) func(context.Context) error {
	if cfg.HealthCheckCmd == "" && !hasNvidiaSMI() {
		return nil
	}
	return func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		defer cancel()
		if cfg.HealthCheckCmd != "" {
			out, ex, err := reaper.Run(ctx, []string{"/bin/sh", "-c", cfg.HealthCheckCmd}, os.Environ())
			if err != nil {
				return fmt.Errorf("health check %q: %w", cfg.HealthCheckCmd, err)
			}
			if ex.Failed() {
				return fmt.Errorf("health check %q failed (%s): %s", cfg.HealthCheckCmd, ex, strings.TrimSpace(string(out)))
			}
		}
		if hasNvidiaSMI() {
			out, ex, err := reaper.Run(ctx, []string{"nvidia-smi", "-L"}, os.Environ())
			if err != nil || ex.Failed() {
				return fmt.Errorf("GPU health check: nvidia-smi -L failed (%v): %s", err, strings.TrimSpace(string(out)))
			}
		}
		return nil
	}
}

// flightRecorderEntries is the NCCL flight recorder's size the launcher
// sets on a GPU node where the job sets none: torch's own tools and
// torchtitan use 2,000 to 20,000; each entry is a few hundred bytes of host
// memory per process group.
const flightRecorderEntries = 2000

// walltimeSettle is how long, under Slurm, a node whose last rank exited
// 0 waits for a pre-walltime warning on its way before calling the job a
// success (agent.Deps.WalltimeSettle): the launcher's copy of the signal
// trails the rank's by the launcher's own scheduling, milliseconds on a
// loaded node; it costs a job's successful end as much at most.
const walltimeSettle = 250 * time.Millisecond

// gpuNode says whether this node has an NVIDIA device (/dev/nvidia<N>).
func gpuNode() bool {
	m, _ := filepath.Glob("/dev/nvidia[0-9]*")
	return len(m) > 0
}

func hasNvidiaSMI() bool {
	_, err := exec.LookPath("nvidia-smi")
	return err == nil
}

// storeLimits are the agent store's limits: tcpstore's defaults with the
// per-address cap sized for this node's ranks.
func storeLimits(nproc int) tcpstore.Limits {
	l := tcpstore.DefaultLimits()
	l.MaxConnsPerAddr = agentstore.ConnsPerAddr(nproc)
	return l
}

// describePrewarmAuto says, for --print-config, what --prewarm auto's
// standbys of local rank 0 would import for this command line.
func describePrewarmAuto(cfg *configs.Config) string {
	l, err := prewarm.NewLearner(prewarm.DefaultStateFile(os.Getenv))
	out := ""
	if err != nil {
		out = "# prewarm auto: " + err.Error() + "\n"
	}
	key := prewarm.CommandKey(agent.WorkerArgv(cfg, 0), prewarm.RankDir(""), os.Getenv("PYTHONPATH"))
	return out + l.Describe(key)
}

// prewarmRanks adapts a *prewarm.Starter to agent.RankStarter: prewarm
// returns its own *prewarm.Group (it does not import agent, which sits
// above it), and this is the one place the two meet.
type prewarmRanks struct{ st *prewarm.Starter }

// StartGroup starts one cycle's ranks on the standbys.
func (p prewarmRanks) StartGroup(specs []spawn.Spec) (agent.RankGroup, error) {
	g, err := p.st.StartGroup(specs)
	if err != nil {
		return nil, err // a nil *prewarm.Group must not become a non-nil RankGroup
	}
	return g, nil
}
