package rendezvous

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/policy"
)

// TestFenceDeadline checks the fence arithmetic: a renewal sent at s for
// which etcd granted ttl seconds is certainly valid until s+ttl, and the
// node fences FenceMargin before that; a gone lease is valid never.
func TestFenceDeadline(t *testing.T) {
	s := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		ttl       int64
		margin    time.Duration
		wantValid time.Time
		wantFence time.Time
	}{
		{"default 6 s TTL, 1.2 s margin", 6, 1200 * time.Millisecond, s.Add(6 * time.Second), s.Add(4800 * time.Millisecond)},
		{"2 s TTL, 400 ms margin", 2, 400 * time.Millisecond, s.Add(2 * time.Second), s.Add(1600 * time.Millisecond)},
		{"etcd granted less than asked", 3, time.Second, s.Add(3 * time.Second), s.Add(2 * time.Second)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := LeaseValidUntil(s, tc.ttl)
			if !v.Equal(tc.wantValid) {
				t.Fatalf("LeaseValidUntil(s, %d) = %v, want %v", tc.ttl, v, tc.wantValid)
			}
			if f := FenceDeadline(v, tc.margin); !f.Equal(tc.wantFence) {
				t.Fatalf("FenceDeadline = %v, want %v", f, tc.wantFence)
			}
		})
	}
	for _, ttl := range []int64{0, -1} {
		if v := LeaseValidUntil(s, ttl); !v.IsZero() {
			t.Errorf("LeaseValidUntil(s, %d) = %v, want zero (lease gone)", ttl, v)
		}
	}
}

// TestFenceMarginOption checks the default margin and the refusal of one
// that leaves no room for a renewal.
func TestFenceMarginOption(t *testing.T) {
	base := EtcdOptions{Endpoints: []string{"http://127.0.0.1:1"}, RunID: "r", NodeID: "n", NProcPerNode: 1, MinNodes: 1, MaxNodes: 1}
	for _, tc := range []struct {
		name    string
		ttl     time.Duration
		margin  time.Duration
		want    time.Duration
		wantErr string
	}{
		{"default TTL and margin", 0, 0, 1200 * time.Millisecond, ""},
		{"margin follows the TTL", 10 * time.Second, 0, 2 * time.Second, ""},
		{"explicit margin", 5 * time.Second, 1500 * time.Millisecond, 1500 * time.Millisecond, ""},
		{"margin of half the TTL", 5 * time.Second, 2500 * time.Millisecond, 0, "fence margin 2.5s must be below half the lease TTL 5s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.LeaseTTL, o.FenceMargin = tc.ttl, tc.margin
			err := o.defaults()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("defaults() = %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || o.FenceMargin != tc.want {
				t.Fatalf("defaults() = %v, margin %v; want nil, %v", err, o.FenceMargin, tc.want)
			}
		})
	}
}

// renewals records a node's OnLeaseRenewed calls.
type renewals struct {
	mu   sync.Mutex
	last time.Time
	n    int
}

func (r *renewals) record(v time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if v.Before(r.last) {
		panic("OnLeaseRenewed went backwards")
	}
	r.last, r.n = v, r.n+1
}

func (r *renewals) get() (time.Time, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.n
}

// TestEtcdFencesBeforeLeaseCanExpire freezes the real etcd server
// (SIGSTOP: connections stay up, nothing answers) while two nodes run a
// round: each must deliver EndFenced for the round strictly before the
// instant its last renewal proved the lease valid until (OnLeaseRenewed),
// and no earlier than the fence margin before it.
func TestEtcdFencesBeforeLeaseCanExpire(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: strings.ReplaceAll(t.Name(), "/", "_")}
	recs := []*renewals{{}, {}}
	for i := range recs {
		o := c.opts(i, 1, 2, 2, 3)
		o.OnLeaseRenewed = recs[i].record
		o.EtcdLossBound = time.Minute // the fence, not the loss bound, acts here
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 2)
	ends := []<-chan RoundEnd{c.nodes[0].Ended(0), c.nodes[1].Ended(0)}
	time.Sleep(time.Second) // a few renewals
	for i, r := range recs {
		if _, n := r.get(); n < 2 {
			t.Fatalf("node %d: %d renewals reported in the first second and more", i, n)
		}
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })
	frozen := time.Now()
	margin := c.nodes[0].o.FenceMargin
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		at := time.Now()
		valid, _ := recs[i].get()
		if e.Kind != EndFenced || e.Round != 0 || !strings.Contains(e.Reason, "fenced") {
			t.Fatalf("node %d: end %+v, want EndFenced for round 0", i, e)
		}
		if !at.Before(valid) {
			t.Errorf("node %d fenced at %v, not before its lease's proven validity %v", i, at, valid)
		}
		if at.Before(valid.Add(-margin - 50*time.Millisecond)) {
			t.Errorf("node %d fenced at %v, earlier than the fence deadline %v", i, at, valid.Add(-margin))
		}
		if r, _, ok := c.nodes[i].Fenced(); !ok || r != 0 {
			t.Errorf("node %d: Fenced() = %d, %v; want round 0", i, r, ok)
		}
		t.Logf("node %d fenced %v after etcd froze, %v before its lease could expire", i, at.Sub(frozen).Round(time.Millisecond), valid.Sub(at).Round(time.Millisecond))
	}
}

// TestEtcdGossipLossWaitsForLeaseExpiry: a node that gossip declares dead
// (its memberlist shut down without a leave, its stream listener closed so
// that the stream check cannot overrule gossip) but whose lease is still
// renewed ends no round; once its lease is no longer renewed, the round
// ends only after the lease's proven validity has passed, with the loss
// named as seen by gossip and confirmed by the lease.
func TestEtcdGossipLossWaitsForLeaseExpiry(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: strings.ReplaceAll(t.Name(), "/", "_")}
	var rec renewals
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 3, 3, 3)
		if i == 2 {
			o.OnLeaseRenewed = rec.record
		}
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 3)
	victim := c.nodes[2]
	ends := []<-chan RoundEnd{c.nodes[0].Ended(0), c.nodes[1].Ended(0)}
	waitGossip(t, c.nodes...) // the peers know the victim by gossip before it goes silent
	// ... and hold their watch connections to its stream port: a watcher
	// that first dials after the listener closed is refused, which is a
	// loss by the stream path, not the gossip one this test is about.
	settle(t, "the victim watched by both peers", func() string {
		victim.loss.mu.Lock()
		s := victim.loss.stream
		victim.loss.mu.Unlock()
		s.mu.Lock()
		defer s.mu.Unlock()
		if n := len(s.conns); n < 2 {
			return fmt.Sprintf("%d watch connections held", n)
		}
		return ""
	})
	victim.stopGossip(false)
	victim.loss.mu.Lock()
	victim.loss.stream.ln.Close() // new dials are refused; held connections stay (no EOF, no refused redial)
	victim.loss.mu.Unlock()
	silent := time.Now()

	// Gossip declares it dead within its bound (about a second here); its
	// lease (TTL 2 s) is renewed all along, so no round may end.
	hold := victim.o.Gossip.Bound(3) + 2*victim.o.LeaseTTL + time.Second
	select {
	case e := <-ends[0]:
		t.Fatalf("node 0: round ended while the victim's lease was renewed: %+v", e)
	case e := <-ends[1]:
		t.Fatalf("node 1: round ended while the victim's lease was renewed: %+v", e)
	case <-time.After(hold):
	}
	if c.nodes[0].loss.alive(victim.o.NodeID) {
		t.Fatalf("gossip still holds the victim alive %v after it went silent: the test proves nothing", time.Since(silent))
	}

	// Its lease is no longer renewed: it ends when the lease expires.
	crash(victim)
	crashed := time.Now()
	for i, ch := range ends {
		e := waitEnd(t, ch, 3*victim.o.LeaseTTL+10*time.Second)
		at := time.Now()
		valid, _ := rec.get()
		if e.Kind != EndRestart || e.Node != victim.o.NodeID || !strings.Contains(e.Reason, "lease expired") {
			t.Fatalf("node %d: end %+v, want a restart for the victim's expired lease", i, e)
		}
		if !at.After(valid) {
			t.Fatalf("node %d: round ended at %v, before the victim's lease could expire (valid until %v)", i, at, valid)
		}
		t.Logf("node %d: round ended %v after the lease stopped being renewed (%v after its proven validity): %s",
			i, at.Sub(crashed).Round(time.Millisecond), at.Sub(valid).Round(time.Millisecond), e.Reason)
	}
}

// TestRejoinWaitsForProof: a node whose lease still holds at etcd but whose
// last renewal is older than its fence deadline (back from a freeze or a
// cut shorter than the TTL, before the keep-alive loop renewed) waits for a
// renewal before it registers for the next round. Registering at once got
// it assigned and fenced at its assignment (fenceIfUnproven): the new round
// ended too, two restarts for one stall (TestStalledNodeCostsOneRestart
// once the default TTL outlasted its 5 s freeze).
func TestRejoinWaitsForProof(t *testing.T) {
	c := embeddedJob(t)
	// A renewal every 3 s: the stale proof below outlives the registration.
	const ttl = 9 * time.Second
	recs := []*renewals{{}, {}}
	for i := range recs {
		o := c.opts(i, 1, 2, 2, 3)
		o.LeaseTTL = ttl
		o.OnLeaseRenewed = recs[i].record
		c.add(o)
	}
	nextAll(t, c.nodes)
	x := c.nodes[1]
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.nodes[0].Fail(ctx, 0, policy.RankCrash, "rank 0 exited with code 1"); err != nil {
		t.Fatal(err)
	}
	// Right after a renewal of node 1 (the next is 3 s away), its proof is
	// made stale: as after a freeze, valid at etcd but not proven now.
	_, n0 := recs[1].get()
	waitFor(t, "a renewal of node 1's lease", func() bool { _, n := recs[1].get(); return n != n0 })
	x.sess.mu.Lock()
	x.sess.validTill = time.Now().Add(x.o.FenceMargin - time.Millisecond)
	x.sess.mu.Unlock()
	_, before := recs[1].get()

	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 2)
	if _, n := recs[1].get(); n == before {
		t.Errorf("node 1 registered for round %d before a renewal proved its lease valid", as[1].Round)
	}
	select {
	case e := <-x.Ended(as[1].Round):
		t.Fatalf("node 1's round %d ended at its assignment: %+v (want it running on a proven lease)", as[1].Round, e)
	case <-time.After(2 * time.Second):
	}
	if r, _, ok := x.Fenced(); ok {
		t.Errorf("node 1 fenced out of round %d", r)
	}
}
