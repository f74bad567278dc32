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

// standbyCluster starts 3 nodes with nnodes 2:3 (two actives, one standby)
// and returns the cluster, round 0's assignments and the indexes of the
// master, the other active and the standby.
func standbyCluster(t *testing.T, ep string, maxRestarts int, gossip bool) (c *cluster, as []Assignment, master, other, standby int) {
	t.Helper()
	c = &cluster{t: t, ep: ep, run: strings.ReplaceAll(t.Name(), "/", "_")}
	for i := 0; i < 3; i++ {
		o := c.opts(i, 1, 2, 3, maxRestarts)
		o.DisableGossip = !gossip
		c.add(o)
	}
	as = nextAll(t, c.nodes)
	checkConsistent(t, as, 1, 2)
	master, other, standby = -1, -1, -1
	for i, a := range as {
		switch {
		case a.Standby:
			standby = i
		case a.GroupRank == 0:
			master = i
		default:
			other = i
		}
		if a.RestartsUsed != 0 || a.MaxRestarts != maxRestarts {
			t.Fatalf("round 0 node %d: %+v", i, a)
		}
	}
	if master < 0 || other < 0 || standby < 0 {
		t.Fatalf("want 2 actives and a standby: %+v", as)
	}
	return c, as, master, other, standby
}

// settleStandbyCluster waits until the standby of a standbyCluster, whose
// Next runs in background, is registered for round 1 and the two actives
// know each other by gossip (with gossip on): what happens to one of them
// next is then seen as in a running job.
func settleStandbyCluster(t *testing.T, c *cluster, master, other, standby int) {
	t.Helper()
	waitRegistered(t, c.nodes[standby], 1)
	waitGossip(t, c.nodes[master], c.nodes[other])
}

type nextResult struct {
	a   Assignment
	err error
}

// nextAsync runs Next on n in background.
func nextAsync(t *testing.T, n *Etcd) <-chan nextResult {
	ch := make(chan nextResult, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a, err := n.Next(ctx)
		ch <- nextResult{a, err}
	}()
	return ch
}

func recvNext(t *testing.T, ch <-chan nextResult) nextResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(40 * time.Second):
		t.Fatal("Next did not return")
	}
	return nextResult{}
}

// TestEtcdRestartPolicy: every failure kind goes through policy.Decide
// with the job's restart count from etcd: a lost or excluded active is
// replaced by the standby without spending a restart (even with
// --max-restarts 0); a rank crash restarts in place, spends a restart and
// never takes the spare; a close carries its typed kind to every node,
// the standby included.
func TestEtcdRestartPolicy(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	tests := []struct {
		name        string
		maxRestarts int
		gossip      bool
		act         string // what happens to the non-master active ("victim") or is done by the master
		wantCause   policy.Failure
		wantClose   verdict.Kind // "" when a round 1 opens
		wantCode    int
		wantUsed    int  // RestartsUsed of round 1
		promoted    bool // the standby is active in round 1
	}{
		{"node lost (gossip), max-restarts 0: standby promoted", 0, true, "crash", policy.NodeLost, "", 0, 0, true},
		{"node lost (lease expiry), max-restarts 0: standby promoted", 0, false, "crash", policy.NodeLost, "", 0, 0, true},
		{"node excluded, max-restarts 0: standby promoted", 0, true, "leave", policy.NodeExcluded, "", 0, 0, true},
		{"node stopped (Depart), max-restarts 0: standby promoted", 0, true, "depart", policy.NodeStopped, "", 0, 0, true},
		{"node stopped (Depart, lease only), max-restarts 0: standby promoted", 0, false, "depart", policy.NodeStopped, "", 0, 0, true},
		{"rank crash, max-restarts 1: restart in place, spare kept", 1, true, "fail", policy.RankCrash, "", 0, 1, false},
		{"rank crash, max-restarts 0: budget exhausted despite a spare", 0, true, "fail", policy.RankCrash, verdict.RestartBudgetExhausted, 1, 0, false},
		{"no-restart request", 3, true, "no-restart", policy.NoRestartRequest, verdict.NoRestart, NoRestartExitCode, 0, false},
		{"shutdown kind reaches every node", 3, true, "shutdown", "", verdict.FatalError, 4, 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, as, master, victim, standby := standbyCluster(t, m.Endpoint(), tc.maxRestarts, tc.gossip)
			sbc := nextAsync(t, c.nodes[standby]) // the standby waits for round 1
			end := c.nodes[master].Ended(0)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			settleStandbyCluster(t, c, master, victim, standby)
			if tc.act == "fail" || tc.act == "no-restart" {
				f := map[string]policy.Failure{"fail": policy.RankCrash, "no-restart": policy.NoRestartRequest}[tc.act]
				d, err := c.nodes[victim].Fail(ctx, 0, f, "rank 1 exited 1")
				if err != nil {
					t.Fatal(err)
				}
				if d.Restart != (tc.wantClose == "") || d.Close != tc.wantClose || d.RestartsUsed != tc.wantUsed {
					t.Fatalf("Fail decision %+v", d)
				}
			} else {
				policyAct(t, ctx, c.nodes[victim], tc.act)
			}
			e := waitEnd(t, end, 15*time.Second)
			if e.Cause != tc.wantCause {
				t.Fatalf("master's end cause %q, want %q: %+v", e.Cause, tc.wantCause, e)
			}
			if tc.wantClose != "" {
				if e.Kind != EndJobClosed || e.Close != tc.wantClose || e.Code != tc.wantCode {
					t.Fatalf("master's end %+v, want close %s code %d", e, tc.wantClose, tc.wantCode)
				}
				var ce *JobClosedError
				if r := recvNext(t, sbc); !errors.As(r.err, &ce) || ce.Kind != tc.wantClose || ce.Code != tc.wantCode {
					t.Fatalf("standby Next: %v, want JobClosedError %s code %d", r.err, tc.wantClose, tc.wantCode)
				}
				return
			}
			if e.Kind != EndRestart {
				t.Fatalf("master's end %+v, want a restart", e)
			}
			if tc.act == "leave" && !strings.Contains(e.Reason, "GPU 2 unhealthy") {
				t.Fatalf("exclusion reason lost: %+v", e)
			}
			if want := "node " + c.nodes[victim].NodeID() + " stopped: SIGTERM"; tc.act == "depart" && (!strings.Contains(e.Reason, want) || e.Node != c.nodes[victim].NodeID()) {
				t.Fatalf("departure: %+v, want a reason with %q", e, want)
			}
			next := []<-chan nextResult{nextAsync(t, c.nodes[master]), sbc}
			if tc.act == "fail" {
				next = append(next, nextAsync(t, c.nodes[victim]))
			}
			got := recvRound(t, next, 1, tc.wantUsed)
			if sb := got[1]; sb.Standby == tc.promoted {
				t.Fatalf("standby in round 1: %+v, promoted %v wanted", sb, tc.promoted)
			} else if tc.promoted && sb.GroupRank != as[victim].GroupRank {
				t.Fatalf("standby took group rank %d, want the lost node's %d", sb.GroupRank, as[victim].GroupRank)
			}
			if got[0].GroupRank != 0 {
				t.Fatalf("master moved: %+v", got[0])
			}
		})
	}
}

// recvRound collects the Next results of round want, checks they agree and
// carry the restart count used.
func recvRound(t *testing.T, next []<-chan nextResult, want, used int) []Assignment {
	t.Helper()
	var got []Assignment
	for _, ch := range next {
		r := recvNext(t, ch)
		if r.err != nil {
			t.Fatalf("round %d Next: %v", want, r.err)
		}
		got = append(got, r.a)
	}
	checkConsistent(t, got, 1, 2)
	for _, a := range got {
		if a.Round != want || a.RestartsUsed != used {
			t.Fatalf("round %d: %+v, want RestartsUsed %d", want, a, used)
		}
	}
	return got
}

// policyAct does to victim what a TestEtcdRestartPolicy case names (other
// than a Fail): crash it, make it leave or depart, or shut the job down.
func policyAct(t *testing.T, ctx context.Context, victim *Etcd, act string) {
	t.Helper()
	switch act {
	case "crash":
		crash(victim)
	case "leave":
		if err := victim.Leave(ctx, "ExcludeThisNode: GPU 2 unhealthy"); err != nil {
			t.Fatal(err)
		}
	case "depart":
		own := victim.Ended(0)
		if err := victim.Depart(ctx, "SIGTERM"); err != nil {
			t.Fatal(err)
		}
		if e := waitEnd(t, own, 5*time.Second); e.Kind != EndJobClosed || e.Close != verdict.Signaled || e.Cause != policy.NodeStopped {
			t.Fatalf("departed node's own end %+v, want closed (signaled, node_stopped)", e)
		}
		if _, err := victim.Next(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Depart: %v, want ErrClosed", err)
		}
	case "shutdown":
		if err := victim.Shutdown(ctx, verdict.FatalError, 4, "ranks could not start"); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown act %q", act)
	}
}

// TestEtcdRestartsCountedApartFromRounds: a swap opens a round without
// spending a restart, so rounds and restarts diverge; the budget is the
// restart count, and its exhaustion closes the job on every node.
func TestEtcdRestartsCountedApartFromRounds(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c, _, master, victim, standby := standbyCluster(t, m.Endpoint(), 1, true)
	sbc := nextAsync(t, c.nodes[standby])
	end := c.nodes[master].Ended(0)
	settleStandbyCluster(t, c, master, victim, standby)
	crash(c.nodes[victim])
	if e := waitEnd(t, end, 15*time.Second); e.Kind != EndRestart || e.Cause != policy.NodeLost {
		t.Fatalf("end of round 0: %+v", e)
	}
	r1 := recvNext(t, nextAsync(t, c.nodes[master]))
	s1 := recvNext(t, sbc)
	if r1.err != nil || s1.err != nil {
		t.Fatalf("round 1: %v %v", r1.err, s1.err)
	}
	nodes := []*Etcd{c.nodes[master], c.nodes[standby]}
	for i, a := range []Assignment{r1.a, s1.a} {
		if a.Round != 1 || a.RestartsUsed != 0 || a.Standby {
			t.Fatalf("node %d round 1 after a swap: %+v", i, a)
		}
	}

	// A rank crash now spends the one restart: round 2, one restart used.
	d, err := nodes[1].Fail(context.Background(), 1, policy.RankCrash, "rank exited 1")
	if err != nil || !d.Restart || d.Action != policy.RestartInPlace || d.RestartsUsed != 1 {
		t.Fatalf("Fail in round 1: %+v %v", d, err)
	}
	as := nextAll(t, nodes)
	for i, a := range as {
		if a.Round != 2 || a.RestartsUsed != 1 {
			t.Fatalf("node %d round 2: %+v", i, a)
		}
	}

	// The next crash finds the budget spent: the job closes everywhere.
	ends := []<-chan RoundEnd{nodes[0].Ended(2), nodes[1].Ended(2)}
	d, err = nodes[0].Fail(context.Background(), 2, policy.RankHang, "rank 0 hung")
	if err != nil || d.Restart || d.Close != verdict.RestartBudgetExhausted || d.Code != 1 || d.RestartsUsed != 1 {
		t.Fatalf("Fail in round 2: %+v %v", d, err)
	}
	for i, ch := range ends {
		e := waitEnd(t, ch, 10*time.Second)
		if e.Kind != EndJobClosed || e.Close != verdict.RestartBudgetExhausted || e.Cause != policy.RankHang || e.Reason != d.Reason {
			t.Fatalf("node %d: %+v, want close %s", i, e, verdict.RestartBudgetExhausted)
		}
	}
	// A late report of the same round gets the winner's outcome.
	if d, err := nodes[1].Fail(context.Background(), 2, policy.RankCrash, "late"); err != nil || d.Close != verdict.RestartBudgetExhausted {
		t.Fatalf("late Fail: %+v %v", d, err)
	}
}

// TestEtcdQuarantine: a node the job replaced with a spare, or that left
// with evidence, may not come back as a new launcher on the same address;
// a node stopped by a signal may.
func TestEtcdQuarantine(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	tests := []struct {
		name        string
		act         string
		quarantined bool
	}{
		{"lost and replaced by the spare", "crash", true},
		{"left (ExcludeThisNode)", "leave", true},
		{"stopped by a signal", "depart", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, _, master, victim, standby := standbyCluster(t, m.Endpoint(), 0, true)
			sbc := nextAsync(t, c.nodes[standby])
			end := c.nodes[master].Ended(0)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			settleStandbyCluster(t, c, master, victim, standby)
			switch tc.act {
			case "crash":
				crash(c.nodes[victim])
			case "leave":
				if err := c.nodes[victim].Leave(ctx, "ExcludeThisNode: GPU 2 unhealthy"); err != nil {
					t.Fatal(err)
				}
			case "depart":
				if err := c.nodes[victim].Depart(ctx, "SIGTERM"); err != nil {
					t.Fatal(err)
				}
			}
			if e := waitEnd(t, end, 15*time.Second); e.Kind != EndRestart {
				t.Fatalf("master's end %+v", e)
			}
			mc := nextAsync(t, c.nodes[master])
			for _, ch := range []<-chan nextResult{mc, sbc} {
				if r := recvNext(t, ch); r.err != nil || r.a.Standby {
					t.Fatalf("round 1: %+v %v", r.a, r.err)
				}
			}
			// The victim's address comes back as a new launcher.
			o := c.opts(victim, 1, 2, 3, 0)
			o.NodeID = nodeAddr(o.NodeID) + "/again"
			back := c.add(o)
			if tc.quarantined {
				// It parks: no round until the job ends, then the job's close.
				bc := nextAsync(t, back)
				select {
				case r := <-bc:
					t.Fatalf("a quarantined node got %+v %v instead of parking", r.a, r.err)
				case <-time.After(time.Second):
				}
				if err := c.nodes[master].Shutdown(ctx, verdict.Succeeded, 0, "done"); err != nil {
					t.Fatal(err)
				}
				r := recvNext(t, bc)
				var ce *JobClosedError
				if !errors.Is(r.err, ErrQuarantined) || !errors.As(r.err, &ce) || ce.Kind != verdict.Succeeded ||
					ce.Quarantine == nil || !strings.Contains(ce.Quarantine.Error(), "cannot become active again") {
					t.Fatalf("parked node: %+v %v, want the job's close with the quarantine", r.a, r.err)
				}
				return
			}
			a, err := back.Next(ctx)
			if err != nil || !a.Standby {
				t.Fatalf("a node stopped by a signal came back: %+v %v, want a standby", a, err)
			}
		})
	}
}
