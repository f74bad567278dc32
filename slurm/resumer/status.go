package resumer

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// StatusView is `ft-resumer status --json`: the chain as a tool reads it.
type StatusView struct {
	Dir                 string          `json:"dir"`
	Status              string          `json:"status"`
	StopReason          string          `json:"stop_reason,omitempty"`
	StopKind            string          `json:"stop_kind,omitempty"`
	ConsecutiveFailures int             `json:"consecutive_failures"`
	FailuresTotal       int             `json:"failures_total"`
	Settings            Settings        `json:"settings"`
	Jobs                []JobView       `json:"jobs"`
	Exclusions          []ExclusionView `json:"exclusions"`
}

// JobView is one job in the status view. Start and End are Slurm's (whole
// seconds). DecisionAfterEndS and SuccessorStartS count from the job's end:
// when its end step ran (the script had just exited), else Slurm's end
// time; the successor starts when its begin step runs.
type JobView struct {
	ID                string           `json:"id"`
	SubmittedBy       string           `json:"submitted_by"`
	Nodes             []string         `json:"nodes"`
	SlurmState        string           `json:"slurm_state"`
	ExitCode          string           `json:"exit_code,omitempty"`
	Outcome           Outcome          `json:"outcome"`
	Counted           bool             `json:"counted"`
	Decision          string           `json:"decision"`
	DecidedBy         string           `json:"decided_by,omitempty"`
	Reason            string           `json:"reason,omitempty"`
	Start             time.Time        `json:"start,omitzero"`
	End               time.Time        `json:"end,omitzero"`
	Decided           time.Time        `json:"decided,omitzero"`
	DecisionAfterEndS *float64         `json:"decision_after_end_s,omitempty"`
	SuccessorStartS   *float64         `json:"successor_start_after_end_s,omitempty"`
	Verdicts          []VerdictSummary `json:"verdicts,omitempty"`
	// WarningSignal, Progress, Quarantined, SpareSwaps and RankFailures
	// are ChainJob's.
	WarningSignal string               `json:"warning_signal,omitempty"`
	Progress      string               `json:"progress,omitempty"`
	Quarantined   []QuarantineSummary  `json:"quarantined,omitempty"`
	SpareSwaps    []SwapSummary        `json:"spare_swaps,omitempty"`
	RankFailures  []RankFailureSummary `json:"rank_failures,omitempty"`
	// Restarts, Successor and NotRun are ChainJob's: the requeued runs,
	// the successor it submitted, why its latest run did not run the
	// script.
	Restarts  int    `json:"restarts,omitempty"`
	Successor string `json:"successor,omitempty"`
	NotRun    string `json:"not_run,omitempty"`
}

// ExclusionView is an exclusion and whether it is in force.
type ExclusionView struct {
	Exclusion
	Active bool `json:"active"`
}

// View builds the status view of st at now.
func (st *State) View(now time.Time) StatusView {
	v := StatusView{Dir: st.Dir, Status: st.Status, StopReason: st.StopReason, StopKind: st.StopKind, ConsecutiveFailures: st.Failures,
		FailuresTotal: st.Total, Settings: st.Settings, Jobs: []JobView{}, Exclusions: []ExclusionView{}}
	for i, j := range st.Jobs {
		// Counted is what the judgement did to the failure count, so that
		// the table's "yes" rows add up to the header's total.
		jv := JobView{ID: j.ID, SubmittedBy: j.SubmittedBy, Nodes: j.Nodes, Outcome: j.Outcome, Counted: j.Counted,
			Decision: j.Decision, DecidedBy: j.DecidedBy, Reason: j.Reason, Decided: j.Decided, Verdicts: j.Verdicts,
			WarningSignal: j.Warning, Progress: j.Progress, Quarantined: j.Quarantined, SpareSwaps: j.Swaps, RankFailures: j.Failures,
			Restarts: j.Restarts, Successor: j.Successor, NotRun: j.NotRun}
		if j.Slurm != nil {
			jv.SlurmState, jv.Start, jv.End = j.Slurm.State, j.Slurm.Start, j.Slurm.End
			jv.ExitCode = fmt.Sprintf("%d:%d", j.Slurm.ExitCode, j.Slurm.Signal)
			if len(jv.Nodes) == 0 {
				jv.Nodes = j.Slurm.NodeList
			}
		}
		// The end: the end step's clock where it ran (milliseconds), else
		// Slurm's (whole seconds); the successor's start: its begin step.
		end := j.ScriptEnded
		if end.IsZero() {
			end = jv.End
		}
		if !end.IsZero() && !j.Decided.IsZero() {
			d := j.Decided.Sub(end).Seconds()
			jv.DecisionAfterEndS = &d
		}
		if !end.IsZero() && i+1 < len(st.Jobs) {
			if n := st.Jobs[i+1]; !n.Began.IsZero() {
				d := n.Began.Sub(end).Seconds()
				jv.SuccessorStartS = &d
			}
		}
		v.Jobs = append(v.Jobs, jv)
	}
	for _, e := range st.Exclusions {
		v.Exclusions = append(v.Exclusions, ExclusionView{Exclusion: e, Active: e.Expires.After(now)})
	}
	return v
}

// WriteJSON writes the status view as JSON.
func (v StatusView) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

// WriteTable writes the status view for people.
func (v StatusView) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "chain %s: %s", v.Dir, v.Status)
	if v.StopKind != "" {
		fmt.Fprintf(w, " [%s]", v.StopKind)
	}
	if v.StopReason != "" {
		fmt.Fprintf(w, " (%s)", v.StopReason)
	}
	fmt.Fprintf(w, "\nfailures: %d consecutive (max %d), %d in all\n\n", v.ConsecutiveFailures, v.Settings.MaxSubsequentFailures, v.FailuresTotal)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tNODES\tSLURM\tEXIT\tOUTCOME\tCOUNTED\tDECISION\tEND->DECISION\tEND->NEXT BEGINS\tREASON")
	for _, j := range v.Jobs {
		state := j.SlurmState
		if state == "" {
			state = "-"
		}
		counted := "no"
		if j.Counted {
			counted = "yes"
		}
		outcome, decision := string(j.Outcome), j.Decision
		if outcome == "" {
			outcome, decision = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", j.ID, dash(strings.Join(j.Nodes, ",")), state, dash(j.ExitCode),
			outcome, counted, decision, secs(j.DecisionAfterEndS), secs(j.SuccessorStartS), j.Reason)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	var notes []string
	for _, j := range v.Jobs {
		for _, q := range j.Quarantined {
			notes = append(notes, fmt.Sprintf("job %s: node %s quarantined (%s: %s)", j.ID, q.Host, q.Evidence, q.Detail))
		}
		for _, sw := range j.SpareSwaps {
			took := "a lost node's place"
			if sw.Replaced != "" {
				took = fmt.Sprintf("%s's place (group rank %d)", sw.Replaced, sw.GroupRank)
			}
			notes = append(notes, fmt.Sprintf("job %s: spare %s took %s at %s", j.ID, sw.Spare, took, sw.At.UTC().Format("15:04:05.000")))
		}
		if j.WarningSignal != "" {
			notes = append(notes, fmt.Sprintf("job %s: its batch shell got Slurm's warning signal SIG%s", j.ID, j.WarningSignal))
		}
		if j.Restarts > 0 {
			notes = append(notes, fmt.Sprintf("job %s: requeued by Slurm %d time(s)", j.ID, j.Restarts))
		}
		if j.NotRun != "" && j.NotRun != j.Reason {
			notes = append(notes, fmt.Sprintf("job %s: its latest run did not run the script: %s", j.ID, j.NotRun))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\nnodes and signals:")
		for _, n := range notes {
			fmt.Fprintln(w, "  "+n)
		}
	}
	if len(v.Exclusions) > 0 {
		fmt.Fprintln(w, "\nexclusions:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tACTIVE\tEVIDENCE\tFROM JOB\tEXPIRES\tDETAIL")
		for _, e := range v.Exclusions {
			fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\n", e.Node, e.Active, e.Evidence, e.Job, e.Expires.Format(time.RFC3339), e.Detail)
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("status: %w", err)
		}
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func secs(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.3fs", *p)
}
