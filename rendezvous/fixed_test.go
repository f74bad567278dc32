package rendezvous

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEtcdFixedAllocationShortOfNodes: in a fixed allocation a
// restart round short of MIN live nodes with no spare closes the job with
// kind not_enough_nodes after MinNodesWait (plus the lease TTL for a node
// that died without a word), long before JoinTimeout; a node that comes
// back in time keeps the job going.
func TestEtcdFixedAllocationShortOfNodes(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	const wait = 2 * time.Second
	tests := []struct {
		name      string
		act       string // what happens to the victim
		wantCause policy.Failure
	}{
		{"stopped node", "depart", policy.NodeStopped},
		{"crashed node", "crash", policy.NodeLost},
		{"stalled node back in time", "stall", policy.NodeLost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &cluster{t: t, ep: m.Endpoint(), run: strings.ReplaceAll(t.Name(), "/", "_")}
			for i := 0; i < 3; i++ {
				o := c.opts(i, 1, 3, 3, 3)
				o.FixedAllocation, o.MinNodesWait, o.JoinTimeout = true, wait, 10*time.Minute
				o.DisableGossip = true // the loss is reported by lease expiry or the test
				c.add(o)
			}
			nextAll(t, c.nodes)
			survivors, victim := c.nodes[:2], c.nodes[2]
			ends := []<-chan RoundEnd{survivors[0].Ended(0), survivors[1].Ended(0)}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			switch tc.act {
			case "depart":
				if err := victim.Depart(ctx, "SIGTERM"); err != nil {
					t.Fatal(err)
				}
			case "crash":
				crash(victim)
			case "stall": // declared lost while its lease lives on; back at once
				survivors[0].round(0).nodeLost(victim.NodeID(), "gossip")
			}
			start := time.Now()
			for i, ch := range ends {
				if e := waitEnd(t, ch, 15*time.Second); e.Kind != EndRestart || e.Cause != tc.wantCause {
					t.Fatalf("survivor %d: %+v, want a restart with cause %s", i, e, tc.wantCause)
				}
			}
			next := []<-chan nextResult{nextAsync(t, survivors[0]), nextAsync(t, survivors[1])}
			if tc.act == "stall" {
				next = append(next, nextAsync(t, victim))
				for _, ch := range next {
					if r := recvNext(t, ch); r.err != nil || r.a.Round != 1 {
						t.Fatalf("round 1 with the node back: %+v %v", r.a, r.err)
					}
				}
				return
			}
			for i, ch := range next {
				var ce *JobClosedError
				r := recvNext(t, ch)
				if !errors.As(r.err, &ce) || ce.Kind != verdict.NotEnoughNodes || ce.Code != 1 || !strings.Contains(ce.Reason, "min_nodes_wait") {
					t.Fatalf("survivor %d Next: %v, want the job closed with not_enough_nodes", i, r.err)
				}
			}
			took := time.Since(start)
			if bound := wait + 2*c.nodes[0].o.LeaseTTL + 5*time.Second; took > bound {
				t.Fatalf("closed %v after the loss, want within %v", took, bound)
			}
			t.Logf("closed with not_enough_nodes %v after the round ended", took)
		})
	}
}

// TestEtcdFixedAllocationConfirmedLossNotCounted: a launcher
// that died alone keeps its alive key until its lease expires, but its
// loss was confirmed (the round's end records its death): it does not
// count as alive, so the job closes with not_enough_nodes min_nodes_wait
// after the round ended, not a lease TTL later.
func TestEtcdFixedAllocationConfirmedLossNotCounted(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	const wait, ttl = time.Second, 20 * time.Second
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	for i := 0; i < 2; i++ {
		o := c.opts(i, 1, 2, 2, 3)
		o.FixedAllocation, o.MinNodesWait, o.JoinTimeout, o.LeaseTTL = true, wait, 10*time.Minute, ttl
		o.DisableGossip = true // the loss is reported by the test, as the stream connections do
		c.add(o)
	}
	nextAll(t, c.nodes)
	survivor, victim := c.nodes[0], c.nodes[1]
	ended := survivor.Ended(0)
	crash(victim) // its lease (and alive key) stays for ttl
	survivor.round(0).nodeLost(victim.NodeID(), "stream")
	if e := waitEnd(t, ended, 15*time.Second); e.Kind != EndRestart {
		t.Fatalf("round 0 end %+v, want a restart", e)
	}
	start := time.Now()
	var ce *JobClosedError
	r := recvNext(t, nextAsync(t, survivor))
	if !errors.As(r.err, &ce) || ce.Kind != verdict.NotEnoughNodes || !strings.Contains(ce.Reason, "only 1 of the 2 nodes") {
		t.Fatalf("Next: %+v %v, want the job closed with not_enough_nodes, 1 of 2 nodes left", r.a, r.err)
	}
	if took := time.Since(start); took > ttl/2 {
		t.Fatalf("closed %v after the round ended, want well within the lease TTL %v (the dead node's alive key counted)", took, ttl)
	} else {
		t.Logf("closed with not_enough_nodes %v after the round ended (lease TTL %v)", took, ttl)
	}
}
