package state

// The bytes a buddy's Receiver holds in copies, complete and in flight:
// its budget, the bound of what the round's own copies need, the eviction of
// copies of nodes that no longer replicate here, and the hand-over of a copy
// once complete.

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// reserve accounts n bytes for a copy of key arriving on c. It fixes the
// budget when the first copy is offered. A copy still in flight for key
// (its sender reconnected; the old stream is dead) is superseded: its
// connection is closed and its bytes released.
func (r *Receiver) reserve(key replKey, c net.Conn, n uint64) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.budgetSet {
		r.budgetSet = true
		avail, err := r.opts.memAvailable()
		switch {
		case err != nil && r.opts.MaxBytes == 0:
			r.budgetWhy = fmt.Sprintf("MemAvailable unreadable: %v", err)
		case err != nil:
			r.budget, r.budgetWhy = r.opts.MaxBytes, "MaxBytes"
		default:
			r.budget = avail - avail/4
			r.budgetWhy = fmt.Sprintf("3/4 of MemAvailable %d bytes at the first copy", avail)
			if r.opts.MaxBytes > 0 && r.opts.MaxBytes < r.budget {
				r.budget, r.budgetWhy = r.opts.MaxBytes, fmt.Sprintf("MaxBytes (MemAvailable %d bytes at the first copy)", avail)
			}
		}
	}
	s := r.slots[key]
	if s == nil {
		s = &replSlot{}
		r.slots[key] = s
	}
	if s.inflight != nil {
		r.held -= s.inflight.bytes
		if s.inflight.conn != c {
			_ = s.inflight.conn.Close()
		}
		s.inflight = nil
	}
	if bound := r.jobBoundLocked(); r.held+n > bound {
		r.evictLocked(r.held + n - bound)
		if r.held+n > bound {
			return jobBoundError{fmt.Sprintf("buddy will not hold a copy of %d bytes of rank %d from node %q: it would hold %d bytes, over the bound of %d bytes its round's copies need (2 × %d ranks × %d senders × the copy limit of %d bytes)",
				n, key.rank, key.node, r.held+n, bound, r.opts.NLocal, max(len(r.allow.senders), 1), r.copyLimitLocked())}
		}
	}
	if r.held+n > r.budget {
		return fmt.Errorf("buddy cannot hold a copy of %d bytes of rank %d from node %q: it would hold %d bytes, over its budget of %d bytes (%s); the sender relies on the files in the state directory for this rank",
			n, key.rank, key.node, r.held+n, r.budget, r.budgetWhy)
	}
	r.held += n
	s.inflight = &inflight{conn: c, bytes: n}
	return nil
}

// jobBoundError: a copy would take the bytes held past what the round's
// own copies need (refused for now).
type jobBoundError struct{ msg string }

func (e jobBoundError) Error() string { return e.msg }

// copyLimitLocked bounds one copy: CopyLimitFactor times the largest save
// this node knows of the job (its own ranks' newest, the copies it holds),
// at least MinCopyLimit. A job's ranks save states of about the same size
// from one save to the next, so a copy far larger is not one of them.
func (r *Receiver) copyLimitLocked() uint64 {
	var largest uint64
	if r.opts.OwnLargest != nil {
		largest = r.opts.OwnLargest()
	}
	for _, s := range r.slots {
		if s.complete != nil {
			largest = max(largest, uint64(len(s.complete.Payload)))
		}
	}
	return max(r.opts.MinCopyLimit, largest*CopyLimitFactor)
}

// jobBoundLocked bounds the bytes held: a complete copy and one in flight
// for every rank of every node that replicates to this one, each at most
// the copy limit.
func (r *Receiver) jobBoundLocked() uint64 {
	return 2 * uint64(r.opts.NLocal) * uint64(max(len(r.allow.senders), 1)) * r.copyLimitLocked()
}

// evictLocked drops complete copies of nodes that no longer replicate to
// this one (a lost node's, once the round after its loss restored from
// them), oldest first, until need bytes are freed or none is left.
func (r *Receiver) evictLocked(need uint64) {
	for need > 0 {
		var old replKey
		var oc *Copy
		for k, s := range r.slots {
			if _, ok := r.allow.senders[k.node]; ok || s.complete == nil {
				continue
			}
			if oc == nil || s.complete.Received.Before(oc.Received) {
				old, oc = k, s.complete
			}
		}
		if oc == nil {
			return
		}
		n := uint64(len(oc.Payload))
		r.held -= n
		need -= min(need, n)
		r.slots[old].complete = nil
		if r.slots[old].inflight == nil {
			delete(r.slots, old)
		}
		r.opts.Logger.Info("state replica receiver: dropped the copy of a node that no longer replicates here, for room", "node", old.node, "rank", old.rank, "bytes", n)
	}
}

// release ends the copy in flight of key on c: cp, when not nil, becomes
// the complete copy (replacing the previous one). It returns false when
// the copy was superseded meanwhile (its bytes were released then).
func (r *Receiver) release(key replKey, c net.Conn, cp *Copy) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slots[key]
	if s == nil || s.inflight == nil || s.inflight.conn != c {
		return false
	}
	r.held -= s.inflight.bytes
	s.inflight = nil
	if cp != nil {
		if s.complete != nil {
			r.held -= uint64(len(s.complete.Payload))
		}
		s.complete = cp
		r.held += uint64(len(cp.Payload))
	}
	return true
}

// memAvailable is MemAvailable of /proc/meminfo, in bytes.
func memAvailable() (uint64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read free memory: %w", err)
	}
	for _, l := range bytes.Split(b, []byte{'\n'}) {
		fs := strings.Fields(string(l))
		if len(fs) >= 2 && fs[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/meminfo: MemAvailable %q: %w", fs[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("/proc/meminfo has no MemAvailable line")
}
