package rendezvous

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/ledger"
	"github.com/ftlauncher/ft-launcher/ledger/etcdstore"
	"github.com/ftlauncher/ft-launcher/policy"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEtcdLossLedgerRecordedOnce: a lost node's open ledger leases are
// ended by the txn that ends the round, exactly once however many
// survivors report the loss at once, at the very revision of the round's
// end (so the record cannot be missing once the round ended, even if the
// node that wrote it dies right after), and only the writer's RoundEnd
// carries the records; every node's RoundEnd names the writer, so no
// survivor writes the ledger again.
func TestEtcdLossLedgerRecordedOnce(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	for i := 0; i < 4; i++ {
		o := c.opts(i, 1, 3, 3, 2) // three actives and one spare
		o.DisableGossip = true
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var victim *Etcd
	var survivors []*Etcd
	for i, a := range as {
		n := c.nodes[i]
		b := ledger.NewBook(c.run, n.NodeID(), "", func(err error) { t.Error(err) }, n.LedgerStore())
		if a.Standby {
			b.Begin(ctx, ledger.Spare, -1, a.Round)
			b.Begin(ctx, ledger.Filler, -1, a.Round)
		} else {
			b.Begin(ctx, ledger.Active, a.GroupRank, a.Round)
		}
		if !a.Standby && a.GroupRank == 1 {
			victim = n
		} else {
			survivors = append(survivors, n)
		}
	}
	if victim == nil || len(survivors) != 3 {
		t.Fatalf("assignments %+v", as)
	}
	ends := make([]<-chan RoundEnd, len(survivors))
	for i, n := range survivors {
		ends[i] = n.Ended(0)
	}
	crash(victim)
	// Every survivor reports the loss at once (as their gossip would).
	var wg sync.WaitGroup
	for _, n := range survivors {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.round(0).nodeLost(victim.NodeID(), "gossip")
		}()
	}
	wg.Wait()

	writer := ""
	withRecs := 0
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndRestart || e.Node != victim.NodeID() || e.Cause != policy.NodeLost {
			t.Fatalf("survivor %d: end %+v, want a restart for the loss of %s", i, e, victim.NodeID())
		}
		if e.LedgerBy == "" || (writer != "" && e.LedgerBy != writer) {
			t.Fatalf("survivor %d: ledger written by %q, others saw %q", i, e.LedgerBy, writer)
		}
		writer = e.LedgerBy
		if len(e.Ledger) > 0 {
			withRecs++
			if survivors[i].NodeID() != writer {
				t.Errorf("survivor %d (%s) got the ledger records; %s wrote them", i, survivors[i].NodeID(), writer)
			}
			if r := e.Ledger[0]; len(e.Ledger) != 1 || r.Node != victim.NodeID() || r.Role != ledger.Active || r.Reason != ledger.NodeFailure || r.ClosedBy != writer {
				t.Errorf("writer's records %+v", e.Ledger)
			}
		}
	}
	if withRecs != 1 {
		t.Fatalf("%d survivors got the ledger records, want 1", withRecs)
	}

	cli := survivors[0].cli
	key := etcdstore.NodePrefix(etcdstore.LedgerBase(survivors[0].k.base), victim.NodeID()) + "1"
	resp, err := cli.Txn(ctx).Then(clientv3.OpGet(key), clientv3.OpGet(survivors[0].k.round())).Commit()
	if err != nil {
		t.Fatal(err)
	}
	lk := resp.Responses[0].GetResponseRange().Kvs
	rk := resp.Responses[1].GetResponseRange().Kvs
	if len(lk) != 1 || len(rk) != 1 {
		t.Fatalf("ledger key %s or round key missing: %v %v", key, lk, rk)
	}
	var rec ledger.Record
	if err := json.Unmarshal(lk[0].Value, &rec); err != nil {
		t.Fatal(err)
	}
	if rec.Reason != ledger.NodeFailure || rec.ClosedBy != writer || rec.Open() {
		t.Errorf("lost node's lease %+v, want ended NodeFailure by %s", rec, writer)
	}
	if lk[0].Version != 2 {
		t.Errorf("lost node's lease written %d times after its start, want exactly 1", lk[0].Version-1)
	}
	if lk[0].ModRevision != rk[0].ModRevision || string(rk[0].Value) != "1" {
		t.Errorf("ledger record at revision %d, round %s opened at %d: want the same txn", lk[0].ModRevision, rk[0].Value, rk[0].ModRevision)
	}
	// The survivors' own leases are untouched.
	for _, n := range survivors {
		r, err := cli.Get(ctx, etcdstore.NodePrefix(etcdstore.LedgerBase(n.k.base), n.NodeID()), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range r.Kvs {
			if kv.Version != 1 {
				t.Errorf("survivor's lease %s written %d times", kv.Key, kv.Version)
			}
		}
	}
}
