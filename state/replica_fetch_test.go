package state

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
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
	c, err := Fetch(ctx, recv.Addr(), testJob, nil, "node-a", 4)
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
			_, err := Fetch(ctx, recv.Addr(), tc.job, nil, tc.node, tc.rank)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("error %v, want %v naming %q", err, tc.want, tc.msg)
			}
		})
	}
}

func TestBuddyRing(t *testing.T) {
	ring := []string{"n0", "n1", "n2", "n3"}
	for _, tc := range []struct {
		self, k int
		want    []string
	}{
		{0, 1, []string{"n1"}},
		{3, 1, []string{"n0"}},
		{2, 2, []string{"n3", "n0"}},
		{1, 3, []string{"n2", "n3", "n0"}},
		{1, 9, []string{"n2", "n3", "n0"}}, // never itself
		{1, 0, nil},
		{4, 1, nil}, // not in the ring (a standby)
	} {
		if got := BuddyRing(ring, tc.self, tc.k); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("BuddyRing(self %d, k %d) = %v, want %v", tc.self, tc.k, got, tc.want)
		}
	}
	if got := BuddyRing([]string{"n0"}, 0, 1); len(got) != 0 {
		t.Errorf("a single node has buddies %v", got)
	}
}

// TestReplicaSetBuddies: a new round's ring moves the copies to the new
// buddy; the sender to the dropped one stops.
func TestReplicaSetBuddies(t *testing.T) {
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 1, 10<<10)
	a, _ := startReceiver(t, ReceiverOptions{})
	b, _ := startReceiver(t, ReceiverOptions{})
	rep, _ := startSender(t, dir, 1, a.Addr(), ReplicatorOptions{})
	waitFor(t, "the copy at a", func() bool { return copySeq(a, "node-a", 4) == 1 })
	rep.SetBuddies([]string{b.Addr()})
	waitFor(t, "the copy at b", func() bool { return copySeq(b, "node-a", 4) == 1 })
	saveRank(t, dir, 0, 4, 2, 10<<10)
	waitFor(t, "the new save at b", func() bool { return copySeq(b, "node-a", 4) == 2 })
	time.Sleep(200 * time.Millisecond)
	if copySeq(a, "node-a", 4) != 1 {
		t.Fatal("the dropped buddy still receives copies")
	}
	if st := rep.Status(); len(st) != 1 || st[0].Addr != b.Addr() {
		t.Fatalf("status %+v, want only buddy b", st)
	}
}

// TestReplicaRestoreRanks: in a round after node-a's loss, a spare (empty
// segments) and a renumbered survivor (its segment holds its old rank)
// get their new ranks' newest copies from the peers; a rank whose own
// save is in memory is left alone; a rank nobody saved is no error.
func TestReplicaRestoreRanks(t *testing.T) {
	// node-a held global ranks 2 and 3; node-x held rank 2 in an older round.
	lost, old := t.TempDir(), t.TempDir()
	saveRank(t, lost, 0, 2, 11, 64<<10)
	saveRank(t, lost, 1, 3, 11, 64<<10)
	saveRank(t, old, 0, 2, 5, 64<<10)
	buddy, _ := startReceiver(t, ReceiverOptions{})
	empty, _ := startReceiver(t, ReceiverOptions{})
	repA, _ := startSender(t, lost, 2, buddy.Addr(), ReplicatorOptions{})
	repX, _ := startSender(t, old, 1, buddy.Addr(), ReplicatorOptions{Node: "node-x"})
	waitFor(t, "the copies", func() bool {
		return copySeq(buddy, "node-a", 2) == 1 && copySeq(buddy, "node-a", 3) == 1 && copySeq(buddy, "node-x", 2) == 1
	})
	repA.Close() // node-a is lost
	repX.Close()
	dead, _ := startReceiver(t, ReceiverOptions{})
	deadAddr := dead.Addr()
	_ = dead.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	spare := t.TempDir()
	saveRank(t, spare, 1, 0, 7, 1000) // local rank 1 held rank 0 before: renumbered
	seg := func(lr int) string { return filepath.Join(spare, "rank-"+string(rune('0'+lr))) }
	ev := &events{}
	got, err := RestoreRanks(ctx, RestoreOptions{Job: testJob, NLocal: 2, Segment: seg, RankBase: 2, Round: 3,
		Peers: []string{empty.Addr(), deadAddr, buddy.Addr()}, Emit: ev.record})
	want := []BuddyRestore{{Round: 3, LocalRank: 0, Rank: 2, Step: 11, Sender: "node-a"}, {Round: 3, LocalRank: 1, Rank: 3, Step: 11, Sender: "node-a"}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("restored %+v, err %v; want %+v and no error (the dead peer skipped)", got, err, want)
	}
	for lr, rank := range []int32{2, 3} {
		d, p, err := ReadNewest(mustOpen(t, seg(lr)))
		if err != nil {
			t.Fatal(err)
		}
		if d.Rank != rank || d.Step != 11 {
			t.Fatalf("local rank %d holds rank %d step %d, want rank %d step 11 (node-a's, not node-x's step 5)", lr, d.Rank, d.Step, rank)
		}
		checkPattern(t, d, p)
	}
	if ev.count(EventRestoredFromBuddy) != 2 {
		t.Fatalf("%d %s events, want 2", ev.count(EventRestoredFromBuddy), EventRestoredFromBuddy)
	}
	// Again: every local rank now holds its own rank's save: nothing to do.
	if n, err := RestoreRanks(ctx, RestoreOptions{Job: testJob, NLocal: 2, Segment: seg, RankBase: 2,
		Peers: []string{buddy.Addr()}}); len(n) != 0 || err != nil {
		t.Fatalf("second restore: %v, err %v; want 0, nil", n, err)
	}
	// Ranks nobody saved (a first round) are no error.
	if n, err := RestoreRanks(ctx, RestoreOptions{Job: testJob, NLocal: 2, Segment: seg, RankBase: 8,
		Peers: []string{buddy.Addr()}}); len(n) != 0 || err != nil {
		t.Fatalf("ranks never saved: %v restored, err %v; want 0, nil", n, err)
	}
	// Only an unreachable peer: the error says so.
	fresh := t.TempDir()
	_, err = RestoreRanks(ctx, RestoreOptions{Job: testJob, NLocal: 1, RankBase: 2,
		Segment: func(int) string { return filepath.Join(fresh, "rank-0") }, Peers: []string{deadAddr}})
	if err == nil || errors.Is(err, ErrNoCopy) || !strings.Contains(err.Error(), "could not be asked") {
		t.Fatalf("restore with only a dead peer: %v, want an error naming the unreachable buddy", err)
	}
}

// BenchmarkReplica256MiB: a 256 MiB save replicated to a buddy on
// loopback (from the commit in the segment to the buddy's verified copy,
// including up to one 5 ms poll) and fetched back (docs/benchmarks.md):
// with the allowlist (every connection's address looked up), and with
// every frame and copy also authenticated with a job secret (HMAC-SHA256).
//
//	go test -run '^$' -bench BenchmarkReplica256MiB -benchtime 4x ./state/
func BenchmarkReplica256MiB(b *testing.B) {
	for _, tc := range []struct {
		name   string
		secret []byte
	}{{"allowlist", nil}, {"hmac", []byte("bench secret")}} {
		b.Run(tc.name, func(b *testing.B) { benchReplica(b, tc.secret) })
	}
}

func benchReplica(b *testing.B, secret []byte) {
	const n = 256 << 20
	dir, err := os.MkdirTemp("/dev/shm", "ftstate-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	seg := filepath.Join(dir, "rank-0")
	ctx := context.Background()
	recv, err := Listen(ctx, ReceiverOptions{Job: testJob, Addr: "127.0.0.1:0", Allow: testAllow, Secret: secret})
	if err != nil {
		b.Fatal(err)
	}
	defer recv.Close()
	rep, err := StartReplicator(ctx, ReplicatorOptions{Job: testJob, Node: "node-a", NLocal: 1, Secret: secret,
		Segment: func(int) string { return seg }, Buddies: []string{recv.Addr()}, Poll: 5 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	defer rep.Close()
	p := make([]byte, n)
	var copyT, fetchT time.Duration
	b.SetBytes(n)
	b.ResetTimer()
	for i := range b.N {
		p[0] = byte(i)
		d, err := (&Saver{Path: seg, SkipCRC: true}).Save(int64(i), p)
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		for copySeq(recv, "node-a", 0) != d.Seq {
			time.Sleep(time.Millisecond)
		}
		t1 := time.Now()
		if _, err := Fetch(ctx, recv.Addr(), testJob, secret, "node-a", 0); err != nil {
			b.Fatal(err)
		}
		copyT += t1.Sub(t0)
		fetchT += time.Since(t1)
	}
	b.ReportMetric(float64(copyT.Milliseconds())/float64(b.N), "copy-ms/op")
	b.ReportMetric(float64(fetchT.Milliseconds())/float64(b.N), "fetch-ms/op")
}
