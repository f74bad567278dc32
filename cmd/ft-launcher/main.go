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
	"os/signal"

	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/internal/version"
	"github.com/ftlauncher/ft-launcher/rendezvous"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command: parse and validate the launch line (a usage
// error exits 2 before anything is started), then launch.
func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := configs.Parse(args, os.Getenv, rendezvous.IsLocalEndpoint)
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
		return configs.ExitSuccess
	}

	// Signals are caught from the start (torchrun installs its handlers only
	// once workers start, so an early SIGTERM kills it without cleanup).
	sigs := make(chan os.Signal, 4)
	handled := make([]os.Signal, 0, len(cfg.SignalsToHandle))
	for _, s := range cfg.SignalsToHandle {
		handled = append(handled, s)
	}
	signal.Notify(sigs, handled...)
	defer signal.Stop(sigs)

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
