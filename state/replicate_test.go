package state

import (
	"bufio"
	"context"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

const testJob = "job-1"

// testAllow admits this host and the tests' sender nodes from 127.0.0.1.
var testAllow = Allowlist{Local: []netip.Addr{loopback}, Senders: map[string][]netip.Addr{
	"node-a": {loopback}, "node-b": {loopback}, "node-x": {loopback}, "n": {loopback}}}

var loopback = netip.MustParseAddr("127.0.0.1")

func startReceiver(t *testing.T, opts ReceiverOptions) (*Receiver, *events) {
	t.Helper()
	ev := &events{}
	opts.Job = cmp(opts.Job, testJob)
	opts.Addr = cmp(opts.Addr, "127.0.0.1:0")
	opts.Emit = ev.record
	if opts.Allow.Local == nil && opts.Allow.Senders == nil {
		opts.Allow = testAllow
	}
	r, err := Listen(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r, ev
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// startSender replicates the segments in dir (rank-0 …) to addr.
func startSender(t *testing.T, dir string, nlocal int, addr string, opts ReplicatorOptions) (*Replicator, *events) {
	t.Helper()
	ev := &events{}
	opts.Job = cmp(opts.Job, testJob)
	opts.Node = cmp(opts.Node, "node-a")
	opts.NLocal = nlocal
	opts.Segment = func(lr int) string { return filepath.Join(dir, "rank-"+string(rune('0'+lr))) }
	opts.Buddies = []string{addr}
	if opts.Poll == 0 {
		opts.Poll = 20 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 200 * time.Millisecond
	}
	opts.Emit = ev.record
	r, err := StartReplicator(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, ev
}

func saveRank(t *testing.T, dir string, lr int, rank int32, step int64, n int) Desc {
	t.Helper()
	d, err := (&Saver{Path: filepath.Join(dir, "rank-"+string(rune('0'+lr))), Rank: rank}).Save(step, pattern(step, n))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func copySeq(r *Receiver, node string, rank int32) uint64 {
	if c := r.Copy(node, rank); c != nil {
		return c.Seq
	}
	return 0
}

func (e *events) with(kind, substr string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, f := range e.got {
		if f["event"] == kind {
			if s, _ := f["error"].(string); strings.Contains(s, substr) {
				n++
			}
		}
	}
	return n
}

func (e *events) last(kind string) map[string]any {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := len(e.got) - 1; i >= 0; i-- {
		if e.got[i]["event"] == kind {
			return e.got[i]
		}
	}
	return nil
}

// TestReplicaCopyArrivesAndVerifies: two local ranks' newest saves arrive,
// verified, at the buddy; the saves before the newest coalesce.
func TestReplicaCopyArrivesAndVerifies(t *testing.T) {
	dir := t.TempDir()
	for step := int64(1); step <= 3; step++ {
		saveRank(t, dir, 0, 4, step, 300<<10)
	}
	saveRank(t, dir, 1, 5, 7, 1000)
	recv, rev := startReceiver(t, ReceiverOptions{})
	rep, sev := startSender(t, dir, 2, recv.Addr(), ReplicatorOptions{})
	waitFor(t, "both ranks' copies", func() bool { return copySeq(recv, "node-a", 4) == 3 && copySeq(recv, "node-a", 5) == 1 })
	// The sender counts a copy when the buddy's acknowledgement arrives,
	// just after the buddy keeps it.
	waitFor(t, "the sender to count both copies", func() bool { return sev.count(EventReplicaSent) >= 2 })
	for _, rank := range []int32{4, 5} {
		c := recv.Copy("node-a", rank)
		if want := pattern(c.Step, len(c.Payload)); string(c.Payload) != string(want) {
			t.Fatalf("rank %d: the copy's payload is not the save", rank)
		}
		if c.CRC32C != crc32.Checksum(c.Payload, castagnoli) {
			t.Fatalf("rank %d: CRC-32C %08x does not match the payload", rank, c.CRC32C)
		}
	}
	if c := recv.Copy("node-a", 4); c.Step != 3 || len(c.Payload) != 300<<10 {
		t.Fatalf("rank 4: copy of step %d with %d bytes, want step 3 with %d", c.Step, len(c.Payload), 300<<10)
	}
	if h, want := recv.Held(), uint64(300<<10+1000); h != want {
		t.Fatalf("the buddy holds %d bytes, want %d (the two complete copies, nothing in flight)", h, want)
	}
	if n := rev.count(EventReplicaReceived); n != 2 {
		t.Fatalf("%d %s events, want 2", n, EventReplicaReceived)
	}
	if n := sev.count(EventReplicaSent); n != 2 {
		t.Fatalf("%d %s events, want 2", n, EventReplicaSent)
	}
	// A new save is sent, as one copy, and replaces the previous one.
	saveRank(t, dir, 0, 4, 4, 300<<10)
	rep.Notify()
	waitFor(t, "the step-4 copy", func() bool { return copySeq(recv, "node-a", 4) == 4 })
	// The buddy keeps the copy before its acknowledgement reaches the
	// sender: wait for the sender to count it too.
	waitFor(t, "the sender to count the step-4 copy", func() bool { return rep.Status()[0].Sent[0] == 4 })
	if st := rep.Status()[0]; st.Copies != 3 || st.Sent[0] != 4 || st.Sent[1] != 1 {
		t.Fatalf("sender status %+v, want 3 copies, sent seqs [4 1]", st)
	}
	if h, want := recv.Held(), uint64(300<<10+1000); h != want {
		t.Fatalf("after the replacement the buddy holds %d bytes, want %d", h, want)
	}
}

// TestReplicaBuddyDiesMidStream: the buddy dies while a copy streams; the
// sender notices, never blocks its caller, and delivers to the buddy's
// replacement on the same address within its backoff bound.
func TestReplicaBuddyDiesMidStream(t *testing.T) {
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 1, 512<<10)
	recv, _ := startReceiver(t, ReceiverOptions{slowRead: func() { time.Sleep(2 * time.Millisecond) }})
	addr := recv.Addr()
	rep, sev := startSender(t, dir, 1, addr, ReplicatorOptions{})
	waitFor(t, "a copy in flight", func() bool { return recv.Held() > 0 })
	if err := recv.Close(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for range 100 {
		rep.Notify()
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("Notify blocked for %s while the buddy was dead", d)
	}
	waitFor(t, "the sender to notice the dead buddy", func() bool { return sev.count(EventReplicaFailed) > 0 })
	if st := rep.Status()[0]; st.Sent[0] != 0 || st.Failures == 0 {
		t.Fatalf("sender status %+v after the buddy died mid-copy: want nothing sent and a failure", st)
	}
	// A rank saves meanwhile, unhindered.
	saveRank(t, dir, 0, 4, 2, 512<<10)
	recv2, _ := startReceiver(t, ReceiverOptions{Addr: addr})
	waitFor(t, "the copy at the restarted buddy", func() bool { return copySeq(recv2, "node-a", 4) == 2 })
	if f := sev.last(EventReplicaFailed); f["retry_in_ms"].(float64) > 200 {
		t.Fatalf("retry after %v ms, above the 200 ms bound", f["retry_in_ms"])
	}
}

// rawCopy starts a copy by hand on a new connection: it sends the header
// and reads the buddy's answer.
func rawCopy(t *testing.T, addr string, f frame) (net.Conn, *bufio.Reader, frame) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if _, err := c.Write(f.encode(nil)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	rep, err := readFrame(br, nil)
	if err != nil {
		t.Fatalf("no answer to the header: %v", err)
	}
	return c, br, rep
}

// TestReplicaSenderDiesMidStream: a sender that dies (its connection
// closes) anywhere in a copy leaves the previous complete copy in place;
// the partial one is discarded and its memory released.
func TestReplicaSenderDiesMidStream(t *testing.T) {
	const n = 64 << 10
	payload := pattern(2, n)
	good := crc32.Checksum(payload, castagnoli)
	cases := []struct {
		name  string
		write []byte // what the sender manages to write after the accept
	}{
		{"after the header", nil},
		{"mid-payload", payload[:n/2]},
		{"before the trailer", payload},
		{"mid-trailer", append(append([]byte(nil), payload...), trailer(good, trailerComplete)[:3]...)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			saveRank(t, dir, 0, 4, 1, n)
			recv, rev := startReceiver(t, ReceiverOptions{})
			rep, _ := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{})
			waitFor(t, "the first copy", func() bool { return copySeq(recv, "node-a", 4) == 1 })
			rep.Close()
			c, _, ans := rawCopy(t, recv.Addr(), frame{Kind: kindCopy, Job: testJob, Node: "node-a", Rank: 4, Step: 2, Seq: 2, Length: n})
			if ans.Kind != kindAccept {
				t.Fatalf("answer %d (%s), want accept", ans.Kind, ans.Msg)
			}
			if _, err := c.Write(tc.write); err != nil {
				t.Fatal(err)
			}
			_ = c.Close()
			waitFor(t, "the partial copy discarded", func() bool { return rev.count(EventReplicaDiscarded) == 1 })
			cp := recv.Copy("node-a", 4)
			if cp == nil || cp.Seq != 1 || cp.Step != 1 {
				t.Fatalf("after a partial copy the buddy holds %+v, want the complete copy of seq 1", cp)
			}
			checkPattern(t, Desc{Seq: cp.Seq, Step: cp.Step, Length: uint64(len(cp.Payload))}, cp.Payload)
			waitFor(t, "the partial copy's memory released", func() bool { return recv.Held() == n })
		})
	}
}

// TestReplicaChecksumMismatch: a copy corrupted on the wire (a byte
// flipped after it was checksummed) is discarded, with an event on both
// sides, and never becomes the complete copy.
func TestReplicaChecksumMismatch(t *testing.T) {
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 1, 100<<10)
	recv, rev := startReceiver(t, ReceiverOptions{})
	var flip atomic.Bool
	flip.Store(true)
	rep, sev := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{corrupt: func(p []byte) {
		if flip.Load() {
			p[len(p)/2] ^= 0x40
		}
	}})
	waitFor(t, "the corrupt copy discarded", func() bool { return rev.with(EventReplicaDiscarded, "checksum mismatch") > 0 })
	waitFor(t, "the sender told", func() bool { return sev.with(EventReplicaFailed, "checksum mismatch") > 0 })
	if c := recv.Copy("node-a", 4); c != nil {
		t.Fatalf("a corrupt copy was kept: seq %d", c.Seq)
	}
	if rep.Status()[0].Sent[0] != 0 {
		t.Fatal("the sender counts the corrupt copy as sent")
	}
	flip.Store(false)
	waitFor(t, "a clean copy after the corruption stops", func() bool { return copySeq(recv, "node-a", 4) == 1 })
}

// TestReplicaSlowBuddyBounded: a buddy reading at a trickle makes a copy
// fail at the sender's per-copy bound, never later; the saves made
// meanwhile are not queued but coalesce into one copy of the newest.
func TestReplicaSlowBuddyBounded(t *testing.T) {
	const n = 256 << 10
	dir := t.TempDir()
	saveRank(t, dir, 0, 4, 1, n)
	var slow atomic.Bool
	recv, rev := startReceiver(t, ReceiverOptions{slowRead: func() {
		if slow.Load() {
			time.Sleep(50 * time.Millisecond) // 1 KiB per 50 ms: 12.8 s for the copy
		}
	}})
	const bound = 400 * time.Millisecond
	rep, sev := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{CopyTimeout: bound})
	waitFor(t, "the first copy", func() bool { return copySeq(recv, "node-a", 4) == 1 })
	slow.Store(true)
	for step := int64(2); step <= 6; step++ {
		start := time.Now()
		saveRank(t, dir, 0, 4, step, n)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("a save took %s while the buddy was slow", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitFor(t, "a copy cut at the bound", func() bool { return sev.with(EventReplicaFailed, "not done within "+bound.String()) > 0 })
	waitFor(t, "the buddy to drop the cut copy", func() bool { return rev.count(EventReplicaDiscarded) > 0 })
	sev.mu.Lock()
	for _, f := range sev.got {
		// The bound plus a margin of 10× the bound for a loaded machine,
		// still far below the 12.8 s an unbounded copy would take.
		if f["event"] == EventReplicaFailed && time.Duration(f["elapsed_ms"].(float64))*time.Millisecond > 11*bound {
			t.Errorf("a copy failed after %v ms, past its %s bound: %v", f["elapsed_ms"], bound, f["error"])
		}
	}
	sev.mu.Unlock()
	if copySeq(recv, "node-a", 4) != 1 {
		t.Fatal("a cut copy replaced the complete one")
	}
	slow.Store(false)
	waitFor(t, "the newest save at the buddy", func() bool { return copySeq(recv, "node-a", 4) == 6 })
	// The buddy holds the copy before the sender has read its verdict.
	waitFor(t, "the sender to count the newest copy", func() bool { return sev.count(EventReplicaSent) >= 2 })
	if n := sev.count(EventReplicaSent); n != 2 {
		t.Fatalf("%d copies sent, want 2 (seq 1, then seq 6 with 2-5 coalesced)", n)
	}
	if f := sev.last(EventReplicaSent); f["skipped"] != float64(4) {
		t.Fatalf("the last copy coalesced %v saves, want 4", f["skipped"])
	}
	if st := rep.Status()[0]; st.Skipped != 4 {
		t.Fatalf("status: %d saves skipped, want 4", st.Skipped)
	}
	// The buddy holds one copy: the in-flight ones were released.
	waitFor(t, "only the complete copy held", func() bool { return recv.Held() == n })
}

// TestReplicaMemoryRefused: a copy that does not fit the buddy's budget
// (from MemAvailable at the first copy, or MaxBytes) is refused with an
// error naming the sizes; the sender stops sending that rank (it relies on
// files) and says so.
func TestReplicaMemoryRefused(t *testing.T) {
	const n = 1 << 20
	cases := []struct {
		name    string
		avail   uint64
		max     uint64
		refused bool
	}{
		{"MemAvailable too small", 1 << 20, 0, true},
		{"MaxBytes too small", 1 << 40, n - 1, true},
		{"fits", 1 << 40, 2 * n, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			saveRank(t, dir, 0, 4, 1, n)
			recv, rev := startReceiver(t, ReceiverOptions{MaxBytes: tc.max, memAvailable: func() (uint64, error) { return tc.avail, nil }})
			rep, sev := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{})
			if !tc.refused {
				waitFor(t, "the copy", func() bool { return copySeq(recv, "node-a", 4) == 1 })
				return
			}
			waitFor(t, "the refusal", func() bool { return sev.with(EventReplicaRefused, "over its budget") == 1 })
			if rev.with(EventReplicaRefused, "relies on the files") != 1 {
				t.Fatal("the buddy did not record its refusal")
			}
			st := rep.Status()[0]
			if !strings.Contains(st.Refused[0], "1048576 bytes") {
				t.Fatalf("refusal %q does not name the copy's size", st.Refused[0])
			}
			// The refused rank is not offered again.
			saveRank(t, dir, 0, 4, 2, n)
			rep.Notify()
			time.Sleep(300 * time.Millisecond)
			if recv.Copy("node-a", 4) != nil || recv.Held() != 0 || sev.count(EventReplicaRefused) != 1 {
				t.Fatalf("after the refusal: copy %v, %d bytes held, %d refusals", recv.Copy("node-a", 4), recv.Held(), sev.count(EventReplicaRefused))
			}
		})
	}
}

// TestReplicaPeerMismatch: a peer of another job or protocol version is
// refused with a clear error; a stranger (bad magic) is dropped.
func TestReplicaPeerMismatch(t *testing.T) {
	recv, _ := startReceiver(t, ReceiverOptions{})
	cases := []struct {
		name string
		f    frame
		want string
	}{
		{"other job", frame{Kind: kindCopy, Job: "job-2", Node: "n", Length: 1}, `job "job-2"`},
		{"other version", frame{Version: 9, Kind: kindCopy, Job: testJob, Node: "n", Length: 1}, "version 9"},
		{"fetch of another job", frame{Kind: kindFetch, Job: "job-2", Node: "n"}, `job "job-2"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, ans := rawCopy(t, recv.Addr(), tc.f)
			if ans.Kind != kindRefuse || !strings.Contains(ans.Msg, tc.want) {
				t.Fatalf("answer kind %d %q, want a refusal naming %q", ans.Kind, ans.Msg, tc.want)
			}
		})
	}
	t.Run("bad magic", func(t *testing.T) {
		c, err := net.Dial("tcp", recv.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := frame{Kind: kindCopy, Job: testJob}.encode(nil)
		copy(b, "HTTP")
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("a stranger's connection got an answer")
		}
	})
	t.Run("sender of another job", func(t *testing.T) {
		dir := t.TempDir()
		saveRank(t, dir, 0, 4, 1, 1000)
		rep, sev := startSender(t, dir, 1, recv.Addr(), ReplicatorOptions{Job: "job-2"})
		waitFor(t, "the refusal", func() bool { return sev.with(EventReplicaRefused, `peer belongs to job "job-2"`) == 1 })
		if rep.Status()[0].Refused[0] == "" {
			t.Fatal("the sender's status does not show the refusal")
		}
	})
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// TestReplicaOneInFlight: a sender that reconnects while its previous
// stream is still open (dead but not yet noticed) supersedes it: the buddy
// closes the old stream and never holds two copies in flight for one
// (node, rank).
func TestReplicaOneInFlight(t *testing.T) {
	const n = 32 << 10
	recv, rev := startReceiver(t, ReceiverOptions{})
	h := frame{Kind: kindCopy, Job: testJob, Node: "node-a", Rank: 4, Step: 1, Seq: 1, Length: n}
	old, oldR, ans := rawCopy(t, recv.Addr(), h)
	if ans.Kind != kindAccept {
		t.Fatalf("first copy: answer %d (%s)", ans.Kind, ans.Msg)
	}
	if _, err := old.Write(pattern(1, n)[:n/2]); err != nil {
		t.Fatal(err)
	}
	h.Step, h.Seq = 2, 2
	c, br, ans := rawCopy(t, recv.Addr(), h)
	if ans.Kind != kindAccept {
		t.Fatalf("second copy: answer %d (%s)", ans.Kind, ans.Msg)
	}
	if got := recv.Held(); got != n {
		t.Fatalf("%d bytes held with two streams of %d bytes open, want %d (one in flight)", got, n, n)
	}
	_ = old.SetReadDeadline(time.Now().Add(20 * time.Second))
	if _, err := oldR.ReadByte(); err == nil {
		t.Fatal("the superseded stream got an answer instead of being closed")
	}
	p := pattern(2, n)
	if _, err := c.Write(append(p, trailer(crc32.Checksum(p, castagnoli), trailerComplete)...)); err != nil {
		t.Fatal(err)
	}
	if rep, err := readFrame(br, nil); err != nil || rep.Kind != kindOK {
		t.Fatalf("verdict %+v, %v; want ok", rep, err)
	}
	if cp := recv.Copy("node-a", 4); cp == nil || cp.Seq != 2 {
		t.Fatalf("the buddy holds %+v, want seq 2", cp)
	}
	waitFor(t, "the superseded stream discarded", func() bool { return rev.count(EventReplicaDiscarded) == 1 })
	if got := recv.Held(); got != n {
		t.Fatalf("%d bytes held after the copy, want %d", got, n)
	}
}
