package agentstore

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/rendezvous"

	"github.com/ftlauncher/ft-launcher/internal/testenv"
)

// debianPython is Debian's interpreter with python3-torch (the python3
// first on PATH may be another one).
const debianPython = "/usr/bin/python3"

// torchSet sets key=value in the store at port with torch 1.13's own
// TCPStore client, as a rank with TORCHELASTIC_USE_AGENT_STORE=True does.
func torchSet(t *testing.T, port int, key string) {
	t.Helper()
	prog := `import sys, datetime
from torch.distributed import TCPStore
s = TCPStore("127.0.0.1", int(sys.argv[1]), None, False, datetime.timedelta(seconds=30))
s.set(sys.argv[2], b"v")
assert s.get(sys.argv[2]) == b"v"
`
	if out, err := exec.Command(debianPython, "-c", prog, strconv.Itoa(port), key).CombinedOutput(); err != nil {
		t.Fatalf("torch TCPStore client on port %d: %v\n%s", port, err, out)
	}
}

func listening(port int) bool {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func master(round, groupRank, port int) rendezvous.Assignment {
	return rendezvous.Assignment{Round: round, GroupRank: groupRank, MasterAddr: "127.0.0.1", MasterPort: port}
}

// TestHostFollowsRounds walks one launcher's store through the rounds of a
// job: bound when the rendezvous asks for the port (before the round can
// close), served and emptied once per round, closed when the node is not
// group rank 0 or a standby, bound again at a fixed address, closed for
// good at exit; the served and closed events record each step.
func TestHostFollowsRounds(t *testing.T) {
	testenv.SkipShort(t, "starts Debian's python3 with torch")
	if out, err := exec.Command(debianPython, "-c", "import torch").CombinedOutput(); err != nil {
		t.Fatalf("Debian's python3-torch is required (apt-get install python3-torch): %v\n%s", err, out)
	}
	dir := t.TempDir()
	evPath := filepath.Join(dir, "events.jsonl")
	ev, err := eventlog.Open(evPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := New(context.Background(), Options{Events: ev})

	// Round 0: the port is bound as the rendezvous advertises it.
	p, err := h.Port("127.0.0.1", 0)
	if err != nil || !listening(p) {
		t.Fatalf("Port: %d, %v (listening %v)", p, err, listening(p))
	}
	if err := h.Round(master(0, 0, p)); err != nil {
		t.Fatal(err)
	}
	torchSet(t, p, "a")
	torchSet(t, p, "b")
	if n := h.srv.Stats().Keys; n < 2 {
		t.Fatalf("%d keys after two sets", n)
	}

	// Round 1 on the same node: same port, emptied when it is advertised.
	p1, err := h.Port("127.0.0.1", 1)
	if err != nil || p1 != p {
		t.Fatalf("Port for round 1: %d, %v; want the same port %d", p1, err, p)
	}
	if n := h.srv.Stats().Keys; n != 0 {
		t.Fatalf("%d keys of round 0 visible in round 1", n)
	}
	if err := h.Round(master(1, 0, p)); err != nil {
		t.Fatal(err)
	}
	torchSet(t, p, "c")
	if err := h.Round(master(1, 0, p)); err != nil || h.srv.Stats().Keys != 1 {
		t.Fatalf("a second Round for the same round must not empty the store: %v, %d keys", err, h.srv.Stats().Keys)
	}

	// Round 2: another node is group rank 0; this one closes its server.
	p2, err := h.Port("127.0.0.1", 2)
	if err != nil || p2 != p {
		t.Fatalf("Port for round 2: %d, %v", p2, err)
	}
	if err := h.Round(rendezvous.Assignment{Round: 2, GroupRank: 1, MasterAddr: "127.0.0.3", MasterPort: 1234}); err != nil {
		t.Fatal(err)
	}
	if listening(p) || h.Addr() != nil {
		t.Fatalf("the server of a node that is not group rank 0 still listens on %d", p)
	}

	// Round 3: a fixed master port (a static launch) is bound at Round.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fixed := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if err := h.Round(master(3, 0, fixed)); err != nil || !listening(fixed) {
		t.Fatalf("fixed port %d: %v (listening %v)", fixed, err, listening(fixed))
	}
	// Round 4: a standby closes it.
	if err := h.Round(rendezvous.Assignment{Round: 4, GroupRank: -1, Standby: true}); err != nil || listening(fixed) {
		t.Fatalf("standby: %v, listening %v", err, listening(fixed))
	}
	// A busy fixed port is an error naming the address.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	bp := busy.Addr().(*net.TCPAddr).Port
	if err := h.Round(master(5, 0, bp)); err == nil || !strings.Contains(err.Error(), "127.0.0.1:"+strconv.Itoa(bp)) {
		t.Fatalf("busy port: %v", err)
	}

	p6, err := h.Port("127.0.0.1", 6)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Round(master(6, 0, p6)); err != nil {
		t.Fatal(err)
	}
	h.Close()
	if listening(p6) {
		t.Fatal("still listening after Close")
	}
	if _, err := h.Port("127.0.0.1", 7); !errors.Is(err, ErrClosed) {
		t.Fatalf("Port after Close: %v", err)
	}
	if err := ev.Close(); err != nil {
		t.Fatal(err)
	}

	evs, err := eventlog.Read(evPath)
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		kind    string
		round   float64
		dropped float64
	}
	var got []rec
	for _, e := range evs {
		r := rec{kind: e["event"].(string), round: e["round"].(float64)}
		if d, ok := e["keys_dropped"].(float64); ok {
			r.dropped = d
		}
		got = append(got, r)
	}
	want := []rec{
		{EventServed, 0, 0}, {EventServed, 1, 2}, {EventServed, 1, 2}, {EventClosed, 2, 0},
		{EventServed, 3, 0}, {EventClosed, 4, 0}, {EventServed, 6, 0}, {EventClosed, 6, 0},
	}
	if len(got) != len(want) {
		t.Fatalf("events %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("event %d: %+v, want %+v (all: %+v)", i, got[i], want[i], got)
		}
	}
}
