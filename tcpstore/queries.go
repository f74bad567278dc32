package tcpstore

import (
	"bufio"
	"encoding/binary"
	"slices"
)

// handle reads the arguments of one query and answers it.
func (c *conn) handle(o op, b byte) error {
	switch o {
	case opSet:
		key, val, err := c.readKeyValue()
		if err != nil {
			return err
		}
		return c.locked(func(st *state) error { return st.set(key, val) })

	case opCompareSet:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		expected, err := c.readValue()
		if err != nil {
			return err
		}
		desired, err := c.readValue()
		if err != nil {
			return err
		}
		var res []byte
		if err := c.locked(func(st *state) (err error) {
			res, err = st.compareSet(key, expected, desired)
			return err
		}); err != nil {
			return err
		}
		return c.replyVec(res)

	case opGet:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		var val []byte
		_ = c.locked(func(st *state) error { val = st.kv[key]; return nil })
		return c.replyVec(val) // a missing key reads as empty, as in torch's libuv server

	case opAdd:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		delta, err := c.readU64()
		if err != nil {
			return err
		}
		var n int64
		if err := c.locked(func(st *state) (err error) {
			n, err = st.add(key, int64(delta))
			return err
		}); err != nil {
			return err
		}
		return c.replyI64(n)

	case opCheck:
		keys, err := c.readKeys()
		if err != nil {
			return err
		}
		var ready bool
		_ = c.locked(func(st *state) error { ready = st.allPresent(keys); return nil })
		if ready {
			return c.replyByte(checkReady)
		}
		return c.replyByte(checkNotReady)

	case opWait:
		keys, err := c.readKeys()
		if err != nil {
			return err
		}
		var ready bool
		if err := c.locked(func(st *state) (err error) {
			ready, err = st.wait(c, keys)
			return err
		}); err != nil {
			return err
		}
		if ready {
			return c.replyByte(waitStopWaiting)
		}
		return nil

	case opCancelWait:
		// Queued behind any answer already on its way, so the client reads
		// STOP_WAITING (if the keys came first) and then WAIT_CANCELED.
		return c.locked(func(st *state) error {
			st.cancelWaits(c)
			c.push([]byte{waitCanceled})
			return nil
		})

	case opNumKeys:
		var n int
		_ = c.locked(func(st *state) error { n = len(st.kv); return nil })
		return c.replyI64(int64(n))

	case opDeleteKey:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		var n int64
		_ = c.locked(func(st *state) error { n = st.deleteKey(key); return nil })
		return c.replyI64(n)

	case opWatchKey:
		// Torch 1.13/2.0 send WATCH_KEY only on their callback connection,
		// which sends nothing else. After other queries, type 7 is almost
		// surely DELETE_KEY in the numbering of torch 2.1-era clients, which
		// had neither WATCH_KEY nor VALIDATE: answering it as a watch would
		// leave that client waiting for a reply that never comes.
		if c.queried {
			return refusef("type 7 (WATCH_KEY) after other queries on this connection: " +
				"this looks like a torch 2.1-era client (DELETE_KEY = 7), whose numbering " +
				"the agent store does not serve; run with --agent-store off")
		}
		key, err := c.readKey()
		if err != nil {
			return err
		}
		return c.locked(func(st *state) error { return st.watch(c, key) })

	case opAppend:
		key, val, err := c.readKeyValue()
		if err != nil {
			return err
		}
		return c.locked(func(st *state) error { return st.appendTo(key, val) })

	case opMultiGet:
		keys, err := c.readKeys()
		if err != nil {
			return err
		}
		vals := make([][]byte, len(keys))
		_ = c.locked(func(st *state) error {
			for i, k := range keys {
				vals[i] = st.kv[k]
			}
			return nil
		})
		return c.write(func(w *bufio.Writer) {
			for _, v := range vals {
				writeVec(w, v)
			}
		})

	case opMultiSet:
		n, err := c.readCount()
		if err != nil {
			return err
		}
		type kv struct {
			k string
			v []byte
		}
		pairs := make([]kv, 0, min(n, 1024))
		for range n {
			if err := c.reserve(2 * listItemCost); err != nil {
				return err
			}
			key, val, err := c.readKeyValue()
			if err != nil {
				return err
			}
			pairs = append(pairs, kv{key, val})
		}
		return c.locked(func(st *state) error {
			for _, p := range pairs {
				if err := st.set(p.k, p.v); err != nil {
					return err
				}
			}
			return nil
		})

	case opPing:
		nonce, err := c.readU32()
		if err != nil {
			return err
		}
		return c.write(func(w *bufio.Writer) {
			var b [4]byte
			binary.LittleEndian.PutUint32(b[:], nonce)
			_, _ = w.Write(b[:])
		})

	case opQueuePush:
		key, val, err := c.readKeyValue()
		if err != nil {
			return err
		}
		return c.locked(func(st *state) error { return st.queuePush(key, val) })

	case opQueuePop:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		var val []byte
		var n int
		_ = c.locked(func(st *state) error { val, n = st.queuePop(key); return nil })
		if n == 0 {
			return c.replyI64(0)
		}
		return c.write(func(w *bufio.Writer) {
			writeU64(w, uint64(n))
			writeVec(w, val)
		})

	case opQueueLen:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		var n int
		_ = c.locked(func(st *state) error { n = len(st.queues[key]); return nil })
		return c.replyI64(int64(n))

	case opListKeys:
		var keys []string
		if err := c.locked(func(st *state) error {
			if err := c.reserve(int64(len(st.kv)) * listKeysCost); err != nil {
				return err
			}
			keys = st.keys()
			return nil
		}); err != nil {
			return err
		}
		slices.Sort(keys) // torch's order is its hash map's; any order will do
		return c.write(func(w *bufio.Writer) {
			writeU64(w, uint64(len(keys)))
			for _, k := range keys {
				writeVec(w, k)
			}
		})

	case opBarrier:
		key, err := c.readKey()
		if err != nil {
			return err
		}
		worldSize, err := c.readU64()
		if err != nil {
			return err
		}
		var done bool
		if err := c.locked(func(st *state) (err error) {
			done, err = st.barrier(c, key, int64(worldSize))
			return err
		}); err != nil {
			return err
		}
		if done {
			return c.replyByte(waitStopWaiting)
		}
		return nil

	case opValidate:
		// Only the first query of a v2 connection may validate (detect
		// consumed it); torch's servers close a connection that sends it
		// again.
		return refusef("VALIDATE after the first query")
	}
	return refusef("unknown query type %d for a %s client", b, c.dialect)
}
