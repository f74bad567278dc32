// Command ft-launcher is a fault-tolerant, torchrun-compatible launcher for
// distributed PyTorch: one process per node spawns the ranks, monitors them,
// and restarts every rank of every node when one fails or hangs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/ftlauncher/ft-launcher/cmd/ft-launcher/internal/earlysig"
	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/internal/version"
)

func main() {
	// Re-executed as the fence watchdog beside a multi-node launcher
	// (package fence): nothing of the launcher runs then.
	if os.Getenv(fence.ModeEnv) == "1" {
		os.Exit(fence.Serve(os.Stdin, os.Stdout, os.Stderr))
	}
	// Terminating signals have been caught since package initialisation
	// (earlysig); run decides what becomes of them.
	os.Exit(run(os.Args[1:], earlysig.Take(), os.Stdout, os.Stderr))
}

// parsePatience is how long a stuck configuration parse (a FIFO as
// --ft-cfg-path) may hold a signal before the signal takes its default
// action; a parse takes about a millisecond.
const parsePatience = 500 * time.Millisecond

// run is the whole command: parse and validate the launch line (a usage
// error exits 2 before anything is started), then launch. Signals caught
// by early before the handled set was known are honoured then.
func run(args []string, early *earlysig.Catcher, stdout, stderr io.Writer) int {
	var cfg *configs.Config
	var err error
	early.During(func() { cfg, err = configs.Parse(args, os.Getenv, launcherNetwork(os.Getenv)) }, parsePatience)
	if err != nil {
		switch {
		case errors.Is(err, configs.ErrHelp):
			fmt.Fprint(stdout, configs.Usage())
			return configs.ExitSuccess
		case errors.Is(err, configs.ErrVersion):
			fmt.Fprintln(stdout, version.String("ft-launcher"))
			return configs.ExitSuccess
		}
		fmt.Fprintf(stderr, "ft-launcher: %v\n", err)
		fmt.Fprintln(stderr, "Run 'ft-launcher --help' for usage.")
		return configs.ExitUsage
	}
	logger := newLogger(stderr, cfg.FT.LogLevel)
	for _, w := range cfg.Warnings {
		logger.Warn(w)
	}
	if cfg.PrintConfig {
		fmt.Fprint(stdout, cfg.Effective())
		if cfg.PrewarmAuto && !cfg.NoPython {
			fmt.Fprint(stdout, describePrewarmAuto(cfg))
		}
		return configs.ExitSuccess
	}

	// From here on exactly --signals-to-handle is handled; one that came
	// earlier is delivered now (torchrun installs its handlers only once
	// workers start, so an early SIGTERM kills it without cleanup).
	handled := slices.Clone(cfg.SignalsToHandle)
	for _, w := range cfg.WalltimeSignals { // forwarded to the ranks, never a failure
		if !slices.Contains(handled, w) {
			handled = append(handled, w)
		}
	}
	sigs := early.Handle(handled)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	return launch(ctx, cfg, logger, sigs, stderr)
}

// newLogger returns the launcher's structured logger. level is nvrx's int
// log level (10 DEBUG ... 50 CRITICAL).
func newLogger(w io.Writer, level int) *slog.Logger {
	var l slog.Level
	switch {
	case level <= 10:
		l = slog.LevelDebug
	case level <= 20:
		l = slog.LevelInfo
	case level <= 30:
		l = slog.LevelWarn
	default:
		l = slog.LevelError
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})).With("launcher_pid", os.Getpid())
}
