// Package monitor runs the rank monitors of one node: for every local rank a
// Unix socket that the rank's client (nvrx's pickle protocol or ft-launcher's
// native FTL1 protocol, docs/protocol.md) talks to, hang detection driven by
// deadlines (one timer per rank), termination of a hung rank's process group,
// the workload-control socket, and the timeouts the launcher computes from
// what it observes (docs/timeouts.md).
//
// The monitors are goroutines inside the launcher, not processes as in nvrx
// (one forked Python+torch process per GPU): they share one address space
// with the agent, cost a few KiB of stack per connection instead of hundreds
// of MiB per process, start in microseconds, and report hangs over a channel
// instead of a side socket. The price is shared fate: if the launcher dies,
// its monitors die with it, which is acceptable because the ranks cannot be
// restarted without the launcher anyway. Shared fate also means a frozen
// launcher freezes its monitors: stall.go notices it from the monotonic
// clock, so the gap is neither learned as a rank's interval nor taken for a
// rank's hang.
package monitor
