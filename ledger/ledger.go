// Package ledger is the record of which node held which role in a job, and
// why each holding ended: every lease of a node as Active (with its group
// rank), Spare or Filler is one Record. The agent of each node keeps the
// book of its own leases (Book) and writes every change to its sinks: the
// JSON-lines event log and the job's etcd prefix (package
// ledger/etcdstore), where any node or tool can read the whole job's
// ledger while it runs. The verdict file summarises a node's records.
package ledger

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Role is what a node does in the job.
type Role string

// Roles.
const (
	Active Role = "Active" // runs ranks with a group rank
	Spare  Role = "Spare"  // parked beyond --nnodes MIN, ready to take a lost node's place
	Filler Role = "Filler" // opportunistic work on a spare, reclaimed when the spare is needed
)

// Reason is why a lease ended.
type Reason string

// Reasons.
const (
	NodeFailure      Reason = "NodeFailure"      // the node was lost (gossip, lease expiry)
	Swap             Reason = "Swap"             // the spare was promoted to Active
	ReclaimedBySpare Reason = "ReclaimedBySpare" // the filler was killed because its spare was needed
	Quarantined      Reason = "Quarantined"      // the node was declared bad (filler not reclaimable, repeated hangs)
	Excluded         Reason = "Excluded"         // the node left the job (ExcludeThisNode, health check)
	Stopped          Reason = "Stopped"          // the node's launcher was stopped by a signal
	Reassigned       Reason = "Reassigned"       // the node kept running under another group rank or role
	FillerExited     Reason = "FillerExited"     // the filler command ended on its own
	JobSucceeded     Reason = "JobSucceeded"     // the job ended with success
	JobFailed        Reason = "JobFailed"        // the job ended otherwise
)

// Record is one lease of one node in one role.
type Record struct {
	Job       string     `json:"job"`  // run id
	Node      string     `json:"node"` // rendezvous node id (<addr>/<pid>)
	Host      string     `json:"host,omitempty"`
	Role      Role       `json:"role"`
	GroupRank int        `json:"group_rank"` // -1 unless Active
	Cycle     int        `json:"cycle"`      // the round the lease began in
	Start     time.Time  `json:"start"`
	End       *time.Time `json:"end,omitempty"`
	Reason    Reason     `json:"reason,omitempty"`
	Detail    string     `json:"detail,omitempty"`
	// Seq numbers the node's leases from 1; with Node it names the record.
	Seq int `json:"seq"`
	// ClosedBy is the node that ended the lease when it was not the holder
	// (a survivor records a lost node's NodeFailure).
	ClosedBy string `json:"closed_by,omitempty"`
	// Restarts counts the job's restarts during an Active lease by the
	// mode that restarted this node's ranks: "full" or "in-process" (the
	// "mode" of the event log's restart events and of the verdict's
	// cycles). The holder keeps the counts in memory and stores them with
	// the lease's next write (its end), so a restart costs no etcd write.
	Restarts map[string]int `json:"restarts,omitempty"`
	// InProcessMaxMS is, per phase, the longest of the in-process restarts
	// completed during an Active lease, in milliseconds (notice, teardown,
	// rejoin, restore, first_step, total: the verdict's inprocess_ms),
	// kept and stored like Restarts.
	InProcessMaxMS map[string]float64 `json:"inprocess_max_ms,omitempty"`
}

// Open reports whether the lease has not ended.
func (r Record) Open() bool { return r.End == nil }

// ID names the record: <node>#<seq>.
func (r Record) ID() string { return fmt.Sprintf("%s#%d", r.Node, r.Seq) }

// Log receives every new or changed record (the event log).
type Log interface {
	Put(ctx context.Context, r Record) error
}

// Store is the job-wide ledger (etcd): it also ends other nodes' leases.
type Store interface {
	Log
	// CloseOpen ends another node's open lease (a survivor recording a
	// lost node) if it is still open; several survivors may race and
	// exactly one gets closed == true.
	CloseOpen(ctx context.Context, node string, reason Reason, detail, by string, at time.Time) (r Record, closed bool, err error)
}

// Book is one node's leases. It is safe for concurrent use.
type Book struct {
	job, node, host string
	store           Store // nil: single node, nothing shared
	logs            []Log
	onErr           func(error)

	mu   sync.Mutex
	recs []Record // this node's leases, in order
	seq  int
	// closedOthers are other nodes' leases this node ended.
	closedOthers []Record
}

// NewBook returns the book of node's leases in job, written to store (nil
// for none) and logs. onErr is told about a write that failed (the ledger
// is a record, never a reason to stop).
func NewBook(job, node, host string, onErr func(error), store Store, logs ...Log) *Book {
	if onErr == nil {
		onErr = func(error) {}
	}
	return &Book{job: job, node: node, host: host, store: store, logs: logs, onErr: onErr}
}

// SetNode renames the node (once its rendezvous id is known) before any
// lease was opened.
func (b *Book) SetNode(node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.recs) == 0 {
		b.node = node
	}
}

// Current returns the open lease in role, if any.
func (b *Book) Current(role Role) (Record, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.recs) - 1; i >= 0; i-- {
		if r := b.recs[i]; r.Role == role && r.Open() {
			return r, true
		}
	}
	return Record{}, false
}

// Begin opens a lease in role unless one is open with the same group
// rank; isNew says which.
func (b *Book) Begin(ctx context.Context, role Role, groupRank, cycle int) (r Record, isNew bool) {
	b.mu.Lock()
	for _, r := range b.recs {
		if r.Role == role && r.Open() && r.GroupRank == groupRank {
			b.mu.Unlock()
			return r, false
		}
	}
	b.seq++
	r = Record{Job: b.job, Node: b.node, Host: b.host, Role: role, GroupRank: groupRank, Cycle: cycle,
		Start: time.Now().UTC(), Seq: b.seq}
	b.recs = append(b.recs, r)
	b.mu.Unlock()
	b.put(ctx, r)
	return r, true
}

// End closes this node's open lease in role with reason.
func (b *Book) End(ctx context.Context, role Role, reason Reason, detail string) (Record, bool) {
	b.mu.Lock()
	idx := b.openIndex(role)
	if idx < 0 {
		b.mu.Unlock()
		return Record{}, false
	}
	now := time.Now().UTC()
	b.recs[idx].End, b.recs[idx].Reason, b.recs[idx].Detail = &now, reason, detail
	r := b.recs[idx]
	b.mu.Unlock()
	b.put(ctx, r)
	return r, true
}

// Restarted counts a restart in mode on this node's open Active lease (no
// lease open: nothing to count). The job-wide store gets the count with
// the lease's next write; the logs (a local file) get it at once, so the
// count survives the holder's SIGKILL in its event log.
func (b *Book) Restarted(ctx context.Context, mode string) {
	b.mu.Lock()
	idx := b.openIndex(Active)
	if idx < 0 {
		b.mu.Unlock()
		return
	}
	r := &b.recs[idx]
	// A new map each time: records handed out earlier share none of it.
	counts := make(map[string]int, len(r.Restarts)+1)
	maps.Copy(counts, r.Restarts)
	counts[mode]++
	r.Restarts = counts
	rec := *r
	b.mu.Unlock()
	b.log(ctx, rec)
}

// InProcessRestarted folds the phases of an in-process restart completed
// on this node (the slowest survivor's each) into its open Active lease's
// InProcessMaxMS, stored like the restart counts.
func (b *Book) InProcessRestarted(ctx context.Context, phases map[string]time.Duration) {
	b.mu.Lock()
	idx := b.openIndex(Active)
	if idx < 0 || len(phases) == 0 {
		b.mu.Unlock()
		return
	}
	r := &b.recs[idx]
	m := make(map[string]float64, len(phases)) // a new map: records handed out share none of it
	maps.Copy(m, r.InProcessMaxMS)
	for p, d := range phases {
		m[p] = max(m[p], float64(d.Microseconds())/1000)
	}
	r.InProcessMaxMS = m
	rec := *r
	b.mu.Unlock()
	b.log(ctx, rec)
}

// openIndex is the index of this node's latest open lease in role, -1 if
// none; b.mu is held.
func (b *Book) openIndex(role Role) int {
	for i := len(b.recs) - 1; i >= 0; i-- {
		if b.recs[i].Role == role && b.recs[i].Open() {
			return i
		}
	}
	return -1
}

// EndAll closes every open lease of this node with reason.
func (b *Book) EndAll(ctx context.Context, reason Reason, detail string) {
	for _, role := range []Role{Filler, Spare, Active} {
		for {
			if _, ok := b.End(ctx, role, reason, detail); !ok {
				break
			}
		}
	}
}

// CloseOther ends another node's open lease in the job-wide store; the
// node whose write wins also writes the record to its logs.
func (b *Book) CloseOther(ctx context.Context, node string, reason Reason, detail string) {
	if b.store == nil || node == "" || node == b.node {
		return
	}
	r, closed, err := b.store.CloseOpen(ctx, node, reason, detail, b.node, time.Now().UTC())
	if err != nil {
		b.onErr(fmt.Errorf("ledger: close %s's lease: %w", node, err))
		return
	}
	if !closed {
		return
	}
	b.mu.Lock()
	b.closedOthers = append(b.closedOthers, r)
	b.mu.Unlock()
	b.log(ctx, r)
}

// Closed keeps other nodes' leases that this node ended by another write
// than CloseOther (the rendezvous ends a lost node's leases in the txn
// that ends its round): they go to this node's logs and Records, as
// CloseOther's would.
func (b *Book) Closed(ctx context.Context, rs []Record) {
	if len(rs) == 0 {
		return
	}
	b.mu.Lock()
	b.closedOthers = append(b.closedOthers, rs...)
	b.mu.Unlock()
	for _, r := range rs {
		b.log(ctx, r)
	}
}

func (b *Book) put(ctx context.Context, r Record) {
	if b.store != nil {
		if err := b.store.Put(ctx, r); err != nil {
			b.onErr(fmt.Errorf("ledger: record %s: %w", r.ID(), err))
		}
	}
	b.log(ctx, r)
}

func (b *Book) log(ctx context.Context, r Record) {
	for _, l := range b.logs {
		if err := l.Put(ctx, r); err != nil {
			b.onErr(fmt.Errorf("ledger: log %s: %w", r.ID(), err))
		}
	}
}

// Records returns this node's leases and the other nodes' leases it ended,
// ordered by the time of their last change.
func (b *Book) Records() []Record {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := append(append([]Record(nil), b.recs...), b.closedOthers...)
	SortByChange(out)
	return out
}

// changed is when a record last changed: its end, else its start.
func changed(r Record) time.Time {
	if r.End != nil {
		return *r.End
	}
	return r.Start
}

// SortByChange orders records by the time of their last change.
func SortByChange(rs []Record) {
	sort.SliceStable(rs, func(i, j int) bool { return changed(rs[i]).Before(changed(rs[j])) })
}

// Merge keeps one record per lease from records gathered from several
// sources (nodes' verdicts, event logs, etcd): a lease recorded by two
// nodes (its holder, and a survivor that ended it) is kept once, in its
// ended form, with the highest restart count of each mode any version
// has (a survivor's closing write lacks the counts the lost holder kept
// in memory; its event log has them).
func Merge(in []Record) []Record {
	byID := map[string]Record{}
	for _, r := range in {
		old, ok := byID[r.ID()]
		if !ok {
			byID[r.ID()] = r
			continue
		}
		keep := r
		if !old.Open() {
			keep = old
		}
		keep.Restarts = maxEach(old.Restarts, r.Restarts)
		keep.InProcessMaxMS = maxEach(old.InProcessMaxMS, r.InProcessMaxMS)
		byID[r.ID()] = keep
	}
	out := make([]Record, 0, len(byID))
	for _, r := range byID {
		out = append(out, r)
	}
	SortByStart(out)
	return out
}

// maxEach is each key's higher value of a and b (nil when both are
// empty): restart counts by mode, in-process phase times.
func maxEach[V int | float64](a, b map[string]V) map[string]V {
	if len(a) == 0 && len(b) == 0 {
		return nil
	}
	out := make(map[string]V, len(a)+len(b))
	maps.Copy(out, a)
	for k, v := range b {
		out[k] = max(out[k], v)
	}
	return out
}

// RestartsString is a record's restart counts as one word for the table:
// "full=2,in-process=1" (modes sorted), "-" when none.
func RestartsString(counts map[string]int) string {
	if len(counts) == 0 {
		return "-"
	}
	modes := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(modes))
	for i, m := range modes {
		parts[i] = fmt.Sprintf("%s=%d", m, counts[m])
	}
	return strings.Join(parts, ",")
}

// SortByStart orders records by start, then node and sequence.
func SortByStart(rs []Record) {
	sort.SliceStable(rs, func(i, j int) bool {
		if !rs[i].Start.Equal(rs[j].Start) {
			return rs[i].Start.Before(rs[j].Start)
		}
		if rs[i].Node != rs[j].Node {
			return rs[i].Node < rs[j].Node
		}
		return rs[i].Seq < rs[j].Seq
	})
}

// WriteTable prints records for people, one lease a line.
func WriteTable(w io.Writer, rs []Record) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tGROUP RANK\tCYCLE\tSTART\tEND\tRESTARTS\tREASON\tDETAIL")
	for _, r := range rs {
		gr, end := "-", "open"
		if r.GroupRank >= 0 {
			gr = fmt.Sprint(r.GroupRank)
		}
		if r.End != nil {
			end = r.End.Format("15:04:05.000")
		}
		detail := r.Detail
		if r.ClosedBy != "" {
			detail = strings.TrimSpace(detail + " (recorded by " + r.ClosedBy + ")")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.Node, r.Role, gr, r.Cycle,
			r.Start.Format("15:04:05.000"), end, RestartsString(r.Restarts), r.Reason, detail)
	}
	return tw.Flush()
}

// WriteJSON prints records for tools: one JSON array.
func WriteJSON(w io.Writer, rs []Record) error {
	if rs == nil {
		rs = []Record{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rs)
}

// WriteJSONLine prints one record as one JSON line (for following).
func WriteJSONLine(w io.Writer, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// FormatLine is one record as one line for people following a ledger.
func FormatLine(r Record) string {
	what := "began"
	at := r.Start
	if r.End != nil {
		what, at = "ended "+string(r.Reason), *r.End
	}
	s := fmt.Sprintf("%s  %-22s %-6s", at.Format("15:04:05.000"), r.Node, r.Role)
	if r.GroupRank >= 0 {
		s += fmt.Sprintf(" group rank %d", r.GroupRank)
	}
	s += fmt.Sprintf(" (cycle %d) %s", r.Cycle, what)
	if r.Detail != "" {
		s += ": " + r.Detail
	}
	if len(r.Restarts) > 0 {
		s += "; restarts " + RestartsString(r.Restarts)
	}
	if t, ok := r.InProcessMaxMS["total"]; ok {
		s += fmt.Sprintf("; slowest in-process restart %.0f ms", t)
	}
	if r.ClosedBy != "" {
		s += " (recorded by " + r.ClosedBy + ")"
	}
	return s
}
