package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// TestEtcdStallPastTTLRestartsOnce freezes Debian's etcd (SIGSTOP: a VM
// pause, a long fsync) for longer than the lease TTL while two active nodes
// and a standby run round 0. Every node fences; when etcd resumes it
// expires every lease (a stalled etcd does not extend them as a restarted
// one does), so every node's report of its fence finds its membership gone
// and no loss watcher is left to end round 0. The round is then orphaned,
// and a node that finds it so must end it: every node gets round 1, having
// spent one restart, and no write of round 0 succeeds once round 1 began.
func TestEtcdStallPastTTLRestartsOnce(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	for _, tc := range []struct {
		name  string
		stall time.Duration
		nodes int // the first two are active, the rest standbys
	}{
		{"2xTTL", 4 * time.Second, 2},
		{"6xTTL with a standby", 12 * time.Second, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startEtcdProc(t)
			c := &cluster{t: t, ep: p.clientURL, run: strings.ReplaceAll(t.Name(), "/", "_")}
			for i := 0; i < tc.nodes; i++ {
				o := c.opts(i, 1, 2, tc.nodes, 3)
				o.EtcdLossBound = time.Minute // the fence acts here, not the loss bound
				c.add(o)
			}
			as := nextAll(t, c.nodes)
			checkConsistent(t, as, 1, 2)
			// The standby (if any) waits for round 1 like an agent does.
			var wg sync.WaitGroup
			got := make([]Assignment, len(c.nodes))
			errs := make([]error, len(c.nodes))
			ctx, cancel := context.WithTimeout(context.Background(), tc.stall+90*time.Second)
			defer cancel()
			ttl := c.nodes[0].o.LeaseTTL
			for i, n := range c.nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if !as[i].Standby {
						// The agent: wait for the fence, report it, rejoin.
						select {
						case e := <-n.Ended(0):
							if e.Kind != EndFenced {
								errs[i] = fmt.Errorf("round 0 end %+v, want EndFenced", e)
								return
							}
						case <-ctx.Done():
							errs[i] = errors.New("no fence of round 0")
							return
						}
						d, err := n.Fail(ctx, 0, policy.NodeStopped, "fenced")
						if err != nil || !d.Restart {
							errs[i] = fmt.Errorf("report the fence: %+v, %v", d, err)
							return
						}
					}
					got[i], errs[i] = n.Next(ctx)
				}()
			}
			// The standby (if any) is registered for round 1 and the
			// actives know each other by gossip before etcd stalls.
			var actives []*Etcd
			for i, n := range c.nodes {
				if as[i].Standby {
					waitRegistered(t, n, 1)
				} else {
					actives = append(actives, n)
				}
			}
			waitGossip(t, actives...)
			if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					_ = p.cmd.Process.Signal(syscall.SIGCONT)
				}
			}
			t.Cleanup(resume)
			time.Sleep(tc.stall)
			resume()
			back := time.Now()
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("node %d after a %v etcd stall (TTL %v): %v", i, tc.stall, ttl, err)
				}
			}
			t.Logf("round 1 assigned on every node %v after etcd resumed", time.Since(back).Round(time.Millisecond))
			checkConsistent(t, got, 1, 2)
			// Every lease expired (the stall is longer than the TTL), so no
			// fenced node's report could end round 0: the orphan rule did.
			if le, ok := c.nodes[0].view.lastEnd(0); !ok || !strings.Contains(le.Reason, "orphaned") || le.Cause != policy.NodeStopped {
				t.Fatalf("round 0's end %+v (seen %v): want the orphaned round's, cause node_stopped", le, ok)
			} else {
				t.Logf("round 0 ended: %s", le.Reason)
			}
			if got[0].Round != 1 || got[0].RestartsUsed != 1 {
				t.Fatalf("after the stall: round %d with %d restarts used, want round 1 with 1", got[0].Round, got[0].RestartsUsed)
			}
			// Fencing holds: round 0 is over for good; a late write of it
			// (a report, a done marker) changes nothing.
			for i, n := range c.nodes {
				d, err := n.Fail(context.Background(), 0, policy.RankCrash, "late")
				if err != nil || !d.Restart || !strings.Contains(d.Reason, "superseded") {
					t.Fatalf("node %d: a late report of round 0: %+v, %v; want superseded", i, d, err)
				}
			}
			for i, code := range succeedAll(t, c.nodes, 1) {
				if code != 0 {
					t.Fatalf("node %d: code %d after the stall", i, code)
				}
			}
		})
	}
}

// TestEtcdStallOrphanCountedWithoutWatchers: the stall outlasts the TTL
// and the round's three loss watchers (group ranks 0-2) die during it
// (their leases are left to expire), so only group rank 3, a node that
// only counts, is left to see round 0 orphaned: it must end it.
func TestEtcdStallOrphanCountedWithoutWatchers(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	p := startEtcdProc(t)
	c := &cluster{t: t, ep: p.clientURL, run: t.Name()}
	for i := 0; i < 4; i++ {
		o := c.opts(i, 1, 4, 4, 3)
		o.EtcdLossBound = time.Minute
		o.DisableGossip = true // no gossip verdicts: the leases alone speak
		c.add(o)
	}
	as := nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 4)
	var last *Etcd
	for i, a := range as {
		if a.GroupRank == 3 {
			last = c.nodes[i]
		}
	}
	fenced := last.Ended(0)
	// Every node holds its membership of round 0 at etcd before the stall:
	// their going with the leases is what the orphan count sees.
	for _, n := range c.nodes {
		waitRegistered(t, n, 0)
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			_ = p.cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	t.Cleanup(resume)
	for _, n := range c.nodes {
		if n != last {
			crash(n) // the watchers die with etcd away: their leases expire
		}
	}
	if e := waitEnd(t, fenced, 10*time.Second); e.Kind != EndFenced {
		t.Fatalf("group rank 3: round 0 end %+v, want EndFenced", e)
	}
	time.Sleep(2 * last.o.LeaseTTL)
	resume()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if d, err := last.Fail(ctx, 0, policy.NodeStopped, "fenced"); err != nil || !d.Restart {
		t.Fatalf("report the fence: %+v, %v", d, err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := last.Next(ctx) // round 1 cannot close (1 of 4 nodes): it waits
		done <- err
	}()
	waitFor := time.Now().Add(30 * time.Second)
	for {
		if le, ok := last.view.lastEnd(0); ok {
			if !strings.Contains(le.Reason, "orphaned") {
				t.Fatalf("round 0 ended %+v, want the orphaned round's end", le)
			}
			t.Logf("round 0 ended: %s", le.Reason)
			break
		}
		if time.Now().After(waitFor) {
			t.Fatal("round 0 not ended within 30 s of etcd's return")
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
}

// TestOrphaned is the orphan rule's table: a round is orphaned when some
// active node has not finished and none of those holds its membership.
func TestOrphaned(t *testing.T) {
	set := func(ids ...string) map[string]bool {
		m := map[string]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	for _, tc := range []struct {
		name                   string
		actives, present, done map[string]bool
		want                   bool
	}{
		{"every active holds its membership", set("a", "b"), set("a", "b"), set(), false},
		{"one active left, one holds on (its loss watchers or its report end the round)", set("a", "b"), set("b"), set(), false},
		{"every active's membership gone", set("a", "b"), set(), set(), true},
		{"only a standby's membership left", set("a", "b"), set("s"), set(), true},
		{"the one still present finished; the other is gone", set("a", "b"), set("a"), set("a"), true},
		{"every active finished (the last done marker closes the job)", set("a", "b"), set(), set("a", "b"), false},
		{"no active known", set(), set(), set(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := orphaned(tc.actives, tc.present, tc.done); got != tc.want {
				t.Fatalf("orphaned(%v, %v, %v) = %v, want %v", tc.actives, tc.present, tc.done, got, tc.want)
			}
		})
	}
}
