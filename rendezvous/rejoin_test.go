package rendezvous

import (
	"context"
	"errors"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEtcdRejoinGate: with nnodes 2:3, a restart round waits for a previous
// active node that is slow to come back (a slow rank stop, simulated by
// delaying its Next) instead of promoting the standby after LastCall; the
// RejoinWait bound still closes the round without it.
func TestEtcdRejoinGate(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	tests := []struct {
		name       string
		delay      time.Duration // before the slow active calls Next
		rejoinWait time.Duration
		keepsSlot  bool // the slow node is still active with its group rank
	}{
		{"slow active keeps its rank", 2 * time.Second, 20 * time.Second, true},
		{"bound expires: standby takes the slot", 3 * time.Second, time.Second, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := &cluster{t: t, ep: m.Endpoint(), run: strings.ReplaceAll(t.Name(), "/", "_")}
			for i := 0; i < 3; i++ {
				o := c.opts(i, 2, 2, 3, 3)
				o.RejoinWait = tc.rejoinWait
				c.add(o)
			}
			as := nextAll(t, c.nodes)
			checkConsistent(t, as, 2, 2)
			slow, fast, standby := -1, -1, -1
			for i, a := range as {
				switch {
				case a.Standby:
					standby = i
				case slow < 0:
					slow = i
				default:
					fast = i
				}
			}
			if standby < 0 || fast < 0 {
				t.Fatalf("want 2 active + 1 standby: %+v", as)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			got := make([]Assignment, 3)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			next := func(i int, delay time.Duration) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					select {
					case <-time.After(delay):
					case <-ctx.Done():
					}
					got[i], errs[i] = c.nodes[i].Next(ctx)
				}()
			}
			next(standby, 0) // the standby is already waiting for round 1
			if d, err := c.nodes[fast].Fail(ctx, 0, policy.RankCrash, "rank exited 1"); err != nil || !d.Restart {
				t.Fatalf("Fail: %+v %v", d, err)
			}
			next(fast, 0)
			next(slow, tc.delay)
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("node %d Next: %v", i, err)
				}
			}
			checkConsistent(t, got, 2, 2)
			if got[0].Round != 1 {
				t.Fatalf("round %d, want 1", got[0].Round)
			}
			if got[fast].Standby || got[fast].GroupRank != as[fast].GroupRank {
				t.Fatalf("fast active moved: round 0 %+v, round 1 %+v", as[fast], got[fast])
			}
			if tc.keepsSlot {
				if got[slow].Standby || got[slow].GroupRank != as[slow].GroupRank || !got[standby].Standby {
					t.Fatalf("slow active demoted: round 0 %+v, round 1 slow %+v standby %+v", as[slow], got[slow], got[standby])
				}
				return
			}
			if !got[slow].Standby || got[standby].Standby || got[standby].GroupRank != as[slow].GroupRank {
				t.Fatalf("after RejoinWait the standby should take rank %d: slow %+v standby %+v", as[slow].GroupRank, got[slow], got[standby])
			}
		})
	}
}

// TestEtcdRunIDReuse: a job that closed does not block a new job with the
// same run id (a new generation starts), and a node of the closed
// generation that is still alive keeps seeing its own job's close.
func TestEtcdRunIDReuse(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	old := []*Etcd{c.add(c.opts(0, 1, 2, 2, 3)), c.add(c.opts(1, 1, 2, 2, 3))}
	lingering := c.add(c.opts(2, 1, 2, 2, 3)) // alive in generation 0, never joins a round
	nextAll(t, old)
	if err := old[0].Shutdown(context.Background(), verdict.NoRestart, 93, "workload asked to stop"); err != nil {
		t.Fatal(err)
	}
	if g := lingering.Generation(); g != 0 {
		t.Fatalf("first job generation %d, want 0", g)
	}

	// A second job with the same run id, while the old processes still run.
	job2 := []*Etcd{c.add(c.opts(3, 1, 2, 2, 3)), c.add(c.opts(4, 1, 2, 2, 3))}
	for i, n := range job2 {
		if g := n.Generation(); g != 1 {
			t.Fatalf("second job node %d generation %d, want 1", i, g)
		}
	}
	as := nextAll(t, job2)
	checkConsistent(t, as, 1, 2)
	if as[0].Round != 0 {
		t.Fatalf("second job starts at round %d, want 0", as[0].Round)
	}

	// The old generation's node exits with its own job's code and cannot
	// touch the new job.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var ce *JobClosedError
	if _, err := lingering.Next(ctx); !errors.As(err, &ce) || ce.Code != 93 || ce.Reason != "workload asked to stop" {
		t.Fatalf("old node Next: %v, want the old job's close (93)", err)
	}
	if d, err := old[1].Fail(ctx, 0, policy.RankCrash, "late failure"); err != nil || d.Restart || d.Code != 93 {
		t.Fatalf("old node Fail: %+v %v, want the old close", d, err)
	}
	if err := old[1].Shutdown(ctx, verdict.NoRestart, 5, "old node shuts down"); err != nil {
		t.Fatal(err)
	}
	end := job2[0].Ended(0)
	assertNoEnd(t, end, 500*time.Millisecond)

	for i, code := range succeedAll(t, job2, 0) {
		if code != 0 {
			t.Fatalf("second job node %d code %d", i, code)
		}
	}
	// Only the old close record is left of generation 0.
	resp, err := job2[0].cli.Get(ctx, c.nodes[0].rk.gen(0).base, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || !strings.HasSuffix(string(resp.Kvs[0].Key), "/ctl/closed") {
		t.Fatalf("generation 0 keys left: %d", len(resp.Kvs))
	}

	// A third job: generation 2, and generation 0 is gone entirely.
	job3 := []*Etcd{c.add(c.opts(5, 1, 2, 2, 3)), c.add(c.opts(6, 1, 2, 2, 3))}
	if g := job3[0].Generation(); g != 2 {
		t.Fatalf("third job generation %d, want 2", g)
	}
	checkConsistent(t, nextAll(t, job3), 1, 2)
	resp, err = job3[0].cli.Get(ctx, c.nodes[0].rk.gen(0).base, clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("generation 0 keys after generation 2 started: %v %v", resp, err)
	}
}
