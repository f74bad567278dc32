package etcdstore

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/internal/etcdtest"
	"github.com/ftlauncher/ft-launcher/ledger"
)

func client(t *testing.T) *clientv3.Client {
	t.Helper()
	srv := etcdtest.Start(t)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Against a real etcd: two nodes keep their books in one store; several
// survivors race to record the lost node; exactly one wins; Discover,
// List and Watch see it all.
func TestStoreWithRealEtcd(t *testing.T) {
	cli := client(t)
	ctx := context.Background()
	if _, err := cli.Put(ctx, "/ft-launcher/job/generation", "2"); err != nil {
		t.Fatal(err)
	}
	st, gen, err := Discover(ctx, cli, "/ft-launcher", "job")
	if err != nil || gen != 2 {
		t.Fatalf("discover: gen %d, %v", gen, err)
	}
	_, rev0, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []ledger.Record
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() {
		watched <- st.Watch(wctx, rev0, func(r ledger.Record) {
			mu.Lock()
			seen = append(seen, r)
			mu.Unlock()
		})
	}()

	lost := ledger.NewBook("job", "10.0.0.2/7", "n2", func(err error) { t.Error(err) }, st)
	lost.Begin(ctx, ledger.Active, 1, 0)
	spare := ledger.NewBook("job", "10.0.0.4/9", "n4", func(err error) { t.Error(err) }, st)
	spare.Begin(ctx, ledger.Spare, -1, 0)

	// Three survivors race to record the loss.
	var wg sync.WaitGroup
	wins := make(chan string, 3)
	for _, id := range []string{"10.0.0.1/5", "10.0.0.3/6", "10.0.0.5/8"} {
		wg.Add(1)
		go func(id string) {
			defer wg.Done()
			r, closed, err := st.CloseOpen(ctx, "10.0.0.2/7", ledger.NodeFailure, "lost (gossip)", id, time.Now().UTC())
			if err != nil {
				t.Error(err)
			}
			if closed {
				if r.Reason != ledger.NodeFailure || r.ClosedBy != id {
					t.Errorf("closed record %+v", r)
				}
				wins <- id
			}
		}(id)
	}
	wg.Wait()
	close(wins)
	if n := len(wins); n != 1 {
		t.Fatalf("%d survivors recorded the loss, want exactly 1", n)
	}
	spare.End(ctx, ledger.Spare, ledger.Swap, "promoted to group rank 1")
	spare.Begin(ctx, ledger.Active, 1, 1)

	recs, _, err := st.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("records %+v", recs)
	}
	ledger.SortByChange(recs)
	want := []struct {
		node   string
		role   ledger.Role
		reason ledger.Reason
	}{{"10.0.0.2/7", ledger.Active, ledger.NodeFailure}, {"10.0.0.4/9", ledger.Spare, ledger.Swap}, {"10.0.0.4/9", ledger.Active, ""}}
	for i, w := range want {
		if recs[i].Node != w.node || recs[i].Role != w.role || recs[i].Reason != w.reason {
			t.Errorf("record %d: %+v, want %+v", i, recs[i], w)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(seen)
		mu.Unlock()
		if n >= 5 { // 2 begins, 1 close, 1 swap, 1 begin
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("watch saw %d changes, want 5", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	<-watched
	// Closing again finds nothing open.
	if _, closed, err := st.CloseOpen(ctx, "10.0.0.2/7", ledger.NodeFailure, "", "x", time.Now()); err != nil || closed {
		t.Fatalf("second close: %v %v", closed, err)
	}
}

func TestDiscoverUnknownRun(t *testing.T) {
	cli := client(t)
	if _, _, err := Discover(context.Background(), cli, "/ft-launcher/", "nope"); err == nil {
		t.Fatal("want an error for a run id with no job")
	}
}
