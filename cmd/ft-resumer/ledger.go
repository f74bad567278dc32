package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/ledger/etcdstore"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// ledgerUsage documents `ft-resumer ledger` and `ft-resumer watch`.
const ledgerUsage = `Usage: ft-resumer ledger --rdzv-endpoint HOST:PORT[,...] --rdzv-id RUN_ID [--json]
       ft-resumer ledger --verdict FILE [--verdict FILE ...] [--json]
       ft-resumer watch  --rdzv-endpoint HOST:PORT[,...] --rdzv-id RUN_ID [--json]

ledger prints a job's ledger: every lease of a node as Active (with its
group rank), Spare or Filler, when it began and ended, and why it ended
(NodeFailure, Swap, ReclaimedBySpare, Quarantined, Excluded, Stopped,
JobSucceeded, JobFailed, ...). It reads the job's etcd (the job's
--rdzv-endpoint and --rdzv-id) while the job runs or while its etcd keeps
the records; once the job is over and its embedded etcd is gone, read the
nodes' verdict files instead (each holds its node's leases). watch prints
the ledger and then every change as it happens, until the job closes or
ft-resumer is interrupted. --json prints one JSON array (ledger) or one
JSON object per line (watch) for tools.
`

type ledgerFlags struct {
	endpoints, runID, prefix string
	verdicts                 []string
	json                     bool
	timeout                  time.Duration
}

func parseLedgerFlags(name string, args []string, stderr io.Writer) (ledgerFlags, int) {
	var f ledgerFlags
	fs := pflag.NewFlagSet("ft-resumer "+name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.endpoints, "rdzv-endpoint", "", "the job's etcd endpoints, host:port, comma-separated")
	fs.StringVar(&f.runID, "rdzv-id", "", "the job's run id (--rdzv-id of its launchers)")
	fs.StringVar(&f.prefix, "key-prefix", "/ft-launcher/", "the rendezvous key prefix")
	fs.StringArrayVar(&f.verdicts, "verdict", nil, "read the ledger from this verdict file (repeatable)")
	fs.BoolVar(&f.json, "json", false, "JSON for tools instead of a table")
	fs.DurationVar(&f.timeout, "timeout", defaultEtcdTimeout, "bound on connecting to etcd and reading")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return f, -1
		}
		fmt.Fprintf(stderr, "ft-resumer %s: %v\n%s", name, err, ledgerUsage)
		return f, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "ft-resumer %s: unexpected argument %q\n", name, fs.Arg(0))
		return f, 2
	}
	fromEtcd := f.endpoints != "" || f.runID != ""
	switch {
	case len(f.verdicts) > 0 && fromEtcd:
		fmt.Fprintf(stderr, "ft-resumer %s: give either --verdict files or --rdzv-endpoint and --rdzv-id, not both\n", name)
		return f, 2
	case len(f.verdicts) > 0 && name == "watch":
		fmt.Fprintln(stderr, "ft-resumer watch: follows a running job's etcd; --verdict is for ft-resumer ledger")
		return f, 2
	case len(f.verdicts) == 0 && (f.endpoints == "" || f.runID == ""):
		fmt.Fprintf(stderr, "ft-resumer %s: --rdzv-endpoint and --rdzv-id are required (or --verdict FILE)\n", name)
		return f, 2
	case f.timeout <= 0:
		fmt.Fprintf(stderr, "ft-resumer %s: --timeout must be positive\n", name)
		return f, 2
	}
	return f, 0
}

// cmdLedger prints a job's ledger once (follow false) or follows it.
func cmdLedger(ctx context.Context, name string, args []string, stdout, stderr io.Writer) int {
	f, code := parseLedgerFlags(name, args, stderr)
	if code == -1 {
		fmt.Fprint(stdout, ledgerUsage)
		return 0
	}
	if code != 0 {
		return code
	}
	if len(f.verdicts) > 0 {
		recs, err := ledgerFromVerdicts(f.verdicts)
		if err != nil {
			fmt.Fprintf(stderr, "ft-resumer ledger: %v\n", err)
			return 1
		}
		return printLedger(stdout, stderr, recs, f.json)
	}
	cli, err := dialEtcd(f)
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer %s: %v\n", name, err)
		return 1
	}
	defer cli.Close()
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	st, gen, err := etcdstore.Discover(rctx, cli, f.prefix, f.runID)
	if err != nil {
		cancel()
		fmt.Fprintf(stderr, "ft-resumer %s: etcd at %s: %v\n", name, f.endpoints, err)
		return 1
	}
	recs, rev, err := st.List(rctx)
	cancel()
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer %s: etcd at %s: %v\n", name, f.endpoints, err)
		return 1
	}
	if name == "ledger" {
		return printLedger(stdout, stderr, recs, f.json)
	}
	return followLedger(ctx, cli, st, f, gen, recs, rev, stdout, stderr)
}

// defaultEtcdTimeout bounds connecting to a job's etcd and reading it.
const defaultEtcdTimeout = 10 * time.Second

// etcdLedger reads a job's ledger from its etcd once.
func etcdLedger(ctx context.Context, f ledgerFlags) ([]ledger.Record, error) {
	cli, err := dialEtcd(f)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	rctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	st, _, err := etcdstore.Discover(rctx, cli, f.prefix, f.runID)
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", f.endpoints, err)
	}
	recs, _, err := st.List(rctx)
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %w", f.endpoints, err)
	}
	return recs, nil
}

func dialEtcd(f ledgerFlags) (*clientv3.Client, error) {
	var eps []string
	for _, e := range strings.Split(f.endpoints, ",") {
		if e = strings.TrimSpace(e); e != "" {
			if !strings.Contains(e, "://") {
				e = "http://" + e
			}
			eps = append(eps, e)
		}
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("--rdzv-endpoint %q names no endpoint", f.endpoints)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: f.timeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("connect to etcd at %s: %w", f.endpoints, err)
	}
	return cli, nil
}

// ledgerFromVerdicts merges the leases recorded in verdict files.
func ledgerFromVerdicts(paths []string) ([]ledger.Record, error) {
	var all []ledger.Record
	for _, p := range paths {
		v, err := verdict.Read(p)
		if err != nil {
			return nil, err
		}
		all = append(all, v.Ledger...)
	}
	return ledger.Merge(all), nil
}

func printLedger(stdout, stderr io.Writer, recs []ledger.Record, asJSON bool) int {
	var err error
	if asJSON {
		err = ledger.WriteJSON(stdout, recs)
	} else {
		err = ledger.WriteTable(stdout, recs)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ft-resumer ledger: %v\n", err)
		return 1
	}
	return 0
}

// followLedger prints the current records, then each change, until the
// job's close record appears or ctx ends.
func followLedger(ctx context.Context, cli *clientv3.Client, st *etcdstore.Store, f ledgerFlags, gen int,
	recs []ledger.Record, rev int64, stdout, stderr io.Writer) int {
	emit := func(r ledger.Record) {
		if f.json {
			_ = ledger.WriteJSONLine(stdout, r)
			return
		}
		fmt.Fprintln(stdout, ledger.FormatLine(r))
	}
	for _, r := range recs {
		emit(r)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	closedKey := fmt.Sprintf("%s%s/g%d/ctl/closed", strings.TrimSuffix(f.prefix, "/")+"/", f.runID, gen)
	go func() {
		// The job's close record ends the watch (the last leases are
		// written just before each launcher exits: give them a moment).
		for wr := range cli.Watch(wctx, closedKey, clientv3.WithRev(rev+1), clientv3.WithFilterDelete()) {
			if len(wr.Events) > 0 {
				time.Sleep(2 * time.Second)
				cancel()
				return
			}
		}
	}()
	if resp, err := cli.Get(wctx, closedKey); err == nil && len(resp.Kvs) > 0 {
		return 0 // already over: what was printed is the whole ledger
	}
	if err := st.Watch(wctx, rev, emit); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(stderr, "ft-resumer watch: %v\n", err)
		return 1
	}
	return 0
}
