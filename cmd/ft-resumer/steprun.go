package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// stepRun runs the job script for the wrapper: it takes the chain's
// training claim for this run of the job (refusing, with ExitSkip, while
// another job of the chain trains), runs the script forwarding signals to it
// and recording Slurm's warnings (resumer.JobScript), and submits the
// chain's successor once the script has started.
//
// With begin (the generated wrapper) it is the begin step first, in the
// same process: one process start and one pass over the chain state fewer
// between the predecessor's end and this job's script. With end (the
// generated wrapper) it is also the end step once the script has exited,
// and writes the status it decides to the job's EndStatusFile for the
// wrapper to exit with: one process start fewer between the script's end
// and the successor's start. Without that file (this process was killed)
// the wrapper runs the end step itself.
func stepRun(ctx context.Context, dir string, restart int, begin, end bool, argv []string, stderr io.Writer) int {
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "Usage: ft-resumer step run --chain-dir DIR -- JOB SCRIPT [ARGS...]")
		return 2
	}
	rc := runJobScript(ctx, dir, restart, begin, argv, stderr)
	id := os.Getenv("SLURM_JOB_ID")
	if !end || dir == "" || id == "" {
		return rc
	}
	code, err := endStep(ctx, dir, id, rc, time.Now(), stderr)
	if err != nil {
		// No status file: the wrapper's own end step tries again.
		return code
	}
	// Read by the wrapper at once: no fsync on the path to the job's end.
	if err := atomicfile.WriteVolatile(filepath.Join(jobDir(dir, id), resumer.EndStatusFile), []byte(strconv.Itoa(code)+"\n"), 0o644); err != nil {
		fmt.Fprintf(stderr, "ft-resumer step run: %v (the wrapper runs the end step again)\n", err)
	}
	return code
}

// endStep is the decision step after job id's script exited with rc at
// ended: it returns the job's exit status (resumer.End). A signal to this
// process does not cut it short: the job's status depends on it, and it is
// bounded.
func endStep(ctx context.Context, dir, id string, rc int, ended time.Time, stderr io.Writer) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	code, err := newResumer(dir, stderr).End(ctx, id, rc, ended)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer step end: %v\n", err)
	}
	return code, err
}

// runJobScript is step run up to the script's exit: the begin step (with
// begin), the training claim, the script and the successor's submission.
// It returns the script's status, or ExitSkip when the script did not run.
func runJobScript(ctx context.Context, dir string, restart int, begin bool, argv []string, stderr io.Writer) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, resumer.ForwardedSignals...)
	defer signal.Stop(sigs)
	js := resumer.JobScript{Argv: argv, JobDir: os.Getenv("FT_RESUMER_JOB_DIR"), Log: stderr, RepeatWindow: 2 * time.Second}
	if id := os.Getenv("SLURM_JOB_ID"); dir != "" && id != "" {
		r := newResumer(dir, stderr)
		if begin {
			bctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			res, err := r.Begin(bctx, id, os.Getenv("SLURM_JOB_NODELIST"), restart)
			cancel()
			switch {
			case err != nil:
				fmt.Fprintf(stderr, "ft-resumer step run: begin: %v; running the job anyway\n", err)
			case !res.Run:
				fmt.Fprintf(stderr, "ft-resumer: job %s does not run: %s\n", id, res.Reason)
				return resumer.ExitSkip
			default:
				env, err := writeEnvSh(dir, id, res.Env)
				if err != nil {
					fmt.Fprintf(stderr, "ft-resumer step run: %v\n", err)
				}
				js.Env = env
			}
		}
		claim, err := r.ClaimTraining(ctx, id, restart, os.Getenv("SLURMD_NODENAME"), resumer.DefaultClaimWait)
		var ce *resumer.ClaimedError
		switch {
		case errors.As(err, &ce):
			fmt.Fprintf(stderr, "ft-resumer: job %s: %v\n", id, ce)
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			if err := r.Refuse(rctx, id, restart, ce.Error()); err != nil {
				fmt.Fprintf(stderr, "ft-resumer step run: %v\n", err)
			}
			return resumer.ExitSkip
		case ctx.Err() != nil:
			fmt.Fprintf(stderr, "ft-resumer step run: stopped while waiting for the training claim: %v\n", err)
			return 143
		case err != nil:
			// The same failure policy as the begin step's: a chain
			// directory that cannot be written does not stop a training.
			fmt.Fprintf(stderr, "ft-resumer step run: %v; running the job anyway\n", err)
		default:
			defer claim.Release()
		}
		// The successor is submitted beside the starting script, off the
		// path to its first step; Run returns only once it is submitted.
		js.AfterStart = func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
			defer cancel()
			if _, err := r.SubmitSuccessor(sctx, id, restart); err != nil {
				fmt.Fprintf(stderr, "ft-resumer step run: successor: %v (a follower, ft-resumer run or status, submits one when none is pending)\n", err)
			}
		}
	}
	// A TERM is forwarded, not a reason to stop waiting: the script and
	// its steps decide when they are done.
	rc, err := js.Run(context.WithoutCancel(ctx), sigs)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer step run: %v\n", err)
	}
	return rc
}
