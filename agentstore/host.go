// Package agentstore keeps this launcher's agent store: the c10d TCPStore
// (package tcpstore) that the launcher of group rank 0 serves to every rank
// of the round, as torchrun's agent store does (the ranks run with
// TORCHELASTIC_USE_AGENT_STORE=True and connect as clients only).
//
// The point is that no rank ever races the store's server. With the rank-0
// store (--agent-store off) rank 0 binds MASTER_PORT while the other ranks
// already try to connect, and a client that comes too early sleeps about a
// second before it retries. Here the server is bound before the round can
// close: the rendezvous advertises this node's MASTER_PORT through Port,
// which binds it, so whichever node becomes group rank 0 is already
// listening when any node learns the round, let alone spawns a rank.
//
// Every round gets an empty store (Reset), so nothing of an old attempt is
// visible to a new one (torch 2.x expects a fresh store per attempt; torch
// 1.13 also prefixes its keys with /worker/attempt_N). A node that is not
// group rank 0 of a round closes its server; a later round that makes it
// group rank 0 binds one again.
package agentstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/ftlauncher/ft-launcher/eventlog"
	"github.com/ftlauncher/ft-launcher/rendezvous"
	"github.com/ftlauncher/ft-launcher/tcpstore"
)

// Event kinds written to the event log.
const (
	EventServed = eventlog.AgentStoreServed // group rank 0 serves the round's store (eventlog.AgentStoreServedEvent)
	EventClosed = eventlog.AgentStoreClosed // the server closed (eventlog.AgentStoreClosedEvent)
)

// Server is the store's server (*tcpstore.Server).
type Server interface {
	Addr() *net.TCPAddr
	Reset()
	SetAllowed([]netip.Addr)
	Close() error
	Stats() tcpstore.Stats
}

// Options configure a Host.
type Options struct {
	// Store are the server's options (limits, logger); Logger defaults to
	// the Host's.
	Store  tcpstore.Options
	Logger *slog.Logger
	Events *eventlog.Log // nil: no event log
	// Listen starts a server on addr (host:port); nil: tcpstore.Listen.
	Listen func(ctx context.Context, addr string, o tcpstore.Options) (Server, error)
}

// Host is this launcher's agent store across rounds. It is safe for
// concurrent use (the rendezvous calls Port from its own goroutine).
type Host struct {
	ctx context.Context
	o   Options
	log *slog.Logger

	mu      sync.Mutex
	srv     Server
	host    string // the host part srv was bound with, as advertised
	round   int    // the round srv's keys belong to
	dropped int    // keys of the round before, dropped when srv was reset for round
	serving bool   // srv serves a round as group rank 0 (EventServed was written)
	closed  bool
	names   *Names // resolved node names (allow.go)
}

// ErrClosed is returned once the Host is closed.
var ErrClosed = errors.New("agent store closed")

// New returns a Host with no server yet; ctx bounds the servers' lives.
func New(ctx context.Context, o Options) *Host {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Store.Logger == nil {
		o.Store.Logger = o.Logger
	}
	if o.Listen == nil {
		o.Listen = func(ctx context.Context, addr string, so tcpstore.Options) (Server, error) {
			s, err := tcpstore.Listen(ctx, addr, so)
			if err != nil {
				return nil, err
			}
			return s, nil
		}
	}
	return &Host{ctx: ctx, o: o, log: o.Logger, round: -1, names: NewNames()}
}

// Port is the rendezvous's MasterPort hook: it makes sure a server listens
// on host (this node's advertised address) with an empty store for round,
// and returns its port. A node registering for a new round has stopped its
// ranks of the old one (or, in an in-process restart, its survivors wait
// for the round's notice and reconnect after it), so emptying the store
// here, before the new round can close, is safe, and no rank of the new
// round can see old keys. Other nodes may still be stopping their old ranks
// at this moment: docs/agentstore.md says what that window allows.
func (h *Host) Port(host string, round int) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return 0, ErrClosed
	}
	if h.srv != nil && h.host == host {
		h.resetLocked(round)
		return h.srv.Addr().Port, nil
	}
	if err := h.listenLocked(host, 0, round); err != nil {
		return 0, err
	}
	return h.srv.Addr().Port, nil
}

// Round makes the store follow asg before this node's ranks start (see
// agent.Store): group rank 0 serves it, emptied for asg.Round, at
// asg.MasterAddr:MasterPort (bound there if Port did not bind it, e.g. a
// fixed --master-port on one node); any other node closes its server.
func (h *Host) Round(asg rendezvous.Assignment) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return ErrClosed
	}
	if asg.Standby || asg.GroupRank != 0 {
		why := "this node is not group rank 0 of the round"
		if asg.Standby {
			why = "this node is a standby in the round"
		}
		h.closeLocked(asg.Round, why)
		return nil
	}
	if h.srv == nil || h.host != asg.MasterAddr || h.srv.Addr().Port != asg.MasterPort {
		h.closeLocked(asg.Round, "the round's master address differs")
		if err := h.listenLocked(asg.MasterAddr, asg.MasterPort, asg.Round); err != nil {
			return err
		}
	}
	h.resetLocked(asg.Round)
	// Only the round's nodes may connect (docs/agentstore.md, "What the
	// store is protected from"); the list is set before this node's ranks
	// start, and a rank of another node that connects before it is held,
	// not refused, until it is set.
	allow, why, ok := h.allowed(asg)
	admits := len(allow)
	if !ok {
		allow, admits = nil, -1
		h.log.Warn("agent store admits every address this round", "round", asg.Round, "why", why)
	}
	h.srv.SetAllowed(allow)
	dropped := h.dropped
	addr := h.srv.Addr().String()
	h.serving = true
	h.log.Info("agent store serving the round", "round", asg.Round, "addr", addr, "keys_dropped", dropped, "allowed_addrs", admits)
	h.o.Events.Emit(eventlog.AgentStoreServedEvent{Round: asg.Round, Addr: addr, KeysDropped: dropped, AllowedAddrs: admits})
	return nil
}

// Close closes the server, if any; later calls fail with ErrClosed.
func (h *Host) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeLocked(h.round, "the launcher is exiting")
	h.closed = true
}

// Addr is the address of the current server, or nil when none listens.
func (h *Host) Addr() *net.TCPAddr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.srv == nil {
		return nil
	}
	return h.srv.Addr()
}

// BindHost is the host part a server for the advertised host binds: the
// address itself, or "" (every interface) for a host name: a name
// (--local-addr defaults to the host's name) may resolve to several
// addresses, and the store listens on all of them, as torch's rank-0 store
// does, so that any of them reaches it.
func BindHost(host string) string {
	if net.ParseIP(host) == nil {
		return ""
	}
	return host
}

// listenLocked binds a new server on host:port for round.
func (h *Host) listenLocked(host string, port, round int) error {
	addr := net.JoinHostPort(BindHost(host), strconv.Itoa(port))
	srv, err := h.o.Listen(h.ctx, addr, h.o.Store)
	if err != nil {
		return fmt.Errorf("agent store: listen on %s: %w", addr, err)
	}
	// Until the round's nodes are known (Round), this host's own addresses
	// are admitted and any other waits for the list.
	own, _, _ := h.allowed(rendezvous.Assignment{})
	srv.SetAllowed(own)
	srv.Reset()
	h.srv, h.host, h.round, h.serving, h.dropped = srv, host, round, false, 0
	h.log.Debug("agent store listening", "addr", srv.Addr().String(), "round", round)
	return nil
}

// resetLocked empties the store when it still holds another round's keys
// (remembering how many it dropped: proof, in the served event, that the
// ranks of the round before used this store).
func (h *Host) resetLocked(round int) {
	if h.round == round {
		return
	}
	h.dropped = h.srv.Stats().Keys
	h.srv.Reset()
	h.round = round
}

// closeLocked closes the server, if any; a server that served a round
// leaves a record of its close.
func (h *Host) closeLocked(round int, why string) {
	if h.srv == nil {
		return
	}
	addr := h.srv.Addr().String()
	st := h.srv.Stats()
	if err := h.srv.Close(); err != nil {
		h.log.Warn("agent store: close", "addr", addr, "err", err)
	}
	if h.serving {
		h.log.Info("agent store closed", "round", round, "addr", addr, "why", why, "keys", st.Keys, "refused", st.Refused,
			"not_member", st.Counts.NotMember, "no_handshake", st.Counts.NoHandshake, "per_addr_cap", st.Counts.PerAddrCap,
			"idle_at_reset", st.Counts.IdleAtReset)
		h.o.Events.Emit(eventlog.AgentStoreClosedEvent{Round: round, Addr: addr, Why: why, Keys: st.Keys, Refused: st.Refused,
			NotMember: st.Counts.NotMember, NoHandshake: st.Counts.NoHandshake, PerAddrCap: st.Counts.PerAddrCap,
			IdleAtReset: st.Counts.IdleAtReset})
	}
	h.srv, h.host, h.serving = nil, "", false
}
