package rendezvous

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestShareStacks: two nodes of a round publish their summaries; each
// gets both once both are in, and a summary the caller does not accept
// as current (an earlier judgement's) is not counted: alone, a node waits
// the bound and says the exchange is incomplete.
func TestShareStacks(t *testing.T) {
	srv := startEmbedded(t)
	c := newCluster(t, srv.Endpoint(), 2, 1, 2, 2, 3)
	nextAll(t, c.nodes)
	all := func(b []byte) bool { return true }
	type result struct {
		got      [][]byte
		complete bool
		err      error
	}
	res := make([]result, 2)
	done := make(chan int, 2)
	for i, mine := range []string{"a", "b"} {
		go func() {
			got, complete, err := c.nodes[i].ShareStacks(context.Background(), 0, []byte(mine), 5*time.Second, all)
			res[i] = result{got, complete, err}
			done <- i
		}()
	}
	<-done
	<-done
	for i, r := range res {
		var s []string
		for _, g := range r.got {
			s = append(s, string(g))
		}
		slices.Sort(s)
		if r.err != nil || !r.complete || !slices.Equal(s, []string{"a", "b"}) {
			t.Errorf("node %d: %v complete %v err %v; want a and b, complete", i, s, r.complete, r.err)
		}
	}
	// A later judgement: node 1's old summary is not current; node 0
	// waits its bound and returns its own alone.
	onlyNew := func(b []byte) bool { return string(b) != "b" }
	start := time.Now()
	got, complete, err := c.nodes[0].ShareStacks(context.Background(), 0, []byte("a2"), 300*time.Millisecond, onlyNew)
	if err != nil || complete || len(got) != 1 || string(got[0]) != "a2" {
		t.Errorf("alone: %q complete %v err %v; want a2 alone, incomplete", got, complete, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("alone: waited %v, bound 300 ms", took)
	}
	if _, _, err := c.nodes[0].ShareStacks(context.Background(), 0, make([]byte, maxStacksSummary+1), time.Second, all); err == nil {
		t.Error("an oversized summary was published")
	}
}
