package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ftlauncher/ft-launcher/verdict"
)

// forwardedSignals are the signals `ft-resumer node` passes on to the
// launcher, as tini does for a container's process: every catchable one
// except those the kernel raises for a fault of this process (SIGSEGV,
// SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT), SIGCHLD (about our own
// child), SIGPIPE (about our own output) and SIGURG (the Go runtime's
// preemption signal).
var forwardedSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2,
	syscall.SIGALRM, syscall.SIGCONT, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGWINCH,
	syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGPWR,
}

// killSettle is how long `ft-resumer node` waits after its launcher was
// SIGKILLed before it records the death: when srun or slurmstepd is
// tearing the whole step down (kill-on-bad-exit, scancel, the end of
// KillWait) it SIGKILLs this process too within that time, and a healthy
// node must not be accused of a kill that came for the whole job.
const killSettle = 200 * time.Millisecond

// nodeRun is one `ft-resumer node` run: where the launcher's verdict goes
// and who this node is.
type nodeRun struct {
	args        []string // the command, args[0] its name
	env         []string
	verdictPath string // "" when not known: no verdict is written for the launcher
	host        string // the Slurm node name ($SLURMD_NODENAME, else the host name)
	killSettle  time.Duration
	stderr      io.Writer
}

// cmdNode runs the launcher as this process's child on a node of the job
// (srun ft-resumer node -- ft-launcher ...): it sets the node's verdict
// path, forwards every catchable signal, waits and exits with the
// launcher's status (128+N for a death by signal N). When the launcher was
// killed without writing its verdict (SIGKILL, a crash by signal), it
// writes one for it (fatal_error, this node quarantined with evidence
// launcher_died), so that the chain excludes the node although its peers
// saw nothing or were killed by srun before they could (docs/slurm.md,
// "A launcher that dies alone").
func cmdNode(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "Usage: ft-resumer node -- COMMAND [ARGS...]")
		return 2
	}
	host := os.Getenv("SLURMD_NODENAME")
	if host == "" {
		host, _ = os.Hostname()
	}
	env := os.Environ()
	if dir := os.Getenv("FT_RESUMER_JOB_DIR"); dir != "" {
		env = append(env, verdict.EnvPath+"="+filepath.Join(dir, "verdict-"+host+".json"))
	}
	n := nodeRun{args: args, env: env, host: host, killSettle: killSettle, stderr: stderr}
	n.verdictPath = launcherVerdictPath(args, env)
	return n.run()
}

// launcherVerdictPath is where the launcher writes its verdict: its
// --verdict-file, else $FT_LAUNCHER_VERDICT_FILE; "" when neither is given
// (the launcher's default lies in a run directory named at run time).
func launcherVerdictPath(args, env []string) string {
	if v := flagValue(args, "--verdict-file"); v != "" {
		return v
	}
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], verdict.EnvPath+"="); ok {
			return v
		}
	}
	return ""
}

// run starts the command, forwards signals to it until it exits, and
// returns the status this process exits with.
func (n nodeRun) run() int {
	path, err := exec.LookPath(n.args[0])
	if err != nil {
		fmt.Fprintf(n.stderr, "ft-resumer node: %v\n", err)
		return 127
	}
	// Signals are caught before the child exists: one arriving while it
	// starts is forwarded once it runs.
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	cmd := exec.Command(path, n.args[1:]...)
	cmd.Args = n.args
	cmd.Env = n.env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	started := time.Now()
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(n.stderr, "ft-resumer node: start %s: %v\n", path, err)
		return 126
	}
	pid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	forwarded := map[syscall.Signal]bool{}
	for {
		select {
		case s := <-sigs:
			ss := s.(syscall.Signal)
			forwarded[ss] = true
			if err := cmd.Process.Signal(ss); err != nil && !errors.Is(err, os.ErrProcessDone) {
				fmt.Fprintf(n.stderr, "ft-resumer node: forward %s to pid %d: %v\n", unix.SignalName(ss), pid, err)
			}
			continue
		case err = <-done:
		}
		break
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		fmt.Fprintf(n.stderr, "ft-resumer node: wait %s: %v\n", path, err)
		return 1
	}
	if !ws.Signaled() {
		// An exit with a code is the launcher's own decision (its verdict
		// says why), or a usage error or a Go panic (2): not a fault of the
		// node, and the chain judges it from the exit status.
		return ws.ExitStatus()
	}
	sig := ws.Signal()
	status := 128 + int(sig)
	if forwarded[sig] {
		// Killed by a signal someone sent the job: their decision.
		return status
	}
	if n.verdictPath == "" || n.launcherWroteVerdict(pid) {
		return status
	}
	if sig == syscall.SIGKILL && n.killSettle > 0 {
		time.Sleep(n.killSettle) // a step teardown kills this process meanwhile
	}
	if n.launcherWroteVerdict(pid) {
		return status
	}
	n.writeDeathVerdict(pid, sig, status, started)
	return status
}

// launcherWroteVerdict reports whether the verdict at the node's path is
// the child's (its pid), not an earlier launcher's or nothing.
func (n nodeRun) launcherWroteVerdict(pid int) bool {
	v, err := verdict.Read(n.verdictPath)
	return err == nil && v.PID == pid
}

// writeDeathVerdict records the launcher's death: fatal_error, with this
// node quarantined (evidence launcher_died), which the chain turns into an
// exclusion of the node.
func (n nodeRun) writeDeathVerdict(pid int, sig syscall.Signal, status int, started time.Time) {
	name := unix.SignalName(sig)
	if name == "" {
		name = "signal " + strconv.Itoa(int(sig))
	}
	reason := fmt.Sprintf("%s (pid %d) was killed by %s without a verdict", filepath.Base(n.args[0]), pid, name)
	now := time.Now().UTC()
	hostname, _ := os.Hostname()
	v := verdict.Verdict{Kind: verdict.FatalError, ExitCode: status, Reason: reason, Hostname: hostname, PID: pid,
		Node: n.host + "/" + strconv.Itoa(pid), LastRound: -1, Signal: name, StartedAt: started.UTC(), EndedAt: now,
		RunID: flagValue(n.args, "--rdzv-id"),
		Quarantined: []verdict.Quarantine{{Node: n.host + "/" + strconv.Itoa(pid), Host: n.host,
			Evidence: verdict.EvidenceLauncherDied, Round: -1, At: now,
			Detail: fmt.Sprintf("the launcher on %s died alone (%s, no verdict) while its parent ft-resumer node lived: the node is suspect", n.host, name)}}}
	if err := verdict.Write(n.verdictPath, v); err != nil {
		fmt.Fprintf(n.stderr, "ft-resumer node: %s; could not record it: %v\n", reason, err)
		return
	}
	fmt.Fprintf(n.stderr, "ft-resumer node: %s; recorded at %s (node %s quarantined: launcher_died)\n", reason, n.verdictPath, n.host)
}

// flagValue is the value of a launcher flag given as --name V or
// --name=V ("" when absent).
func flagValue(args []string, name string) string {
	for i, a := range args[1:] {
		if a == "--" {
			break
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+2 < len(args) {
			return args[i+2]
		}
	}
	return ""
}
