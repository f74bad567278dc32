package rendezvous

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// portHook records the rounds it is asked about and answers a port per
// node and round, as the agent store's Port does.
type portHook struct {
	mu     sync.Mutex
	base   int
	rounds []int
	err    error
}

func (p *portHook) port(round int) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rounds = append(p.rounds, round)
	return p.base + round, p.err
}

// TestLocalMasterPortHook: with no fixed port the round's MASTER_PORT is
// the hook's, asked with the round number; a fixed port never asks it; a
// hook error fails Next and names the round.
func TestLocalMasterPortHook(t *testing.T) {
	ctx := context.Background()
	h := &portHook{base: 40000}
	l := NewLocal("run", 2, 3, "127.0.0.1", 0).WithMasterPort(h.port)
	for r := 0; r < 3; r++ {
		a, err := l.Next(ctx)
		if err != nil || a.MasterPort != 40000+r || a.MasterAddr != "127.0.0.1" {
			t.Fatalf("round %d: %+v, %v", r, a, err)
		}
		if _, err := l.Fail(ctx, r, policy.RankCrash, "boom"); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(h.rounds, []int{0, 1, 2}) {
		t.Fatalf("hook asked for rounds %v", h.rounds)
	}

	fixed := &portHook{base: 40000}
	a, err := NewLocal("run", 2, 3, "127.0.0.1", 29500).WithMasterPort(fixed.port).Next(ctx)
	if err != nil || a.MasterPort != 29500 || len(fixed.rounds) != 0 {
		t.Fatalf("fixed port: %+v, %v; hook asked %v", a, err, fixed.rounds)
	}

	bad := &portHook{err: errors.New("listen tcp 127.0.0.1:0: too many open files")}
	if _, err := NewLocal("run", 2, 3, "127.0.0.1", 0).WithMasterPort(bad.port).Next(ctx); err == nil ||
		!strings.Contains(err.Error(), "master port for round 0") || !strings.Contains(err.Error(), "too many open files") {
		t.Fatalf("hook error: %v", err)
	}
}

// TestEtcdMasterPortHook: each node advertises the hook's port when it
// registers for a round, and the round's MASTER_PORT is group rank 0's;
// group rank 0 alone gets the round's node addresses (NodeAddrs).
func TestEtcdMasterPortHook(t *testing.T) {
	testenv.SkipShort(t, "runs an etcd server")
	m := startEmbedded(t)
	c := &cluster{t: t, ep: m.Endpoint(), run: t.Name()}
	hooks := make([]*portHook, 2)
	for i := range hooks {
		hooks[i] = &portHook{base: 41000 + 100*i}
		o := c.opts(i, 1, 2, 2, 3)
		o.MasterPort = hooks[i].port
		c.add(o)
	}
	for round := 0; round < 2; round++ {
		as := nextAll(t, c.nodes)
		checkConsistent(t, as, 1, 2)
		for i, a := range as {
			if a.GroupRank != 0 {
				if a.NodeAddrs != nil {
					t.Fatalf("round %d: node %d (group rank %d) got the node list %v, only group rank 0 needs it", round, i, a.GroupRank, a.NodeAddrs)
				}
				continue
			}
			// Group rank 0 gets the round's nodes, for its store's allowlist.
			if !slices.Equal(a.NodeAddrs, []string{"127.0.0.2", "127.0.0.3"}) {
				t.Fatalf("round %d: group rank 0's node list %v, want [127.0.0.2 127.0.0.3]", round, a.NodeAddrs)
			}
			want := hooks[i].base + round
			if a.Round != round || a.MasterPort != want || a.MasterAddr != fmt.Sprintf("127.0.0.%d", i+2) {
				t.Fatalf("round %d: group rank 0 is node %d, master %s:%d, want port %d", round, i, a.MasterAddr, a.MasterPort, want)
			}
		}
		if round == 0 {
			ended := c.nodes[0].Ended(0)
			if _, err := c.nodes[1].Fail(context.Background(), 0, policy.RankCrash, "boom"); err != nil {
				t.Fatal(err)
			}
			waitEnd(t, ended, 10*time.Second)
		}
	}
	for i, h := range hooks {
		h.mu.Lock()
		if !slices.Equal(h.rounds, []int{0, 1}) {
			t.Errorf("node %d: hook asked for rounds %v, want [0 1]", i, h.rounds)
		}
		h.mu.Unlock()
	}
}
