package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

type memLog struct{ got []Record }

func (m *memLog) Put(_ context.Context, r Record) error { m.got = append(m.got, r); return nil }

type failLog struct{}

func (failLog) Put(context.Context, Record) error { return errors.New("disk full") }

func TestBook(t *testing.T) {
	ctx := context.Background()
	log := &memLog{}
	var errs []error
	b := NewBook("job", "pending", "n1", func(err error) { errs = append(errs, err) }, nil, log, failLog{})
	b.SetNode("10.0.0.1/5")
	if _, isNew := b.Begin(ctx, Spare, -1, 0); !isNew {
		t.Fatal("first Begin not new")
	}
	if _, isNew := b.Begin(ctx, Spare, -1, 1); isNew {
		t.Fatal("a second Begin with the same role and group rank opened a new lease")
	}
	b.SetNode("ignored") // a lease exists: the node keeps its name
	b.Begin(ctx, Filler, -1, 1)
	if _, ok := b.End(ctx, Filler, ReclaimedBySpare, "promoted"); !ok {
		t.Fatal("End of the open filler lease")
	}
	if _, ok := b.End(ctx, Filler, ReclaimedBySpare, ""); ok {
		t.Fatal("End with nothing open")
	}
	b.End(ctx, Spare, Swap, "promoted")
	b.Begin(ctx, Active, 2, 1)
	b.CloseOther(ctx, "10.0.0.9/1", NodeFailure, "no store: nothing to do")
	b.EndAll(ctx, JobSucceeded, "done")
	recs := b.Records()
	var got []string
	for _, r := range recs {
		if r.Node != "10.0.0.1/5" || r.Job != "job" || r.Open() {
			t.Errorf("record %+v", r)
		}
		got = append(got, string(r.Role)+"/"+string(r.Reason))
	}
	if strings.Join(got, " ") != "Filler/ReclaimedBySpare Spare/Swap Active/JobSucceeded" {
		t.Fatalf("records %v", got)
	}
	if len(log.got) != 6 || len(errs) != 6 {
		t.Fatalf("log got %d writes, %d errors reported; want 6 and 6 (every write, the failing log reported)", len(log.got), len(errs))
	}
	if cur, ok := b.Current(Active); ok {
		t.Fatalf("an Active lease still open: %+v", cur)
	}
}

func TestWriteTableAndJSON(t *testing.T) {
	end := time.Date(2026, 11, 23, 1, 0, 2, 0, time.UTC)
	rs := []Record{
		{Job: "j", Node: "a/1", Role: Active, GroupRank: 0, Start: end.Add(-time.Second), End: &end, Reason: NodeFailure, ClosedBy: "b/2", Seq: 1},
		{Job: "j", Node: "c/3", Role: Spare, GroupRank: -1, Start: end, Seq: 1},
	}
	var tb bytes.Buffer
	if err := WriteTable(&tb, rs); err != nil {
		t.Fatal(err)
	}
	out := tb.String()
	for _, want := range []string{"NODE", "a/1", "Active", "NodeFailure", "recorded by b/2", "c/3", "Spare", "open"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	var jb bytes.Buffer
	if err := WriteJSON(&jb, rs); err != nil {
		t.Fatal(err)
	}
	var back []Record
	if err := json.Unmarshal(jb.Bytes(), &back); err != nil || len(back) != 2 || back[0].Reason != NodeFailure || back[1].End != nil {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
	jb.Reset()
	_ = WriteJSON(&jb, nil)
	if strings.TrimSpace(jb.String()) != "[]" {
		t.Fatalf("empty ledger as JSON: %q", jb.String())
	}
}

// memStore is a job-wide store that keeps every write (the real one is
// etcd, tested in ledger/etcdstore).
type memStore struct{ memLog }

func (m *memStore) CloseOpen(context.Context, string, Reason, string, string, time.Time) (Record, bool, error) {
	return Record{}, false, nil
}

func TestBookRestarts(t *testing.T) {
	ctx := context.Background()
	store, log := &memStore{}, &memLog{}
	b := NewBook("job", "10.0.0.1/5", "n1", nil, store, log)
	b.Restarted(ctx, "full") // no lease open: nothing to count
	b.Begin(ctx, Active, 0, 0)
	b.Restarted(ctx, "in-process")
	b.Restarted(ctx, "full")
	b.Restarted(ctx, "in-process")
	if len(store.got) != 1 {
		t.Fatalf("store got %d writes before the lease ended; want 1 (its begin): restarts cost no store write", len(store.got))
	}
	if len(log.got) != 4 || log.got[3].Restarts["in-process"] != 2 || log.got[1].Restarts["in-process"] != 1 || len(log.got[1].Restarts) != 1 {
		t.Fatalf("the log gets every count at once, each write its own copy: %+v", log.got)
	}
	cur, _ := b.Current(Active)
	b.End(ctx, Active, Reassigned, "group rank 1 in round 3")
	b.Begin(ctx, Active, 1, 3)
	b.EndAll(ctx, JobSucceeded, "done")
	if cur.Restarts["full"] != 1 || len(store.got) != 4 {
		t.Fatalf("open lease %+v; store writes %d, want 4", cur, len(store.got))
	}
	closed, next := store.got[1], store.got[3]
	if closed.Open() || closed.Restarts["in-process"] != 2 || closed.Restarts["full"] != 1 || len(closed.Restarts) != 2 {
		t.Fatalf("the closing write carries the counts: %+v", closed)
	}
	if next.Restarts != nil {
		t.Fatalf("the next lease starts with no restarts: %+v", next)
	}

	var jb bytes.Buffer
	if err := WriteJSON(&jb, []Record{closed, next}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(jb.String(), `"restarts": {`) || strings.Count(jb.String(), `"restarts"`) != 1 {
		t.Fatalf("JSON: restarts only where counted:\n%s", jb.String())
	}
	var back []Record
	if err := json.Unmarshal(jb.Bytes(), &back); err != nil || len(back) != 2 ||
		back[0].Restarts["in-process"] != 2 || back[0].Restarts["full"] != 1 || back[1].Restarts != nil {
		t.Fatalf("json round trip: %v %+v", err, back)
	}
	var tb bytes.Buffer
	if err := WriteTable(&tb, back); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(tb.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "RESTARTS") ||
		!strings.Contains(lines[1], " full=1,in-process=2 ") || !strings.Contains(lines[2], " - ") {
		t.Fatalf("table:\n%s", tb.String())
	}
	if line := FormatLine(back[0]); !strings.HasSuffix(line, "; restarts full=1,in-process=2") {
		t.Fatalf("FormatLine: %q", line)
	}
}

func TestMergeRestarts(t *testing.T) {
	start := time.Date(2026, 11, 23, 1, 0, 0, 0, time.UTC)
	end := start.Add(time.Minute)
	// The holder's event log has its counts on the open lease; the
	// survivor that ended it (the holder was lost) wrote it without.
	open := Record{Job: "j", Node: "a/1", Role: Active, Start: start, Seq: 1, Restarts: map[string]int{"in-process": 1}}
	open2 := open
	open2.Restarts = map[string]int{"in-process": 2, "full": 1}
	closed := Record{Job: "j", Node: "a/1", Role: Active, Start: start, Seq: 1, End: &end, Reason: NodeFailure, ClosedBy: "b/2"}
	for _, in := range [][]Record{{open, open2, closed}, {closed, open2, open}, {open2, closed}} {
		got := Merge(in)
		if len(got) != 1 || got[0].Open() || got[0].ClosedBy != "b/2" ||
			got[0].Restarts["in-process"] != 2 || got[0].Restarts["full"] != 1 {
			t.Errorf("Merge(%d records) = %+v", len(in), got)
		}
	}
	if got := Merge([]Record{closed, closed}); got[0].Restarts != nil || got[0].InProcessMaxMS != nil {
		t.Errorf("no counts anywhere: %+v", got[0])
	}
	// The in-process phases merge the same way: each phase's longest.
	open.InProcessMaxMS = map[string]float64{"total": 300, "rejoin": 50}
	open2.InProcessMaxMS = map[string]float64{"total": 200, "rejoin": 80}
	for _, in := range [][]Record{{open, open2, closed}, {closed, open2, open}} {
		got := Merge(in)
		if ph := got[0].InProcessMaxMS; ph["total"] != 300 || ph["rejoin"] != 80 || len(ph) != 2 {
			t.Errorf("Merge phases %v", ph)
		}
	}
	if line := FormatLine(Merge([]Record{open, closed})[0]); !strings.Contains(line, "slowest in-process restart 300 ms") {
		t.Errorf("FormatLine = %q", line)
	}
}

// TestBookInProcessRestarted: the open Active lease keeps each phase's
// longest time over its in-process restarts.
func TestBookInProcessRestarted(t *testing.T) {
	b := NewBook("j", "a/1", "host", func(err error) { t.Error(err) }, nil)
	ctx := context.Background()
	b.InProcessRestarted(ctx, map[string]time.Duration{"total": time.Second}) // no lease: nothing
	b.Begin(ctx, Active, 0, 0)
	b.InProcessRestarted(ctx, map[string]time.Duration{"total": 300 * time.Millisecond, "rejoin": 50 * time.Millisecond})
	b.InProcessRestarted(ctx, map[string]time.Duration{"total": 200 * time.Millisecond, "rejoin": 80 * time.Millisecond})
	recs := b.Records()
	if len(recs) != 1 || recs[0].InProcessMaxMS["total"] != 300 || recs[0].InProcessMaxMS["rejoin"] != 80 {
		t.Fatalf("records %+v", recs)
	}
}
