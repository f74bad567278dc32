package integration

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/ftlauncher/ft-launcher/state"
)

// replicaAddrIn waits for a node's registration in the rendezvous's etcd
// at endpoint to publish its state replica receiver ("replica_addr"), as
// anyone who can read etcd, or the launcher's log, finds it.
func replicaAddrIn(t *testing.T, endpoint string) string {
	t.Helper()
	var addr string
	waitFor(t, generous, func() bool {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			return false
		}
		defer cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		resp, err := cli.Get(ctx, "\x00", clientv3.WithFromKey())
		if err != nil {
			return false
		}
		for _, kv := range resp.Kvs {
			var m struct {
				ReplicaAddr string `json:"replica_addr"`
			}
			if json.Unmarshal(kv.Value, &m) == nil && m.ReplicaAddr != "" {
				addr = m.ReplicaAddr
				return true
			}
		}
		return false
	})
	return addr
}

// replFrame is a state replication frame header as a peer writes it (the
// wire format of state/replicate.go, version 2, no job secret).
func replFrame(kind uint8, job, node string, rank int32, step int64, length uint64) []byte {
	b := make([]byte, 56, 56+len(job)+len(node))
	le := binary.LittleEndian
	copy(b, state.ReplMagic)
	le.PutUint16(b[4:], state.ReplVersion)
	b[6] = kind
	le.PutUint32(b[8:], uint32(rank))
	le.PutUint64(b[16:], uint64(step))
	le.PutUint64(b[24:], 1)
	le.PutUint64(b[32:], length)
	le.PutUint16(b[48:], uint16(len(job)))
	le.PutUint16(b[50:], uint16(len(node)))
	return append(append(b, job...), node...)
}

// replAnswer reads one frame's kind and message.
func replAnswer(c net.Conn) (kind uint8, msg string, err error) {
	var h [56]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, "", err
	}
	le := binary.LittleEndian
	s := make([]byte, int(le.Uint16(h[48:]))+int(le.Uint16(h[50:]))+int(le.Uint16(h[52:])))
	if _, err := io.ReadFull(c, s); err != nil {
		return 0, "", err
	}
	return h[6], string(s[int(le.Uint16(h[48:]))+int(le.Uint16(h[50:])):]), nil
}

// TestStateReplicaPortRefusesNonMembers replays the attack on the state
// replication port from 127.0.0.99, an address of no node of the job,
// knowing only the run id and the port (from etcd): before the job's
// second node starts, it pushes a forged copy (step 10^9) of every rank,
// asks for every rank's state, and pushes 1 GiB of zeros as a copy. Each
// is refused at once (kind refuse, naming the address), the launcher's
// memory does not grow by the gigabyte, and once the second node joins the
// job runs from scratch: no rank restores the forged copy, no buddy
// restore happens, and node 0 recorded the refusals (reason not_member).
func TestStateReplicaPortRefusesNonMembers(t *testing.T) {
	skipShort(t)
	script, err := filepath.Abs("testdata/state_plain.py")
	if err != nil {
		t.Fatal(err)
	}
	endpoint := embeddedEndpoint(t)
	c := newCluster(t, endpoint)
	c.extra = []string{"--rdzv-backend", "c10d"}
	out := filepath.Join(c.dir, "out")
	mkdir(t, out)
	node := func() {
		i := len(c.nodes)
		c.addNodeV([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", "2", "--nproc-per-node", "2", "--max-restarts", "0",
			"--state-dir", filepath.Join(c.dir, "state"+string(rune('0'+i))), "--state-persist-every", "0", "--state-replicas", "1",
			script, "--out", out, "--steps", "5")
	}
	node()
	addr := replicaAddrIn(t, endpoint)
	job := "job-" + c.marker
	dial := func() net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.99")}, Timeout: 5 * time.Second}
		conn, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %s from 127.0.0.99: %v", addr, err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
		return conn
	}
	pid := c.nodes[0].cmd.Process.Pid
	before := vmRSS(t, pid)

	for r := int32(0); r < 4; r++ {
		conn := dial()
		payload := []byte(strings.Repeat("forged ", 100))
		_, _ = conn.Write(append(replFrame(1, job, "127.0.0.3/4242", r, 1_000_000_000, uint64(len(payload))), payload...))
		kind, msg, err := replAnswer(conn)
		if err != nil || kind != 3 || !strings.Contains(msg, "127.0.0.99 is not an address of this job") {
			t.Fatalf("forged copy of rank %d: answer kind %d %q, %v; want a refusal naming the address", r, kind, msg, err)
		}
		conn = dial()
		_, _ = conn.Write(replFrame(6, job, "", r, 0, 0))
		if kind, msg, err := replAnswer(conn); err != nil || kind != 3 {
			t.Fatalf("fetch of rank %d from 127.0.0.99: answer kind %d %q, %v; want a refusal", r, kind, msg, err)
		}
	}
	// 1 GiB of zeros as a copy, written regardless of the answer.
	conn := dial()
	const giant = 1 << 30
	_, _ = conn.Write(replFrame(1, job, "127.0.0.3/4242", 0, 1, giant))
	zeros, sent := make([]byte, 1<<20), 0
	for sent < giant {
		n, err := conn.Write(zeros)
		sent += n
		if err != nil {
			break
		}
	}
	if sent >= giant {
		t.Errorf("the receiver took the whole 1 GiB push")
	}
	if grew := vmRSS(t, pid) - before; grew > 64<<20 {
		t.Errorf("the launcher grew by %d MiB after a 1 GiB push from a non-member; want far less", grew>>20)
	}

	node()
	for i, n := range c.nodes {
		if code := n.wait(torchTimeout); code != 0 {
			t.Fatalf("node %d exited %d", i, code)
		}
	}
	for r := 0; r < 4; r++ {
		b, err := os.ReadFile(filepath.Join(out, "rank-"+string(rune('0'+r))+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			ResumedFrom *int `json:"resumed_from"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.ResumedFrom != nil {
			t.Errorf("rank %d resumed from step %d: a forged copy was restored", r, *got.ResumedFrom)
		}
	}
	for i, n := range c.nodes {
		if ev := n.eventsOf(state.EventRestoredFromBuddy); len(ev) != 0 {
			t.Errorf("node %d restored from buddies: %v", i, ev)
		}
	}
	refused := 0
	for _, e := range c.nodes[0].eventsOf(state.EventReplicaRefused) {
		if e["reason"] == "not_member" && strings.HasPrefix(e["peer"].(string), "127.0.0.99:") {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("node 0 recorded no refusal of 127.0.0.99 (state_replica_refused, reason not_member)")
	}
}
