package rendezvous

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestSpeedRecords: each node's sample is one key, overwritten each
// interval, read back in one range; the result is one key; both go with
// the writer's lease, and a sample over the bound is refused.
func TestSpeedRecords(t *testing.T) {
	srv := startEmbedded(t)
	c := newCluster(t, srv.Endpoint(), 2, 1, 2, 2, 3)
	nextAll(t, c.nodes)
	ctx := context.Background()
	for i, n := range c.nodes {
		for _, v := range []string{"old", "new"} {
			if err := n.PublishSpeed(ctx, 0, []byte(v+string(rune('a'+i)))); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, err := c.nodes[1].Speeds(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for _, g := range got {
		s = append(s, string(g))
	}
	slices.Sort(s)
	if !slices.Equal(s, []string{"newa", "newb"}) {
		t.Fatalf("speeds %q, want each node's latest", s)
	}
	if r, err := c.nodes[0].SpeedResult(ctx, 0); err != nil || r != nil {
		t.Fatalf("result before any: %q %v", r, err)
	}
	if err := c.nodes[0].PublishSpeedResult(ctx, 0, []byte("r")); err != nil {
		t.Fatal(err)
	}
	if r, err := c.nodes[1].SpeedResult(ctx, 0); err != nil || string(r) != "r" {
		t.Fatalf("result %q %v, want r", r, err)
	}
	if err := c.nodes[0].PublishSpeed(ctx, 0, []byte(strings.Repeat("x", maxSpeedRecord+1))); err == nil {
		t.Fatal("an oversized sample was accepted")
	}
}
