package state

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestReplicaFetchRestore: a spare fetches a lost node's rank from the
// buddy, verified, and restores it into its own segment, where it is the
// newest committed save.
func TestReplicaFetchRestore(t *testing.T) {
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 10, 200<<10)
	saveRank(t, dir, 0, 4, 11, 200<<10)
	recv, _ := startReceiver(t, ReceiverOptions{})
	rep, _ := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{})
	waitFor(t, "the copy", func() bool { return copySeq(recv, "node-a", 4) == 2 })
	rep.Close() // the node is lost

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := Fetch(ctx, recv.Addr(), testJob, "node-a", 4)
	if err != nil {
		t.Fatal(err)
	}
	if c.Rank != 4 || c.Step != 11 || c.Node != "node-a" {
		t.Fatalf("fetched rank %d step %d of %q, want rank 4 step 11 of node-a", c.Rank, c.Step, c.Node)
	}
	spare := filepath.Join(t.TempDir(), "rank-0")
	saveRank(t, filepath.Dir(spare), 0, 0, 1, 1000) // the spare's own earlier save
	d, err := Restore(spare, c)
	if err != nil {
		t.Fatal(err)
	}
	got, p, err := ReadNewest(mustOpen(t, spare))
	if err != nil {
		t.Fatal(err)
	}
	if got != d || got.Step != 11 || got.Rank != 4 {
		t.Fatalf("the spare's newest save is %+v, want the restored step 11 of rank 4 (%+v)", got, d)
	}
	checkPattern(t, got, p)

	for _, tc := range []struct {
		name, job, node string
		rank            int32
		want            error
		msg             string
	}{
		{"rank never copied", testJob, "node-a", 9, ErrNoCopy, "rank 9"},
		{"node never seen", testJob, "node-z", 4, ErrNoCopy, `node "node-z"`},
		{"other job", "job-2", "node-a", 4, nil, `job "job-2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Fetch(ctx, recv.Addr(), tc.job, tc.node, tc.rank)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v naming %q", err, tc.want, tc.msg)
			}
		})
	}
}
