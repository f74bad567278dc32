package rendezvous

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/ftlauncher/ft-launcher/policy"
	"github.com/ftlauncher/ft-launcher/verdict"
)

// nodeState is one node's rendezvous life. Every change goes through
// (*Etcd).setStateLocked, so this table is the whole state machine:
//
//	joining ──► waiting ──► active ──► roundEnded ──► joining ...
//	                 │          │  └──► fenced ──► roundEnded / (Next) joining
//	                 └─► standby ┴─────► (Next) joining
//	any ──► closed (job closed, Leave, Close, etcd lost beyond the bound)
//
// A node that fenced out of round r (or whose report found its membership
// of r gone) while r is still the job's round waits for round r+1 and
// ends r once every active node of it has lost its membership: an
// orphaned round, which nobody else ends (orphan.go).
type nodeState int

const (
	stateJoining    nodeState = iota // config check, health check, registering in a round
	stateWaiting                     // registered; waiting for the round to close
	stateActive                      // assigned ranks in the current round
	stateStandby                     // parked beyond MIN; keeps membership for the next round
	stateRoundEnded                  // the round this node ran in is over; Next rejoins
	stateFenced                      // its lease could not be renewed: it stopped its ranks (fence.go)
	stateClosed                      // terminal
)

func (s nodeState) String() string {
	switch s {
	case stateJoining:
		return "joining"
	case stateWaiting:
		return "waiting-for-round-close"
	case stateActive:
		return "active"
	case stateStandby:
		return "standby"
	case stateRoundEnded:
		return "round-ended"
	case stateFenced:
		return "fenced"
	case stateClosed:
		return "closed"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// allowed lists the legal transitions; anything else is a bug and is logged.
var allowed = map[nodeState][]nodeState{
	stateJoining:    {stateWaiting, stateStandby, stateClosed},
	stateWaiting:    {stateActive, stateStandby, stateJoining, stateClosed},
	stateActive:     {stateRoundEnded, stateFenced, stateJoining, stateClosed},
	stateFenced:     {stateRoundEnded, stateJoining, stateClosed},
	stateStandby:    {stateJoining, stateClosed},
	stateRoundEnded: {stateJoining, stateClosed},
	stateClosed:     {},
}

func transitionOK(from, to nodeState) bool {
	if from == to {
		return true
	}
	for _, s := range allowed[from] {
		if s == to {
			return true
		}
	}
	return false
}

// Stored values (JSON) under <prefix><run_id>/.
type jobConfig struct {
	NProcPerNode int `json:"nproc_per_node"`
	MinNodes     int `json:"min_nodes"`
	MaxNodes     int `json:"max_nodes"`
	MaxRestarts  int `json:"max_restarts"`
	// The restart window and delay (--restart-window, --restart-delay),
	// seconds; absent (an older launcher's job): none.
	RestartWindowS float64 `json:"restart_window_s,omitempty"`
	RestartDelayS  float64 `json:"restart_delay_s,omitempty"`
	// Layout is the job's key layout (keyLayout); absent: 1, before the
	// rounds' assignment and closer keys moved under ctl/.
	Layout int `json:"layout,omitempty"`
}

// keyLayout is the key layout this launcher writes and reads. Layout 2
// keeps each round's assignment and closer key under ctl/, where every
// node's one long-lived watch sees them, instead of under rounds/<N>/
// with a watch per node and round (docs/rendezvous.md, Scale). Launchers
// of different layouts cannot share a job: each would wait for keys the
// other never writes.
const keyLayout = 2

// window and delay are the job's restart window and delay.
func (c jobConfig) window() time.Duration { return seconds(c.RestartWindowS) }
func (c jobConfig) delay() time.Duration  { return seconds(c.RestartDelayS) }

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

type memberInfo struct {
	NodeID     string `json:"node_id"`
	Addr       string `json:"addr"`
	InfraRank  int    `json:"infra_rank"`
	NProc      int    `json:"nproc"`
	MasterPort int    `json:"master_port"`
	GossipAddr string `json:"gossip_addr,omitempty"`
	StreamAddr string `json:"stream_addr,omitempty"` // watch listener (stream.go)
	// ReplicaAddr is the node's state replica receiver (--state-dir with
	// --state-replicas; docs/state.md); empty, and omitted, otherwise.
	ReplicaAddr string `json:"replica_addr,omitempty"`
}

type rankInfo struct {
	GroupRank int  `json:"group_rank"` // -1 for standby
	RankBase  int  `json:"rank_base"`
	Standby   bool `json:"standby"`
	Order     int  `json:"order"` // position in the sorted candidate list, kept for the next round's ordering
	// Watch are the active nodes whose stream listener this active node
	// holds a connection to (the next ones in group rank order): the
	// connection's close is the fast loss signal (stream.go).
	Watch []streamPeer `json:"watch,omitempty"`
	// Replicas are the state replica receivers of the next active nodes
	// in group rank order (rings.replicasOf); omitted when no node has one.
	Replicas []string `json:"replicas,omitempty"`
	// ReplicaFrom are the node ids whose Replicas hold this node's
	// receiver (rings.replicaFrom); omitted when none.
	ReplicaFrom []string `json:"replica_from,omitempty"`
}

// streamPeer is a node to watch and its stream listener.
type streamPeer struct {
	ID   string `json:"id"`
	Addr string `json:"addr"`
}

type roundSummary struct {
	Round          int      `json:"round"`
	GroupWorldSize int      `json:"group_world_size"`
	WorldSize      int      `json:"world_size"`
	MasterAddr     string   `json:"master_addr"`
	MasterPort     int      `json:"master_port"`
	MasterNode     string   `json:"master_node"`
	Standbys       int      `json:"standbys"`
	Seeds          []string `json:"seeds,omitempty"` // gossip addresses of the first nodes
	MembersRev     int64    `json:"members_rev"`     // etcd revision the membership was read at
	// RestartsUsed is ctl/restarts when the round closed (it only changes
	// together with ctl/round, so it is the count the round opened with).
	RestartsUsed int `json:"restarts_used"`
	// Delta says that every node with a rank entry in round Round-1 that is
	// not listed in Changed has the same entry in this round (Order aside):
	// such a node skips reading its rank key. Most restart rounds change no
	// rank at all, so at 4,000 nodes this saves 4,000 reads per round. A
	// launcher that does not know the fields reads its key as before.
	Delta   bool     `json:"delta,omitempty"`
	Changed []string `json:"changed,omitempty"`
}

// maxRankDelta bounds Changed: the summary goes to every node, so past this
// many changes each node reads its own key instead (Delta false).
const maxRankDelta = 64

// rankDelta fills sum.Delta and sum.Changed from round r-1's rank entries
// (prev, empty for round 0 or when they were not found) and this round's.
func rankDelta(sum *roundSummary, prev, ranks map[string]rankInfo) {
	if len(prev) == 0 {
		return
	}
	var changed []string
	for id, old := range prev {
		if cur, ok := ranks[id]; !ok || !sameRank(old, cur) {
			changed = append(changed, id)
			if len(changed) > maxRankDelta {
				return
			}
		}
	}
	slices.Sort(changed)
	sum.Delta, sum.Changed = true, changed
}

// sameRank compares what a node takes from its rank entry (not Order, which
// only the closer uses).
func sameRank(a, b rankInfo) bool {
	return a.GroupRank == b.GroupRank && a.RankBase == b.RankBase && a.Standby == b.Standby && slices.Equal(a.Watch, b.Watch) &&
		slices.Equal(a.Replicas, b.Replicas) && slices.Equal(a.ReplicaFrom, b.ReplicaFrom)
}

// closeInfo is the job's close record. Kind is the typed outcome; a record
// written by an older launcher has none and is read as failure (or success
// for code 0).
type closeInfo struct {
	Kind   verdict.Kind   `json:"kind,omitempty"`
	Code   int            `json:"code"`
	Reason string         `json:"reason"`
	Node   string         `json:"node,omitempty"`
	Cause  policy.Failure `json:"cause,omitempty"` // the failure that closed the job, if one did
	// LedgerBy is the node whose txn that closed the job also ended Node's
	// open ledger leases (a node loss); empty when it did not.
	LedgerBy string `json:"ledger_by,omitempty"`
}

// endInfo is the record of the last round that ended with a new round.
type endInfo struct {
	Round        int            `json:"round"`
	Reason       string         `json:"reason"`
	Node         string         `json:"node,omitempty"`
	Cause        policy.Failure `json:"cause,omitempty"`
	Action       policy.Action  `json:"action,omitempty"`
	RestartsUsed int            `json:"restarts_used"` // after this end
	// At is when the round was ended (the next one opened); nodes use it
	// to time a swap from the decision to their ranks' start.
	At time.Time `json:"at,omitempty"`
	// DetectMS is, for a node loss, the time from the detector's first
	// evidence (the lost node's closed connection, or its last gossip ack)
	// to this end; 0 when not known (a lease expiry, a local failure).
	DetectMS float64 `json:"detect_ms,omitempty"`
	// LedgerBy is the node whose end txn also ended Node's open ledger
	// leases (a node loss: one writer for the whole job); empty when it
	// did not (a local failure, an older launcher), and then every
	// survivor records the loss itself (ledger.Book.CloseOther).
	LedgerBy string `json:"ledger_by,omitempty"`
	// DelayMS is how long the next round waits to start (--restart-delay
	// of a restart that spent the budget); 0: at once.
	DelayMS float64 `json:"delay_ms,omitempty"`
}

// excludeInfo is written by a node that leaves the job (Leave) or departs
// (Depart) before it drops its lease, so that peers report an exclusion or
// a stop, not a loss.
type excludeInfo struct {
	Round  int    `json:"round"` // the last round the node was assigned (-1 none)
	Reason string `json:"reason"`
	// Cause is policy.NodeStopped for a departure; empty (older launchers)
	// or policy.NodeExcluded for an exclusion.
	Cause policy.Failure `json:"cause,omitempty"`
}

// failure is the policy failure this record turns a loss of node id into,
// with the round-end reason peers report.
func (x excludeInfo) failure(id string) (policy.Failure, string) {
	if x.Cause == policy.NodeStopped {
		return policy.NodeStopped, fmt.Sprintf("node %s stopped: %s", id, x.Reason)
	}
	return policy.NodeExcluded, fmt.Sprintf("node %s left the job: %s", id, x.Reason)
}

// keys builds the key layout of one generation of one run: base is
// <prefix><run_id>/g<N>/ (see runKeys for the run-level keys).
type keys struct{ base string }

// runKeys are the keys of a run that outlive its generations.
type runKeys struct{ base string } // <prefix><run_id>/

func (k runKeys) generation() string { return k.base + "generation" }
func (k runKeys) gen(g int) keys     { return keys{base: k.base + "g" + strconv.Itoa(g) + "/"} }

func (k keys) config() string                 { return k.base + "config" }
func (k keys) ctl() string                    { return k.base + "ctl/" }
func (k keys) round() string                  { return k.base + "ctl/round" }
func (k keys) closed() string                 { return k.base + "ctl/closed" }
func (k keys) lastEnd() string                { return k.base + "ctl/end" }
func (k keys) restarts() string               { return k.base + "ctl/restarts" }
func (k keys) restartTimes() string           { return k.base + "ctl/restart-times" }
func (k keys) roundDir(r int) string          { return k.base + "rounds/" + strconv.Itoa(r) + "/" }
func (k keys) ctlRounds() string              { return k.base + "ctl/rounds/" }
func (k keys) ctlRoundDir(r int) string       { return k.ctlRounds() + strconv.Itoa(r) + "/" }
func (k keys) assignment(r int) string        { return k.ctlRoundDir(r) + "assignment" }
func (k keys) closer(r int) string            { return k.ctlRoundDir(r) + "closer" }
func (k keys) nodes(r int) string             { return k.roundDir(r) + "nodes/" }
func (k keys) member(r int, id string) string { return k.nodes(r) + id }
func (k keys) ranks(r int) string             { return k.roundDir(r) + "rank/" }
func (k keys) rank(r int, id string) string   { return k.ranks(r) + id }
func (k keys) dones(r int) string             { return k.roundDir(r) + "done/" }
func (k keys) stacks(r int) string            { return k.roundDir(r) + "stacks/" }
func (k keys) speeds(r int) string            { return k.roundDir(r) + "speed/" }
func (k keys) speedResult(r int) string       { return k.roundDir(r) + "speed-result" }
func (k keys) done(r int, id string) string   { return k.dones(r) + id }
func (k keys) alives() string                 { return k.base + "alive/" }
func (k keys) alive(id string) string         { return k.alives() + id }
func (k keys) deads() string                  { return k.base + "dead/" }
func (k keys) dead(id string) string          { return k.deads() + id }
func (k keys) excluded(id string) string      { return k.base + "excluded/" + id }
func (k keys) quarantines() string            { return k.base + "quarantine/" }
func (k keys) quarantine(addr string) string  { return k.quarantines() + addr }

// orderMembers sorts round candidates deterministically (see docs/rendezvous.md):
//  1. known infra rank (SLURM_PROCID, --node-rank, ...) ascending, unknown last;
//  2. position in the previous round (keeps group ranks stable), newcomers last;
//  3. (addr, node id).
func orderMembers(ms []memberInfo, prevOrder map[string]int) {
	sort.SliceStable(ms, func(i, j int) bool {
		a, b := ms[i], ms[j]
		if ka, kb := infraKey(a.InfraRank), infraKey(b.InfraRank); ka != kb {
			return ka < kb
		}
		pa, oka := prevOrder[a.NodeID]
		pb, okb := prevOrder[b.NodeID]
		if oka != okb {
			return oka
		}
		if oka && pa != pb {
			return pa < pb
		}
		if a.Addr != b.Addr {
			return a.Addr < b.Addr
		}
		return a.NodeID < b.NodeID
	})
}

func infraKey(r int) int64 {
	if r < 0 {
		return int64(^uint64(0) >> 1)
	}
	return int64(r)
}

// assign computes every candidate's rank entry. ms is sorted (orderMembers).
// A node that was active in the previous round keeps its group rank
// (pinned: node id -> previous group rank); the remaining active slots go to
// the other candidates in order, and whoever is left is a standby.
func assign(ms []memberInfo, minNodes int, pinned map[string]int) (map[string]rankInfo, roundSummary, error) {
	if len(ms) < minNodes {
		return nil, roundSummary{}, fmt.Errorf("only %d of %d nodes present", len(ms), minNodes)
	}
	slots := make([]*memberInfo, minNodes)
	rest := make([]*memberInfo, 0, len(ms))
	for i := range ms {
		m := &ms[i]
		if g, ok := pinned[m.NodeID]; ok && g >= 0 && g < minNodes && slots[g] == nil {
			slots[g] = m
			continue
		}
		rest = append(rest, m)
	}
	for g := range slots {
		if slots[g] == nil {
			slots[g], rest = rest[0], rest[1:]
		}
	}
	out := make(map[string]rankInfo, len(ms))
	var sum roundSummary
	base := 0
	rg := newRings(slots)
	for i, m := range append(slots, rest...) {
		if i < minNodes {
			out[m.NodeID] = rankInfo{GroupRank: i, RankBase: base, Order: i, Watch: rg.watch(i), Replicas: rg.replicasOf(i), ReplicaFrom: rg.replicaFrom(i)}
			base += m.NProc
			if i == 0 {
				sum.MasterAddr, sum.MasterPort, sum.MasterNode = m.Addr, m.MasterPort, m.NodeID
			}
			if m.GossipAddr != "" && len(sum.Seeds) < 3 {
				sum.Seeds = append(sum.Seeds, m.GossipAddr)
			}
			continue
		}
		out[m.NodeID] = rankInfo{GroupRank: -1, Standby: true, Order: i}
		sum.Standbys++
	}
	sum.GroupWorldSize = minNodes
	sum.WorldSize = base
	return out, sum, nil
}

// replicaRingPeers bounds Assignment.ReplicaRing: a node's buddies are its
// next --state-replicas active nodes, so this is the largest K served.
// Carrying the ring's neighbours rather than every node's address keeps a
// rank entry a few hundred bytes at 4,000 nodes.
const replicaRingPeers = 4

// rings are the positions, in group rank order, of the active nodes that
// have a replica receiver and of those that have a stream listener: each
// node's ring walks skip the others by a binary search. Walking past them
// one by one cost O(N) per node when few or none have one (no
// --state-replicas: every node walked the whole ring, 256 million steps
// for the closer of a 16,000-node round).
type rings struct {
	actives          []*memberInfo
	replicas, stream []int
}

func newRings(actives []*memberInfo) rings {
	rg := rings{actives: actives}
	for i, m := range actives {
		if m.ReplicaAddr != "" {
			rg.replicas = append(rg.replicas, i)
		}
		if m.StreamAddr != "" {
			rg.stream = append(rg.stream, i)
		}
	}
	return rg
}

// ringAfter is up to k positions of idx after position i (wrapping, never
// i itself), nearest first.
func ringAfter(idx []int, i, k int) []int {
	var out []int
	j, _ := slices.BinarySearch(idx, i+1)
	for c := 0; c < len(idx) && len(out) < k; c++ {
		if p := idx[(j+c)%len(idx)]; p != i {
			out = append(out, p)
		}
	}
	return out
}

// ringBefore is up to k positions of idx before position i (wrapping,
// never i itself), nearest first.
func ringBefore(idx []int, i, k int) []int {
	var out []int
	j, _ := slices.BinarySearch(idx, i)
	n := len(idx)
	for c := 1; c <= n && len(out) < k; c++ {
		if p := idx[((j-c)%n+n)%n]; p != i {
			out = append(out, p)
		}
	}
	return out
}

// replicasOf is the replica receivers of the next replicaRingPeers actives
// after active node i (wrapping, never itself) that have one.
func (rg rings) replicasOf(i int) []string {
	var out []string
	for _, p := range ringAfter(rg.replicas, i, replicaRingPeers) {
		out = append(out, rg.actives[p].ReplicaAddr)
	}
	return out
}

// replicaFrom is the node ids of the actives whose replicasOf hold active
// node i's receiver: walking back from i, the nodes with a receiver until
// replicaRingPeers of them (each one passed is one more receiver between
// the next and i, and a ring holds replicaRingPeers).
func (rg rings) replicaFrom(i int) []string {
	if rg.actives[i].ReplicaAddr == "" {
		return nil
	}
	var out []string
	for _, p := range ringBefore(rg.replicas, i, replicaRingPeers) {
		out = append(out, rg.actives[p].NodeID)
	}
	return out
}

// watch is what active node i watches: the next streamWatchPeers actives
// (wrapping) that have a stream listener, so each is watched by that many
// others.
func (rg rings) watch(i int) []streamPeer {
	var out []streamPeer
	for _, p := range ringAfter(rg.stream, i, streamWatchPeers) {
		m := rg.actives[p]
		out = append(out, streamPeer{ID: m.NodeID, Addr: m.StreamAddr})
	}
	return out
}
