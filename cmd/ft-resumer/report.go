package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/ftlauncher/ft-launcher/internal/atomicfile"
	"github.com/ftlauncher/ft-launcher/report"
)

// reportUsage documents `ft-resumer report`.
const reportUsage = `Usage: ft-resumer report [--event-log FILE]... [--verdict FILE]... [--chain-dir DIR]
                        [--appwrapper FILE] [--rdzv-endpoint HOST:PORT --rdzv-id RUN_ID]
                        [-o report.html] [--json]

Turns a run's records into a timeline and a goodput account: where the
wall time went, split into productive training and the badput of each
fault (detection, stop, rendezvous, start-up until the first heartbeat,
steps recomputed since the last checkpoint). The phases add up to the wall
time. Give every node's event log (--event-log of each launcher) and
verdict, or a Slurm chain's directory (its jobs' verdicts are read from
it; add the jobs' event logs for the ranks' detail). The ledger comes from
the event logs and verdicts, or from the job's etcd while it keeps the
records (--rdzv-endpoint, --rdzv-id). --appwrapper adds an AppWrapper's
status (kubectl get appwrapper NAME -o yaml).

Writes one self-contained HTML page (-o, default report.html; it loads
nothing from the network) and, with --json, the same numbers as JSON on
standard output (then HTML only when -o is given). docs/report.md explains
every number.

Flags:
`

func cmdReport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("ft-resumer report", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	var in report.Inputs
	fs.StringArrayVar(&in.EventLogs, "event-log", nil, "a launcher's JSON-lines event log (repeatable: one per node)")
	fs.StringArrayVar(&in.Verdicts, "verdict", nil, "a launcher's verdict file (repeatable)")
	fs.StringVar(&in.ChainDir, "chain-dir", "", "a Slurm chain's directory (chain.json and jobs/<id>/verdict-*.json)")
	fs.StringVar(&in.AppWrapper, "appwrapper", "", "an AppWrapper object, YAML or JSON, for its status")
	endpoints := fs.String("rdzv-endpoint", "", "read the ledger from the job's etcd: its endpoints, host:port, comma-separated")
	runID := fs.String("rdzv-id", "", "with --rdzv-endpoint: the job's run id")
	prefix := fs.String("key-prefix", "/ft-launcher/", "with --rdzv-endpoint: the rendezvous key prefix")
	out := fs.StringP("output", "o", "", "the HTML file to write (default report.html, none with --json)")
	asJSON := fs.Bool("json", false, "print the report as JSON on standard output")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(stdout, reportUsage+fs.FlagUsages())
			return 0
		}
		fmt.Fprintf(stderr, "ft-resumer report: %v\n%s%s", err, reportUsage, fs.FlagUsages())
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "ft-resumer report: unexpected argument %q (files are given with --event-log and --verdict)\n", fs.Arg(0))
		return 2
	case len(in.EventLogs) == 0 && len(in.Verdicts) == 0 && in.ChainDir == "":
		fmt.Fprintln(stderr, "ft-resumer report: no records: give --event-log, --verdict or --chain-dir")
		return 2
	case (*endpoints == "") != (*runID == ""):
		fmt.Fprintln(stderr, "ft-resumer report: --rdzv-endpoint and --rdzv-id go together")
		return 2
	}
	if *out == "" && !*asJSON {
		*out = "report.html"
	}
	if *endpoints != "" {
		recs, err := etcdLedger(ctx, ledgerFlags{endpoints: *endpoints, runID: *runID, prefix: *prefix, timeout: defaultEtcdTimeout})
		if err != nil {
			fmt.Fprintf(stderr, "ft-resumer report: %v\n", err)
			return 1
		}
		in.Ledger = recs
	}
	rep, err := report.Build(in)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer report: %v\n", err)
		return 1
	}
	for _, w := range rep.Warnings {
		fmt.Fprintf(stderr, "ft-resumer report: warning: %s\n", w)
	}
	if *asJSON {
		if err := rep.WriteJSON(stdout); err != nil {
			fmt.Fprintf(stderr, "ft-resumer report: %v\n", err)
			return 1
		}
	}
	if *out != "" {
		var b bytes.Buffer
		if err := rep.WriteHTML(&b); err != nil {
			fmt.Fprintf(stderr, "ft-resumer report: %v\n", err)
			return 1
		}
		if err := atomicfile.Write(*out, b.Bytes(), 0o644); err != nil {
			fmt.Fprintf(stderr, "ft-resumer report: %v\n", err)
			return 1
		}
		if !*asJSON {
			fmt.Fprintf(stdout, "report written to %s: wall %.1fs, goodput %.1f%%, %d restart(s)\n", *out, rep.WallS, rep.Goodput*100, len(rep.Restarts))
		}
	}
	return 0
}
