package rendezvous

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/policy"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEtcdStallEndsOneRound: a node frozen for about the lease
// TTL is declared lost by gossip, which ends round 0; it comes back and
// joins round 1. Its old lease then expiring must not end round 1 too.
// Gossip is simulated (the survivor reports the loss and records the death
// as its gossip callback does) so the order of events is fixed.
func TestEtcdStallEndsOneRound(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 3, 3, 1)
		o.DisableGossip = true
		c.add(o)
	}
	nextAll(t, c.nodes)
	survivor, victim := c.nodes[0], c.nodes[2]
	oldLease := victim.sess.current()
	ends := make([]<-chan RoundEnd, 3)
	for i, n := range c.nodes {
		ends[i] = n.Ended(0)
	}
	survivor.round(0).nodeLost(victim.NodeID(), "gossip")
	survivor.markDead(victim.NodeID())
	for i, ch := range ends {
		if e := waitEnd(t, ch, 10*time.Second); e.Kind != EndRestart || e.Node != victim.NodeID() || e.Cause != policy.NodeLost {
			t.Fatalf("node %d: round 0 end %+v, want a restart naming the lost node %s", i, e, victim.NodeID())
		}
	}

	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 3)
	if as[0].Round != 1 || as[0].RestartsUsed != 1 {
		t.Fatalf("round after the loss: %+v, want round 1 with 1 restart used", as[0])
	}
	if victim.sess.current() == oldLease {
		t.Fatal("the node declared lost rejoined on the lease it had when it was lost")
	}
	for i, n := range c.nodes {
		ends[i] = n.Ended(1)
	}
	// The old incarnation's lease goes (it expires, or was revoked): only
	// keys of round 0 may go with it. Watch the new lease outlive its TTL.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := victim.cli.Revoke(ctx, oldLease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("revoke the old lease: %v", err)
	}
	cancel()
	for _, ch := range ends {
		assertNoEnd(t, ch, 2*victim.o.LeaseTTL)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := victim.cli.Get(ctx, victim.k.dead(victim.NodeID()), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("death record of the returned node: %v %v, want none (later restart rounds wait for it again)", resp, err)
	}
	for i, code := range succeedAll(t, c.nodes, 1) {
		if code != 0 {
			t.Fatalf("node %d: code %d after the stall", i, code)
		}
	}
}
