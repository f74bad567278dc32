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
