package rendezvous

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// TestEtcdRestartWindowAndDelay: the job's restart window and delay live
// in its stored config (the first node's win); each counted restart's
// time is written with ctl/restarts (so the end txn's fence covers it);
// the delay reaches both the reporter (Decision.Delay) and the other
// node (RoundEnd.Delay); a restart within the window counts.
func TestEtcdRestartWindowAndDelay(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	const window, delay = time.Hour, 1500 * time.Millisecond
	c := &cluster{t: t, ep: m.Endpoint(), run: strings.ReplaceAll(t.Name(), "/", "_")}
	for i := range 2 {
		o := c.opts(i, 1, 2, 2, 1)
		if i == 0 {
			o.RestartWindow, o.RestartDelay = window, delay
		} // node 1 proposes none: the job's (node 0's) apply
		c.add(o)
	}
	ctx := context.Background()
	nextAll(t, c.nodes)

	// Round 0: node 1's rank crashes; the one restart is spent, with the delay.
	end := c.nodes[0].Ended(0)
	d, err := c.nodes[1].Fail(ctx, 0, policy.RankCrash, "rank 1 exited with code 1")
	if err != nil || !d.Restart || d.RestartsUsed != 1 || d.Delay != delay {
		t.Fatalf("Fail in round 0: %+v %v; want a restart with the job's delay %v", d, err, delay)
	}
	if e := waitEnd(t, end, 10*time.Second); e.Kind != EndRestart || e.Delay != delay {
		t.Fatalf("node 0's end of round 0: %+v, want the delay %v", e, delay)
	}
	resp, err := c.nodes[0].parts.cli.Get(ctx, c.nodes[0].parts.k.restartTimes())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("ctl/restart-times: %v %v", resp, err)
	}
	var times []time.Time
	if err := json.Unmarshal(resp.Kvs[0].Value, &times); err != nil || len(times) != 1 {
		t.Fatalf("ctl/restart-times = %s (%v), want one time", resp.Kvs[0].Value, err)
	}

	// Round 1, at once: the restart is within the window, the budget is spent.
	nextAll(t, c.nodes)
	d, err = c.nodes[0].Fail(ctx, 1, policy.RankCrash, "rank 0 exited with code 1")
	if err != nil || d.Restart || d.Close != verdict.RestartBudgetExhausted || !strings.Contains(d.Reason, "1 of 1 restarts used within 1h0m0s") {
		t.Fatalf("Fail in round 1 within the window: %+v %v; want the budget exhausted", d, err)
	}
}

// TestEtcdRestartWindowForgets: a restart older than the window no longer
// counts, so a job with --max-restarts 1 survives a second failure that
// comes after it.
func TestEtcdRestartWindowForgets(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	const window = 500 * time.Millisecond
	c := &cluster{t: t, ep: m.Endpoint(), run: strings.ReplaceAll(t.Name(), "/", "_")}
	for i := range 2 {
		o := c.opts(i, 1, 2, 2, 1)
		o.RestartWindow = window
		c.add(o)
	}
	ctx := context.Background()
	nextAll(t, c.nodes)
	d, err := c.nodes[1].Fail(ctx, 0, policy.RankCrash, "rank 1 exited with code 1")
	if err != nil || !d.Restart || d.Delay != 0 {
		t.Fatalf("Fail in round 0: %+v %v", d, err)
	}
	nextAll(t, c.nodes)
	time.Sleep(window + 200*time.Millisecond) // the first restart leaves the window
	d, err = c.nodes[0].Fail(ctx, 1, policy.RankCrash, "rank 0 exited with code 1")
	if err != nil || !d.Restart || d.RestartsUsed != 2 {
		t.Fatalf("Fail in round 1 after the window: %+v %v; want a restart (2 spent in all)", d, err)
	}
}
