package rendezvous

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The tests wait for the condition a step needs (a peer known to gossip, a
// node registered in etcd), never for a while in the hope that it holds: on
// a loaded machine any fixed pause is sometimes too short.

// settleWithin bounds each wait below: generous, as a machine running the
// whole suite at load 20 schedules a launcher's goroutines seconds late.
const settleWithin = 60 * time.Second

// settle polls cond until it holds, failing the test with what after
// settleWithin; cond returns "" once satisfied, else what is still missing.
func settle(t testing.TB, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(settleWithin)
	for {
		missing := cond()
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, settleWithin, missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitGossip waits until the gossip view of each of nodes holds every other
// one alive, so that a crash among them is gossip's to see (a peer its
// detector never knew is only noticed when its lease expires). Nodes
// without gossip (DisableGossip) are left out.
func waitGossip(t *testing.T, nodes ...*Etcd) {
	t.Helper()
	settle(t, "gossip converged", func() string {
		var missing []string
		for _, n := range nodes {
			if n.o.DisableGossip {
				continue
			}
			alive := map[string]bool{}
			for _, m := range n.loss.members() {
				alive[m.Name] = m.State == memberlist.StateAlive
			}
			for _, p := range nodes {
				if p != n && !p.o.DisableGossip && !alive[p.o.NodeID] {
					missing = append(missing, fmt.Sprintf("%s does not hold %s alive", n.o.NodeID, p.o.NodeID))
				}
			}
		}
		return strings.Join(missing, "; ")
	})
}

// waitRegistered waits until n's membership of round r is in etcd: n, whose
// Next runs in background, is registered and waits for the round.
func waitRegistered(t *testing.T, n *Etcd, r int) {
	t.Helper()
	waitKey(t, n, n.k.member(r, n.o.NodeID), fmt.Sprintf("node %s registered in round %d", n.o.NodeID, r))
}

// waitDone waits until n's done marker of round r is in etcd: n's Succeed,
// running in background, waits for the other nodes.
func waitDone(t *testing.T, n *Etcd, r int) {
	t.Helper()
	waitKey(t, n, n.k.done(r, n.o.NodeID), fmt.Sprintf("node %s done in round %d", n.o.NodeID, r))
}

// waitKey waits until key exists in etcd, read through n's client.
func waitKey(t *testing.T, n *Etcd, key, what string) {
	t.Helper()
	settle(t, what, func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := n.cli.Get(ctx, key, clientv3.WithCountOnly())
		switch {
		case err != nil:
			return fmt.Sprintf("read %s: %v", key, err)
		case resp.Count == 0:
			return "no key " + key
		}
		return ""
	})
}
