package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/ftlauncher/ft-launcher/eventlog"
)

// ErrNoCopy: the buddy holds no complete copy of the rank asked for.
var ErrNoCopy = errors.New("no complete copy")

// ErrNotAdmitted: the buddy does not admit this node now (its list of the
// round's nodes may be a round behind: asking again later may succeed).
var ErrNotAdmitted = errors.New("not admitted by the buddy")

// Fetch asks the buddy at addr for the newest complete copy of rank that
// node sent ("": from any node, the highest step), and returns it verified
// (length and CRC-32C, and with the job secret its HMAC tags). ctx bounds
// it.
func Fetch(ctx context.Context, addr, job string, secret []byte, node string, rank int32) (*Copy, error) {
	return fetch(ctx, netip.Addr{}, addr, job, secret, node, rank)
}

// localTCP is the local address to dial from (nil: the kernel's choice).
func localTCP(ip netip.Addr) net.Addr {
	if !ip.IsValid() {
		return nil
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, 0))
}

func fetch(ctx context.Context, local netip.Addr, addr, job string, secret []byte, node string, rank int32) (*Copy, error) {
	key := macKey(secret, job)
	d := net.Dialer{LocalAddr: localTCP(local)}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fetch rank %d of node %q: connect to buddy %s: %w", rank, node, addr, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	wrap := func(err error) error {
		if ctx.Err() != nil {
			err = errors.Join(ctx.Err(), err)
		}
		return fmt.Errorf("fetch rank %d of node %q from buddy %s: %w", rank, node, addr, err)
	}
	if _, err := c.Write(frame{Kind: kindFetch, Job: job, Node: node, Rank: rank}.encode(key)); err != nil {
		return nil, wrap(err)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	f, err := readFrame(br, key)
	if err != nil {
		return nil, wrap(err)
	}
	switch f.Kind {
	case kindNotFound:
		return nil, wrap(fmt.Errorf("%w: %s", ErrNoCopy, f.Msg))
	case kindRefuse:
		if f.Status == refuseLater {
			return nil, wrap(fmt.Errorf("%w: %s", ErrNotAdmitted, f.Msg))
		}
		return nil, wrap(fmt.Errorf("refused: %s", f.Msg))
	case kindCopy:
	default:
		return nil, wrap(fmt.Errorf("%w: frame kind %d", ErrProtocol, f.Kind))
	}
	if err := checkPeer(f, job); err != nil {
		return nil, wrap(err)
	}
	if (node != "" && f.Node != node) || f.Rank != rank {
		return nil, wrap(fmt.Errorf("%w: asked for rank %d of node %q, got rank %d of node %q", ErrProtocol, rank, node, f.Rank, f.Node))
	}
	p, crc, err := readPayload(br, f, key)
	if err != nil {
		return nil, wrap(err)
	}
	if crc != f.CRC {
		return nil, wrap(fmt.Errorf("%w: trailer CRC %08x, header %08x", errChecksum, crc, f.CRC))
	}
	return &Copy{Node: f.Node, Rank: f.Rank, Step: f.Step, Seq: f.Seq, CRC32C: crc,
		Duration: time.Duration(f.DurationNS), Received: time.Now(), Payload: p}, nil
}

// Restore commits c into the segment at path as a save of c.Step by
// c.Rank (the segment's own sequence continues), so that the rank that
// takes c's place loads it with state.load() like any save.
func Restore(path string, c *Copy) (Desc, error) {
	d, err := (&Saver{Path: path, Rank: c.Rank}).Save(c.Step, c.Payload)
	if err != nil {
		return Desc{}, fmt.Errorf("restore the copy of rank %d (step %d) from node %q: %w", c.Rank, c.Step, c.Node, err)
	}
	return d, nil
}

// admitWait bounds how long a fetch asks again a buddy that does not
// admit this node yet: a peer learns a new round only once it stopped its
// ranks of the old one, which may take a while after this node learned it.
const admitWait = 30 * time.Second

// fetchAdmitted is Fetch, asked again every half second for up to
// admitWait while the buddy answers ErrNotAdmitted.
func fetchAdmitted(ctx context.Context, local netip.Addr, addr, job string, secret []byte, rank int32) (*Copy, error) {
	start := time.Now()
	for {
		c, err := fetch(ctx, local, addr, job, secret, "", rank)
		if !errors.Is(err, ErrNotAdmitted) || time.Since(start) > admitWait {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// FetchNewest asks every buddy in addrs for rank's newest complete copy
// from any node and returns the one with the highest step. The error is
// ErrNoCopy when every buddy answered that it holds none; a buddy that
// fails is skipped, its error returned only when no copy is found.
func FetchNewest(ctx context.Context, local netip.Addr, addrs []string, job string, secret []byte, rank int32) (*Copy, error) {
	var best *Copy
	var errs []error
	for _, a := range addrs {
		c, err := fetchAdmitted(ctx, local, a, job, secret, rank)
		if err != nil {
			if !errors.Is(err, ErrNoCopy) {
				errs = append(errs, err)
			}
			continue
		}
		if best == nil || c.Step > best.Step {
			best = c
		}
	}
	switch {
	case best == nil && len(errs) == 0:
		return nil, fmt.Errorf("rank %d: %w at any of %d buddies", rank, ErrNoCopy, len(addrs))
	case best == nil:
		return nil, fmt.Errorf("rank %d: no copy found, and %d of %d buddies could not be asked: %w", rank, len(errs), len(addrs), errors.Join(errs...))
	}
	return best, nil
}

// RestoreOptions say which ranks a node holds in a new round and where to
// look for their state.
type RestoreOptions struct {
	Job    string
	Secret []byte // the job secret (--job-secret-file); nil: none
	// LocalIP, when valid, is the address to fetch from (the node's
	// advertised address, which the buddies admit).
	LocalIP netip.Addr
	NLocal  int
	Segment func(lr int) string // Store.SegmentPath
	// RankBase is the round's global rank of local rank 0.
	RankBase int
	// Peers are the receivers to ask (the round's other nodes).
	Peers []string
	// Round is the round the ranks start in (BuddyRestore.Round).
	Round int
	Emit  func(eventlog.Record) // nil: no events (*eventlog.Log\'s Emit)
}

// EventRestoredFromBuddy: a local rank's segment got a buddy's copy.
const EventRestoredFromBuddy = eventlog.StateRestoredFromBuddy // StateRestoredFromBuddyEvent

// RestoreRanks gives every local rank whose segment does not hold a save
// of its global rank in this round (a spare, or a node whose ranks were
// renumbered) the newest copy of that rank held by a peer, so that the
// rank's state.load() finds it in memory. A rank no peer holds a copy of
// keeps its segment (the state directory stays its fallback). It returns
// the ranks restored (for Store.BuddyRestored) and the errors of those
// that could not be (unreachable peers, a failed restore).
func RestoreRanks(ctx context.Context, o RestoreOptions) ([]BuddyRestore, error) {
	if o.Emit == nil {
		o.Emit = func(eventlog.Record) {}
	}
	var errs []error
	var restored []BuddyRestore
	for lr := 0; lr < o.NLocal; lr++ {
		g := int32(o.RankBase + lr)
		path := o.Segment(lr)
		if f, err := os.Open(path); err == nil {
			d, err := Newest(f)
			_ = f.Close()
			if err == nil && d.Rank == g {
				continue // memory holds this rank's own newest save
			}
		}
		start := time.Now()
		c, err := FetchNewest(ctx, o.LocalIP, o.Peers, o.Job, o.Secret, g)
		if errors.Is(err, ErrNoCopy) {
			continue // nobody saved this rank yet (a job's first round)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("local rank %d: %w", lr, err))
			continue
		}
		if _, err := Restore(path, c); err != nil {
			errs = append(errs, fmt.Errorf("local rank %d: %w", lr, err))
			continue
		}
		restored = append(restored, BuddyRestore{Round: o.Round, LocalRank: lr, Rank: g, Step: c.Step, Sender: c.Node})
		o.Emit(eventlog.StateRestoredFromBuddyEvent{LocalRank: lr, Rank: int(g), Step: c.Step, Sender: c.Node,
			Bytes: int64(len(c.Payload)), FetchMS: float64(time.Since(start).Microseconds()) / 1000})
	}
	return restored, errors.Join(errs...)
}
