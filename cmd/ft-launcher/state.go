package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/ftlauncher/ft-launcher/agent"
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
	cfg  *configs.Config
	st   *state.Store
	recv *state.Receiver
	repl *state.Replicator
	emit func(eventlog.Record)
	log  *slog.Logger
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
	emit := ev.Emit
	log = log.With("component", "state-replica")
	recv, err := state.Listen(ctx, state.ReceiverOptions{Job: cfg.RdzvID, Addr: net.JoinHostPort(host, "0"), Emit: emit, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("state replicas: listen on %s: %w", host, err)
	}
	log.Info("state: receiving buddy copies", "addr", recv.Addr(), "replicas", cfg.StateReplicas)
	return &stateReplicas{cfg: cfg, st: st, recv: recv, emit: emit, log: log}, nil
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
	repl, err := state.StartReplicator(ctx, state.ReplicatorOptions{Job: r.cfg.RdzvID, Node: node,
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
	if asg.Standby {
		r.repl.SetBuddies(nil)
		return
	}
	r.repl.SetBuddies(state.BuddyRing(append([]string{r.recv.Addr()}, asg.ReplicaRing...), 0, r.cfg.StateReplicas))
	ctx, cancel := context.WithTimeout(ctx, restoreTimeout)
	defer cancel()
	got, err := state.RestoreRanks(ctx, state.RestoreOptions{Job: r.cfg.RdzvID, NLocal: r.cfg.NProcPerNode,
		Segment: r.st.SegmentPath, RankBase: asg.RankBase, Round: asg.Round,
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
