package resumer

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// WarningFile is the record, in a job's directory, of the warning signals
// its batch shell received: one line "SIG <unix seconds>" each, written by
// `ft-resumer step run` (the generated wrapper's signal forwarder).
const WarningFile = "warning_signals"

// readWarning returns the first warning signal recorded for the job in
// dir ("" none).
func readWarning(dir string) string {
	f, err := os.Open(filepath.Join(dir, WarningFile))
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if sc.Scan() {
		sig, _, _ := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		switch sig {
		case "USR1", "USR2", "TERM":
			return sig
		}
	}
	return ""
}

// maxProgressEntries bounds the files a --progress-path directory walk
// looks at, so that judging never crawls a huge tree.
const maxProgressEntries = 10000

// progressEvidence gathers the evidence that job advanced: its verdicts'
// progress records, and the files under the chain's --progress-path
// modified between the job's begin step and the next job's (a later job's
// writes are not this job's progress).
func progressEvidence(st *State, job *ChainJob, vs []verdict.Verdict) Evidence {
	var e Evidence
	var steps, ckpts, hbs int64
	nodes := 0
	for _, v := range vs {
		if v.Progress == nil {
			continue
		}
		e.Known, e.Reported = true, true
		if it := v.Progress.LastIteration; it != nil && (e.LastIteration == nil || *it > *e.LastIteration) {
			e.LastIteration = it
		}
		nodes++
		steps += v.Progress.Steps
		ckpts += v.Progress.Checkpoints
		hbs += v.Progress.Heartbeats
		if v.Progress.Advanced() {
			e.Advanced = true
		}
	}
	var notes []string
	if nodes > 0 {
		notes = append(notes, fmt.Sprintf("%d steps, %d checkpoints, %d heartbeats reported on %d node(s)", steps, ckpts, hbs, nodes))
	}
	if len(st.Settings.ProgressPaths) > 0 {
		e.Known = true
		from, until := job.Began, nextBegan(st, job)
		if path, at, ok := newestIn(st.Settings.ProgressPaths, from, until); ok {
			e.Advanced = true
			notes = append(notes, fmt.Sprintf("%s written at %s", path, at.UTC().Format(time.RFC3339)))
		} else {
			notes = append(notes, "no file under --progress-path "+strings.Join(st.Settings.ProgressPaths, ",")+" changed during the job")
		}
	}
	e.Detail = strings.Join(notes, "; ")
	return e
}

// nextBegan is when the first job after job began (zero: none yet).
func nextBegan(st *State, job *ChainJob) time.Time {
	seen := false
	for _, j := range st.Jobs {
		if j == job {
			seen = true
		} else if seen && !j.Began.IsZero() {
			return j.Began
		}
	}
	return time.Time{}
}

// newestIn finds a file under paths (files, directories walked to a bound,
// or globs) modified after from and, unless until is zero, before it.
func newestIn(paths []string, from, until time.Time) (string, time.Time, bool) {
	if from.IsZero() {
		return "", time.Time{}, false
	}
	in := func(t time.Time) bool { return t.After(from) && (until.IsZero() || t.Before(until)) }
	seen := 0
	for _, p := range paths {
		matches, err := filepath.Glob(p)
		if err != nil || len(matches) == 0 {
			matches = []string{p}
		}
		for _, m := range matches {
			var found string
			var at time.Time
			_ = filepath.WalkDir(m, func(path string, d fs.DirEntry, err error) error {
				if err != nil {
					return nil
				}
				if seen++; seen > maxProgressEntries {
					return errors.New("enough")
				}
				if d.IsDir() {
					return nil
				}
				info, err := d.Info()
				if err == nil && in(info.ModTime()) {
					found, at = path, info.ModTime()
					return errors.New("found")
				}
				return nil
			})
			if found != "" {
				return found, at, true
			}
		}
	}
	return "", time.Time{}, false
}

// summarize records what job's verdicts say beyond their kind: rank
// failures, quarantined nodes and spare swaps (deduplicated across the
// nodes' verdicts).
func summarize(job *ChainJob, vs []verdict.Verdict) {
	job.Failures, job.Quarantined, job.Swaps = nil, nil, nil
	seenQ := map[string]bool{}
	type lease struct {
		node string
		seq  int
	}
	seenL := map[lease]bool{}
	var lost []ledger.Record
	var swaps []ledger.Record
	for _, v := range vs {
		for _, f := range v.RankFailures {
			job.Failures = append(job.Failures, RankFailureSummary{Host: v.Hostname, Rank: f.Rank, ExitCode: f.ExitCode,
				Signal: f.Signal, Kind: f.Kind, Steps: f.Steps, Iteration: f.Iteration, Cause: f.Cause})
		}
		for _, q := range v.Quarantined {
			host := q.Host
			if host == "" {
				host = q.Node
			}
			if !seenQ[host] {
				seenQ[host] = true
				job.Quarantined = append(job.Quarantined, QuarantineSummary{Host: host, Evidence: string(q.Evidence), Detail: q.Detail})
			}
		}
		for _, r := range v.Ledger {
			k := lease{r.Node, r.Seq}
			if seenL[k] || r.End == nil {
				continue
			}
			seenL[k] = true
			switch {
			case r.Role == ledger.Spare && r.Reason == ledger.Swap:
				swaps = append(swaps, r)
			case r.Role == ledger.Active && r.Reason == ledger.NodeFailure:
				lost = append(lost, r)
			}
		}
	}
	for _, s := range swaps {
		sw := SwapSummary{Spare: hostOf(s), GroupRank: -1, At: *s.End}
		// The lost node it replaced: the Active lease that ended for a
		// node failure most recently before the swap.
		var best *ledger.Record
		for i := range lost {
			if l := &lost[i]; !l.End.After(*s.End) && (best == nil || l.End.After(*best.End)) {
				best = l
			}
		}
		if best != nil {
			sw.Replaced, sw.GroupRank = hostOf(*best), best.GroupRank
		}
		job.Swaps = append(job.Swaps, sw)
	}
}

func hostOf(r ledger.Record) string {
	if r.Host != "" {
		return r.Host
	}
	return r.Node
}

// sameFailure reports whether a and b are the same rank failure: the same
// rank, kind, exit code and signal, at the same point of the training
// (iterations within tol when both report one, else steps within tol). A
// failure with no position (the rank reported no step) matches nothing:
// without it, two crashes of an uninstrumented rank look alike however far
// apart they happened.
func sameFailure(a, b RankFailureSummary, tol int64) bool {
	if a.Rank != b.Rank || a.Rank < 0 || a.Kind != b.Kind || a.ExitCode != b.ExitCode || a.Signal != b.Signal {
		return false
	}
	if a.Cause != nil && b.Cause != nil {
		// The same exception at the same place is the same failure,
		// whatever step it came at (a data-dependent bug).
		return a.Cause.Same(*b.Cause)
	}
	if a.Iteration != nil && b.Iteration != nil {
		return abs(*a.Iteration-*b.Iteration) <= tol
	}
	if a.Steps == 0 || b.Steps == 0 {
		return false
	}
	return abs(a.Steps-b.Steps) <= tol
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

func (f RankFailureSummary) String() string {
	how := fmt.Sprintf("exited with code %d", f.ExitCode)
	if f.Signal != "" {
		how = "was killed by " + f.Signal
	}
	if f.Kind == verdict.FailureHang {
		how = "hung"
	}
	at := fmt.Sprintf("after %d steps", f.Steps)
	if f.Iteration != nil {
		at = fmt.Sprintf("at iteration %d", *f.Iteration)
	}
	if f.Cause != nil {
		return fmt.Sprintf("rank %d %s %s: %s", f.Rank, how, at, f.Cause)
	}
	return fmt.Sprintf("rank %d %s %s", f.Rank, how, at)
}

// deterministic looks for the failure that ended job (its newest rank
// failure) among the rank failures of the consecutive failed jobs ending
// with job. It returns a description of the evidence when the chain should
// stop: the same failure at least DeterministicAfter times, in at least
// two jobs.
func deterministic(st *State, job *ChainJob) (string, bool) {
	need := st.Settings.DeterministicAfter
	if need <= 0 || len(job.Failures) == 0 {
		return "", false
	}
	cand := job.Failures[len(job.Failures)-1]
	var run []*ChainJob
	for i := len(st.Jobs) - 1; i >= 0; i-- {
		j := st.Jobs[i]
		if j.Outcome == "" || !j.Outcome.Ran() {
			continue
		}
		if j.Outcome != Failure {
			break
		}
		run = append(run, j)
	}
	n, jobs := 0, []string{}
	for i := len(run) - 1; i >= 0; i-- {
		hit := false
		for _, f := range run[i].Failures {
			if sameFailure(cand, f, int64(st.Settings.DeterministicSteps)) {
				n++
				hit = true
			}
		}
		if hit {
			jobs = append(jobs, run[i].ID)
		}
	}
	if n < need || len(jobs) < 2 {
		return "", false
	}
	return fmt.Sprintf("the same failure %d times in %d consecutive jobs (%s): %s on %s; fix the cause, then run ft-resumer again",
		n, len(jobs), strings.Join(jobs, ","), cand, cand.Host), true
}
