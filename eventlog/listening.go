package eventlog

// Listening: once the launcher is set up, every socket it and its helpers
// (the embedded etcd it hosts) listen on, each named by its identifier in
// the threat model (docs/security.md), so an operator sees what to
// firewall and a test can hold the real sockets against the list.
const Listening = "listening"

// ListeningEvent: the sockets this launcher and its helpers listen on, as
// set up (before the first round).
type ListeningEvent struct {
	Sockets []ListeningSocket `json:"sockets"`
}

// ListeningSocket is one listener of a ListeningEvent.
type ListeningSocket struct {
	// Name is the listener's identifier in docs/security.md's table
	// (agent-store, stream, gossip, metrics, etcd-client, ...).
	Name string `json:"name"`
	// Network is tcp, udp or unix.
	Network string `json:"network"`
	// Address is host:port as bound (a host of 0.0.0.0, [::] or none: every
	// interface; port 0: a port picked when it is bound, see When), or a
	// Unix socket's path.
	Address string `json:"address"`
	// PID and Process are the process that listens: this launcher
	// (ft-launcher) or a helper it started (ft-launcher-etcd).
	PID     int    `json:"pid"`
	Process string `json:"process"`
	// When says when it listens if not from set-up until the launcher
	// exits.
	When string `json:"when,omitempty"`
}

func (ListeningEvent) Kind() string { return Listening }
