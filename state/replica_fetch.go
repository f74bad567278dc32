package state

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// ErrNoCopy: the buddy holds no complete copy of the rank asked for.
var ErrNoCopy = errors.New("no complete copy")

// Fetch asks the buddy at addr for the newest complete copy of rank that
// node sent, and returns it verified (length and CRC-32C). ctx bounds it.
func Fetch(ctx context.Context, addr, job, node string, rank int32) (*Copy, error) {
	var d net.Dialer
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
	if _, err := c.Write(frame{Kind: kindFetch, Job: job, Node: node, Rank: rank}.encode()); err != nil {
		return nil, wrap(err)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	f, err := readFrame(br)
	if err != nil {
		return nil, wrap(err)
	}
	switch f.Kind {
	case kindNotFound:
		return nil, wrap(fmt.Errorf("%w: %s", ErrNoCopy, f.Msg))
	case kindRefuse:
		return nil, wrap(fmt.Errorf("refused: %s", f.Msg))
	case kindCopy:
	default:
		return nil, wrap(fmt.Errorf("%w: frame kind %d", ErrProtocol, f.Kind))
	}
	if err := checkPeer(f, job); err != nil {
		return nil, wrap(err)
	}
	if f.Node != node || f.Rank != rank {
		return nil, wrap(fmt.Errorf("%w: asked for rank %d of node %q, got rank %d of node %q", ErrProtocol, rank, node, f.Rank, f.Node))
	}
	p, crc, err := readPayload(br, f)
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
