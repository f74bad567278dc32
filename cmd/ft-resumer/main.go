// Command ft-resumer drives the outer loop of fault tolerance, above the
// launchers. On Slurm it keeps a chain of jobs going until training is
// finished (auto-resume), with the decisions made from facts: the
// launchers' verdict files, the finished flag and Slurm's record (package
// slurm; docs/slurm.md). On Kubernetes, `ft-resumer appwrapper-controller`
// resets AppWrapper workloads (package k8s/appwrapper; docs/kubernetes.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/internal/cli"
	"github.com/ftlauncher/ft-launcher/internal/version"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
	"github.com/ftlauncher/ft-launcher/verdict"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `Usage: ft-resumer COMMAND [flags]

Keeps a chain of Slurm jobs going until training is finished. The chain's
state lives in its directory (chain.json) and in Slurm, so ft-resumer may
die and be run again at any time: it picks the chain up where it was.

Commands:
  run SCRIPT      start a chain with the batch script SCRIPT (or pick up the
                  chain in --chain-dir) and follow it until it ends; exits 0
                  when training finished, 1 when the chain stopped
  submit SCRIPT   start (or pick up) a chain and return at once
  status          show the chain (--json for tools)
  ledger          print a job's ledger of node leases (Active, Spare, Filler)
                  and why each ended, from its etcd or its verdict files
  watch           print a running job's ledger and follow it live
  report          a run's timeline and goodput account (where the time
                  went: training, detection, stop, rendezvous, start-up,
                  recomputed steps) as one offline HTML page or --json
  cancel          stop the chain and cancel its pending and running jobs
  step begin|end  the decision steps the generated job wrapper runs
  node -- CMD     run CMD (ft-launcher) on a node with its verdict file set to
                  $FT_RESUMER_JOB_DIR/verdict-$SLURMD_NODENAME.json: use it in
                  srun lines (srun ft-resumer node -- ft-launcher ...)
  appwrapper generate VALUES
                  on Kubernetes: write a complete AppWrapper that runs
                  ft-launcher from a short values file (docs/kubernetes.md)
  appwrapper-controller
                  on Kubernetes: reconcile AppWrapper workloads (resets with
                  AppWrapper's contract, driven by the launchers' verdicts);
                  replaces the upstream AppWrapper controller

Run 'ft-resumer COMMAND --help' for a command's flags; --version prints the
version.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "--version":
		if len(args) == 1 {
			fmt.Fprintln(stdout, version.String("ft-resumer"))
			return 0
		}
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	case "run", "submit":
		return cmdStart(ctx, args[0], args[1:], stdout, stderr)
	case "status":
		return cmdStatus(ctx, args[1:], stdout, stderr)
	case "ledger", "watch":
		return cmdLedger(ctx, args[0], args[1:], stdout, stderr)
	case "cancel":
		return cmdCancel(ctx, args[1:], stdout, stderr)
	case "step":
		return cmdStep(ctx, args[1:], stderr)
	case "node":
		return cmdNode(args[1:], stderr)
	case "appwrapper":
		return cmdAppWrapper(args[1:], stdout, stderr)
	case "appwrapper-controller":
		// A program of its own, so that the Kubernetes packages it links
		// are not loaded at every start of ft-resumer (a Slurm job's
		// steps): see companion.go.
		return execCompanion(controllerCompanion, args[1:], stderr)
	case "report":
		return cmdReport(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "ft-resumer: unknown command %q\n\n%s", strings.Join(args, " "), usage)
	return 2
}

// flagSet is a pflag set that reports errors once, to stderr.
func flagSet(name string, stderr io.Writer) *pflag.FlagSet {
	return cli.FlagSet("ft-resumer "+name, stderr)
}

func parse(fs *pflag.FlagSet, args []string, stdout io.Writer) (code int, done bool) {
	return cli.Parse(fs, args, stdout)
}

func chainDirFlag(fs *pflag.FlagSet) *string {
	return fs.String("chain-dir", os.Getenv("FT_RESUMER_CHAIN"), "the chain's directory (state, job script, verdicts, _job_results); on a file system every node sees ($FT_RESUMER_CHAIN)")
}

func newResumer(dir string, log io.Writer) *resumer.Resumer {
	return &resumer.Resumer{Dir: dir, Log: log}
}

func cmdStart(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	fs := flagSet(name, stderr)
	dir := chainDirFlag(fs)
	maxFail := fs.Int("max-subsequent-job-failures", 3, "consecutive failed jobs that are retried; the next failure stops the chain (walltime and preemption never count; a job that exits 0 without evidence of progress counts as no_progress; a job with evidence of progress resets the count)")
	maxJobs := fs.Int("max-jobs", resumer.DefaultMaxJobs, "at most this many jobs train (0: no limit; the default is over a month of 4-hour jobs)")
	progress := fs.StringArray("progress-path", nil, "a file, directory or glob the training writes as it advances (its checkpoints); a file there modified during a job is evidence of progress for ranks that report no steps (repeatable)")
	rate := fs.String("max-submit-rate", "30/10m", `stop the chain rather than submit more than N jobs in any window D ("N/D", e.g. 30/10m; "0" for no limit)`)
	detAfter := fs.Int("deterministic-after", resumer.DefaultDeterministicAfter, "stop the chain with deterministic_failure when the same rank failure (same rank and exit code, and the same exception at the same place when the verdicts say it, else the step within --deterministic-steps) happened this many times over consecutive failed jobs, in two jobs at least (0: never)")
	detSteps := fs.Int("deterministic-steps", resumer.DefaultDeterministicSteps, "how many steps (or iterations) apart two rank failures may be and still be the same failure")
	expiry := fs.Duration("exclusion-expiry", 24*time.Hour, "how long a node quarantined by a launcher stays excluded from the chain's jobs")
	flag := fs.String("finished-flag", "", "FAULT_TOL_FINISHED_FLAG_FILE: the file the training creates when it is complete (default <chain-dir>/finished.flag)")
	format := fs.String("job-results-format", "nfl", `_job_results lines: "nfl" (<jobid> X|S|F) or "nemo-run" (<jobid> <restarts> X|S|F)`)
	noRestart := fs.Int("no-restart-exit-code", verdict.DefaultNoRestartExitCode, "the launcher's exit code for do-not-restart (--ft-no-restart-exit-code)")
	resumerPath := fs.String("resumer-path", "", "the ft-resumer binary the jobs run (default: this one; it must be visible on every node)")
	poll := fs.Duration("poll", 500*time.Millisecond, "run: how often to check Slurm")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if *dir == "" {
		fmt.Fprintf(stderr, "ft-resumer %s: --chain-dir is required\n", name)
		return 2
	}
	if *format != "nfl" && *format != "nemo-run" {
		fmt.Fprintf(stderr, "ft-resumer %s: --job-results-format must be nfl or nemo-run, not %q\n", name, *format)
		return 2
	}
	if *maxFail < 0 || *maxJobs < 0 || *expiry <= 0 || *detAfter < 0 || *detSteps < 0 {
		fmt.Fprintf(stderr, "ft-resumer %s: --max-subsequent-job-failures, --max-jobs, --deterministic-after and --deterministic-steps must be >= 0, --exclusion-expiry > 0\n", name)
		return 2
	}
	maxSubmits, window, err := parseRate(*rate)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer %s: --max-submit-rate: %v\n", name, err)
		return 2
	}
	var progressPaths []string
	for _, p := range *progress {
		a, err := filepath.Abs(p)
		if err != nil || p == "" {
			fmt.Fprintf(stderr, "ft-resumer %s: --progress-path %q: want a file, directory or glob\n", name, p)
			return 2
		}
		if _, err := filepath.Match(a, ""); err != nil {
			fmt.Fprintf(stderr, "ft-resumer %s: --progress-path %q: %v\n", name, p, err)
			return 2
		}
		progressPaths = append(progressPaths, a)
	}
	abs, err := filepath.Abs(*dir)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer %s: %v\n", name, err)
		return 2
	}
	r := newResumer(abs, stderr)
	pos := fs.Args()
	script := ""
	var sbatchArgs []string
	if dash := fs.ArgsLenAtDash(); dash >= 0 {
		sbatchArgs, pos = pos[dash:], pos[:dash]
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "ft-resumer %s: one script expected, got %q (sbatch options go after --)\n", name, pos)
		return 2
	}
	if len(pos) == 1 {
		script = pos[0]
	}
	if _, err := resumer.LoadState(abs); errors.Is(err, resumer.ErrNoChain) {
		if script == "" {
			fmt.Fprintf(stderr, "ft-resumer %s: no chain in %s yet: give the batch script\n", name, abs)
			return 2
		}
		// Refuse what sbatch would refuse before anything exists or is
		// submitted (Start checks again).
		body, err := os.ReadFile(script)
		if err == nil {
			err = resumer.CheckScript(script, body)
		}
		if err != nil {
			fmt.Fprintf(stderr, "ft-resumer %s: %v\n", name, err)
			return 2
		}
	}
	set := resumer.Settings{
		MaxSubsequentFailures: *maxFail, MaxJobs: *maxJobs, ExclusionTTL: resumer.Duration(*expiry),
		FinishedFlag: *flag, SbatchArgs: sbatchArgs, Resumer: *resumerPath, JobResultsFormat: *format,
		NoRestartCode: *noRestart, ProgressPaths: progressPaths, MaxSubmits: maxSubmits, SubmitWindow: resumer.Duration(window),
		DeterministicAfter: *detAfter, DeterministicSteps: *detSteps,
	}
	if set.FinishedFlag != "" {
		if set.FinishedFlag, err = filepath.Abs(set.FinishedFlag); err != nil {
			fmt.Fprintf(stderr, "ft-resumer %s: %v\n", name, err)
			return 2
		}
	}
	st, created, err := r.Start(ctx, script, set)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer %s: %v\n", name, err)
		return 1
	}
	if !created {
		fmt.Fprintf(stderr, "ft-resumer: picking up the chain in %s (%s, %d jobs); its settings are kept\n", abs, st.Status, len(st.Jobs))
	}
	if name == "submit" {
		if _, err := r.Reconcile(ctx); err != nil {
			fmt.Fprintf(stderr, "ft-resumer submit: %v\n", err)
			return 1
		}
		return 0
	}
	return follow(ctx, r, *poll, stdout, stderr)
}

// follow reconciles the chain with Slurm every poll until it has ended and
// no job of it is left in Slurm, printing each job's judgement once.
func follow(ctx context.Context, r *resumer.Resumer, poll time.Duration, stdout, stderr io.Writer) int {
	printed := map[string]bool{}
	for {
		st, err := r.Reconcile(ctx)
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(stderr, "ft-resumer: %v (retrying)\n", err)
		}
		if st != nil {
			for _, j := range st.Jobs {
				if j.Outcome != "" && !printed[j.ID] {
					printed[j.ID] = true
					fmt.Fprintf(stdout, "job %s: %s -> %s (%s; decided by %s)\n", j.ID, j.Outcome, j.Decision, j.Reason, j.DecidedBy)
				}
			}
			if st.Status != resumer.Active && allEnded(st) {
				if st.Status == resumer.Done {
					fmt.Fprintf(stdout, "chain done: training finished (%d jobs trained)\n", trained(st))
					return 0
				}
				fmt.Fprintf(stdout, "chain stopped: %s\n", st.StopReason)
				return 1
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(stderr, "ft-resumer: interrupted; the chain goes on in Slurm (run ft-resumer again to follow it)")
			return 130
		case <-time.After(poll):
		}
	}
}

// trained counts the chain's jobs that ran the training (not relocated,
// skipped, or removed by Slurm before they began).
func trained(st *resumer.State) int {
	n := 0
	for _, j := range st.Jobs {
		if j.Outcome.Ran() {
			n++
		}
	}
	return n
}

// parseRate reads --max-submit-rate: "N/D" (N jobs in any window D) or "0".
func parseRate(s string) (int, time.Duration, error) {
	if strings.TrimSpace(s) == "0" {
		return 0, 0, nil
	}
	n, d, ok := strings.Cut(s, "/")
	max, err := strconv.Atoi(strings.TrimSpace(n))
	if !ok || err != nil || max < 1 {
		return 0, 0, fmt.Errorf("%q: want N/DURATION with N >= 1 (e.g. 30/10m), or 0 for no limit", s)
	}
	win, err := time.ParseDuration(strings.TrimSpace(d))
	if err != nil || win <= 0 {
		return 0, 0, fmt.Errorf("%q: want N/DURATION with a positive duration (e.g. 30/10m), or 0 for no limit", s)
	}
	return max, win, nil
}

func allEnded(st *resumer.State) bool {
	for _, j := range st.Jobs {
		if j.Slurm == nil || !j.Slurm.Terminal() {
			return false
		}
	}
	return true
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flagSet("status", stderr)
	dir := chainDirFlag(fs)
	asJSON := fs.Bool("json", false, "print JSON (for tools) instead of a table")
	noUpdate := fs.Bool("no-update", false, "do not ask Slurm first (show chain.json as it is)")
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "ft-resumer status: --chain-dir is required")
		return 2
	}
	abs, _ := filepath.Abs(*dir)
	var st *resumer.State
	var err error
	if *noUpdate {
		st, err = resumer.LoadState(abs)
	} else {
		st, err = newResumer(abs, stderr).Reconcile(ctx)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer status: %v\n", err)
		if st == nil {
			return 1
		}
	}
	v := st.View(time.Now())
	if *asJSON {
		err = v.WriteJSON(stdout)
	} else {
		err = v.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer status: %v\n", err)
		return 1
	}
	return 0
}

func cmdCancel(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flagSet("cancel", stderr)
	dir := chainDirFlag(fs)
	if code, done := parse(fs, args, stdout); done {
		return code
	}
	if *dir == "" {
		fmt.Fprintln(stderr, "ft-resumer cancel: --chain-dir is required")
		return 2
	}
	abs, _ := filepath.Abs(*dir)
	if _, err := newResumer(abs, stderr).Cancel(ctx, "cancelled with ft-resumer cancel"); err != nil {
		fmt.Fprintf(stderr, "ft-resumer cancel: %v\n", err)
		return 1
	}
	return 0
}

// cmdStep runs a decision step inside a job (the wrapper calls it).
func cmdStep(ctx context.Context, args []string, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "begin" && args[0] != "end" && args[0] != "run") {
		fmt.Fprintln(stderr, "Usage: ft-resumer step begin|end|run --chain-dir DIR [--rc N] [-- JOB SCRIPT...]")
		return 2
	}
	fs := flagSet("step "+args[0], stderr)
	dir := chainDirFlag(fs)
	rc := fs.Int("rc", 0, "end: the job script's exit status")
	ended := fs.String("script-ended", "", "end: when the job script exited, in Unix seconds ($EPOCHREALTIME); default now")
	begin := fs.Bool("begin", false, "run: be the begin step first (the generated wrapper's way: one process fewer before the script)")
	end := fs.Bool("end", false, "run: be the end step after the script, writing the job's status to jobs/<id>/"+resumer.EndStatusFile+" (the generated wrapper's way: one process fewer after the script)")
	if code, done := parse(fs, args[1:], stderr); done {
		return code
	}
	restart := 0
	if v := os.Getenv("SLURM_RESTART_COUNT"); v != "" { // absent on a first run
		restart, _ = strconv.Atoi(v)
	}
	if args[0] == "run" {
		return stepRun(ctx, *dir, restart, *begin, *end, fs.Args(), stderr)
	}
	id := os.Getenv("SLURM_JOB_ID")
	if *dir == "" || id == "" {
		fmt.Fprintln(stderr, "ft-resumer step: needs --chain-dir and SLURM_JOB_ID (run it inside the job)")
		if args[0] == "end" {
			return *rc
		}
		return 2
	}
	if args[0] == "end" {
		var at time.Time
		if f, err := strconv.ParseFloat(strings.Replace(*ended, ",", ".", 1), 64); err == nil && f > 0 {
			at = time.Unix(0, int64(f*1e9))
		}
		code, _ := endStep(ctx, *dir, id, *rc, at, stderr)
		return code
	}
	// A decision step must not hang the job: bound it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r := newResumer(*dir, stderr)
	res, err := r.Begin(ctx, id, os.Getenv("SLURM_JOB_NODELIST"), restart)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer step begin: %v\n", err)
		return 1
	}
	if !res.Run {
		fmt.Fprintf(stderr, "ft-resumer: job %s does not run: %s\n", id, res.Reason)
		if res.Continue {
			return resumer.ExitSkipContinue
		}
		return resumer.ExitSkip
	}
	if _, err := writeEnvSh(*dir, id, res.Env); err != nil {
		fmt.Fprintf(stderr, "ft-resumer step begin: %v\n", err)
	}
	return 0
}

// jobDir is job id's folder in the chain dir: $FT_RESUMER_JOB_DIR, which the
// generated wrapper exports, else jobs/<id>.
func jobDir(dir, id string) string {
	if d := os.Getenv("FT_RESUMER_JOB_DIR"); d != "" {
		return d
	}
	return filepath.Join(dir, resumer.JobsDir, id)
}

// writeEnvSh writes what the begin step exports to the job script into
// jobs/<id>/env.sh (the record; older wrappers source it) and returns it as
// KEY=VALUE pairs.
func writeEnvSh(dir, id string, env map[string]string) ([]string, error) {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	kv := make([]string, 0, len(keys))
	for _, k := range keys {
		fmt.Fprintf(&b, "export %s=%q\n", k, env[k])
		kv = append(kv, k+"="+env[k])
	}
	// A record for this run only (a crash of the node ends the run): no
	// fsync on the path to the script.
	return kv, atomicfile.WriteVolatile(filepath.Join(jobDir(dir, id), "env.sh"), []byte(b.String()), 0o644)
}
