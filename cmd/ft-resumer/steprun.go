package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"time"

	"github.com/ftlauncher/ft-launcher/slurm/resumer"
)

// stepRun runs the job script for the wrapper, forwarding signals to it and
// recording Slurm's warnings (resumer.JobScript).
func stepRun(ctx context.Context, argv []string, stderr io.Writer) int {
	if len(argv) == 0 {
		fmt.Fprintln(stderr, "Usage: ft-resumer step run --chain-dir DIR -- JOB SCRIPT [ARGS...]")
		return 2
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, resumer.ForwardedSignals...)
	defer signal.Stop(sigs)
	js := resumer.JobScript{Argv: argv, JobDir: os.Getenv("FT_RESUMER_JOB_DIR"), Log: stderr, RepeatWindow: 2 * time.Second}
	// A TERM is forwarded, not a reason to stop waiting: the script and
	// its steps decide when they are done.
	rc, err := js.Run(context.WithoutCancel(ctx), sigs)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer step run: %v\n", err)
	}
	return rc
}
