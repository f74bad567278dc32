package tcpstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
)

// state is what one attempt holds. Reset replaces it whole, so nothing an
// attempt grew (map buckets included) outlives it. Every method runs under
// Server.mu.
type state struct {
	lim      Limits
	kv       map[string][]byte
	queues   map[string][][]byte // QUEUE_PUSH lists, present while not empty
	bytes    int64               // keys+values of kv and queues
	regBytes int64               // what wait and watch registrations hold (regCost each)
	waiting  map[string][]*waiter
	watchers map[string][]*conn
	waiters  int // registrations: one per key a WAIT waits on, one per watched key
}

// waiter is one WAIT query still waiting on left keys.
type waiter struct {
	c    *conn
	left int
	keys []string // the keys it is registered under
}

func newState(lim Limits) *state {
	return &state{
		lim:      lim,
		kv:       map[string][]byte{},
		queues:   map[string][][]byte{},
		waiting:  map[string][]*waiter{},
		watchers: map[string][]*conn{},
	}
}

func (st *state) present(key string) bool {
	if _, ok := st.kv[key]; ok {
		return true
	}
	return len(st.queues[key]) > 0
}

func (st *state) allPresent(keys []string) bool {
	for _, k := range keys {
		if !st.present(k) {
			return false
		}
	}
	return true
}

// fits checks that replacing a value of oldLen bytes (-1: a new key) under key
// by one of newLen bytes stays within the limits.
func (st *state) fits(key string, oldLen, newLen int) error {
	if newLen > st.lim.MaxValueBytes {
		return refusef("value of %d bytes for key %q exceeds the limit of %d bytes", newLen, clip(key), st.lim.MaxValueBytes)
	}
	grow := int64(newLen)
	if oldLen < 0 {
		if len(st.kv)+len(st.queues) >= st.lim.MaxKeys {
			return refusef("store holds %d keys, the limit", st.lim.MaxKeys)
		}
		grow += int64(len(key))
	} else {
		grow -= int64(oldLen)
	}
	return st.room(grow, 0)
}

// put stores val under key (limits checked by the caller), wakes the key's
// waiters and tells its watchers: created, or changed the way kind says.
func (st *state) put(key string, val []byte, kind byte) {
	st.store(key, val, kind, true)
}

// store is put, waking the key's waiters only when wake is set.
func (st *state) store(key string, val []byte, kind byte, wake bool) {
	old, had := st.kv[key]
	if had {
		st.bytes += int64(len(val)) - int64(len(old))
	} else {
		st.bytes += int64(len(key)) + int64(len(val))
	}
	st.kv[key] = val
	if wake {
		st.wake(key)
	}
	if had {
		st.notifyWatchers(key, kind, old, val)
	} else {
		st.notifyWatchers(key, watchKeyCreated, nil, val)
	}
}

func (st *state) set(key string, val []byte) error {
	oldLen := -1
	if old, ok := st.kv[key]; ok {
		oldLen = len(old)
	}
	if err := st.fits(key, oldLen, len(val)); err != nil {
		return err
	}
	st.put(key, val, watchKeyUpdated)
	return nil
}

// compareSet stores desired when the key holds expected, or when it is
// missing and expected is empty, and returns what the key holds afterwards;
// a missing key with a non-empty expected value answers expected, as torch's
// servers do.
func (st *state) compareSet(key string, expected, desired []byte) ([]byte, error) {
	cur, ok := st.kv[key]
	switch {
	case !ok && len(expected) == 0:
		if err := st.fits(key, -1, len(desired)); err != nil {
			return nil, err
		}
		st.put(key, desired, watchKeyUpdated)
		return desired, nil
	case !ok:
		return expected, nil
	case bytes.Equal(cur, expected):
		if err := st.fits(key, len(cur), len(desired)); err != nil {
			return nil, err
		}
		st.put(key, desired, watchKeyUpdated)
		return desired, nil
	}
	return cur, nil
}

func (st *state) add(key string, delta int64) (int64, error) {
	n, val, err := st.sum("ADD", key, delta)
	if err != nil {
		return 0, err
	}
	st.put(key, val, watchKeyUpdated)
	return n, nil
}

// sum is what ADD and BARRIER store: the integer held under key (a missing
// key counts as 0) plus delta, as decimal text, limits checked.
func (st *state) sum(query, key string, delta int64) (int64, []byte, error) {
	oldLen := -1
	if cur, ok := st.kv[key]; ok {
		n, err := parseLeadingInt(cur)
		if err != nil {
			return 0, nil, refusef("%s on key %q, whose value %q is not an integer", query, clip(key), clip(string(cur)))
		}
		delta += n // wraps like the C++ servers
		oldLen = len(cur)
	}
	val := []byte(strconv.FormatInt(delta, 10))
	if err := st.fits(key, oldLen, len(val)); err != nil {
		return 0, nil, err
	}
	return delta, val, nil
}

func (st *state) appendTo(key string, data []byte) error {
	cur, ok := st.kv[key]
	oldLen := -1
	if ok {
		oldLen = len(cur)
	}
	if err := st.fits(key, oldLen, len(cur)+len(data)); err != nil {
		return err
	}
	// A fresh slice: a value handed to a reply being written is never
	// changed under it.
	val := make([]byte, 0, len(cur)+len(data))
	val = append(append(val, cur...), data...)
	st.put(key, val, watchKeyAppended)
	return nil
}

func (st *state) deleteKey(key string) int64 {
	cur, ok := st.kv[key]
	if !ok {
		return 0
	}
	delete(st.kv, key)
	st.bytes -= int64(len(key)) + int64(len(cur))
	st.notifyWatchers(key, watchKeyDeleted, cur, nil)
	return 1
}

func (st *state) queuePush(key string, val []byte) error {
	q, ok := st.queues[key]
	if len(val) > st.lim.MaxValueBytes {
		return refusef("value of %d bytes for queue %q exceeds the limit of %d bytes", len(val), clip(key), st.lim.MaxValueBytes)
	}
	grow := int64(len(val))
	if !ok {
		if len(st.kv)+len(st.queues) >= st.lim.MaxKeys {
			return refusef("store holds %d keys, the limit", st.lim.MaxKeys)
		}
		grow += int64(len(key))
	}
	if err := st.room(grow, 0); err != nil {
		return err
	}
	st.bytes += grow
	st.queues[key] = append(q, val)
	st.wakeOne(key)
	return nil
}

// queuePop takes the oldest item of a queue and returns it with the length
// the queue had (0: nothing taken), which is what torch's reply carries.
func (st *state) queuePop(key string) ([]byte, int) {
	q := st.queues[key]
	if len(q) == 0 {
		return nil, 0
	}
	v := q[0]
	q[0] = nil
	st.bytes -= int64(len(v))
	if len(q) == 1 {
		delete(st.queues, key)
		st.bytes -= int64(len(key))
	} else {
		st.queues[key] = q[1:]
	}
	return v, len(q)
}

// wait registers c to be told when every key is present; it returns true
// when they already are (nothing registered).
func (st *state) wait(c *conn, keys []string) (bool, error) {
	var missing []string
	var seen map[string]bool // a key named twice is registered once
	if len(keys) > 1 {
		seen = make(map[string]bool, len(keys))
	}
	for _, k := range keys {
		if !st.present(k) && !seen[k] {
			missing = append(missing, k)
			if seen != nil {
				seen[k] = true
			}
		}
	}
	if len(missing) == 0 {
		return true, nil
	}
	if err := st.canWait(c, missing); err != nil {
		return false, err
	}
	st.register(c, missing)
	return false, nil
}

// canWait checks that c may register one more wait, on keys: the
// registrations count against MaxWaiters, and the key strings they hold
// against MaxTotalBytes with the store's keys and values (a million waits
// on 8 KiB keys would otherwise hold 8 GiB).
func (st *state) canWait(c *conn, keys []string) error {
	if len(c.waits) >= st.lim.MaxWaitsPerConn {
		return refusef("connection has %d WAIT queries outstanding, the limit", len(c.waits))
	}
	if held := c.regs(); held+len(keys) > st.lim.MaxRegsPerConn {
		return refusef("connection holds %d wait and watch registrations, a wait on %d more keys would pass the limit of %d",
			held, len(keys), st.lim.MaxRegsPerConn)
	}
	if n := len(keys); st.waiters+n > st.lim.MaxWaiters {
		return refusef("server has %d wait registrations, a wait on %d more keys would pass the limit of %d", st.waiters, n, st.lim.MaxWaiters)
	}
	var cost int64
	for _, k := range keys {
		cost += regCost(k)
	}
	return st.room(cost, len(keys))
}

// regs counts the wait and watch registrations c holds (one per key not
// yet set of each outstanding wait, one per watch); called under
// Server.mu. At most MaxWaitsPerConn waits: cheap.
func (c *conn) regs() int {
	n := len(c.watching)
	for _, w := range c.waits {
		n += w.left
	}
	return n
}

// regOverhead is charged per wait or watch registration beside its key:
// the slice entries and the waiter that hold it.
const regOverhead = 64

func regCost(key string) int64 { return int64(len(key)) + regOverhead }

// room checks that grow more bytes, for regs new wait or watch registrations
// when regs > 0, fit under MaxTotalBytes beside the keys, values and
// registrations held.
func (st *state) room(grow int64, regs int) error {
	held := st.bytes + st.regBytes + grow
	switch {
	case held <= st.lim.MaxTotalBytes:
		return nil
	case regs > 0:
		return refusef("store would hold %d bytes with %d more wait or watch registrations, over the limit of %d", held, regs, st.lim.MaxTotalBytes)
	default:
		return refusef("store would hold %d bytes, over the limit of %d", held, st.lim.MaxTotalBytes)
	}
}

// register makes c wait until every one of keys has been set (canWait
// checked by the caller).
func (st *state) register(c *conn, keys []string) {
	w := &waiter{c: c, left: len(keys), keys: keys}
	for _, k := range keys {
		st.waiting[k] = append(st.waiting[k], w)
		st.regBytes += regCost(k)
	}
	st.waiters += len(keys)
	c.waits = append(c.waits, w)
}

// barrier counts one arrival at key, whose value is the decimal count of
// arrivals so far (a missing key: none), the way torch's libuv server
// serves BARRIER. The arrival that brings the count to worldSize stores it,
// wakes the key's waiters and is answered at once (true). An earlier one
// stores the count without waking anyone (a WAIT on the key goes on waiting;
// legacy watchers are told, as for ADD) and waits on the key itself, to be
// answered STOP_WAITING by the last arrival or WAIT_CANCELED by CANCEL_WAIT.
func (st *state) barrier(c *conn, key string, worldSize int64) (bool, error) {
	n, val, err := st.sum("BARRIER", key, 1)
	if err != nil {
		return false, err
	}
	if n >= worldSize {
		st.put(key, val, watchKeyUpdated)
		return true, nil
	}
	if err := st.canWait(c, []string{key}); err != nil {
		return false, err
	}
	st.store(key, val, watchKeyUpdated, false)
	st.register(c, []string{key})
	return false, nil
}

// keys lists the keys of the key/value map (not the queues), for LIST_KEYS.
func (st *state) keys() []string {
	out := make([]string, 0, len(st.kv))
	for k := range st.kv {
		out = append(out, k)
	}
	return out
}

// wake counts key off every waiter registered on it and answers those that
// have nothing left to wait for.
func (st *state) wake(key string) {
	ws, ok := st.waiting[key]
	if !ok {
		return
	}
	delete(st.waiting, key)
	st.waiters -= len(ws)
	st.regBytes -= int64(len(ws)) * regCost(key)
	for _, w := range ws {
		w.left--
		if w.left == 0 {
			w.c.forgetWait(w)
			w.c.push([]byte{waitStopWaiting})
		}
	}
}

// wakeOne counts key off the oldest waiter registered on it: one pushed
// queue item lets one blocked QUEUE_POP go on, as in torch's libuv server.
func (st *state) wakeOne(key string) {
	ws := st.waiting[key]
	if len(ws) == 0 {
		return
	}
	w := ws[0]
	if len(ws) == 1 {
		delete(st.waiting, key)
	} else {
		st.waiting[key] = ws[1:]
	}
	st.waiters--
	st.regBytes -= regCost(key)
	w.left--
	if w.left == 0 {
		w.c.forgetWait(w)
		w.c.push([]byte{waitStopWaiting})
	}
}

// cancelWaits drops every wait registration of c.
func (st *state) cancelWaits(c *conn) {
	for _, w := range c.waits {
		for _, k := range w.keys {
			if removeOne(st.waiting, k, w) {
				st.waiters--
				st.regBytes -= regCost(k)
			}
		}
	}
	c.waits = nil
}

// removeOne removes one x from m[k], and m[k] itself once empty.
func removeOne[T comparable](m map[string][]T, k string, x T) bool {
	xs := m[k]
	for i, y := range xs {
		if y == x {
			xs = append(xs[:i], xs[i+1:]...)
			if len(xs) == 0 {
				delete(m, k)
			} else {
				m[k] = xs
			}
			return true
		}
	}
	return false
}

func (st *state) watch(c *conn, key string) error {
	if held := c.regs(); held+1 > st.lim.MaxRegsPerConn {
		return refusef("connection holds %d wait and watch registrations, the limit", held)
	}
	if st.waiters+1 > st.lim.MaxWaiters {
		return refusef("server has %d wait registrations, the limit", st.waiters)
	}
	if err := st.room(regCost(key), 1); err != nil {
		return err
	}
	st.watchers[key] = append(st.watchers[key], c)
	st.waiters++
	st.regBytes += regCost(key)
	c.watching = append(c.watching, key)
	c.push([]byte{watchKeyCallbackRegistered})
	return nil
}

func (st *state) notifyWatchers(key string, kind byte, old, cur []byte) {
	cs := st.watchers[key]
	if len(cs) == 0 {
		return
	}
	msg := make([]byte, 0, 1+3*8+len(key)+len(old)+len(cur))
	msg = append(msg, kind)
	msg = appendBytes(msg, []byte(key))
	msg = appendBytes(msg, old)
	msg = appendBytes(msg, cur)
	for _, c := range cs {
		c.push(msg)
	}
}

// dropWatches removes every watch registration of c.
func (st *state) dropWatches(c *conn) {
	for _, k := range c.watching {
		if removeOne(st.watchers, k, c) {
			st.waiters--
			st.regBytes -= regCost(k)
		}
	}
	c.watching = nil
}

func appendBytes(b, v []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(v)))
	return append(b, v...)
}

// parseLeadingInt reads an integer the way std::stoll does, which is what
// torch's servers use for ADD: leading white space, a sign, digits, and
// whatever follows ignored.
func parseLeadingInt(b []byte) (int64, error) {
	i := 0
	for i < len(b) && (b[i] == ' ' || (b[i] >= '\t' && b[i] <= '\r')) {
		i++
	}
	j := i
	if j < len(b) && (b[j] == '+' || b[j] == '-') {
		j++
	}
	k := j
	for k < len(b) && b[k] >= '0' && b[k] <= '9' {
		k++
	}
	if k == j {
		return 0, fmt.Errorf("no digits")
	}
	return strconv.ParseInt(string(b[i:k]), 10, 64)
}

// clip shortens what a client sent for a log line.
func clip(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
