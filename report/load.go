package report

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/k8s/api/v1beta2"
	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/slurm/resumer"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// Inputs name a run's records.
type Inputs struct {
	EventLogs []string // JSON-lines event logs (--event-log of each launcher)
	Verdicts  []string // verdict files
	// ChainDir is a Slurm chain's directory (chain.json); its jobs'
	// verdicts under jobs/<id>/ are read too.
	ChainDir string
	// AppWrapper is a file holding an AppWrapper object (YAML or JSON,
	// kubectl get -o yaml), for its status.
	AppWrapper string
	// Ledger is the job's ledger read elsewhere (etcd); the ledger records
	// of the event logs and verdicts are merged with it.
	Ledger []ledger.Record
}

// Event is one event-log record, decoded by eventlog.Decode.
type Event struct {
	File  string
	Line  int
	Kind  string
	TS    time.Time
	Node  string
	RunID string
	Job   string // slurm_job_id, "" outside Slurm
	// Rec is the typed record (eventlog/records.go, components.go), or
	// eventlog.Unknown for a kind eventlog has no record for (a newer
	// launcher's) or a line that does not fit its record.
	Rec eventlog.Record
}

// records is everything loaded, before computation.
type records struct {
	events   []Event
	verdicts []loadedVerdict
	chain    *resumer.State
	aw       *v1beta2.AppWrapper
	ledger   []ledger.Record
	warnings []string
	stacks   map[stacksKey]StacksText // a hang's culprits' stacks files (hangs.go)
}

type loadedVerdict struct {
	file string
	job  string // the chain job it belongs to ("" outside a chain)
	v    verdict.Verdict
}

// load reads and checks every input. Anything that would make a number
// wrong is an error naming the file; what only leaves something out is a
// warning.
func load(in Inputs) (*records, error) {
	rec := &records{ledger: in.Ledger}
	if len(in.EventLogs) == 0 && len(in.Verdicts) == 0 && in.ChainDir == "" {
		return nil, errors.New("no records given: name event logs, verdict files or a Slurm chain directory")
	}
	for _, p := range in.EventLogs {
		evs, warn, err := readEventLog(p)
		if err != nil {
			return nil, err
		}
		rec.warnings = append(rec.warnings, warn...)
		if len(evs) == 0 {
			return nil, fmt.Errorf("event log %s is empty", p)
		}
		rec.events = append(rec.events, evs...)
	}
	for _, p := range in.Verdicts {
		v, err := readVerdict(p)
		if err != nil {
			return nil, err
		}
		rec.verdicts = append(rec.verdicts, loadedVerdict{file: p, v: v})
	}
	if in.ChainDir != "" {
		if err := rec.loadChain(in.ChainDir); err != nil {
			return nil, err
		}
	}
	if in.AppWrapper != "" {
		aw, err := readAppWrapper(in.AppWrapper)
		if err != nil {
			return nil, err
		}
		rec.aw = aw
	}
	if err := rec.checkRuns(); err != nil {
		return nil, err
	}
	sort.SliceStable(rec.events, func(i, j int) bool { return rec.events[i].TS.Before(rec.events[j].TS) })
	for _, e := range rec.events {
		if l, ok := e.Rec.(eventlog.LedgerEvent); ok && l.Record.Node != "" {
			rec.ledger = append(rec.ledger, l.Record)
		}
	}
	for _, lv := range rec.verdicts {
		rec.ledger = append(rec.ledger, lv.v.Ledger...)
	}
	rec.ledger = ledger.Merge(rec.ledger)
	rec.readStacksFiles()
	return rec, nil
}

// readEventLog parses one event log. A line that is not a JSON object (a
// log cut short by a crash or a full disk, or another file) is an error
// naming the file and line: the run's end would be missing from it. A line
// whose fields do not fit its kind's record is kept without them, with a
// warning: only what it would have shown is missing.
func readEventLog(path string) (out []Event, warnings []string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("event log: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64*1024), 16*1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		d, err := eventlog.Decode(line)
		var rerr *eventlog.RecordError
		switch {
		case errors.Is(err, eventlog.ErrNotEvent):
			return nil, nil, fmt.Errorf("event log %s: line %d is not an ft-launcher event (no event kind or ts)", path, n)
		case errors.As(err, &rerr):
			warnings = append(warnings, fmt.Sprintf("event log %s: line %d: %v (its fields are left out)", path, n, err))
		case err != nil:
			what := "is not a JSON object"
			if n == bytes.Count(b, []byte{'\n'})+1 && !bytes.HasSuffix(b, []byte{'\n'}) {
				what = "is cut short (the log is truncated)"
			}
			return nil, nil, fmt.Errorf("event log %s: line %d %s: %v", path, n, what, err)
		}
		out = append(out, Event{File: path, Line: n, Kind: d.Event, TS: d.TS, Node: d.Node, RunID: d.RunID, Job: d.SlurmJobID, Rec: d.Record})
	}
	if err := sc.Err(); err != nil {
		return nil, nil, fmt.Errorf("event log %s: %w", path, err)
	}
	return out, warnings, nil
}

func readVerdict(path string) (verdict.Verdict, error) {
	v, err := verdict.Read(path)
	if err != nil {
		if errors.Is(err, verdict.ErrSchema) {
			return v, fmt.Errorf("verdict %s: %w (this ft-resumer reads %s; use the ft-resumer of the launcher that wrote it)", path, err, verdict.Schema)
		}
		return v, fmt.Errorf("verdict %s: %w", path, err)
	}
	return v, nil
}

// loadChain reads chain.json and the verdicts of its jobs.
func (rec *records) loadChain(dir string) error {
	if filepath.Base(dir) == resumer.StateFile {
		dir = filepath.Dir(dir)
	}
	st, err := resumer.LoadState(dir)
	if err != nil {
		return err
	}
	rec.chain = st
	have := map[string]bool{}
	for _, lv := range rec.verdicts {
		abs, _ := filepath.Abs(lv.file)
		have[abs] = true
	}
	for _, j := range st.Jobs {
		files, _ := filepath.Glob(filepath.Join(dir, resumer.JobsDir, j.ID, "verdict-*.json"))
		for _, vs := range j.Verdicts {
			if vs.File != "" && !filepath.IsAbs(vs.File) {
				files = append(files, filepath.Join(dir, vs.File))
			} else if vs.File != "" {
				files = append(files, vs.File)
			}
		}
		for _, f := range files {
			abs, _ := filepath.Abs(f)
			if have[abs] {
				continue
			}
			if _, err := os.Stat(f); err != nil {
				rec.warnings = append(rec.warnings, fmt.Sprintf("chain job %s: verdict %s: %v", j.ID, f, err))
				continue
			}
			have[abs] = true
			v, err := readVerdict(f)
			if err != nil {
				return err
			}
			rec.verdicts = append(rec.verdicts, loadedVerdict{file: f, job: j.ID, v: v})
		}
	}
	return nil
}

func readAppWrapper(path string) (*v1beta2.AppWrapper, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("appwrapper: %w", err)
	}
	var aw v1beta2.AppWrapper
	if err := yaml.Unmarshal(b, &aw); err != nil {
		return nil, fmt.Errorf("appwrapper %s: %w", path, err)
	}
	if aw.Kind != "AppWrapper" {
		return nil, fmt.Errorf("appwrapper %s: kind %q, want AppWrapper (kubectl get appwrapper NAME -o yaml)", path, aw.Kind)
	}
	return &aw, nil
}

// checkRuns refuses records of different runs mixed: one run id per job
// (per Slurm job in a chain, where each job may be its own run).
func (rec *records) checkRuns() error {
	type first struct{ id, file string }
	seen := map[string]first{} // job → first run id seen
	check := func(job, id, file string) error {
		if id == "" {
			return nil
		}
		if f, ok := seen[job]; ok && f.id != id {
			where := ""
			if job != "" {
				where = " of Slurm job " + job
			}
			return fmt.Errorf("records of two runs mixed%s: %s has run id %q, %s has %q (give the files of one run, or --chain-dir for the jobs of a Slurm chain)",
				where, f.file, f.id, file, id)
		}
		seen[job] = first{id, file}
		return nil
	}
	for _, e := range rec.events {
		job := ""
		if rec.chain != nil {
			job = e.Job // outside a chain, two Slurm jobs are two runs
		}
		if err := check(job, e.RunID, e.File); err != nil {
			return err
		}
	}
	for _, lv := range rec.verdicts {
		if lv.job == "" && rec.chain != nil {
			continue // a verdict given by hand beside a chain: its job is unknown
		}
		if err := check(lv.job, lv.v.RunID, lv.file); err != nil {
			return err
		}
	}
	return nil
}

// shortNode is a rendezvous node id without its /pid: the name the
// launcher's events carry (its --local-addr or host name).
func shortNode(id string) string {
	if i := strings.LastIndexByte(id, '/'); i > 0 {
		return id[:i]
	}
	return id
}
