package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
	"github.com/ftlauncher/ft-launcher/agentstore"
	"github.com/ftlauncher/ft-launcher/configs"
	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/monitor"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/state"
)

// openState starts the launcher-held state store when --state-dir is set
// (docs/state.md); nil when it is not.
func openState(cfg *configs.Config, ev *eventlog.Log, log *slog.Logger) (*state.Store, error) {
	if cfg.StateDir == "" {
		return nil, nil
	}
	st, err := state.Open(state.Options{NLocal: cfg.NProcPerNode, Dir: cfg.StateDir, ShmRoot: cfg.StateShmDir, Every: cfg.StatePersist,
		Emit: ev.Emit, Logger: log.With("component", "state")})
	if err != nil {
		if cfg.StateShmDir != "" { // name the flag the user can change
			return nil, fmt.Errorf("--state-shm-dir %s (an existing directory on a tmpfs): %w", cfg.StateShmDir, err)
		}
		return nil, err
	}
	log.Info("state: ranks save into launcher memory", "segments", st.ShmDir(), "dir", cfg.StateDir, "persist_every", cfg.StatePersist.String())
	return st, nil
}

// stateMonitors are the rank monitors as the agent sees them, plus a
// write-out of every new save as soon as a cycle that did not complete has
// ended (a rank failed or hung, a signal stopped the job: walltime), so
// that a continuation job starts from the newest state. Embedding keeps
// every other interface of *monitor.Manager the agent asks for.
type stateMonitors struct {
	*monitor.Manager
	st *state.Store
}

func (m stateMonitors) EndCycleWith(completed bool) {
	m.Manager.EndCycleWith(completed)
	if !completed { // a completed run is written out when the store closes
		m.st.Kick("ranks stopped")
	}
}

// stateReplicas is this node's part of the replication to buddy nodes
// (--state-replicas K > 0 with --state-dir; docs/state.md): the receiver
// that holds its peers' copies, and, once the rendezvous gave the node its
// id, the sender of its own ranks' saves.
type stateReplicas struct {
	cfg    *configs.Config
	st     *state.Store
	recv   *state.Receiver
	repl   *state.Replicator
	secret []byte     // --job-secret-file's; nil: none
	local  netip.Addr // the advertised address when it is an IP: copies and fetches are sent from it
	names  *agentstore.Names
	emit   func(eventlog.Record)
	log    *slog.Logger
}

// readJobSecret reads --job-secret-file: the whole file is the secret. A
// file others may read is refused: the secret is what keeps them out.
func readJobSecret(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("--job-secret-file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("--job-secret-file %s: not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 && !secretGroupGranted(fi) {
		return nil, fmt.Errorf("--job-secret-file %s: mode %04o lets other users read the secret; want 0600 or 0400 (chmod 600 %s), "+
			"or 0440 on a file root owns with a group of this process (a Kubernetes Secret volume with the pod's fsGroup)", path, perm, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--job-secret-file: %w", err)
	}
	if len(bytes.TrimSpace(b)) < 16 {
		return nil, fmt.Errorf("--job-secret-file %s: %d bytes; want a secret of at least 16 bytes (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(bytes.TrimSpace(b)), path)
	}
	return b, nil
}

// secretGroupGranted reports whether a secret file others may read is one
// that root made readable to a group of this process only, at mode 0440
// (read for owner and group, nothing for others): how Kubernetes mounts a
// Secret for a pod with an fsGroup, the only way a pod not running as root
// reads one. Only root can have set that up, so it is a grant, not the
// accident the mode check is for; a file a user made group-readable is
// still refused.
func secretGroupGranted(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid != 0 || fi.Mode().Perm() != 0o440 {
		return false
	}
	if st.Gid == uint32(os.Getegid()) {
		return true
	}
	groups, err := os.Getgroups()
	return err == nil && slices.Contains(groups, int(st.Gid))
}

// gossipKeyOf is gossip's 32-byte key under --job-secret-file (nil without
// one): HMAC-SHA256 of the run id under the secret, so that the secret
// itself never keys a second protocol and another job's gossip, even one
// sharing the secret file, does not decrypt this one's.
func gossipKeyOf(cfg *configs.Config) ([]byte, error) { return jobSecretKey(cfg, "gossip") }

// jobSecretKey is the 32-byte key of one use of the job secret (nil
// without a secret): HMAC-SHA256 of "ft-launcher <use>", a zero byte and
// the run id, under the secret.
func jobSecretKey(cfg *configs.Config, use string) ([]byte, error) {
	secret, err := readJobSecret(cfg.JobSecretFile)
	if err != nil || secret == nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("ft-launcher " + use + "\x00" + cfg.RdzvID))
	return mac.Sum(nil), nil
}

// ownLargest is the largest newest save of this node's ranks (0: none).
func ownLargest(st *state.Store, nlocal int) func() uint64 {
	return func() uint64 {
		var n uint64
		for lr := range nlocal {
			f, err := os.Open(st.SegmentPath(lr))
			if err != nil {
				continue
			}
			if d, err := state.Newest(f); err == nil {
				n = max(n, d.Length)
			}
			_ = f.Close()
		}
		return n
	}
}

// listenReplicas starts the receiver on the node's advertised address
// (the one its peers reach it by for the rendezvous), on a port of its
// own; nil when replication is off.
func listenReplicas(ctx context.Context, cfg *configs.Config, st *state.Store, ev *eventlog.Log, log *slog.Logger) (*stateReplicas, error) {
	if st == nil || cfg.StateReplicas == 0 || cfg.Rdzv.Mode == configs.RdzvSingleNode {
		return nil, nil
	}
	host := cfg.LocalAddr
	if host == "" {
		host, _ = os.Hostname() // as the etcd rendezvous advertises it
	}
	secret, err := readJobSecret(cfg.JobSecretFile)
	if err != nil {
		return nil, err
	}
	emit := ev.Emit
	log = log.With("component", "state-replica")
	r := &stateReplicas{cfg: cfg, st: st, secret: secret, names: agentstore.NewNames(), emit: emit, log: log}
	r.local = r.ownIP(host)
	// Until a round names the nodes that replicate here, only this host
	// is admitted (docs/state.md, "Who may reach the replication port").
	r.recv, err = state.Listen(ctx, state.ReceiverOptions{Job: cfg.RdzvID, Addr: net.JoinHostPort(host, "0"), Emit: emit, Logger: log,
		Allow: state.Allowlist{Local: r.localAddrs()}, Secret: secret, NLocal: cfg.NProcPerNode,
		OwnLargest: ownLargest(st, cfg.NProcPerNode)})
	if err != nil {
		return nil, fmt.Errorf("state replicas: listen on %s: %w", host, err)
	}
	log.Info("state: receiving buddy copies", "addr", r.recv.Addr(), "replicas", cfg.StateReplicas, "authenticated", secret != nil, "send_from", r.local)
	return r, nil
}

// Addr is the receiver's address, published in the node's registration.
func (r *stateReplicas) Addr() string {
	if r == nil {
		return ""
	}
	return r.recv.Addr()
}

// start starts the sender under the node id the rendezvous knows this
// node by (its copies' key at the buddies); the buddies come per round.
func (r *stateReplicas) start(ctx context.Context, node string) error {
	repl, err := state.StartReplicator(ctx, state.ReplicatorOptions{Job: r.cfg.RdzvID, Node: node, Secret: r.secret, LocalIP: r.local,
		NLocal: r.cfg.NProcPerNode, Segment: r.st.SegmentPath, Emit: r.emit, Logger: r.log})
	if err != nil {
		return fmt.Errorf("state replicas: start the sender: %w", err)
	}
	r.repl = repl
	return nil
}

// Close stops the sender, then the receiver (the node's copies go with it).
func (r *stateReplicas) Close() {
	if r.repl != nil {
		r.repl.Close()
	}
	_ = r.recv.Close()
}

// restoreTimeout bounds the fetches of a round's restore, so that an
// unreachable peer cannot hold the round's ranks back for long.
const restoreTimeout = 2 * time.Minute

// round sets the round's buddies (the next K active nodes) and gives every
// local rank whose segment does not hold its new global rank's state (a
// spare, renumbered survivors) the newest copy a neighbour holds: its own
// receiver, then the next nodes of the ring, where the lost node's buddies
// are after a swap or a renumbering (docs/state.md).
func (r *stateReplicas) round(ctx context.Context, asg rendezvous.Assignment) {
	r.recv.SetAllowed(r.allowed(asg))
	if asg.Standby {
		r.repl.SetBuddies(nil)
		return
	}
	r.repl.SetBuddies(state.BuddyRing(append([]string{r.recv.Addr()}, asg.ReplicaRing...), 0, r.cfg.StateReplicas))
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	got, err := state.RestoreRanks(ctx, state.RestoreOptions{Job: r.cfg.RdzvID, NLocal: r.cfg.NProcPerNode,
		Segment: r.st.SegmentPath, RankBase: asg.RankBase, Round: asg.Round, Secret: r.secret, LocalIP: r.local,
		Peers: append([]string{r.recv.Addr()}, asg.ReplicaRing...), Emit: r.emit})
	r.st.BuddyRestored(got...) // their loads read as "buddy" (state_restore), and the verdict lists them
	n := len(got)
	if err != nil {
		// Not fatal: the ranks fall back to the files in the state directory.
		r.log.Warn("state: restore from buddies incomplete; the ranks fall back to the state directory", "round", asg.Round, "restored", n, "err", err)
	} else if n > 0 {
		r.log.Info("state: ranks restored from buddies", "round", asg.Round, "restored", n)
	}
}

// ownIP is the address this node's copies and fetches go out from: its
// advertised address (host), or the first of its name's addresses that is
// this host's, so that its buddies, which admit its node id from that
// host's addresses only, see it come from one of them. Invalid (the
// kernel's choice) when there is none.
func (r *stateReplicas) ownIP(host string) netip.Addr {
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap()
	}
	ips, bad := r.names.Resolve([]string{host})
	if bad != "" {
		return netip.Addr{}
	}
	own := agentstore.LocalAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() || slices.Contains(own, ip) {
			return ip
		}
	}
	return netip.Addr{}
}

// localAddrs are this host's addresses, its advertised one among them.
func (r *stateReplicas) localAddrs() []netip.Addr {
	a := agentstore.LocalAddrs()
	if r.local.IsValid() && !slices.Contains(a, r.local) {
		a = append(a, r.local)
	}
	return a
}

// allowed is the receiver's allowlist for asg: this host, and the nodes
// that replicate to it or restore from it (asg.ReplicaFrom), each admitted
// from its own host's addresses (a node id is "<host>/<pid>"). A node
// whose host does not resolve is left out, with a warning: its copies are
// refused (it relies on the state directory), never anyone else's.
func (r *stateReplicas) allowed(asg rendezvous.Assignment) state.Allowlist {
	a := state.Allowlist{Local: r.localAddrs(), Senders: map[string][]netip.Addr{}}
	for _, id := range asg.ReplicaFrom {
		ips, bad := r.names.Resolve([]string{rendezvous.NodeHost(id)})
		if bad != "" {
			r.log.Warn("state: a node that replicates here does not resolve; its copies are refused", "node", id, "host", bad)
			continue
		}
		a.Senders[id] = ips
	}
	return a
}

// replicaStore is the agent store with the replication's per-round step
// before it: the agent calls Round before any rank of the round starts,
// on a fresh start and on an in-process rejoin alike.
type replicaStore struct {
	agent.Store
	ctx  context.Context
	repl *stateReplicas
}

func (s replicaStore) Round(asg rendezvous.Assignment) error {
	if err := s.Store.Round(asg); err != nil { // group rank 0's store first: the other nodes' ranks wait on it
		return err
	}
	s.repl.round(s.ctx, asg)
	return nil
}
