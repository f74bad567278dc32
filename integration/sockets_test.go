package integration

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/fence"
	"github.com/ftlauncher/ft-launcher/internal/procfs"
	"github.com/ftlauncher/ft-launcher/prewarm"
)

// The socket inventory: every socket a process of the launcher's tree
// listens on is either the training's (a rank's own: gloo, a TCPStore it
// opens) or one the launcher recorded in its listening event under a name
// that the threat model (docs/security.md) has in its table.

// threatModelNames are the backticked identifiers in the first column of
// the tables of docs/security.md.
func threatModelNames(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "security.md"))
	if err != nil {
		t.Fatalf("the threat model: %v (docs/security.md names every listener in its table)", err)
	}
	names := parseThreatModel(string(b))
	if len(names) == 0 {
		t.Fatal("docs/security.md has no table row with a `name` in its first column")
	}
	return names
}

// parseThreatModel returns the backticked identifiers in the first cell of
// every Markdown table row of doc.
func parseThreatModel(doc string) map[string]bool {
	names := map[string]bool{}
	ident := regexp.MustCompile("`([^`]+)`")
	for _, line := range strings.Split(doc, "\n") {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 3 || cells[0] != "" {
			continue
		}
		for _, m := range ident.FindAllStringSubmatch(cells[1], -1) {
			names[m[1]] = true
		}
	}
	return names
}

// treeProc is one process of a launcher's tree.
type treeProc struct {
	pid  int
	role string // launcher, fence-watchdog, etcd, rank, prewarm-standby, cgroup-guardian, other
	argv string
	// sockets and listening count the sockets it holds and those of
	// them that listen.
	sockets, listening int
}

// listener is a listening socket and the processes that hold it.
type listener struct {
	sock    procfs.Socket
	holders []treeProc
}

// nodeInventory is what one launcher's tree listens on.
type nodeInventory struct {
	procs     []treeProc
	listeners []listener
}

// inventory lists the processes of launcher pid's tree, with their roles,
// and every listening socket any of them holds. ranks are the pids of the
// node's ranks of the current round; standbys the prewarm standbys'.
func inventory(t *testing.T, pid int, ranks, standbys []int) nodeInventory {
	t.Helper()
	all, err := procfs.NetSockets(pid)
	if err != nil {
		t.Fatalf("sockets of launcher %d's network namespace: %v", pid, err)
	}
	var inv nodeInventory
	tree := append([]int{pid}, procfs.Descendants(pid)...)
	rankTree := map[int]bool{}
	for _, r := range ranks {
		rankTree[r] = true
		for _, d := range procfs.Descendants(r) {
			rankTree[d] = true
		}
	}
	launcherExe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	byInode := map[uint64]int{}
	for _, p := range tree {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		if err != nil {
			continue // exited meanwhile
		}
		argv := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", p))
		tp := treeProc{pid: p, argv: strings.Join(argv, " "), role: "other"}
		switch {
		case p == pid:
			tp.role = "launcher"
		case rankTree[p]:
			tp.role = "rank"
		case exe == launcherExe && len(argv) > 1 && argv[1] == fence.ModeArg:
			tp.role = "fence-watchdog"
		case filepath.Base(exe) == "ft-launcher-etcd":
			tp.role = "etcd"
		case slices.Contains(standbys, p):
			tp.role = "prewarm-standby"
		case argv[0] == "ftl-guardian":
			tp.role = "cgroup-guardian" // spawn.Contain's: holds the launcher's cgroup
		}
		if first, _, more := strings.Cut(tp.argv, "\n"); more || len(first) > 120 {
			tp.argv = first[:min(len(first), 120)] + " ..."
		}
		inodes, err := procfs.SocketInodes(p)
		if err != nil {
			continue // exited meanwhile
		}
		tp.sockets = len(inodes)
		for _, in := range inodes {
			if s, ok := all[in]; ok && s.Listening {
				tp.listening++
			}
		}
		inv.procs = append(inv.procs, tp)
		for _, in := range inodes {
			s, ok := all[in]
			if !ok || !s.Listening {
				continue
			}
			i, ok := byInode[in]
			if !ok {
				i = len(inv.listeners)
				byInode[in] = i
				inv.listeners = append(inv.listeners, listener{sock: s})
			}
			inv.listeners[i].holders = append(inv.listeners[i].holders, tp)
		}
	}
	return inv
}

// training reports a listener held by rank processes only: the training's
// own. One a launcher-side process holds too was inherited: the launcher's.
func (l listener) training() bool {
	for _, h := range l.holders {
		if h.role != "rank" {
			return false
		}
	}
	return true
}

func (l listener) String() string {
	var hs []string
	for _, h := range l.holders {
		hs = append(hs, fmt.Sprintf("%s pid %d (%s)", h.role, h.pid, h.argv))
	}
	return l.sock.String() + " held by " + strings.Join(hs, ", ")
}

// matchRecord is the index of the recorded listener that is socket s held
// by pid, -1 if none: one at its very address, else one whose port is
// picked later (port 0, with a When) on its host.
func matchRecord(rec []eventlog.ListeningSocket, s procfs.Socket, pid int) int {
	if k := slices.IndexFunc(rec, func(e eventlog.ListeningSocket) bool { return matches(e, s, pid, false) }); k >= 0 {
		return k
	}
	return slices.IndexFunc(rec, func(e eventlog.ListeningSocket) bool { return matches(e, s, pid, true) })
}

// matches reports whether the recorded listener e is socket s held by pid;
// anyPort: a port 0 stands for any, where the record says when it is
// picked.
func matches(e eventlog.ListeningSocket, s procfs.Socket, pid int, anyPort bool) bool {
	if e.Network != s.Network || e.PID != pid {
		return false
	}
	if s.Network == "unix" {
		return e.Address == s.Path
	}
	h, p, err := net.SplitHostPort(e.Address)
	if err != nil {
		return false
	}
	port, err := strconv.Atoi(p)
	if err != nil || (port != int(s.Local.Port()) && !(anyPort && port == 0 && e.When != "")) {
		return false
	}
	if h == "" {
		return s.Local.Addr().IsUnspecified()
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.Unmap() == s.Local.Addr()
}

// listeningRecord is the node's one listening event.
func listeningRecord(t *testing.T, j *job, node int) eventlog.ListeningEvent {
	t.Helper()
	var recs []eventlog.ListeningEvent
	b, err := os.ReadFile(j.events)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		e, err := eventlog.Decode(line)
		if err != nil {
			t.Fatalf("node %d's event log: %v: %s", node, err, line)
		}
		if r, ok := e.Record.(eventlog.ListeningEvent); ok {
			recs = append(recs, r)
		}
	}
	if len(recs) != 1 {
		t.Fatalf("node %d wrote %d %s records, want one", node, len(recs), eventlog.Listening)
	}
	return recs[0]
}

// pidsOf are the "pid" fields of the node's events of kind, as ints.
func pidsOf(evs []map[string]any, field string) []int {
	var out []int
	for _, e := range evs {
		switch v := e[field].(type) {
		case float64:
			out = append(out, int(v))
		case []any:
			for _, x := range v {
				if f, ok := x.(float64); ok {
					out = append(out, int(f))
				}
			}
		}
	}
	return out
}

// TestListenersAreInTheThreatModel: a real two-node job on loopback
// (127.0.0.2 and .3) with every feature that opens a socket: the embedded
// etcd (hosted by node 0's launcher in ft-launcher-etcd), gossip and the
// stream listener, the agent store, --state-dir with --state-replicas 1,
// --metrics-addr, the rank monitors, --prewarm standbys and the fence
// watchdog, and a torch rank per node (gloo, heartbeats, saves). While the
// ranks run, every listening socket of every process of each launcher's
// tree must be the training's (held by a rank only: listed, not judged) or
// one of the node's listening record, by network, address and process,
// under a name of docs/security.md's table; and every recorded listener
// must really listen (the agent store on the round's group rank 0 only).
func TestListenersAreInTheThreatModel(t *testing.T) {
	skipShort(t)
	requireTorch(t)
	names := threatModelNames(t)
	script, err := filepath.Abs("testdata/socket_worker.py")
	if err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, embeddedEndpoint(t))
	c.extra = []string{"--rdzv-backend", "c10d"}
	const nodes = 2
	for i := range nodes {
		c.addNode([]string{"PYTHON_EXEC=" + debianPython}, "--nnodes", strconv.Itoa(nodes), "--nproc-per-node", "1",
			"--max-restarts", "1", "--metrics-addr", c.nodeAddr(i)+":0",
			"--state-dir", filepath.Join(c.dir, "state"+strconv.Itoa(i)), "--state-replicas", "1",
			"--prewarm", "torch,torch.distributed", "--health-check-cmd", "true", script)
	}
	// Every rank is up (its process group all-reduced) and every node's
	// standby for the next cycle has imported torch.
	waitFor(t, torchTimeout, func() bool {
		for r := range nodes {
			if _, err := os.Stat(filepath.Join(c.dir, "up-"+strconv.Itoa(r))); err != nil {
				return false
			}
		}
		for _, n := range c.nodes {
			if len(n.eventsOfQuiet(prewarm.EventReady)) == 0 {
				return false
			}
		}
		return true
	})

	seen := map[string]bool{} // the recorded names found listening, on any node
	for i, n := range c.nodes {
		rec := listeningRecord(t, n, i)
		cycles := n.eventsOf(eventlog.CycleStarted)
		if len(cycles) != 1 {
			t.Fatalf("node %d started %d cycles, want 1", i, len(cycles))
		}
		ranks := pidsOf(cycles, "pids")
		groupRank0 := cycles[0]["group_rank"] == float64(0)
		inv := inventory(t, n.cmd.Process.Pid, ranks, pidsOf(n.eventsOf(prewarm.EventReady), "pid"))

		var lines []string
		for _, p := range inv.procs {
			lines = append(lines, fmt.Sprintf("  process %d %s, %d sockets, %d listening: %s", p.pid, p.role, p.sockets, p.listening, p.argv))
		}
		found := make([]bool, len(rec.Sockets))
		ownPort := rankListener(t, c.dir, i, nodes, cycles[0])
		training := 0
		for _, l := range inv.listeners {
			if l.training() {
				lines = append(lines, "  training: "+l.String())
				if l.sock.Network == "tcp" && l.sock.Local.Port() == uint16(ownPort) {
					training++
				}
				continue
			}
			if len(l.holders) > 1 {
				t.Errorf("node %d: %s: a listener held by several processes (inherited: the launcher's sockets are close-on-exec)", i, l)
			}
			h := l.holders[0]
			k := matchRecord(rec.Sockets, l.sock, h.pid)
			if k < 0 {
				t.Errorf("node %d: %s: not in the node's %s record; every listener of the launcher and its helpers must be recorded "+
					"under its name in docs/security.md (cmd/ft-launcher/listening.go). The record: %+v", i, l, eventlog.Listening, rec.Sockets)
				lines = append(lines, "  UNRECORDED: "+l.String())
				continue
			}
			e := rec.Sockets[k]
			found[k] = true
			seen[e.Name] = true
			lines = append(lines, fmt.Sprintf("  %s: %s (recorded as %s)", e.Name, l, e.Address))
			if !names[e.Name] {
				t.Errorf("node %d: %s is recorded as %q, which no row of docs/security.md's table names (it names %v)",
					i, l, e.Name, sortedKeys(names))
			}
			if e.Process == "ft-launcher-etcd" && h.role != "etcd" || e.Process == "ft-launcher" && h.role != "launcher" {
				t.Errorf("node %d: %s is recorded as %s's, held by a %s", i, l, e.Process, h.role)
			}
			if e.Name == "agent-store" {
				served := n.eventsOf("agent_store_served")
				if len(served) == 0 || served[len(served)-1]["addr"] != l.sock.Local.String() {
					t.Errorf("node %d: the agent store listens on %s; its last agent_store_served names %v", i, l.sock.Local, served)
				}
			}
		}
		if training != 1 {
			t.Errorf("node %d: the rank's own listener on port %d was found %d times as the training's, want once", i, ownPort, training)
		}
		for k, e := range rec.Sockets {
			perRound := e.Name == "agent-store"
			switch {
			case found[k] && perRound && !groupRank0:
				t.Errorf("node %d is not group rank 0, yet its agent store listens (%+v): the record says only group rank 0's does", i, e)
			case !found[k] && (!perRound || groupRank0):
				t.Errorf("node %d: the %s record names %+v, but no process of the launcher's tree listens there (stale)", i, eventlog.Listening, e)
			}
		}
		t.Logf("node %d (launcher %d, group rank 0: %v):\n%s", i, n.cmd.Process.Pid, groupRank0, strings.Join(lines, "\n"))
	}
	for _, want := range []string{"agent-store", "state-replication", "stream", "gossip", "metrics", "etcd-client", "etcd-peer",
		"rank-monitor", "workload-control"} {
		if !seen[want] {
			t.Errorf("no node listens on a %q socket: the job did not run with every feature on", want)
		}
	}

	if err := os.WriteFile(filepath.Join(c.dir, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if codes := c.waitAll(torchTimeout); slices.ContainsFunc(codes, func(c int) bool { return c != 0 }) {
		t.Fatalf("exit codes %v, want 0 everywhere", codes)
	}
}

// rankListener is the port of the listener that node's rank opened
// itself (its $OUT/up-<RANK> file: "pid port").
func rankListener(t *testing.T, dir string, node, world int, cycle map[string]any) int {
	t.Helper()
	pids := pidsOf([]map[string]any{cycle}, "pids")
	for r := range world {
		b, err := os.ReadFile(filepath.Join(dir, "up-"+strconv.Itoa(r)))
		if err != nil {
			t.Fatal(err)
		}
		var pid, port int
		if _, err := fmt.Sscan(string(b), &pid, &port); err != nil {
			t.Fatalf("up-%d %q: %v", r, b, err)
		}
		if slices.Contains(pids, pid) {
			return port
		}
	}
	t.Fatalf("node %d: no up file of its rank %v", node, pids)
	return 0
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestThreatModelNames: only the first cell of a table row names a
// listener; backticks elsewhere do not.
func TestThreatModelNames(t *testing.T) {
	doc := "Text with `not-a-name`.\n\n| name | process |\n|---|---|\n| `agent-store` | ft-launcher `x` |\n" +
		"|`gossip` and `stream`|ft-launcher|\n- `list-item`\n  | `indented` | y |\n"
	got := sortedKeys(parseThreatModel(doc))
	if want := []string{"agent-store", "gossip", "indented", "stream"}; !slices.Equal(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
}

// TestListenerMatching: a socket matches the recorded listener of its
// process at its address; a port 0 only where the record says when the
// port is picked, and only when no record has the very address.
func TestListenerMatching(t *testing.T) {
	tcp := func(a string) procfs.Socket {
		return procfs.Socket{Network: "tcp", Local: netip.MustParseAddrPort(a), Listening: true}
	}
	rec := []eventlog.ListeningSocket{
		{Name: "agent-store", Network: "tcp", Address: "127.0.0.2:0", PID: 7, When: "per round"},
		{Name: "gossip", Network: "tcp", Address: "127.0.0.2:4000", PID: 7},
		{Name: "gossip", Network: "udp", Address: "127.0.0.2:4000", PID: 7},
		{Name: "metrics", Network: "tcp", Address: "[::]:9400", PID: 7},
		{Name: "etcd-client", Network: "tcp", Address: "127.0.0.2:2379", PID: 9},
		{Name: "fixed", Network: "tcp", Address: "127.0.0.5:0", PID: 7},
		{Name: "rank-monitor", Network: "unix", Address: "/tmp/m/rmon0.sock", PID: 7},
		{Name: "every", Network: "tcp", Address: ":0", PID: 8, When: "per round"},
	}
	tests := []struct {
		name string
		sock procfs.Socket
		pid  int
		want string // the name matched; "" none
	}{
		{"exact address wins over a per-round port", tcp("127.0.0.2:4000"), 7, "gossip"},
		{"per-round port", tcp("127.0.0.2:5555"), 7, "agent-store"},
		{"udp twin", procfs.Socket{Network: "udp", Local: netip.MustParseAddrPort("127.0.0.2:4000")}, 7, "gossip"},
		{"every interface, IPv6 socket", tcp("[::]:9400"), 7, "metrics"},
		{"another process's address", tcp("127.0.0.2:2379"), 7, "agent-store"},
		{"the etcd's own", tcp("127.0.0.2:2379"), 9, "etcd-client"},
		{"port 0 without a When is no wildcard", tcp("127.0.0.5:1234"), 7, ""},
		{"other host", tcp("127.0.0.3:4000"), 7, ""},
		{"unix path", procfs.Socket{Network: "unix", Path: "/tmp/m/rmon0.sock"}, 7, "rank-monitor"},
		{"unix other path", procfs.Socket{Network: "unix", Path: "/tmp/m/rmon1.sock"}, 7, ""},
		{"no host: every interface only", tcp("0.0.0.0:6000"), 8, "every"},
		{"no host is not a specific address", tcp("127.0.0.1:6000"), 8, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ""
			if k := matchRecord(rec, tc.sock, tc.pid); k >= 0 {
				got = rec[k].Name
			}
			if got != tc.want {
				t.Errorf("%s held by %d matched %q, want %q", tc.sock, tc.pid, got, tc.want)
			}
		})
	}
}
