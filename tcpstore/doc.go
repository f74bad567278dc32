// Package tcpstore serves the key-value store that torch.distributed ranks
// reach through c10d's TCPStore client, so that a launcher (not rank 0) can
// host it: the server listens before any rank starts, and no rank ever races
// a bind or sleeps through a connect retry.
//
// The server speaks the TCPStore wire protocol of two client generations and
// picks one per connection from its first bytes:
//
//   - "legacy": torch 1.13 and 2.0, whose first query type is SET = 0 and
//     which can open a second connection for WATCH_KEY callbacks (the
//     2.1-era numbering without WATCH_KEY is not served: its DELETE_KEY,
//     type 7 after other queries, is refused);
//   - "v2": torch 2.2 and later, whose clients open every connection with a
//     VALIDATE query carrying a magic number and number the queries from
//     VALIDATE = 0.
//
// docs/protocol.md ("c10d TCPStore (the agent store)") gives the wire format,
// every query, the wait semantics and the limits. Everything a client can make
// the server hold or wait on is bounded by Limits; a client that goes past a
// limit is refused: its connection is closed, the refusal is counted in
// Stats.Refused and logged at a limited rate, and other clients carry on.
//
// Who may connect is bounded too (admit.go): an allowlist of source
// addresses (SetAllowed; the launcher sets the job's nodes each round),
// connections per address (MaxConnsPerAddr), and HandshakeTimeout for the
// first query; at a connection cap the oldest connection that has not
// completed its first query is closed to make room. torch 1.13's silent
// callback connection is exempt from the handshake (one per 1.13 client).
//
// Keys live until Reset, which a launcher calls between attempts: torch 1.13
// ranks scope their keys under /worker/attempt_N themselves, torch 2.x ranks
// expect a fresh store, and both are served by dropping everything
// (connections that never completed a query included).
package tcpstore
